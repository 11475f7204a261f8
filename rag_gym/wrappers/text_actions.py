"""``TextActions``: let an LLM drive a :class:`~rag_gym.envs.SearchEnv` by writing text."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from rag_gym.envs.base import clip_text, read_text_action
from rag_gym.envs.search import ActionType
from rag_gym.envs.spaces import UnicodeText, sanitize
from rag_gym.envs.tags import TagSet, parse, tag_set
from rag_gym.wrappers.base import find_wrapper

#: How an observation follows the model's reply in a policy's token stream (Search-R1's layout:
#: the ``<information>`` block on its own lines). The trainers' rollouts, the SFT transcripts and
#: the ``search_r1`` agent all insert observations with it.
OBS_TEMPLATE = "\n{obs}\n"

INVALID_FORMAT = (
    "The previous action was invalid: no complete action tag was found. To search, put the query "
    "between {search}. To give the final answer, put it between {answer}.{more} Try again."
)

#: ``info["action_type"]`` of a step whose text held no complete action tag
UNPARSABLE = "UNPARSABLE"


def _pair(tag: str | None) -> str:
    return f"<{tag}> and </{tag}>" if tag else ""


def instructions(tags: TagSet) -> str:
    """The system prompt for a tag set (our own words, after the papers' prompts)."""
    lines = ["Answer the question by searching a document collection."]
    if tags.reasoning:
        names = " or ".join(f"<{r}>...</{r}>" for r in tags.reasoning)
        lines.append(f"Reason step by step inside {names} before you act.")
    lines.append(
        f"To search, write <{tags.search}>query</{tags.search}>; the results come back inside "
        f"<{tags.information}>...</{tags.information}>."
    )
    if tags.evaluate:
        lines.append(
            f"After each search, judge what the results establish and what is still missing inside "
            f"<{tags.evaluate}>...</{tags.evaluate}>."
        )
    if tags.backtrack:
        lines.append(
            f"To drop your last search from the context because it led nowhere, write <{tags.backtrack}/>."
        )
    if tags.refuse:
        lines.append(f"If the collection cannot answer the question, write <{tags.refuse}/>.")
    lines.append(
        f"When you know the answer, write it inside <{tags.answer}>...</{tags.answer}> as a short phrase, "
        "with no explanation."
    )
    return " ".join(lines)


PASSAGE_STYLES = ("search_r1", "numbered")


def format_passages(passages: Sequence[Any], style: str = "search_r1", start: int = 1) -> str:
    """Retrieved passages as a model reads them, a line each: the one passage renderer of
    rag-gym's agents and trainers.

    ``style="search_r1"``: ``Doc i(Title: …) text``, Search-R1's and Eval-RAR's rendering, which
    every tag-speaking agent and every trained policy reads (:func:`render_passages`).
    ``style="numbered"``: ``[i] Title: text``, the prompt baselines' rendering
    (:func:`rag_gym.agents.llm_agent.passages_text`). A passage is a
    :class:`~rag_gym.data.Passage` or a ``{"title", "text"}`` dict.
    """
    if style not in PASSAGE_STYLES:
        raise ValueError(f"expected style in {PASSAGE_STYLES}, got {style!r}")
    lines = []
    for i, p in enumerate(passages, start):
        title, text = (p["title"], p["text"]) if isinstance(p, dict) else (p.title, p.text)
        if style == "search_r1":
            lines.append(f"Doc {i}(Title: {title}) {text}")
        else:
            lines.append(f"[{i}] {title}: {text}")
    return "\n".join(lines)


def render_passages(corpus: Any, info: dict[str, Any]) -> str:
    """A SEARCH step's passages as the policy reads them, ``Doc i(Title: …) text`` a line each
    (:func:`format_passages`), or the env's message when none came back. The body of the
    ``<information>`` block, and what a tool-calling policy's ``search`` tool returns."""
    ids = info["retrieved_ids"]
    if not ids:
        return info["message"] or "No results."
    return format_passages([corpus[pid] for pid in ids])


def start_messages(tags: TagSet, question: str) -> list[dict[str, str]]:
    """The chat an episode starts from: the tag set's :func:`instructions` as the system
    message, then ``Question: …`` (what :meth:`TextActions.messages` holds after ``reset``)."""
    return [
        {"role": "system", "content": instructions(tags)},
        {"role": "user", "content": f"Question: {question}"},
    ]


class TextActions(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Text in, text out: the action is the model's raw output, the observation what it reads next.

    ## Action

    A string (``UnicodeText(max_action_chars)``). Characters outside the printable charset are
    replaced (:func:`~rag_gym.envs.spaces.sanitize`) and text beyond ``max_action_chars`` is cut
    (``info["action_clipped"]``): an LLM's output never crashes the episode. A non-string
    raises ``TypeError``.

    The text is parsed with the preset's tags (:mod:`rag_gym.envs.tags`): each
    ``<evaluate>`` before the first other action tag becomes an EVALUATE step, then the first
    ``<search>``, ``<answer>``, ``<backtrack/>`` or ``<refuse/>`` becomes that step; later action
    tags are ignored (``info["ignored_tags"]``). Reasoning tags (``<think>``, ``<reflect>``) are
    allowed anywhere and do nothing. So one turn of Eval-RAR's format,
    ``<evaluate>…</evaluate><think>…</think><search>…</search>``, is two env steps.

    Text with no complete action tag gets the papers' treatment: the observation says the
    previous action was invalid and how to write one, ``info["format_ok"]`` is ``False``, and
    the env spends a step on it (truncation still comes). The step is reported as what it is:
    ``info["action_type"]`` is ``"UNPARSABLE"``, ``info["invalid_action"]`` is ``True`` and
    ``info["message"]`` names the tags the preset accepts (so traces, reports and the
    ``unparsable`` health flag show an unparsable reply, whatever the preset).

    ## Observation

    ``UnicodeText(max_obs_chars)``. After ``reset``: the instructions and the question. After a
    step: what the model reads next — the retrieved passages as
    ``<information>Doc 1(Title: …) …</information>`` (the Search-R1 / Eval-RAR rendering), the
    env's message about an invalid or backtracked action, the format message, or ``""`` once the
    episode has ended.

    ## Information

    The wrapped env's ``info`` (of its last step), plus ``format_ok``, ``tags`` (every tag name
    in order of appearance), ``tag_counts``, ``unclosed_tags``, ``actions`` (the action names
    executed this turn), ``queries`` (the queries searched this turn), ``ignored_tags``,
    ``action_clipped`` and ``text`` (the sanitised action text); ``reward_terms`` are summed
    over the turn's steps.

    :meth:`messages` renders the episode as chat messages (system prompt, then user and
    assistant turns) for a chat template.

    Args:
        env: a SearchEnv (through ``gym.make`` or not).
        tags: a tag preset name (``all``, ``search_r1``, ``eval_rar``, ``evo_rag``,
            ``when_to_search``) or a :class:`~rag_gym.envs.tags.TagSet`.
        max_action_chars: longest action text kept (65,536).
        max_obs_chars: longest observation (16,384).

    >>> import gymnasium as gym, rag_gym
    >>> env = TextActions(gym.make("rag_gym/SynthHop-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]}))
    >>> obs, info = env.reset(seed=0)
    >>> obs, r, term, trunc, info = env.step("<think>find it</think><search>" + info["question"] + "</search>")
    >>> obs.startswith("<information>Doc 1(Title: "), info["format_ok"], info["actions"]
    (True, True, ['SEARCH'])
    >>> obs, r, term, trunc, info = env.step("I am not sure.")
    >>> info["format_ok"], obs.startswith("The previous action was invalid"), info["action_type"]
    (False, True, 'UNPARSABLE')
    """

    def __init__(
        self,
        env: gym.Env,
        tags: str | TagSet = "all",
        max_action_chars: int = 65_536,
        max_obs_chars: int = 16_384,
    ) -> None:
        gym.utils.RecordConstructorArgs.__init__(
            self,
            tags=tags if isinstance(tags, str) else tags.name,
            max_action_chars=max_action_chars,
            max_obs_chars=max_obs_chars,
        )
        gym.Wrapper.__init__(self, env)
        self.tags = tag_set(tags)
        self.max_action_chars = max_action_chars
        self.max_obs_chars = max_obs_chars
        self.action_space = UnicodeText(max_length=max_action_chars)
        self.observation_space = UnicodeText(max_length=max_obs_chars)
        self.system_prompt = instructions(self.tags)
        self._actions = self.tags.actions()
        self._inner_text_limit = env.action_space["text"].max_length
        self._messages: list[dict[str, str]] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        _, info = self.env.reset(seed=seed, options=options)
        self._messages = start_messages(self.tags, info["question"])
        obs = self._clip(f"{self.system_prompt}\n\n{self._messages[1]['content']}")
        info = {
            **info,
            "format_ok": True,
            "tags": [],
            "tag_counts": {},
            "unclosed_tags": [],
            "actions": [],
            "ignored_tags": [],
            "action_clipped": False,
            "queries": [],
            "text": "",
        }
        return obs, info

    def messages(self, system: bool = True) -> list[dict[str, str]]:
        """The episode so far as chat messages; ``system=False`` folds the system prompt into
        the first user message (for chat templates without a system role)."""
        msgs = [dict(m) for m in self._messages]
        if not system and msgs and msgs[0]["role"] == "system":
            first = msgs.pop(0)
            msgs[0]["content"] = f"{first['content']}\n\n{msgs[0]['content']}"
        return msgs

    def step(self, action: str):
        text, clipped = read_text_action(action, self.max_action_chars)
        parsed = parse(text, names=self.tags.all_names(), self_closing=self.tags.self_closing())
        action_tags = [t for t in parsed.tags if t.name in self._actions]
        plan: list[tuple[ActionType, str]] = []
        ignored: list[str] = []
        for tag in action_tags:
            kind = self._actions[tag.name]
            if plan and plan[-1][0] != ActionType.EVALUATE:
                ignored.append(tag.name)
                continue
            plan.append((kind, tag.content))
        format_ok = bool(plan)
        if not plan:
            plan = [
                (ActionType.EVALUATE, "")
            ]  # an invalid step: the env counts it and may truncate

        total, terms_sum = 0.0, {}
        segments: list[str] = []
        executed: list[str] = []
        queries: list[str] = []
        info: dict[str, Any] = {}
        terminated = truncated = False
        for kind, content in plan:
            _, reward, terminated, truncated, info = self.env.step(
                {"type": kind, "text": content[: self._inner_text_limit]}
            )
            total += reward
            for key, value in info.get("reward_terms", {}).items():
                terms_sum[key] = terms_sum.get(key, 0.0) + value
            executed.append(kind.name)
            if kind == ActionType.SEARCH and not info.get("invalid_action"):
                queries.append(info["query"])
            if format_ok:
                segments.append(self._segment(kind, info))
            if terminated or truncated:
                break
        if not format_ok:
            more = []
            for name, tag in (
                ("evaluate", self.tags.evaluate),
                ("backtrack", self.tags.backtrack),
                ("refuse", self.tags.refuse),
            ):
                if tag:
                    more.append(
                        f" To {name}, write "
                        + (f"<{tag}>...</{tag}>." if name == "evaluate" else f"<{tag}/>.")
                    )
            segments = [
                INVALID_FORMAT.format(
                    search=_pair(self.tags.search),
                    answer=_pair(self.tags.answer),
                    more="".join(more),
                )
            ]
            # the env stepped an empty EVALUATE to count the step: reported as what it was
            info = {
                **info,
                "action_type": UNPARSABLE,
                "invalid_action": True,
                "message": self._unparsable_message(parsed.unclosed),
            }
        observation = "" if terminated else self._clip("\n".join(s for s in segments if s))
        counts: dict[str, int] = {}
        for name in parsed.names():
            counts[name] = counts.get(name, 0) + 1
        info = {
            **info,
            "reward_terms": terms_sum,
            "format_ok": format_ok,
            "tags": parsed.names(),
            "tag_counts": counts,
            "unclosed_tags": list(parsed.unclosed),
            "actions": executed if format_ok else [],
            "ignored_tags": ignored,
            "action_clipped": clipped,
            "queries": queries,
            "text": text,
        }
        self._messages.append({"role": "assistant", "content": text})
        if observation:
            self._messages.append({"role": "user", "content": observation})
        return observation, float(total), terminated, truncated, info

    def _unparsable_message(self, unclosed: Sequence[str]) -> str:
        """``info["message"]`` of a reply with no complete action tag."""
        accepted = ", ".join(
            f"<{tag}/>" if tag in self.tags.self_closing() else f"<{tag}>…</{tag}>"
            for tag in self._actions
        )
        where = f" (<{unclosed[0]}> is never closed)" if unclosed else ""
        return (
            f"Unparsable reply: no complete action tag{where}; the {self.tags.name!r} tags are "
            f"{accepted}."
        )

    def _segment(self, kind: ActionType, info: dict[str, Any]) -> str:
        if info.get("invalid_action") or kind == ActionType.BACKTRACK:
            return f"<{self.tags.information}>{info['message']}</{self.tags.information}>"
        if kind != ActionType.SEARCH:
            return ""
        body = render_passages(self.env.unwrapped.corpus, info)
        return f"<{self.tags.information}>{body}</{self.tags.information}>"

    def _clip(self, text: str) -> str:
        return clip_text(sanitize(text), self.max_obs_chars)


def text_actions_of(env: gym.Env) -> TextActions | None:
    """The :class:`TextActions` in ``env``'s wrapper chain (a preset that is text-in, such as
    ``when_to_search``, puts one there), or ``None``."""
    return find_wrapper(env, TextActions)
