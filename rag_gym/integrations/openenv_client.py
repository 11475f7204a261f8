"""A typed OpenEnv client for ``rag-gym openenv serve``: ``RagGymEnvClient``.

openenv's ``GenericEnvClient`` plays the server with plain dicts; this client sends
:class:`~rag_gym.integrations.openenv_server.RagGymAction` models and returns
``RagGymObservation`` and ``RagGymState`` models, as the ``client.py`` of an ``openenv init``
package does (``deploy/openenv/client.py`` re-exports it)::

    from rag_gym.integrations.openenv_client import RagGymEnvClient
    from rag_gym.integrations.openenv_server import RagGymAction

    with RagGymEnvClient(base_url="http://127.0.0.1:8000").sync() as client:
        result = client.reset(seed=0)
        result = client.step(RagGymAction(type="search", text=result.metadata["question"]))
        print(result.observation.text, result.reward, result.observation.truncated)

Importing this module imports openenv (``pip install 'rag-gym[openenv]'``; an ``ImportError``
naming that extra without it), as the server's does.
"""

from __future__ import annotations

from typing import Any

try:
    from openenv.core.client_types import StepResult
    from openenv.core.env_client import EnvClient
except ImportError as exc:
    raise ImportError(
        "the OpenEnv client needs the openenv package: pip install 'rag-gym[openenv]'"
    ) from exc

from rag_gym.integrations.openenv_server import RagGymAction, RagGymObservation, RagGymState

__all__ = ["RagGymEnvClient"]


class RagGymEnvClient(EnvClient[RagGymAction, RagGymObservation, RagGymState]):
    """One WebSocket session of a rag-gym OpenEnv server, with typed actions and results.

    ``step`` takes a ``RagGymAction`` (or a dict of its fields); the result's
    ``observation`` is a ``RagGymObservation`` (``text``, ``truncated``, ``reward``,
    ``done``, ``metadata``: the env's JSON-safe ``info``) and ``state()`` a
    ``RagGymState``.
    """

    def _step_payload(self, action: Any) -> dict[str, Any]:
        if isinstance(action, dict):
            action = RagGymAction(**action)  # checked here, before it travels
        return action.model_dump(exclude={"metadata"}, exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult:
        fields = dict(payload.get("observation") or {})
        metadata = payload.get("metadata", fields.pop("metadata", {})) or {}
        fields.pop("metadata", None)
        observation = RagGymObservation(
            **fields,
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=metadata,
        )
        return StepResult(
            observation=observation,
            reward=payload.get("reward"),
            done=payload.get("done", False),
            metadata=metadata,
        )

    def _parse_state(self, payload: dict[str, Any]) -> Any:
        return RagGymState(**payload)
