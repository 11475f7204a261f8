"""rag-gym's tools as a verifiers MCP tool server (a ``verifiers.v1`` ``Toolset``, 0.4.0 tested).

The ``tools`` interaction of :mod:`rag_gym.integrations.verifiers_taskset` serves the tools of
:class:`~rag_gym.integrations.trl_env.RagGymToolEnv` over MCP: ``search(query)``,
``answer(answer)``, ``backtrack()``, ``refuse()``, and ``evaluate(note)`` under a preset that
scores notes (``eval_rar``). Names, arguments and descriptions are those
:func:`~rag_gym.integrations.verifiers_common.tool_schema` reads off ``RagGymToolEnv``, so any
verifiers harness that speaks MCP tools plays a rag-gym env with the tools a TRL-trained policy
knows; rag-gym's own harness calls them through MCP too.

How verifiers runs it (``verifiers.v1.mcp``):

* **One server per rollout.** ``RagGymTask.toolsets`` returns a :class:`RagGymToolset`
  (verifiers' task scope; a ``Taskset.toolsets`` server would be shared by every rollout), so
  each rollout's env lives in its own process and its state is that process's.
* **On this machine.** verifiers starts ``python -m rag_gym.integrations.verifiers_tools`` with
  its own interpreter in a ``subprocess`` runtime; the server binds 127.0.0.1 on a port the OS
  picks and installs nothing (verifiers installs a server only into a container or remote
  runtime, which :class:`RagGymToolsConfig` refuses, as it refuses ``colocated`` and ``url``).
* **Task in.** The server fetches its rollout's task over the rollout's private state channel;
  :meth:`RagGymToolset.setup_task` makes the env and resets it to the task's question.
* **Outcome out.** After every call the server writes the episode so far (EM, F1, return, reward
  terms, searches, steps, calls: :func:`~rag_gym.integrations.verifiers_common.outcome`) to
  the rollout's shared state, ``RagGymState.outcome``. verifiers syncs it into ``trace.state``,
  where the task's ``@stop`` hooks, ``finalize`` and rewards read it.
* **Malformed calls.** An unknown tool or wrong arguments (missing, extra, not strings) get
  :data:`UNKNOWN_TOOL` or :data:`BAD_ARGUMENTS` back, take no env step and count in
  ``format_errors``, as does a call the env refuses (one after the episode ended).

Importing this module imports verifiers (``pip install 'rag-gym[verifiers]'``; an
``ImportError`` naming that extra without it); the helpers it shares with the taskset, which need
nothing but rag-gym, are in :mod:`rag_gym.integrations.verifiers_common`.
"""

# no "from __future__ import annotations": pydantic and MCP read the annotations of the tool
# server's classes and tools.

import inspect
import json
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

try:
    import verifiers.v1 as vf
    from mcp.types import CallToolResult, TextContent
    from pydantic import Field, model_validator
    from verifiers.v1.utils.decorators import discover_decorated
except ImportError as exc:
    raise ImportError(
        "the verifiers tool server needs verifiers: pip install 'rag-gym[verifiers]'"
    ) from exc

from rag_gym.integrations.trl_env import RagGymToolEnv, make_env_class, tools_of
from rag_gym.integrations.verifiers_common import outcome, tool_env_class, tool_schema, tool_schemas

__all__ = ["BAD_ARGUMENTS", "UNKNOWN_TOOL", "tool_env_class"]

UNKNOWN_TOOL = "error: there is no tool {name!r}; the tools are {tools}."
"""The answer to a call of a tool the env does not have (``name``, ``tools`` filled in)."""
BAD_ARGUMENTS = "error: {name} takes {expected}, got {got}. Call {name} again with {expected}."
"""The answer to a call with missing, extra or non-string arguments."""


def _tool(fn: Any) -> Any:
    """A ``@vf.tool`` method that plays ``fn`` (a ``RagGymToolEnv`` tool) on the rollout's env,
    with the name, description and string arguments :func:`tool_schema` gives ``fn``."""
    spec = tool_schema(fn)["function"]
    name = spec["name"]
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for arg, prop in spec["parameters"]["properties"].items():
        params.append(
            inspect.Parameter(
                arg,
                inspect.Parameter.KEYWORD_ONLY,
                annotation=Annotated[str, Field(description=prop["description"])],
            )
        )

    async def call(self, **arguments):
        return self.play(name, arguments)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = spec["description"]
    call.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore
    return vf.tool(call)


class RagGymState(vf.State):
    """A rollout's state shared by its tool server and the host (``trace.state``)."""

    outcome: dict[str, Any] = Field(default_factory=dict)
    """The episode so far, written by the tool server after each call; empty until the first."""


class RagGymToolsConfig(vf.ToolsetConfig):
    """Where the tool server runs (``--env.taskset.task.tools.*``): a ``subprocess`` runtime on
    this machine, the only placement allowed."""

    @model_validator(mode="after")
    def _check(self):
        if self.runtime.type != "subprocess":
            raise ValueError(
                f"expected tools.runtime.type 'subprocess', got {self.runtime.type!r}: "
                "rag-gym's tool server runs on this machine and is never installed into "
                "another runtime"
            )
        if self.colocated:
            raise ValueError(
                "expected tools.colocated false, got true: a colocated server runs in the "
                "harness's runtime, where verifiers would install rag-gym"
            )
        if self.url is not None:
            raise ValueError(
                f"expected no tools.url, got {self.url!r}: each rollout's env lives in a tool "
                "server verifiers starts for it"
            )
        return self


