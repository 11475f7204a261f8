"""A scripted expert for SynthHop: the transcript a search policy should write, turn by turn.

EVO-RAG's Algorithm 1 starts "from supervised warm start" (EVO-RAG, arXiv:2505.17391, §3.7),
as R1-style search agents do. :class:`SynthHopExpert` writes those demonstrations for the
SynthHop worlds: it follows each question's gold decomposition (``meta["decomposition"]``,
``meta["relations"]``) and writes, in the env's tag format, what a good policy writes:

* a ``<think>`` that says what is needed next, then ``<search>`` with a query for it (the
  sub-question, a relation phrase, or keywords: the phrasing varies);
* after the passages come back, a ``<think>`` that states the fact it read and the document
  it read it from (``Doc 2 says ...``), then the next search, which names the entity it read;
* when a search misses the needed passage, a ``<think>`` that says so and a rephrased search;
* ``<answer>`` with the gold answer once every hop is read; for a comparison, the two values
  compared; on an unanswerable question (SynthHop-Hard), ``<refuse/>`` once the missing passage
  cannot be found, when the tag set has a refusal;
* with ``confirm_rate`` > 0, that share of the demonstrations searches once more after the
  last hop is read, to check it (a rephrased query for the same fact), then answers: a
  redundant search, the kind EVO-RAG's step cost exists to remove;

The expert reads only what the policy reads — the question, the decomposition's relations and
the retrieved passages' ids, which it checks against the gold ids — so every statement in a
transcript is backed by a passage in the same transcript. Phrasings are drawn from the expert's
own ``numpy`` generator, so a seed gives the same demonstrations.

>>> import rag_gym
>>> env = rag_gym.make("rag_gym/SynthHop-v0", text_actions="search_r1", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})
>>> demo = SynthHopExpert(env.tags, seed=0).play(env, index=0)
>>> demo.info["scores"]["em"], demo.turns[-1].action.endswith("</answer>")
(1.0, True)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from rag_gym.envs.tags import TagSet
from rag_gym.wrappers.text_actions import text_actions_of

#: relation → (fact sentence, keyword) — the fact is what the passage about X states.
_FACTS: dict[str, tuple[str, str]] = {
    "author": ("{X} was written by {A}", "author"),
    "publisher": ("{X} was published by {A}", "publisher"),
    "published_year": ("{X} was published in {A}", "published year"),
    "birthplace": ("{X} was born in {A}", "birthplace"),
    "employer": ("{X} works for {A}", "employer"),
    "mentor": ("the mentor of {X} was {A}", "mentor"),
    "birth_year": ("{X} was born in {A}", "birth year"),
    "occupation": ("{X} is a {A}", "occupation"),
    "headquarters": ("{X} is headquartered in {A}", "headquarters"),
    "founder": ("{X} was founded by {A}", "founder"),
    "founded_year": ("{X} was founded in {A}", "founded year"),
    "country": ("{X} is in {A}", "country"),
    "capital": ("the capital of {X} is {A}", "capital"),
    "currency": ("the currency of {X} is {A}", "currency"),
}
#: relation → what is needed, as a noun phrase about X.
_NEEDS: dict[str, str] = {
    "author": "who wrote {X}",
    "publisher": "who published {X}",
    "published_year": "when {X} was published",
    "birthplace": "where {X} was born",
    "employer": "who employs {X}",
    "mentor": "who the mentor of {X} was",
    "birth_year": "when {X} was born",
    "occupation": "the occupation of {X}",
    "headquarters": "where {X} is headquartered",
    "founder": "who founded {X}",
    "founded_year": "when {X} was founded",
    "country": "which country {X} is in",
    "capital": "the capital of {X}",
    "currency": "the currency of {X}",
}
_PLAN = (
    "I need to find {need}.",
    "First I need {need}.",
    "To answer, I must know {need}.",
    "Let me search for {need}.",
    "The question depends on {need}.",
)
_READ = (
    "Doc {r} says {fact}.",
    "According to Doc {r}, {fact}.",
    "From Doc {r}: {fact}.",
    "Doc {r} tells me {fact}.",
)
_NEXT = (
    "Now I need {need}.",
    "Next, I need {need}.",
    "Now I must find {need}.",
    "So next I look up {need}.",
)
_MISS = (
    "None of these documents is about {X}. Let me search differently.",
    "The results do not say {need}. I will rephrase the search.",
    "These documents do not mention {need}. Let me try another query.",
)
#: the confirming search (``confirm_rate``): its plan, then the reading of its results
_CONFIRM = (
    "Let me check {need} once more.",
    "Before answering, I search {need} again to be sure.",
    "To be sure, I look up {need} again.",
)
_CONFIRMED = ("That confirms it.", "Both searches agree.", "It is confirmed.")
_UNCONFIRMED = (
    "These documents do not repeat it, but the earlier document said {fact}.",
    "The new results do not mention it; what I read before stands: {fact}.",
)
_FINAL = ("So the answer is {A}.", "Therefore the answer is {A}.", "The answer is {A}.")
_REFUSE = (
    "I searched twice and the collection has no passage saying {need}. I cannot answer.",
    "No document tells {need}, so the question cannot be answered from this collection.",
)
_EARLIER = {
    "birth_year": "was born first",
    "founded_year": "was founded earlier",
    "published_year": "was published first",
}


@dataclass
class Turn:
    """One turn of a demonstration: the action text the policy writes and what the env returns."""

    action: str
    observation: str
    reward: float = 0.0


@dataclass
class Demonstration:
    """An expert episode: the question's index, the chat it starts from, its turns, and the last
    step's ``info`` (``scores``, ``retrieved_history``…)."""

    index: int
    messages: list[dict[str, str]]
    turns: list[Turn] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    gold_found: bool = True
    """Every gold passage of the question was retrieved by one of its searches."""

    @property
    def episode_return(self) -> float:
        return float(sum(t.reward for t in self.turns))


