"""A typed OpenEnv client for ``rag-gym openenv serve``: ``RagGymEnvClient``.

openenv's ``GenericEnvClient`` plays the server with plain dicts; this client sends
:class:`~rag_gym.integrations.openenv_server` ``RagGymAction`` models and returns
``RagGymObservation`` and ``RagGymState`` models, as the ``client.py`` of an ``openenv init``
package does (``deploy/openenv/client.py`` re-exports it)::

    from rag_gym.integrations.openenv_client import RagGymEnvClient
    from rag_gym.integrations.openenv_server import RagGymAction

    with RagGymEnvClient(base_url="http://127.0.0.1:8000").sync() as client:
        result = client.reset(seed=0)
        result = client.step(RagGymAction(type="search", text=result.metadata["question"]))
        print(result.observation.text, result.reward, result.observation.truncated)

The classes are built on first access, like the server's: ``import openenv.core`` pulls gradio
in (seconds).
"""

from __future__ import annotations

import functools
from typing import Any


@functools.cache
def _client_class() -> type:
    try:
        from openenv.core.client_types import StepResult
        from openenv.core.env_client import EnvClient
    except ImportError as exc:
        raise ImportError(
            "the OpenEnv client needs the openenv package: pip install 'rag-gym[openenv]'"
        ) from exc
    from rag_gym.integrations import openenv_server

    Action = openenv_server.RagGymAction
    Observation = openenv_server.RagGymObservation
    State = openenv_server.RagGymState

    class RagGymEnvClient(EnvClient[Action, Observation, State]):  # type: ignore[valid-type]
        """One WebSocket session of a rag-gym OpenEnv server, with typed actions and results.

        ``step`` takes a ``RagGymAction`` (or a dict of its fields); the result's
        ``observation`` is a ``RagGymObservation`` (``text``, ``truncated``, ``reward``,
        ``done``, ``metadata``: the env's JSON-safe ``info``) and ``state()`` a
        ``RagGymState``.
        """

        def _step_payload(self, action: Any) -> dict[str, Any]:
            if isinstance(action, dict):
                action = Action(**action)  # checked here, before it travels
            return action.model_dump(exclude={"metadata"}, exclude_none=True)

        def _parse_result(self, payload: dict[str, Any]) -> StepResult:
            fields = dict(payload.get("observation") or {})
            metadata = payload.get("metadata", fields.pop("metadata", {})) or {}
            fields.pop("metadata", None)
            observation = Observation(
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
            return State(**payload)

    RagGymEnvClient.__module__ = __name__
    return RagGymEnvClient


def __getattr__(name: str) -> Any:  # built on first access: openenv is heavy to import
    if name == "RagGymEnvClient":
        return _client_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RagGymEnvClient"]  # noqa: F822 (built by __getattr__)
