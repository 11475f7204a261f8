"""rag-gym envs for TRL's ``GRPOTrainer(environment_factory=...)`` (TRL 1.16 tested).

TRL's contract, as its ``grpo_trainer.py`` reads it: the factory is called with no arguments and
its instances are pooled and reused, so :meth:`RagGymToolEnv.reset` clears every bit of episode
state; ``reset(**row)`` receives the whole dataset row and returns the text glued onto the last
user message; every public method but ``reset`` and ``get_reward`` is a tool (listed in
alphabetical order), described by its type hints and its Google-style docstring; a tool that
raises answers the model with ``{"error": ...}``. Tool results are env-written tokens, which
TRL keeps out of the loss (``tool_mask`` 0).

* :func:`make_env_class` builds the factory: a :class:`RagGymToolEnv` subclass bound to an env
  id, a reward preset and env kwargs. Its tools are ``answer(answer)``, ``backtrack()``,
  ``refuse()``, ``search(query)``, and ``evaluate(note)`` where the preset scores notes
  (``eval_rar``). A tool call is one env step; ``search`` returns the passages as
  :func:`~rag_gym.wrappers.text_actions.render_passages` writes them (what the text-tag policy
  reads inside ``<information>``).
* :func:`episode_return` and :func:`reward_term` are reward functions that read the preset's
  episode return and its terms from the env instances (TRL's ``environments`` keyword).
* :func:`build_dataset` turns a split into the rows ``reset`` receives.
* :func:`prepare_tokenizer` gives a ChatML model whose own template drops tool calls (SmolLM2)
  TRL's stored Qwen2.5 template (ChatML plus Hermes ``<tool_call>`` JSON).
* :func:`tool_call_demonstrations` writes warm-start transcripts from :class:`SynthHopExpert`,
  with the tools in TRL's order: an untrained SmolLM2 emits no parsable tool call, and a short
  SFT on these makes it call the tools (see ``examples/trl_environment_factory.py``).

>>> Env = make_env_class("rag_gym/SynthHop-v0", env_kwargs={"dataset_kwargs": {"n_passages": 2000, "n_questions": [40, 10, 10]}})
>>> env = Env()
>>> env.reset(question_id=env.question_ids[0]).startswith("Question: ")
True
>>> env.search("who wrote it").startswith("Doc 1(Title: ")
True
>>> env.answer("Nobody"), env.done, env.episode_return
('Your answer is submitted; the episode has ended.', True, 0.0)
>>> [tool.__name__ for tool in tools_of(env)]
['answer', 'backtrack', 'refuse', 'search']
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, ClassVar

from rag_gym.envs.search import ActionType
from rag_gym.integrations._common import check_env_id, check_json_dict
from rag_gym.wrappers.text_actions import text_actions_of

SYSTEM_PROMPT = (
    "Answer the question by searching a document collection with the tools. Call search with a "
    "short query to read passages; search again with what you learned until you have every fact "
    "you need. Then call answer with the answer as a short phrase, with no explanation."
)
SYSTEM_PROMPT_REFUSE = " If the collection cannot answer the question, call refuse."
SYSTEM_PROMPT_EVALUATE = (
    " After each search, call evaluate with a note on what the results establish and what is "
    "still missing."
)
ENDED = "Your answer is submitted; the episode has ended."


class RagGymToolEnv:
    """One rag-gym episode, played through tool calls (bind it with :func:`make_env_class`).

    Attributes read by reward functions: ``episode_return`` (the sum of the preset's rewards so
    far), ``step_rewards`` (the reward of each tool call's step, in order: per-turn credit for a
    trainer that gives it), ``return_terms`` (each reward term summed), ``done``, ``truncated``,
    ``info`` (the last step's Gymnasium ``info``), ``calls`` (the tool calls of the episode, in
    order).
    """

    env_id: ClassVar[str] = "rag_gym/SynthHop-v0"
    reward_preset: ClassVar[str | None] = None
    reward_kwargs: ClassVar[dict[str, Any]] = {}
    env_kwargs: ClassVar[dict[str, Any]] = {}

    def __init__(self) -> None:
        from rag_gym.wrappers.presets import make as make_with_preset

        self._env = make_with_preset(
            self.env_id,
            self.reward_preset or "none",
            dict(self.reward_kwargs) if self.reward_kwargs else None,
            **self.env_kwargs,
        )
        text = text_actions_of(self._env)
        self._tags = text.tags if text is not None else None
        self._clear()

    def _clear(self) -> None:
        self.episode_return = 0.0
        self.step_rewards: list[float] = []
        self.return_terms: dict[str, float] = {}
        self.done = False
        self.truncated = False
        self.info: dict[str, Any] = {}
        self.calls: list[tuple[str, str]] = []
        self.question = ""

    def reset(self, **row: Any) -> str:
        """Start the episode of a dataset row (``question_id`` or ``index``, optional ``seed``);
        return ``"Question: ..."`` for the user message."""
        self._clear()
        if "question_id" in row and row["question_id"] is not None:
            options = {"question_id": row["question_id"]}
        elif "index" in row and row["index"] is not None:
            options = {"question_index": row["index"]}
        else:
            options = None
        _, info = self._env.reset(seed=row.get("seed"), options=options)
        self.info = info
        self.question = info["question"]
        return f"Question: {self.question}"

    @property
    def question_ids(self) -> list[str]:
        """The ids of the questions this env poses (its split; a property, so not a tool)."""
        return [ex.id for ex in self._env.unwrapped.examples]

    def _step(self, kind: ActionType, text: str) -> str:
        if self.done:
            raise ValueError("the episode has ended: no more tool calls")
        if not isinstance(text, str):
            raise TypeError(f"expected a string argument, got {type(text).__name__}")
        self.calls.append((kind.name.lower(), text))
        if self._tags is not None:
            action: Any = _tag_text(self._tags, kind, text)
        else:
            action = {"type": kind, "text": text[: self._env.action_space["text"].max_length]}
        _, reward, terminated, truncated, info = self._env.step(action)
        self.episode_return += float(reward)
        self.step_rewards.append(float(reward))
        for key, value in info.get("reward_terms", {}).items():
            self.return_terms[key] = self.return_terms.get(key, 0.0) + float(value)
        self.done = bool(terminated or truncated)
        self.truncated = bool(truncated)
        self.info = info
        if info.get("invalid_action") or (self._tags is not None and not info.get("format_ok")):
            return info.get("message") or "That action was invalid."
        if truncated:
            return "The step limit is reached; the episode has ended."
        if terminated:
            return ENDED
        if kind == ActionType.SEARCH:
            from rag_gym.wrappers.text_actions import render_passages

            return render_passages(self._env.unwrapped.corpus, info)
        if kind == ActionType.BACKTRACK:
            return info.get("message") or "Your last search is dropped from the context."
        return "Noted."

    def search(self, query: str) -> str:
        """Search the document collection.

        Args:
            query: What to look for, as a short search query.

        Returns:
            The best passages, one per line, each with its title.
        """
        return self._step(ActionType.SEARCH, query)

    def answer(self, answer: str) -> str:
        """Give the final answer and end the episode.

        Args:
            answer: The answer, as a short phrase with no explanation.

        Returns:
            A confirmation that the episode has ended.
        """
        return self._step(ActionType.ANSWER, answer)

    def backtrack(self) -> str:
        """Drop your most recent search from the context, because it led nowhere.

        Returns:
            What was dropped.
        """
        return self._step(ActionType.BACKTRACK, "")

    def refuse(self) -> str:
        """Declare that the collection cannot answer the question, and end the episode.

        Returns:
            A confirmation that the episode has ended.
        """
        return self._step(ActionType.REFUSE, "")


class _EvaluateTool:
    def evaluate(self, note: str) -> str:
        """Note what the results so far establish and what is still missing.

        Args:
            note: Your assessment of the evidence gathered so far.

        Returns:
            An acknowledgement.
        """
        return self._step(ActionType.EVALUATE, note)  # type: ignore[attr-defined]


def evaluates(reward_preset: str) -> bool:
    """Whether ``reward_preset`` scores EVALUATE notes (the ``evaluate`` tool exists only with
    such a preset): its policy's tag set has an ``evaluate`` tag (rag-gym's: ``eval_rar``)."""
    from rag_gym.envs.tags import tag_set
    from rag_gym.wrappers.presets import default_tags

    return tag_set(default_tags(reward_preset)).evaluate is not None


@dataclass
class EnvFactoryConfig:
    """The settings of ``examples/trl_environment_factory.py``: a warm-start SFT on tool-call
    transcripts, then TRL's ``GRPOTrainer(environment_factory=make_env_class(...))``."""

    env_id: str = "rag_gym/SynthHop-v0"
    """the env to train in"""
    reward_preset: str = "evo_rag"
    """the reward stack whose episode return is the reward"""
    model: str = "embedded"
    """the base: embedded | tiny | a hub id | a full checkpoint directory"""
    init: str = ""
    """a LoRA adapter to start from and go on training (an SFT run of `rag-gym train sft`, or
    rag_gym/checkpoints/synthhop-search-r1); its base is --model"""
    exp_name: str = "trl_environment_factory"
    seed: int = 1
    warm_start: int = 64
    """expert tool-call transcripts for the warm-start SFT (0: none)"""
    sft_steps: int = 60
    sft_learning_rate: float = 5e-5
    """5e-5 suits full weights (--model embedded); a LoRA adapter (--init) needs about 1e-3"""
    max_steps: int = 2
    """GRPO steps"""
    num_generations: int = 2
    prompts_per_step: int = 2
    learning_rate: float = 1e-5
    max_completion_length: int = 1024
    """counts the tool results too (one search turn is about 130 tokens)"""
    max_tool_calling_iterations: int = 4
    temperature: float = 0.8
    n_passages: int = 10000
    """SynthHop world size (the default world; at least 4 passages a question)"""
    output_dir: str = "runs"
    track: bool = False