class TranscriptWriter:
    """What every expert shares: the env's tag set, a seeded generator for the phrasing, the
    searches per hop before it gives up, and the text pieces a turn is made of."""

    def __init__(self, tags: TagSet, seed: int = 0, max_attempts: int = 2) -> None:
        if tags.search is None or tags.answer is None:
            raise ValueError(f"expected a tag set with search and answer tags, got {tags.name!r}")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise ValueError(f"expected max_attempts >= 1, got {max_attempts!r}")
        self.tags = tags
        self.rng = np.random.default_rng(seed)
        self.max_attempts = max_attempts

    def _pick(self, options: tuple[str, ...]) -> str:
        return options[int(self.rng.integers(len(options)))]

    def _think(self, text: str) -> str:
        if not self.tags.reasoning:
            return ""
        return f"<{self.tags.reasoning[0]}>{text}</{self.tags.reasoning[0]}>\n"

    def _search(self, query: str) -> str:
        return f"<{self.tags.search}>{query}</{self.tags.search}>"

    def _answer(self, text: str) -> str:
        return f"<{self.tags.answer}>{text}</{self.tags.answer}>"

    @staticmethod
    def _search_step(env: gym.Env, demo: Demonstration, text: str) -> dict[str, Any] | None:
        """Step a search turn into ``demo``; its ``info``, or ``None`` when the env ended the
        episode (its step limit: ``demo`` is then closed, without every gold passage)."""
        obs, reward, terminated, truncated, info = env.step(text)
        demo.turns.append(Turn(text, obs, float(reward)))
        if terminated or truncated:
            demo.info, demo.gold_found = info, False
            return None
        return info

    @staticmethod
    def _finish(env: gym.Env, demo: Demonstration, text: str) -> Demonstration:
        obs, reward, _, _, info = env.step(text)
        demo.turns.append(Turn(text, obs, float(reward)))
        demo.info = info
        return demo


