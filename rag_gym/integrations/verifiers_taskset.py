"""A verifiers taskset (``verifiers.v1``, 0.4.0 tested) over any registered rag-gym id.

verifiers finds a taskset by the name of a top-level module; ``rag_gym_verifiers`` re-exports
this one, so its CLI loads it as ``rag-gym-verifiers``::

    vf-eval rag-gym-verifiers --env.taskset.env-id rag_gym/SynthHop-v0 \\
        --env.taskset.interaction text --model <model> --client.base-url http://127.0.0.1:8080/v1 \\
        --client.api-key-var MY_KEY --no-push --no-rich -n 5

It exports (``__all__``) one ``Taskset`` (:class:`RagGymTaskset`: one task per question of the
env's split), one ``Env`` (:class:`RagGymEnv`, which plays the episode) and one ``Harness``
(:class:`RagGymHarness`, the default for this taskset). Two interactions
(``--env.taskset.interaction``):

* ``text``: the text-tag protocol of :class:`~rag_gym.wrappers.TextActions` (``--env.taskset.tags``,
  ``search_r1`` by default), so any chat model can play without tool calling. The env steps the
  rag-gym env host-side: each model reply is an action, the next observation (the
  ``<information>`` block or the format message) comes back as the user turn, until the episode
  ends or ``max_turns``.
* ``tools``: the tools of :class:`~rag_gym.integrations.trl_env.RagGymToolEnv` (``search``,
  ``answer``, ``backtrack``, ``refuse``, and ``evaluate`` with the ``eval_rar`` preset), for
  models that call tools. They are served over MCP by a verifiers ``Toolset``, one server per
  rollout holding that rollout's env (:mod:`rag_gym.integrations.verifiers_tools`), so any
  harness that speaks MCP tools can play; :class:`RagGymHarness` calls them through verifiers'
  MCP client. The episode ends the rollout through the task's ``@stop`` hooks
  (``episode_over`` once the env is done, ``turn_limit`` after ``max_turns`` model turns).

Rewards: ``em`` and ``f1`` of the final answer (weight 0.5 each: their weighted sum is the env's
``em_f1`` score); metrics: ``episode_return`` (the sum of the reward preset's rewards),
``term/<name>`` for each preset term, ``searches``, ``format_errors`` and ``steps``;
:class:`RagGymHarness` adds ``unsent_tool_calls``. The episode's outcome is kept in
``trace.info["rag_gym"]`` (for ``tools``, the task's ``finalize`` copies it there from the state
the tool server wrote), with ``step_rewards``, the preset's reward of each env step in order:
verifiers scores a rollout as a whole and has no per-turn reward field, so a trainer that gives
per-turn credit reads them there.

Safe defaults: the agent runs in a ``subprocess`` runtime on this machine (not a remote one),
the harness is rag-gym's own in-process chat loop (no shell, nothing installed), and it only
talks to the run's interception endpoint and the rollout's tool server (127.0.0.1). Pass
``--no-push`` (verifiers uploads runs by default) and point ``--client.base-url`` at your
server. Neither the harness nor the tool server writes to ``HOME``; verifiers' subprocess
runtimes keep a scratch folder under ``~/.cache/verifiers/runtimes`` while a rollout runs.

Importing this module imports verifiers (``pip install 'rag-gym[verifiers]'``; an
``ImportError`` naming that extra without it). The helpers the taskset shares with the tool
server (:func:`~rag_gym.integrations.verifiers_common.tool_schema`,
:func:`~rag_gym.integrations.verifiers_common.outcome`, ...) need nothing but rag-gym and live in
:mod:`rag_gym.integrations.verifiers_common`; this module re-exports them.
"""

# no "from __future__ import annotations": verifiers reads the hooks' annotations (a @stop's
# ``trace: vf.Trace``) with get_type_hints.

import contextlib
import json
from typing import Any

import gymnasium as gym

try:
    import verifiers.v1 as vf
    from openai import APIStatusError, AsyncOpenAI
    from pydantic import Field, model_validator
    from verifiers.v1.dialects.chat import message_to_wire
    from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp
    from verifiers.v1.runtimes import ProgramResult, SubprocessConfig
