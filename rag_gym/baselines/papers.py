"""The five papers' methods as prompted agents (trainable with the training recipes).

Each prompt is written in our own words after the paper's; each parses the paper's output
format with :mod:`rag_gym.envs.tags` and falls back to a sensible action on unparsable output.
The three search-env agents act through :class:`~rag_gym.wrappers.TextActions` (their
``env_kind`` is ``"text"``, with the paper's tag preset): they write tags, and read retrieved
passages as ``<information>Doc 1(Title: …) …</information>``, the parser and renderer a policy
trained in the env has, so an agent evaluated here and a policy trained there see the same text.

* ``evo_rag`` — EVO-RAG's query-rewriting agent (EVO-RAG §3.1): each step it sees the
  question, its previous sub-queries and the evidence in context, and picks one of four actions:
  ``<search>new sub-query</search>``, ``<backtrack/>``, ``<answer>…</answer>``, ``<refuse/>``.
* ``eval_rar`` — Eval-RAR's search-then-evaluate agent (Eval-RAR §4, appendix prompt):
  ``<think>``, ``<search>``, and after every search an ``<evaluate>`` block judging what the
  evidence establishes, before the next search or the ``<answer>``.
* ``lwts`` — Learning When to Search (LWTS appendix prompt): think first, answer from internal
  knowledge (``<reflect>`` then ``<answer>``) when it can, search with a short keyword query
  only when it cannot.
* ``r2ag`` — R²AG's retrieval steering on the tree env (R²AG §2, appendix C prompt):
  ``<think>``, base queries (``<base-Q>``), predicted queries (``<predicted-Q>``), or
  ``<base-Q>stop retrieval</base-Q>``; Top-Survivor at inference keeps the first t = 4 base and
  2 predicted queries it ranks, each retrieving its top-1 document.
* ``arena`` — ARENA's structured reader on the reader env (ARENA §3.1, Table 1):
  ``<relevance>[i, j]</relevance><analysis>…</analysis><answer>…</answer>``.

References:

* EVO-RAG: Ji et al., "Curriculum-Guided Reinforcement Learning for Efficient Multi-Hop
  Retrieval-Augmented Generation", arXiv:2505.17391.
* Eval-RAR: Yu et al., "Eval-RAR: Evaluation-Driven Retrieval-Augmented Reasoning via
  Reinforcement Learning", Findings of ACL 2026 (no arXiv id).
* LWTS: "Learning When to Search: Multi-Stage Reward Design for Efficient Agentic RAG with
  Reasoning Language Models" (anonymous ACL submission, no arXiv id).
* R²AG: "R²AG: Learning to Reason, Retrieve, and Self-Evolve through a Multi-Branch Retrieval
  Tree" (anonymous submission under review, no arXiv id).
* ARENA: Ren et al., "Effective and Transparent RAG: Adaptive-Reward Reinforcement Learning for
  Decision Traceability", arXiv:2505.13258.
"""

from __future__ import annotations

from typing import Any

from rag_gym.agents.llm_agent import (
    LLMAgent,
    TextAction,
    answer,
    first_line,
    note,
    search,
    user_message,
)
from rag_gym.envs.search import ActionType
from rag_gym.envs.tags import parse


def _turn(*parts: tuple[str, str]) -> TextAction:
    """The text of one turn: ``<name>content</name>`` per part (``<name/>`` for an empty
    backtrack or refuse); angle brackets inside a content become parentheses, so the text
    parses back into exactly these parts."""
    out = []
    for name, content in parts:
        if name in ("backtrack", "refuse"):
            out.append(f"<{name}/>")
        else:
            safe = content.replace("<", "(").replace(">", ")")
            out.append(f"<{name}>{safe}</{name}>")
    return TextAction("".join(out))


def _observed(state: dict[str, Any], obs: str) -> str:
    """What the env showed after the agent's last turn (``""`` at the first step, whose
    observation is TextActions' instructions, which the paper's own prompt replaces)."""
    return obs.strip() if state.get("steps", 0) and isinstance(obs, str) else ""


def _close(text: str, names: tuple[str, ...]) -> str:
    """Close an action tag the stop sequence cut off (generation stops at ``</search>``)."""
    for name in names:
        if f"<{name}>" in text and f"</{name}>" not in text:
            text += f"</{name}>"
    return text


def _tags(text: str, names: set[str], self_closing: set[str] = frozenset()):
    return parse(text, names=frozenset(names), self_closing=frozenset(self_closing)).tags


class EvoRagAgent(LLMAgent):
    name = "evo_rag"
    env_kind = "text"
    tags = "evo_rag"
    prompt_version = "v2"
    max_tokens = 64
    max_searches = 8

    def start(self, obs, info):
        return {"question": info["question"], "steps": 0, "queries": [], "evidence": []}

    def decide(self, state, obs, info):
        shown = _observed(state, obs)
        actions = info.get("actions") or []
        if actions and actions[-1] == "SEARCH" and not info.get("invalid_action"):
            state["evidence"].append(shown)  # this search's <information> block
        elif actions and actions[-1] == "BACKTRACK" and not info.get("invalid_action"):
            state["evidence"] = state["evidence"][:-1]  # the env dropped that search
        if info.get("query"):
            state["queries"].append(info["query"])
        if info.get("num_searches", 0) == 0:
            return _turn(("search", search(state["question"])["text"]))
        context = "\n".join(state["evidence"]) or "(none)"
        return user_message(
            "You answer a multi-hop question by rewriting it into sub-queries for a search engine. Choose ONE "
            "action: <search>a new sub-query</search> to find missing evidence, <backtrack/> to drop your last "
            "search if it led nowhere, <answer>short answer</answer> when the evidence answers the question, or "
            "<refuse/> when the collection cannot answer it.\n\n"
            f"Question: {state['question']}\nPrevious sub-queries: {'; '.join(state['queries'])}\n"
            f"Evidence:\n{context}\n\nAction:"
        )

    def parse(self, state, text, obs, info):
        for tag in _tags(
            text, {"search", "answer", "backtrack", "refuse"}, {"backtrack", "refuse"}
        ):
            if (
                tag.name == "search"
                and tag.content
                and info.get("num_searches", 0) < self.max_searches
            ):
                return _turn(("search", search(tag.content)["text"]))
            if tag.name == "answer" and tag.content:
                return _turn(("answer", answer(tag.content)["text"]))
            if tag.name == "backtrack" and info.get("action_mask", [1] * 5)[ActionType.BACKTRACK]:
                return _turn(("backtrack", ""))
            if tag.name == "refuse":
                return _turn(("refuse", ""))
        state["bad_reply"] = True
        return _turn(("answer", answer(first_line(text))["text"]))