# the tool env of a preset that scores notes (Eval-RAR's): the one with an ``evaluate`` tool
_EVALUATING = make_env_class(reward_preset="eval_rar")


class RagGymToolset(vf.Toolset[RagGymToolsConfig, RagGymState]):
    """One rollout's env behind MCP tools (see the module docstring).

    It offers the tools its env has (:func:`~rag_gym.integrations.trl_env.tools_of`): the
    ``evaluate`` declared here is served only under a preset that scores notes.
    """

    TOOL_PREFIX = None
    """Bare tool names (``search``, not ``rag_gym_search``), as the system prompt and TRL's env
    name them; harnesses that namespace MCP tools by server add their own prefix."""

    answer = _tool(RagGymToolEnv.answer)
    backtrack = _tool(RagGymToolEnv.backtrack)
    evaluate = _tool(_EVALUATING.evaluate)
    refuse = _tool(RagGymToolEnv.refuse)
    search = _tool(RagGymToolEnv.search)

    def __init__(self, config: RagGymToolsConfig) -> None:
        super().__init__(config)
        self.env: RagGymToolEnv | None = None
        self.format_errors = 0

    async def setup(self) -> None:
        """Remove, when the server stops, the port file verifiers had it write (in /tmp, read
        once at start and otherwise left behind: one per rollout)."""
        port_file = os.environ.get("MCP_PORT_FILE")
        if port_file:
            self._exit_stack.callback(Path(port_file).unlink, missing_ok=True)
            # verifiers stops the server with SIGTERM; uvicorn shuts down and then raises the
            # signal again, which by default kills the process before this stack unwinds
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    async def setup_task(self, task: Any) -> None:
        """Make the task's env and reset it to the task's question (``task`` is its
        ``RagGymData``, fetched over the rollout's state channel)."""
        env_cls = tool_env_class(
            task.env_id, task.reward_preset, json.dumps(task.env_kwargs, sort_keys=True)
        )
        self.env = env_cls()
        self.env.reset(question_id=task.question_id)

    def register(self, mcp: Any) -> None:
        """Register the ``@vf.tool`` methods the env has, and answer every call through
        :meth:`call_tool`, which syncs the rollout's state around it."""
        if self.env is None:
            raise vf.ToolsetError(
                "RagGymToolset serves one rollout's env and got no task: run it through "
                "RagGymTask.toolsets, which hands it the rollout's task"
            )
        offered = {tool.__name__ for tool in tools_of(self.env)}
        for fn in discover_decorated(self, "tool"):
            if fn.__name__ in offered:
                mcp.add_tool(fn, name=fn.__name__, description=fn.__doc__, structured_output=False)
        self._registered_call = mcp.call_tool
        mcp.call_tool = self._with_state(self.call_tool)

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None):
        """Play a well-formed call; answer a malformed one with :data:`UNKNOWN_TOOL` or
        :data:`BAD_ARGUMENTS` (no env step, one more ``format_errors``)."""
        problem = self.check_call(name, arguments)
        if problem is None:
            return await self._registered_call(name, arguments, context)
        self.format_errors += 1
        self.record()
        return CallToolResult(content=[TextContent(type="text", text=problem)], is_error=True)

    def check_call(self, name: str, arguments: Any) -> str | None:
        """The message for a call the env's tools cannot take, else ``None``."""
        assert self.env is not None
        schemas = {s["function"]["name"]: s["function"] for s in tool_schemas(self.env)}
        if name not in schemas:
            return UNKNOWN_TOOL.format(name=name, tools=", ".join(sorted(schemas)))
        wanted = schemas[name]["parameters"]["properties"]
        if (
            isinstance(arguments, dict)
            and set(arguments) == set(wanted)
            and all(isinstance(v, str) for v in arguments.values())
        ):
            return None
        expected = json.dumps({arg: "<string>" for arg in wanted}) if wanted else "no arguments"
        got = json.dumps(arguments, default=repr)
        got = got if len(got) <= 200 else got[:197] + "..."
        return BAD_ARGUMENTS.format(name=name, expected=expected, got=got)

    def play(self, name: str, arguments: dict[str, str]) -> str:
        """Step the env with one tool call and record the outcome; a call the env refuses (one
        after the episode ended) is answered ``error: ...`` and counted in ``format_errors``."""
        assert self.env is not None
        try:
            text = getattr(self.env, name)(**arguments)
        except (ValueError, TypeError) as exc:
            self.format_errors += 1
            text = f"error: {exc}"
        self.record()
        return text

    def record(self) -> None:
        """Write the episode so far to the rollout's shared state."""
        env = self.env
        assert env is not None
        self.state.outcome = outcome(
            env.info,
            env.episode_return,
            env.return_terms,
            searches=sum(1 for c in env.calls if c[0] == "search"),
            format_errors=self.format_errors,
            steps=len(env.calls),
            done=env.done,
            calls=[list(c) for c in env.calls],
            step_rewards=list(env.step_rewards),
        )


if __name__ == "__main__":  # how verifiers starts the server: python -m <this module>
    # run the importable module's class, not a second copy built in __main__
    from rag_gym.integrations.verifiers_tools import RagGymToolset

    RagGymToolset.run()
