"""What the verifiers taskset and its MCP tool server share: tool schemas, tool env classes and
the episode's outcome.

:mod:`rag_gym.integrations.verifiers_taskset` (the ``Taskset``, ``Env`` and ``Harness``) and
:mod:`rag_gym.integrations.verifiers_tools` (the ``Toolset``) both read these; neither imports
the other for them. This module needs nothing but rag-gym (``verifiers`` is imported by those
two).

>>> from rag_gym.integrations.trl_env import RagGymToolEnv
>>> tool_schema(RagGymToolEnv.search)["function"]["parameters"]["required"]
['query']
"""

from __future__ import annotations

import functools
import json
from typing import Any

from rag_gym.integrations._common import json_safe
from rag_gym.integrations.trl_env import make_env_class, tools_of

_ARGS = {"search": "query", "answer": "answer", "evaluate": "note"}


def tool_schema(tool: Any) -> dict[str, Any]:
    """The OpenAI tool schema of one :class:`~rag_gym.integrations.trl_env.RagGymToolEnv` tool
    (a method, bound or not), from its Google-style docstring as TRL and transformers read it:
    the first line describes the tool, the ``Args:`` line its one string argument."""
    doc = (tool.__doc__ or "").strip().splitlines()
    description = doc[0].strip() if doc else tool.__name__
    properties, required = {}, []
    arg = _ARGS.get(tool.__name__)
    if arg:
        text = next(
            (ln.split(":", 1)[1].strip() for ln in doc if ln.strip().startswith(f"{arg}:")),
            arg,
        )
        properties[arg] = {"type": "string", "description": text}
        required.append(arg)
    return {
        "type": "function",
        "function": {
            "name": tool.__name__,
            "description": description,
            "parameters": {"type": "object", "properties": properties, "required": required},
        },
    }


def tool_schemas(env: Any) -> list[dict[str, Any]]:
    """OpenAI tool schemas of a :class:`~rag_gym.integrations.trl_env.RagGymToolEnv`'s tools,
    in TRL's order."""
    return [tool_schema(tool) for tool in tools_of(env)]


@functools.cache
def tool_env_class(env_id: str, reward_preset: str | None, env_kwargs_json: str):
    """The :class:`~rag_gym.integrations.trl_env.RagGymToolEnv` class of a task's env (one per
    distinct env, preset and JSON-encoded ``gym.make`` kwargs)."""
    return make_env_class(
        env_id, reward_preset=reward_preset, env_kwargs=json.loads(env_kwargs_json)
    )


def outcome(info: dict[str, Any], returns: float, terms: dict[str, float], **extra):
    """The JSON-safe summary of an episode that rewards and metrics read."""
    scores = info.get("scores") or {}
    return json_safe(
        {
            "question_id": info.get("question_id"),
            "prediction": info.get("prediction"),
            "em": float(scores.get("em", 0.0)),
            "f1": float(scores.get("f1", 0.0)),
            "episode_return": float(returns),
            "return_terms": dict(terms),
            **extra,
        }
    )