class _TrajectoryAgent(LLMAgent):
    """A search-env agent whose prompt is its paper's instruction (:attr:`instruction`), the
    question, and the whole trajectory so far: each reply it wrote and each observation the env
    showed after it."""

    env_kind = "text"
    prompt_version = "v2"
    max_tokens = 128
    stop = ("</search>", "</answer>")
    instruction = ""

    def start(self, obs, info):
        return {"question": info["question"], "steps": 0, "trajectory": ""}

    def decide(self, state, obs, info):
        shown = _observed(state, obs)
        if shown:
            state["trajectory"] += shown + "\n"
        return user_message(
            f"{self.instruction}\nQuestion: {state['question']}\n{state['trajectory']}"
        )

    def _reply(self, state, text) -> str:
        """``text`` with its cut-off action tag closed, added to the trajectory."""
        text = _close(text, ("search", "answer"))
        state["trajectory"] += text + "\n"
        return text


class EvalRarAgent(_TrajectoryAgent):
    name = "eval_rar"
    tags = "eval_rar"
    max_searches = 5
    instruction = (
        "Answer the question with searches. Reason inside <think>...</think>. To search, write "
        "<search>query</search>; results come back inside <information>...</information>. After each search, "
        "write <evaluate>...</evaluate>: what the documents establish and what is still missing. When you can "
        "answer, write <answer>short answer</answer>."
    )

    def parse(self, state, text, obs, info):
        text = self._reply(state, text)
        parts: list[tuple[str, str]] = []
        for tag in _tags(text, {"evaluate", "search", "answer"}):
            if tag.name == "evaluate" and tag.content:
                parts.append(("evaluate", note(tag.content)["text"]))
            elif (
                tag.name == "search"
                and tag.content
                and info.get("num_searches", 0) < self.max_searches
            ):
                parts.append(("search", search(tag.content)["text"]))
                break
            elif tag.name in ("search", "answer"):
                parts.append(("answer", answer(tag.content or first_line(text))["text"]))
                break
        if not parts or parts[-1][0] == "evaluate":
            state["bad_reply"] = True
            parts.append(("answer", answer(first_line(text))["text"]))
        return _turn(*parts)  # TextActions steps the evaluations, then the search or answer


class LWTSAgent(_TrajectoryAgent):
    name = "lwts"
    tags = "when_to_search"
    max_searches = 3
    instruction = (
        "Begin with <think>...</think>, relying on what you know. If you know the answer, summarise in "
        "<reflect>...</reflect> and answer in <answer>...</answer>. Only if you do not know, search with a "
        "short keyword query in <search>...</search>; then judge the results in <reflect>...</reflect> and "
        "answer, or search again."
    )

    def parse(self, state, text, obs, info):
        text = self._reply(state, text)
        for tag in _tags(text, {"search", "answer"}):
            if (
                tag.name == "search"
                and tag.content
                and info.get("num_searches", 0) < self.max_searches
            ):
                return _turn(("search", search(tag.content)["text"]))
            if tag.content:
                return _turn(("answer", answer(tag.content)["text"]))
        state["bad_reply"] = True
        return _turn(("answer", answer(first_line(text))["text"]))


class R2AGAgent(LLMAgent):
    name = "r2ag"
    env_kind = "tree"
    max_tokens = 160
    top_t_base, top_t_predicted = 4, 2

    def decide(self, state, obs, info):
        return user_message(obs)  # the tree env's observation is R²AG's prompt

    def parse(self, state, text, obs, info):
        tags = _tags(text, {"think", "base-q", "predicted-q"})
        think = next((t.content for t in tags if t.name == "think"), "")
        base = [t.content for t in tags if t.name == "base-q" and t.content][: self.top_t_base]
        predicted = [t.content for t in tags if t.name == "predicted-q" and t.content][
            : self.top_t_predicted
        ]
        stop = any(b.strip().lower().startswith("stop retrieval") for b in base)
        if not base and not stop:
            state["bad_reply"] = True
            base = [first_line(text) or info["question"]] if info.get("step", 0) == 0 else []
            stop = not base
        from rag_gym.envs.tree import TreeSearchEnv

        return TreeSearchEnv.format_action(
            think or "-",
            base=[b for b in base if "stop retrieval" not in b.lower()],
            predicted=predicted,
            stop=stop,
        )


class ArenaAgent(LLMAgent):
    name = "arena"
    env_kind = "reader"
    max_tokens = 160

    def decide(self, state, obs, info):
        return user_message(obs)  # the reader env's observation is ARENA's prompt

    def parse(self, state, text, obs, info):
        if "<answer>" not in text:  # a reply with no structure still answers
            state["bad_reply"] = True
            text = f"{text}\n<answer>{first_line(text)}</answer>"
        return text