except ImportError as exc:
    raise ImportError(
        "the verifiers taskset needs verifiers: pip install 'rag-gym[verifiers]'"
    ) from exc

from rag_gym.envs.tags import tag_set
from rag_gym.integrations import trl_env
from rag_gym.integrations._common import check_env_id
from rag_gym.integrations.verifiers_common import (  # noqa: F401  (tool_schema* re-exported)
    outcome,
    tool_schema,
    tool_schemas,
)
from rag_gym.integrations.verifiers_tools import (
    UNKNOWN_TOOL,
    RagGymState,
    RagGymToolsConfig,
    RagGymToolset,
    tool_env_class,
)
from rag_gym.wrappers.presets import check_preset
from rag_gym.wrappers.presets import make as make_with_preset
from rag_gym.wrappers.text_actions import instructions

__all__ = ["RagGymEnv", "RagGymHarness", "RagGymTaskset"]

NOT_AN_OBJECT = (
    "error: the arguments of {name} are not a JSON object ({detail}). "
    "Call {name} again with a JSON object."
)
"""What :class:`RagGymHarness` answers a tool call whose arguments it cannot send (not a JSON
object); the tool server answers the other malformed calls (see
:mod:`rag_gym.integrations.verifiers_tools`)."""


class RagGymTaskConfig(vf.TaskConfig):
    """What a task reads at run time (``--env.taskset.task.*``)."""

    tools: RagGymToolsConfig | None = None
    """Where the ``tools`` interaction's MCP tool server runs; the taskset sets it for that
    interaction (``None``: no tool server, the ``text`` interaction)."""


class RagGymTasksetConfig(vf.TasksetConfig):
    """Which rag-gym env and how it is played (``--env.taskset.*``)."""

    env_id: str = "rag_gym/SynthHop-v0"
    """A registered rag-gym id."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """``gym.make`` keyword arguments (``split``, ``data_path``, ``dataset_kwargs``...)."""
    reward_preset: str | None = None
    """A reward preset (its return and terms become metrics)."""
    interaction: str = "text"
    """``text`` (the text-tag protocol) or ``tools`` (tool calls, served over MCP)."""
    tags: str = "search_r1"
    """The tag preset of the text interaction."""
    max_turns: int = Field(8, ge=1)
    """Most model turns per episode."""
    num_tasks: int | None = Field(None, ge=1)
    """Keep the first ``num_tasks`` questions of the split."""
    task: RagGymTaskConfig = RagGymTaskConfig()
    """Run-time task knobs: the tool server's placement (``task.tools``)."""

    @model_validator(mode="after")
    def _check(self):
        check_env_id(self.env_id)
        if self.reward_preset is not None:
            check_preset(self.reward_preset)
        if self.interaction not in ("text", "tools"):
            raise ValueError(f"expected interaction 'text' or 'tools', got {self.interaction!r}")
        tag_set(self.tags)
        if self.interaction == "tools" and self.task.tools is None:
            self.task = self.task.model_copy(update={"tools": RagGymToolsConfig()})
        if self.interaction == "text" and self.task.tools is not None:
            raise ValueError(
                "expected no task.tools with interaction 'text' (it serves no tools), got "
                f"{self.task.tools!r}; pass --env.taskset.interaction tools to serve them"
            )
        return self


class RagGymData(vf.TaskData):
    question_id: str
    answers: list[str] = Field(default_factory=list)
    env_id: str
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    reward_preset: str | None = None
    interaction: str = "text"
    tags: str = "search_r1"
    max_turns: int = 8


def _outcome(trace) -> dict[str, Any]:
    return trace.info.get("rag_gym") or {}


