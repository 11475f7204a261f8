"""rag-gym envs behind other trainers' environment interfaces.

* :mod:`rag_gym.integrations.openenv_server`: an OpenEnv server (the ``openenv`` package) for any
  registered id, WebSocket sessions sharing one index (``rag-gym openenv serve``), configured by
  :mod:`rag_gym.integrations.openenv_config`; :mod:`rag_gym.integrations.openenv_client`, its
  typed client;
* :mod:`rag_gym.integrations.trl_env`: a class for TRL's ``GRPOTrainer(environment_factory=...)``,
  a dataset builder and a tool-capable chat template helper;
* :mod:`rag_gym.integrations.verifiers_taskset`: a ``verifiers.v1`` Taskset over any id, played
  through the text-tag protocol or through tools;
* :mod:`rag_gym.integrations.verifiers_tools`: those tools as a verifiers MCP ``Toolset``, one
  server per rollout, so that any harness that calls MCP tools can play; the helpers the two
  share are in :mod:`rag_gym.integrations.verifiers_common`.

Each is an optional extra (``openenv``, ``train``, ``verifiers``); importing this package imports
none of them. The openenv and verifiers modules import their package at their top (an
``ImportError`` naming the extra without it), so they are imported only where the extra is used;
``openenv_config`` and ``verifiers_common`` need nothing but rag-gym, and ``trl_env`` imports
TRL only when used.
"""
