"""Training policies in rag_gym envs.

* :mod:`~rag_gym.train.grpo`: GRPO/DAPO with multi-turn rollouts (TRL's ``GRPOTrainer`` with
  ``rollout_func`` and ``env_mask``), and :mod:`~rag_gym.train.recipes`, the papers' settings;
* :mod:`~rag_gym.train.sft`: the supervised cold start on expert transcripts;
* :mod:`~rag_gym.train.evo_rag_dpo`: EVO-RAG's preference training (a package: config,
  preference model, branching, the DPO epoch, tracking, the loop);
* :mod:`~rag_gym.train.episodes`: the one env set-up (:class:`~rag_gym.train.episodes.TextEnvSpec`)
  and :func:`~rag_gym.train.episodes.evaluate_policy` they all use; :mod:`~rag_gym.train.rollout`
  plays the episodes; :mod:`~rag_gym.train.rollout_log` saves a sample of them every N steps
  in the step-trace schema (``rag-gym view`` shows them);
* :mod:`~rag_gym.train.trl_compat`: the only module that reaches into TRL's private methods,
  with the TRL range it is tested with;
* :mod:`~rag_gym.train.sb3`: classic RL with Stable-Baselines3; :mod:`~rag_gym.train.ship`:
  shipping an adapter to llama.cpp.

Needs ``pip install torch==2.13.0 && pip install 'rag-gym[train]'`` (``[sb3]`` for SB3); nothing
here is imported by ``import rag_gym``.
"""

import os as _os

# JAX, where it is installed beside torch (as on many GPU images), takes 75% of the GPU's memory
# when something imports it, which leaves too little for a GRPO step's rollouts and loss.
# Trainers here never use JAX, so it allocates on demand unless the user set otherwise.
_os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