def make_env_class(
    env_id: str = "rag_gym/SynthHop-v0",
    reward_preset: str | None = None,
    reward_kwargs: dict[str, Any] | None = None,
    env_kwargs: dict[str, Any] | None = None,
) -> type[RagGymToolEnv]:
    """A no-argument :class:`RagGymToolEnv` class for ``environment_factory=`` (the env is made
    with ``rag_gym.make(env_id, reward_preset=..., **env_kwargs)``)."""
    from rag_gym.wrappers.presets import check_preset

    check_env_id(env_id)
    if reward_preset is not None:
        check_preset(reward_preset)
    attrs = {
        "env_id": env_id,
        "reward_preset": reward_preset,
        "reward_kwargs": check_json_dict("reward_kwargs", reward_kwargs),
        "env_kwargs": check_json_dict("env_kwargs", env_kwargs),
        "__module__": __name__,
    }
    bases: tuple[type, ...] = (RagGymToolEnv,)
    if reward_preset is not None and evaluates(reward_preset):
        bases = (RagGymToolEnv, _EvaluateTool)
    name = "RagGym" + "".join(c for c in env_id.split("/")[-1].title() if c.isalnum()) + "ToolEnv"
    return type(name, bases, attrs)


def tools_of(env: RagGymToolEnv) -> list[Any]:
    """The env's tools as TRL lists them: public methods but ``reset``, alphabetically."""
    return [
        getattr(env, name)
        for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
        if name not in ("reset", "get_reward") and not name.startswith("_")
    ]