class SynthHopExpert(TranscriptWriter):
    """Writes SynthHop demonstrations in a :class:`~rag_gym.wrappers.TextActions` env (see the
    module doc).

    Args:
        tags: the env's tag set (its names are used in every turn).
        seed: seed of the phrasing choices.
        max_attempts: searches per hop before the expert gives up (refuses, or, with no
            refusal in the tag set, answers with what it has and the demonstration is marked
            ``gold_found=False``).
        confirm_rate: the share of answered demonstrations that search the last hop's fact
            once more, with another query, and read it again before answering: one search
            more than the question needs. 0 (the default) makes no extra random draw, so a seed
            gives the same demonstrations as without the option.
    """

    def __init__(
        self,
        tags: TagSet,
        seed: int = 0,
        max_attempts: int = 2,
        confirm_rate: float = 0.0,
    ) -> None:
        super().__init__(tags, seed, max_attempts)
        check_options(confirm_rate)
        self.confirm_rate = float(confirm_rate)

    # -- text pieces --
    def _read(self, relation: str, entity: str, value: str, rank: int) -> str:
        """The sentence that states what passage ``rank`` (1-based) says about ``entity``."""
        return self._pick(_READ).format(r=rank, fact=_fact(relation, entity, value))

    def _miss(self, entity: str, need: str, refuse: bool = False) -> str:
        """The sentence of a search that missed ``entity``'s passage (then a refusal's, when
        ``refuse``)."""
        return self._pick(_REFUSE if refuse else _MISS).format(X=entity, need=need)

    def _query(self, relation: str, entity: str, sub_question: str, attempt: int) -> str:
        keyword = _FACTS[relation][1]
        forms = [sub_question, f"{keyword} of {entity}", f"{entity} {keyword}", entity]
        first = int(self.rng.integers(3))  # the entity alone only as a second try
        return forms[first] if attempt == 0 else forms[(first + attempt) % 4]

    # -- playing --
    def play(self, env: gym.Env, index: int, seed: int | None = None) -> Demonstration:
        """Play question ``index`` of ``env``'s split and return the demonstration."""
        obs, info = env.reset(seed=seed, options={"question_index": int(index)})
        example = env.unwrapped.current_example
        meta = example.meta
        if "decomposition" not in meta or "relations" not in meta:
            raise ValueError(
                f"expected a SynthHop question with meta['decomposition'] and meta['relations'], "
                f"got question {example.id!r} without them"
            )
        demo = Demonstration(index=int(index), messages=_messages(env, obs))
        hops = meta["decomposition"]
        relations = meta["relations"]
        comparison = example.type == "comparison"
        entity = meta.get("start_entity", "")
        values: list[str] = []
        hop, attempt = 0, 0
        prefix = ""

        def entity_of(h: int) -> str:
            if comparison:
                return meta["start_entity"] if h == 0 else meta["other_entity"]
            return entity

        def need(h: int) -> str:
            return _NEEDS[relations[h]].format(X=entity_of(h))

        text = self._think(self._pick(_PLAN).format(need=need(0)))
        while hop < len(hops):
            sub_q = hops[hop]["question"]
            text += self._search(self._query(relations[hop], entity_of(hop), sub_q, attempt))
            info = self._search_step(env, demo, text)
            if info is None:  # the env's step limit (not reached by the expert)
                return demo
            gold = hops[hop]["passage_id"]
            retrieved = list(info.get("retrieved_ids", []))
            if gold in retrieved:
                value = hops[hop]["answer"]
                prefix = self._read(
                    relations[hop], entity_of(hop), value, retrieved.index(gold) + 1
                )
                values.append(value)
                hop, attempt = hop + 1, 0
                if hop == len(hops):
                    break
                if not comparison:
                    entity = value
                text = self._think(f"{prefix} {self._pick(_NEXT).format(need=need(hop))}")
                continue
            attempt += 1
            if attempt < self.max_attempts:
                text = self._think(self._miss(entity_of(hop), need(hop)))
                continue
            demo.gold_found = False
            if self.tags.refuse:
                final = self._think(self._miss(entity_of(hop), need(hop), refuse=True))
                final += f"<{self.tags.refuse}/>"
            else:
                final = self._think(self._pick(_FINAL).format(A=example.answers[0]))
                final += self._answer(example.answers[0])
            return self._finish(env, demo, final)

        if self.confirm_rate and self.rng.random() < self.confirm_rate:
            last = len(hops) - 1
            text = self._think(f"{prefix} {self._pick(_CONFIRM).format(need=need(last))}")
            query = self._query(relations[last], entity_of(last), hops[last]["question"], 1)
            text += self._search(query)
            info = self._search_step(env, demo, text)
            if info is None:  # the env's step limit (not reached by the expert)
                return demo
            retrieved = list(info.get("retrieved_ids", []))
            gold = hops[last]["passage_id"]
            if gold in retrieved:
                read = self._read(
                    relations[last], entity_of(last), values[last], retrieved.index(gold) + 1
                )
                prefix = f"{read} {self._pick(_CONFIRMED)}"
            else:
                fact = _fact(relations[last], entity_of(last), values[last])
                prefix = self._pick(_UNCONFIRMED).format(fact=fact)
        answer = example.answers[0]
        if comparison:
            a, b = meta["start_entity"], meta["other_entity"]
            verb = _EARLIER.get(relations[0], "comes first")
            reason = f"{a}: {values[0]}, {b}: {values[1]}. So {answer} {verb}."
            final = self._think(f"{prefix} {reason}")
        else:
            final = self._think(f"{prefix} {self._pick(_FINAL).format(A=answer)}")
        return self._finish(env, demo, final + self._answer(answer))


def check_options(confirm_rate: float = 0.0) -> None:
    """Raise ``ValueError`` for options :class:`SynthHopExpert` does not take (also checked by
    ``SFTConfig``, before any demonstration is written)."""
    if isinstance(confirm_rate, bool) or not 0.0 <= confirm_rate <= 1.0:
        raise ValueError(f"expected confirm_rate in [0, 1], got {confirm_rate!r}")


def _fact(relation: str, entity: str, value: str) -> str:
    """The sentence a passage about ``entity`` states for ``relation``."""
    return _FACTS[relation][0].format(X=entity, A=value)


def _messages(env: gym.Env, obs: str) -> list[dict[str, str]]:
    text = text_actions_of(env)
    if text is not None:
        return text.messages()
    raise TypeError(
        "expected a TextActions-wrapped search env (rag_gym.wrappers.TextActions), got "
        f"{type(env).__name__} without one"
    )