class RagGymTask(vf.Task[RagGymData, RagGymState, RagGymTaskConfig]):
    """Scores an episode from ``trace.info["rag_gym"]``; for ``tools``, serves the env's
    tools (:class:`~rag_gym.integrations.verifiers_tools.RagGymToolset`, one per rollout)
    and ends the rollout when the episode ends."""

    @classmethod
    def toolsets(cls, config: RagGymTaskConfig) -> list:
        return [] if config.tools is None else [RagGymToolset(config.tools)]

    async def finalize(self, trace, runtime) -> None:
        """Keep the tool server's outcome (``trace.state``, not serialised) in
        ``trace.info["rag_gym"]``, which the rewards read and ``traces.jsonl`` keeps."""
        if self.data.interaction == "tools":
            trace.info["rag_gym"] = dict(trace.state.outcome) or _no_steps(self.data)

    @vf.stop
    async def episode_over(self, trace: vf.Trace) -> bool:
        """The episode ended (an answer, a refusal, the env's step limit)."""
        return bool(trace.state.outcome.get("done"))

    @vf.stop
    async def turn_limit(self, trace: vf.Trace) -> bool:
        """The tools interaction's ``max_turns`` model turns are spent."""
        return self.data.interaction == "tools" and trace.num_turns >= self.data.max_turns

    @vf.reward(weight=0.5)
    async def em(self, trace) -> float:
        return float(_outcome(trace).get("em", 0.0))

    @vf.reward(weight=0.5)
    async def f1(self, trace) -> float:
        return float(_outcome(trace).get("f1", 0.0))

    @vf.metric
    async def episode_return(self, trace) -> float:
        return float(_outcome(trace).get("episode_return", 0.0))

    @vf.metric
    async def terms(self, trace) -> dict[str, float]:
        terms = _outcome(trace).get("return_terms", {})
        return {f"term/{k}": float(v) for k, v in terms.items()} or {"term/none": 0.0}

    @vf.metric
    async def searches(self, trace) -> float:
        return float(_outcome(trace).get("searches", 0))

    @vf.metric
    async def format_errors(self, trace) -> float:
        return float(_outcome(trace).get("format_errors", 0))

    @vf.metric
    async def steps(self, trace) -> float:
        return float(_outcome(trace).get("steps", 0))


class RagGymTaskset(vf.Taskset[RagGymTask, RagGymTasksetConfig]):
    """One task per question of the env's split."""

    def load(self):
        cfg = self.config
        env = gym.make(cfg.env_id, **cfg.env_kwargs)
        examples = list(env.unwrapped.examples)[: cfg.num_tasks]
        env.close()
        if cfg.interaction == "text":
            system = instructions(tag_set(cfg.tags))
        else:
            system = trl_env.system_prompt(
                tool_env_class(
                    cfg.env_id, cfg.reward_preset, json.dumps(cfg.env_kwargs, sort_keys=True)
                )
            )
        for ex in examples:
            yield RagGymTask(
                RagGymData(
                    id=ex.id,
                    name=ex.id,
                    prompt=f"Question: {ex.question}",
                    system_prompt=system,
                    question_id=ex.id,
                    answers=list(ex.answers),
                    env_id=cfg.env_id,
                    env_kwargs=cfg.env_kwargs,
                    reward_preset=cfg.reward_preset,
                    interaction=cfg.interaction,
                    tags=cfg.tags,
                    max_turns=cfg.max_turns,
                ),
                cfg.task,
            )


class RagGymEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig(runtime=SubprocessConfig())
    """The one seat; its runtime is a subprocess on this machine."""


class RagGymEnv(vf.Env[RagGymEnvConfig]):
    """Plays one episode: host-side steps for ``text``; for ``tools``, the seat's harness
    calls the rollout's MCP tool server until a ``@stop`` ends the rollout."""

    async def run(self, task, agents):
        data = task.data
        if data.interaction == "tools":
            await agents.player.run(task)
            return
        env = _text_env(data)
        _, info = env.reset(options={"question_id": data.question_id})
        terms, step_rewards = {}, []
        searches = format_errors = 0
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                obs, reward, terminated, truncated, info = env.step(segment.last_reply)
                step_rewards.append(float(reward))
                for k, v in info.get("reward_terms", {}).items():
                    terms[k] = terms.get(k, 0.0) + float(v)
                searches += len(info.get("queries", []))
                format_errors += 0 if info.get("format_ok", True) else 1
                interaction.trace.info["rag_gym"] = outcome(
                    info,
                    sum(step_rewards),
                    terms,
                    searches=searches,
                    format_errors=format_errors,
                    steps=len(step_rewards),
                    done=bool(terminated or truncated),
                    step_rewards=list(step_rewards),
                )
                if terminated or truncated or len(step_rewards) >= data.max_turns:
                    break
                segment = await interaction.turn(obs or "Continue.")
        env.close()