def system_prompt(env_cls: type[RagGymToolEnv]) -> str:
    """The system message for ``env_cls``'s tools."""
    text = SYSTEM_PROMPT + SYSTEM_PROMPT_REFUSE
    if issubclass(env_cls, _EvaluateTool):
        text += SYSTEM_PROMPT_EVALUATE
    return text


def episode_return(environments: list[RagGymToolEnv] | None = None, **_: Any) -> list[float]:
    """TRL reward function: each rollout's return under the env's reward preset."""
    if environments is None:
        raise ValueError(
            "episode_return reads the env instances: pass environment_factory= to GRPOTrainer"
        )
    return [float(env.episode_return) for env in environments]


def reward_term(name: str):
    """TRL reward function of one reward term summed over the episode (give it weight 0 in
    ``GRPOConfig.reward_weights`` to log the term without training on it twice)."""

    def term(environments: list[RagGymToolEnv] | None = None, **_: Any) -> list[float]:
        if environments is None:
            raise ValueError("reward terms read the env instances: pass environment_factory=")
        return [float(env.return_terms.get(name, 0.0)) for env in environments]

    term.__name__ = f"rewards/{name}"
    return term


def build_dataset(
    env_cls: type[RagGymToolEnv], n: int | None = None, seed: int = 0, repeat: int = 1
):
    """A ``datasets.Dataset`` of ``{"prompt": [system, user ""], "question_id": ...}`` rows
    over the questions ``env_cls`` poses (its ``split``), shuffled with ``seed``; ``n`` keeps
    the first ``n``, ``repeat`` repeats the list (epochs). ``reset`` fills in the question."""
    import numpy as np

    try:
        from datasets import Dataset
    except ImportError as exc:
        raise ImportError("build_dataset needs datasets: pip install 'rag-gym[train]'") from exc
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"expected n to be an int >= 1 or None, got {n!r}")
    ids = env_cls().question_ids
    order = np.random.default_rng(seed).permutation(len(ids))
    chosen = [ids[i] for i in order[: n or len(ids)]]
    prompt = [
        {"role": "system", "content": system_prompt(env_cls)},
        {"role": "user", "content": ""},
    ]
    return Dataset.from_list([{"prompt": prompt, "question_id": q} for q in chosen] * repeat)


