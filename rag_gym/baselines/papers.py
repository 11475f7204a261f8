"""The five papers' methods as prompted agents (trainable with the training recipes).

Each prompt is written in our own words after the paper's; each parses the paper's output
format with :mod:`rag_gym.envs.tags` and falls back to a sensible action on unparsable output.

* ``evo_rag`` — EVO-RAG's query-rewriting agent (``000-evo-rag.txt`` §3.1): each step it sees
  the question, its previous sub-queries and the evidence in context, and picks one of four
  actions: ``<search>new sub-query</search>``, ``<backtrack/>``, ``<answer>…</answer>``,
  ``<refuse/>``.
* ``eval_rar`` — Eval-RAR's search-then-evaluate agent (``003-eval-rar.txt`` §4, appendix
  prompt): ``<think>``, ``<search>``, and after every search an ``<evaluate>`` block judging what
  the evidence establishes, before the next search or the ``<answer>``.
* ``lwts`` — Learning When to Search (``004`` appendix prompt): think first, answer from
  internal knowledge (``<reflect>`` then ``<answer>``) when it can, search with a short keyword
  query only when it cannot.
* ``r2ag`` — R²AG's retrieval steering on the tree env (``002-r2ag.md`` §2, appendix C prompt):
  ``<think>``, base queries (``<base-Q>``), predicted queries (``<predicted-Q>``), or
  ``<base-Q>stop retrieval</base-Q>``; Top-Survivor at inference keeps the first t = 4 base and
  2 predicted queries it ranks, each retrieving its top-1 document.
* ``arena`` — ARENA's structured reader on the reader env (``001-arena.txt`` §3.1, Table 1):
  ``<relevance>[i, j]</relevance><analysis>…</analysis><answer>…</answer>``.
"""

from __future__ import annotations

from typing import Any

from rag_gym.agents.llm_agent import LLMAgent, answer, first_line, note, search
from rag_gym.envs.search import ActionType
from rag_gym.envs.tags import parse


def _information(passages) -> str:
    """Retrieved passages the way Search-R1, Eval-RAR and LWTS show them."""
    docs = " ".join(f"Doc {i}(Title: {p['title']}) {p['text']}" for i, p in enumerate(passages, 1))
    return f"<information>{docs}</information>\n"


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
    max_tokens = 64
    max_searches = 8

    def start(self, obs, info):
        return {"question": info["question"], "steps": 0, "queries": []}

    def decide(self, state, obs, info):
        if info.get("query"):
            state["queries"].append(info["query"])
        if info.get("num_searches", 0) == 0:
            return search(state["question"])
        context = obs.split("\n\n", 1)[1] if "\n\n" in obs else "(none)"
        return [
            {
                "role": "user",
                "content": (
                    "You answer a multi-hop question by rewriting it into sub-queries for a search engine. Choose ONE "
                    "action: <search>a new sub-query</search> to find missing evidence, <backtrack/> to drop your last "
                    "search if it led nowhere, <answer>short answer</answer> when the evidence answers the question, or "
                    "<refuse/> when the collection cannot answer it.\n\n"
                    f"Question: {state['question']}\nPrevious sub-queries: {'; '.join(state['queries'])}\n"
                    f"Evidence:\n{context}\n\nAction:"
                ),
            }
        ]

    def parse(self, state, text, obs, info):
        for tag in _tags(
            text, {"search", "answer", "backtrack", "refuse"}, {"backtrack", "refuse"}
        ):
            if (
                tag.name == "search"
                and tag.content
                and info.get("num_searches", 0) < self.max_searches
            ):
                return search(tag.content)
            if tag.name == "answer" and tag.content:
                return answer(tag.content)
            if tag.name == "backtrack" and info.get("action_mask", [1] * 5)[ActionType.BACKTRACK]:
                return {"type": ActionType.BACKTRACK, "text": ""}
            if tag.name == "refuse":
                return {"type": ActionType.REFUSE, "text": ""}
        state["bad_reply"] = True
        return answer(first_line(text))


class EvalRarAgent(LLMAgent):
    name = "eval_rar"
    max_tokens = 128
    stop = ("</search>", "</answer>")
    max_searches = 5

    def start(self, obs, info):
        return {"question": info["question"], "steps": 0, "trajectory": "", "queue": []}

    def decide(self, state, obs, info):
        if state["queue"]:
            return state["queue"].pop(0)
        if info.get("passages"):
            state["trajectory"] += _information(info["passages"])
        return [
            {
                "role": "user",
                "content": (
                    "Answer the question with searches. Reason inside <think>...</think>. To search, write "
                    "<search>query</search>; results come back inside <information>...</information>. After each search, "
                    "write <evaluate>...</evaluate>: what the documents establish and what is still missing. When you can "
                    f"answer, write <answer>short answer</answer>.\nQuestion: {state['question']}\n{state['trajectory']}"
                ),
            }
        ]

    def parse(self, state, text, obs, info):
        text = _close(text, ("search", "answer"))
        state["trajectory"] += text + "\n"
        actions: list[dict[str, Any]] = []
        for tag in _tags(text, {"evaluate", "search", "answer"}):
            if tag.name == "evaluate" and tag.content:
                actions.append(note(tag.content))
            elif (
                tag.name == "search"
                and tag.content
                and info.get("num_searches", 0) < self.max_searches
            ):
                actions.append(search(tag.content))
                break
            elif tag.name in ("search", "answer"):
                actions.append(answer(tag.content or first_line(text)))
                break
        if not actions or actions[-1]["type"] == ActionType.EVALUATE:
            state["bad_reply"] = True
            actions.append(answer(first_line(text)))
        state["queue"] = actions[1:]
        return actions[0]


class LWTSAgent(LLMAgent):
    name = "lwts"
    max_tokens = 128
    stop = ("</search>", "</answer>")
    max_searches = 3

    def start(self, obs, info):
        return {"question": info["question"], "steps": 0, "trajectory": ""}

    def decide(self, state, obs, info):
        if info.get("passages"):
            state["trajectory"] += _information(info["passages"])
        return [
            {
                "role": "user",
                "content": (
                    "Begin with <think>...</think>, relying on what you know. If you know the answer, summarise in "
                    "<reflect>...</reflect> and answer in <answer>...</answer>. Only if you do not know, search with a "
                    "short keyword query in <search>...</search>; then judge the results in <reflect>...</reflect> and "
                    f"answer, or search again.\nQuestion: {state['question']}\n{state['trajectory']}"
                ),
            }
        ]

    def parse(self, state, text, obs, info):
        text = _close(text, ("search", "answer"))
        state["trajectory"] += text + "\n"
        for tag in _tags(text, {"search", "answer"}):
            if (
                tag.name == "search"
                and tag.content
                and info.get("num_searches", 0) < self.max_searches
            ):
                return search(tag.content)
            if tag.content:
                return answer(tag.content)
        state["bad_reply"] = True
        return answer(first_line(text))


class R2AGAgent(LLMAgent):
    name = "r2ag"
    env_kind = "tree"
    max_tokens = 160
    top_t_base, top_t_predicted = 4, 2

    def decide(self, state, obs, info):
        return [{"role": "user", "content": obs}]  # the tree env's observation is R²AG's prompt

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
        return [{"role": "user", "content": obs}]  # the reader env's observation is ARENA's prompt

    def parse(self, state, text, obs, info):
        if "<answer>" not in text:  # a reply with no structure still answers
            state["bad_reply"] = True
            text = f"{text}\n<answer>{first_line(text)}</answer>"
        return text