class RagGymHarnessConfig(vf.HarnessConfig):
    """rag-gym's in-process chat loop (no shell, no install)."""


class RagGymHarness(vf.Harness[RagGymHarnessConfig]):
    """A chat loop against the run's interception endpoint: one completion per segment
    for the text interaction; for ``tools``, completions offering the rollout's MCP tools
    (listed and called with verifiers' MCP client) until the model stops calling tools or
    a ``@stop`` refuses the next turn (the episode ended, or ``max_turns``). A call whose
    arguments are not a JSON object, or names no served tool, is answered here
    (:data:`NOT_AN_OBJECT`, ``UNKNOWN_TOOL``) and counted in the ``unsent_tool_calls``
    metric; the tool server answers every other call."""

    APPENDS_SYSTEM_PROMPT = True
    SUPPORTS_MCP = True
    SUPPORTS_RESUME = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(
        self,
        ctx,
        trace,
        runtime,
        endpoint,
        secret,
        mcp_urls,
        data,
        tool_interception_url=None,
    ):
        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        elif prompt:
            messages.extend(m if isinstance(m, dict) else message_to_wire(m) for m in prompt)
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            if getattr(data, "interaction", "text") != "tools":
                await client.chat.completions.create(model=ctx.model, messages=messages)
            else:
                await _tool_loop(
                    client, ctx.model, messages, mcp_urls, trace, self.config.tool_timeout
                )
        finally:
            await client.close()
        return ProgramResult(exit_code=0, stdout="", stderr="")

    @vf.metric
    async def unsent_tool_calls(self, trace) -> float:
        return float(trace.info.get("rag_gym_harness", {}).get("unsent_tool_calls", 0))


def _no_steps(data: Any) -> dict[str, Any]:
    """The outcome of a tools episode in which the model called no tool."""
    return outcome(
        {"question_id": data.question_id},
        0.0,
        {},
        searches=0,
        format_errors=0,
        steps=0,
        done=False,
        calls=[],
    )


def _text_env(data: Any):
    return make_with_preset(
        data.env_id, data.reward_preset or "none", text_actions=data.tags, **data.env_kwargs
    )


async def _tool_loop(
    client: Any, model: str, messages: list, mcp_urls: dict[str, str], trace: Any, timeout: float
) -> None:
    """Complete, offering the MCP servers' tools, and answer each tool call through verifiers'
    MCP client, until the model calls no tool or a ``@stop`` refuses the turn."""
    servers_config = {name: {"url": url, "timeout": timeout} for name, url in mcp_urls.items()}
    counts = trace.info.setdefault("rag_gym_harness", {"unsent_tool_calls": 0})
    async with contextlib.AsyncExitStack() as stack:
        tools, dispatch, servers = await connect_mcp({"mcpServers": servers_config}, stack)
        while True:
            try:
                response = await client.chat.completions.create(
                    model=model, messages=messages, tools=tools
                )
            except APIStatusError:
                if trace.stop_condition is not None:  # a @stop refused the turn: done
                    return
                raise
            message = response.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return
            for call in message.tool_calls:
                name = call.function.name
                try:
                    arguments = json.loads(call.function.arguments or "{}")
                    if not isinstance(arguments, dict):
                        raise ValueError(f"got {type(arguments).__name__}")
                except ValueError as exc:  # json.JSONDecodeError is a ValueError
                    content = NOT_AN_OBJECT.format(name=name, detail=exc)
                    counts["unsent_tool_calls"] += 1
                else:
                    if name in dispatch:
                        content = await call_mcp(servers, dispatch, name, arguments)
                    else:
                        content = UNKNOWN_TOOL.format(name=name, tools=", ".join(sorted(dispatch)))
                        counts["unsent_tool_calls"] += 1
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "name": name, "content": content}
                )