def prepare_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer`` with a chat template that renders tool calls and tool messages.

    A template that already does is kept. A ChatML model's (``<|im_start|>``/``<|im_end|>``,
    e.g. SmolLM2, whose own template drops ``tool_calls``) gets TRL's stored Qwen2.5 template;
    TRL then attaches its response schema and parses ``<tool_call>`` JSON. Other models need a
    tool-capable template of their own: ``ValueError``.
    """
    try:
        from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling
    except ImportError as exc:
        raise ImportError("prepare_tokenizer needs trl: pip install 'rag-gym[train]'") from exc
    if supports_tool_calling(tokenizer):
        return tokenizer
    vocab = tokenizer.get_vocab()
    if "<|im_start|>" not in vocab or "<|im_end|>" not in vocab:
        raise ValueError(
            "expected a ChatML tokenizer (<|im_start|>, <|im_end|>) or one whose chat template "
            "renders tool calls; set tokenizer.chat_template to a tool-capable template for this model"
        )
    tokenizer.chat_template = qwen2_5_chat_template
    if not supports_tool_calling(tokenizer):  # pragma: no cover - TRL's own template
        raise ValueError("TRL's qwen2_5 template does not render tool calls with this tokenizer")
    return tokenizer


def tool_call_demonstrations(
    env_cls: type[RagGymToolEnv], tokenizer: Any, n: int, seed: int = 0
) -> list[dict[str, str]]:
    """``n`` warm-start transcripts ``{"prompt", "completion"}`` (text, rendered by
    ``tokenizer``'s chat template with the tools in TRL's order) of :class:`SynthHopExpert`
    playing ``env_cls``'s questions through the tools: the expert decides each call, and the
    tool results are what ``env_cls`` returns. SynthHop ids only (the expert reads the world's
    gold decomposition)."""
    from rag_gym.agents.expert import SynthHopExpert
    from rag_gym.envs.tags import parse
    from rag_gym.wrappers.presets import make as make_with_preset

    if not env_cls.env_id.startswith("rag_gym/SynthHop"):
        raise ValueError(
            f"expected a SynthHop id (the expert needs its world), got {env_cls.env_id!r}"
        )
    tool_env = env_cls()
    twin = make_with_preset(env_cls.env_id, text_actions="all", **env_cls.env_kwargs)
    expert = SynthHopExpert(twin.tags, seed=seed)
    kinds = twin.tags.actions()
    tools = tools_of(tool_env)
    names = {t.__name__ for t in tools}
    rows = []
    for index in range(n):
        demo = expert.play(twin, index=index % len(tool_env.question_ids))
        user = tool_env.reset(question_id=demo.info["question_id"])
        prompt = [
            {"role": "system", "content": system_prompt(env_cls)},
            {"role": "user", "content": user},
        ]
        completion: list[dict[str, Any]] = []
        for turn in demo.turns:
            parsed = parse(
                turn.action, names=twin.tags.all_names(), self_closing=twin.tags.self_closing()
            )
            thoughts = [t.content for t in parsed.tags if t.name in twin.tags.reasoning]
            for tag in (t for t in parsed.tags if t.name in kinds):
                kind = kinds[tag.name]
                name = kind.name.lower()
                if name not in names:
                    continue
                arg = {"search": "query", "answer": "answer", "evaluate": "note"}.get(name)
                result = getattr(tool_env, name)(*([tag.content] if arg else []))
                completion.append(
                    {
                        "role": "assistant",
                        "content": " ".join(thoughts),
                        "tool_calls": [
                            {
                                "type": "function",
                                "function": {
                                    "name": name,
                                    "arguments": {arg: tag.content} if arg else {},
                                },
                            }
                        ],
                    }
                )
                completion.append({"role": "tool", "name": name, "content": result})
                thoughts = []
                if kind != ActionType.EVALUATE:
                    break
            if tool_env.done:
                break
        completion.append({"role": "assistant", "content": "Done."})
        head = tokenizer.apply_chat_template(
            prompt, tools=tools, add_generation_prompt=True, tokenize=False
        )
        full = tokenizer.apply_chat_template(prompt + completion, tools=tools, tokenize=False)
        assert full.startswith(head), "the chat template re-renders the prompt"
        rows.append({"prompt": head, "completion": full[len(head) :]})
    return rows


def _tag_text(tags: Any, kind: ActionType, text: str) -> str:
    name = getattr(tags, kind.name.lower())  # the TagSet field of each action type
    if not name:
        raise ValueError(f"this env's tag preset {tags.name!r} has no {kind.name.lower()} action")
    if kind in (ActionType.BACKTRACK, ActionType.REFUSE):
        return f"<{name}/>"
    return f"<{name}>{text.replace('<', ' ')}</{name}>"
