"""An expert for the real benchmarks: transcripts built from each dataset's own annotations.

:class:`AnnotationExpert` writes, for a HotpotQA, 2WikiMultiHopQA or MuSiQue question, the
transcript a good search policy writes, in the layout of :class:`~rag_gym.agents.expert.
SynthHopExpert`'s (``<think>``, ``<search>``, the passages, a ``<think>`` that reads them,
``<answer>``), played turn by turn in the same :class:`~rag_gym.wrappers.TextActions` env the
trainers and the ``search_r1`` agent use. The plan of each question comes from its annotation
(:func:`plan`):

* **HotpotQA** (``supporting_facts``, ``type``): a *bridge* question is a chain of two
  paragraphs, the second one's title (the bridge entity) named in the first; the first search is
  the question itself, the second the bridge entity read from the first paragraph plus the words
  of the question the first paragraph does not answer. A *comparison* reads the two entities'
  paragraphs, each searched as the entity plus the attribute compared.
* **2WikiMultiHopQA** (``evidences`` triples and ``supporting_facts``): one hop per triple,
  searched as its subject plus its relation (``Girl Rising director``); a triple whose subject is
  an earlier triple's object waits for it (compositional, inference and bridge-comparison
  chains), the others can be read in any order (comparisons).
* **MuSiQue** (``question_decomposition`` with ``paragraph_support_idx``): one hop per
  sub-question, searched as the sub-question with ``#k`` replaced by the answer read at hop
  ``k`` (``X >> relation`` as ``X relation``).

Each search is followed by a reading of every gold passage it brought whose hop can be read
(its earlier hops read): ``Doc 2 says: <the supporting sentence>`` (HotpotQA and MuSiQue quote
the sentence, clipped to :data:`QUOTE_WORDS` words around what it is read for; 2WikiMultiHopQA
paraphrases the triple, ``Doc 2 says the director of Girl Rising is Richard E. Robbins``), then
the next need. A search that brings no readable gold passage is said to miss and the next query
form of the hop is tried, :data:`MAX_ATTEMPTS` at most. After the last reading, ``<answer>`` with
the gold answer.

A transcript is kept only when the env's own scoring gives its answer EM 1 and its searches
retrieved every gold passage of the question; :func:`play_split` counts the others by dataset,
question type and reason (:data:`DROP_REASONS`) instead of failing.

>>> from rag_gym.data import Passage, QAExample
>>> ex = QAExample("q1", "Which city was the birthplace of the author of Vell Tales?", ("Orlin",),
...     ("Vell Tales", "Ada Marr"), (Passage("Vell Tales", "Vell Tales", "Vell Tales is a book by Ada Marr."),
...     Passage("Ada Marr", "Ada Marr", "Ada Marr was born in Orlin."), Passage("Kest", "Kest", "Kest is a town.")),
...     hops=2, type="bridge", meta={"support": (("Vell Tales", "Vell Tales is a book by Ada Marr."),
...     ("Ada Marr", "Ada Marr was born in Orlin."))})
>>> [h.queries[0] for h in plan(ex, "hotpotqa")]
['Which city was the birthplace of the author of Vell Tales?', 'Ada Marr city birthplace author']
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from rag_gym.agents.expert import _FINAL, Demonstration, TranscriptWriter, _messages
from rag_gym.data.types import QAExample
from rag_gym.envs.tags import TagSet

#: Searches per hop before the question is dropped.
MAX_ATTEMPTS = 3
#: The most words of a supporting sentence a reading quotes.
QUOTE_WORDS = 30
#: Why a question gets no transcript (the keys of :attr:`ExpertReport.dropped`).
DROP_REASONS = {
    "no_plan": "its annotation gives no usable hop plan (a gold paragraph missing, no evidence)",
    "not_retrieved": "a gold passage was not retrieved in MAX_ATTEMPTS searches of its hop",
    "wrong_answer": "the env did not score the gold answer EM 1",
    "step_limit": "the env ended the episode before the answer",
    "turn_too_long": "a turn is longer than a policy may write in one (checked by the SFT)",
}
#: Datasets the expert plans for.
DATASETS = ("hotpotqa", "2wikimultihopqa", "musique")

_STOP_WORDS = """a an the of in on at to for from by with and or but is are was were be been being do
does did what which who whom whose when where why how that this these those it its as than then
there their they he she his her him them both same one any all also into about after before over
under more most less least many much not no yes if whether has have had who's what's name named
called known"""
_STOP = frozenset(_STOP_WORDS.split())
_PLAN_FIRST = (
    "Let me search for the question.",
    "I will start by searching the question.",
    "First I search for what the question asks.",
)
_NEXT = ("Now I need {need}.", "Next, I need {need}.", "Next I need {need}.")
_MISS = (
    "The results do not say {need}. Let me search differently.",
    "These documents do not mention {need}. I will rephrase the search.",
)
_READ = ("Doc {r} says: {fact}.", "From Doc {r}: {fact}.")
_COMPARE = (
    "Comparing the two, the answer is {A}.",
    "So, comparing them, the answer is {A}.",
)
#: 2WikiMultiHopQA relations read as a sentence: relation → "{S} ... {O}"
_RELATION_FACTS = {
    "educated at": "{S} was educated at {O}",
    "place of birth": "{S} was born in {O}",
    "place of death": "{S} died in {O}",
    "date of birth": "{S} was born on {O}",
    "date of death": "{S} died on {O}",
    "place of burial": "{S} was buried in {O}",
    "cause of death": "{S} died of {O}",
    "publication date": "{S} was published on {O}",
    "inception": "{S} was founded in {O}",
    "founded by": "{S} was founded by {O}",
    "country of citizenship": "{S} was a citizen of {O}",
    "country of origin": "{S} is from {O}",
    "employer": "{S} worked for {O}",
    "award received": "{S} received {O}",
    "occupation": "{S} was a {O}",
}


@dataclass
class Hop:
    """One hop of a plan: the gold passage it reads and how it is searched and read."""

    gold: str
    """The gold passage id."""
    queries: list[str]
    """Query forms, tried in order (the first is the searcher's first choice)."""
    need: str
    """What the hop looks for, as a noun phrase (``the director of Girl Rising``)."""
    fact: str
    """What the reading says: the quoted sentence, or the triple as a sentence."""
    after: tuple[int, ...] = ()
    """Hops that must be read before this one (the hop whose answer it searches)."""


@dataclass
class ExpertReport:
    """What :func:`play_split` kept and dropped, by dataset and question type."""

    kept: Counter = field(default_factory=Counter)
    """``(dataset, type)`` → transcripts kept."""
    dropped: Counter = field(default_factory=Counter)
    """``(dataset, type, reason)`` → questions dropped (reasons: :data:`DROP_REASONS`)."""

    def as_rows(self) -> list[dict[str, Any]]:
        """One row per dataset and type: kept, dropped and each drop reason's count."""
        keys = sorted({k for k in self.kept} | {(d, t) for d, t, _ in self.dropped})
        rows = []
        for dataset, qtype in keys:
            reasons = {r: self.dropped[(dataset, qtype, r)] for r in DROP_REASONS}
            rows.append(
                {
                    "dataset": dataset,
                    "type": qtype,
                    "kept": self.kept[(dataset, qtype)],
                    "dropped": sum(reasons.values()),
                    **{f"dropped_{r}": n for r, n in reasons.items() if n},
                }
            )
        return rows

    def update(self, other: ExpertReport) -> None:
        self.kept.update(other.kept)
        self.dropped.update(other.dropped)

    def drop(self, dataset: str, example: QAExample, reason: str) -> None:
        """Count a kept transcript of ``example`` as dropped for ``reason`` instead."""
        key = (dataset, example.type or "-")
        self.kept[key] -= 1
        self.dropped[(*key, reason)] += 1


class PlanError(ValueError):
    """A question whose annotation gives no usable plan."""


# -- plans ------------------------------------------------------------------------------------
def _words(text: str) -> list[str]:
    return re.findall(r"[\w'-]+", text, flags=re.UNICODE)


def keywords(question: str, *exclude: str) -> str:
    """The question's content words that none of ``exclude`` contains (lower-cased compare),
    in question order, each once: the relation a searcher adds to an entity.

    >>> keywords("What city did the band of Tinted Windows first perform in?", "Tinted Windows (band)")
    'city first perform'
    """
    banned = {w.lower() for text in exclude for w in _words(text)}
    out: list[str] = []
    for word in _words(question):
        low = word.lower()
        if low in _STOP or low in banned or low in (w.lower() for w in out):
            continue
        out.append(word)
    return " ".join(out)


def entity_name(title: str) -> str:
    """A title as a searcher names the entity: without Wikipedia's ``(disambiguation)``.

    >>> entity_name("Tinted Windows (band)")
    'Tinted Windows'
    """
    return re.sub(r"\s*\([^)]*\)\s*$", "", title).strip() or title


def clip(sentence: str, key: str = "", words: int = QUOTE_WORDS) -> str:
    """``sentence`` without its end stop, cut to ``words`` words around ``key`` when longer
    (``...`` marks a cut).

    >>> clip("A b c d e f g h.", "f", words=3)
    '... e f g ...'
    """
    text = sentence.strip().rstrip(".").strip()
    tokens = text.split()
    if len(tokens) <= words:
        return text
    start = 0
    if key:
        low = text.lower()
        at = low.find(key.lower())
        if at >= 0:
            centre = len(low[:at].split())
            start = max(0, min(len(tokens) - words, centre - words // 3))
    cut = " ".join(tokens[start : start + words])
    return f"{'... ' if start else ''}{cut}{' ...' if start + words < len(tokens) else ''}"


def _support(example: QAExample) -> dict[str, list[str]]:
    """Gold passage id → its supporting sentences (HotpotQA, 2WikiMultiHopQA ``meta``)."""
    out: dict[str, list[str]] = {}
    for pid, sentence in example.meta.get("support", ()):
        out.setdefault(pid, []).append(sentence)
    return out


def _sentence_with(sentences: list[str], key: str) -> str:
    low = key.lower()
    for s in sentences:
        if low and low in s.lower():
            return s
    return sentences[0] if sentences else ""


def _passage(example: QAExample, pid: str):
    for p in example.passages:
        if p.id == pid:
            return p
    raise PlanError(f"gold passage {pid!r} is not in the question's pool")


def _plan_hotpotqa(example: QAExample) -> list[Hop]:
    golds = list(example.supporting_ids)
    if len(golds) != 2:
        raise PlanError(f"expected 2 gold paragraphs, got {len(golds)}")
    support = _support(example)
    answer = example.answer
    titles = [_passage(example, g).title for g in golds]
    if example.type == "comparison":
        kw = keywords(example.question, *titles)
        hops = []
        for i, (gold, title) in enumerate(zip(golds, titles, strict=True)):
            name = entity_name(title)
            fact = clip(_sentence_with(support.get(gold, []), answer), answer)
            queries = [f"{name} {kw}".strip(), name]
            if i == 0:
                queries.insert(0, example.question)
            hops.append(Hop(gold, queries, f"more about {name}", fact))
        return hops
    # bridge: the paragraph whose entity the other one names is read second
    texts = [" ".join(support.get(g, [])) or _passage(example, g).text for g in golds]
    named = [entity_name(titles[1 - i]).lower() in texts[i].lower() for i in range(2)]
    if named[0] == named[1]:  # both or neither: the paragraph holding the answer comes last
        has_answer = [answer.lower() in _passage(example, g).text.lower() for g in golds]
        first = 1 if has_answer[0] and not has_answer[1] else 0
    else:
        first = 0 if named[0] else 1
    # Either paragraph may be read first: a question often brings the answer's paragraph before
    # the bridge's, and each paragraph's text names the other's entity.
    second = 1 - first
    names = [entity_name(t) for t in titles]
    kw2 = keywords(example.question, texts[first], titles[first], names[second])
    kw1 = keywords(example.question, names[first], names[second])
    fact1 = clip(_sentence_with(support.get(golds[first], []), names[second]), names[second])
    fact2 = clip(_sentence_with(support.get(golds[second], []), answer), answer)
    return [
        Hop(
            golds[first],
            [example.question, f"{names[first]} {kw1}".strip(), names[first]],
            f"more about {names[first]}",
            fact1,
        ),
        Hop(
            golds[second],
            [f"{names[second]} {kw2}".strip(), names[second], example.question],
            f"more about {names[second]}",
            fact2,
        ),
    ]


def _relation_fact(subject: str, relation: str, obj: str) -> str:
    form = _RELATION_FACTS.get(relation.lower())
    if form:
        return form.format(S=subject, O=obj)
    return f"the {relation} of {subject} is {obj}"


def _plan_2wiki(example: QAExample) -> list[Hop]:
    evidences = example.meta.get("evidences") or []
    triples = [e for e in evidences if isinstance(e, (list, tuple)) and len(e) == 3]
    if not triples or len(triples) != len(evidences):
        raise PlanError("expected evidences as [subject, relation, object] triples")
    golds = list(example.supporting_ids)
    titles = {g: _passage(example, g).title for g in golds}

    def gold_of(j: int, subject: str) -> str:
        low = subject.lower()
        for g in golds:  # the paragraph titled with the subject
            if entity_name(titles[g]).lower() == entity_name(subject).lower():
                return g
        for g in golds:
            if low in titles[g].lower() or entity_name(titles[g]).lower() in low:
                return g
        if len(golds) == len(triples):
            return golds[j]
        raise PlanError(f"no gold paragraph for the subject {subject!r}")

    hops: list[Hop] = []
    for j, (subject, relation, obj) in enumerate(triples):
        subject, relation, obj = str(subject), str(relation), str(obj)
        after = tuple(i for i, t in enumerate(triples[:j]) if str(t[2]).lower() == subject.lower())
        name = entity_name(subject)
        queries = [f"{name} {relation}", name]
        if j == 0:
            queries.insert(1, example.question)
        hops.append(
            Hop(
                gold_of(j, subject),
                queries,
                f"the {relation} of {name}",
                _relation_fact(name, relation, obj),
                after,
            )
        )
    found = {h.gold for h in hops}
    if not set(golds) <= found:
        raise PlanError("a gold paragraph is read by no evidence triple")
    return hops


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def _plan_musique(example: QAExample) -> list[Hop]:
    steps = example.meta.get("decomposition") or []
    if not steps:
        raise PlanError("expected a question_decomposition")
    qid = example.id
    answers: list[str] = []
    hops: list[Hop] = []
    for j, step in enumerate(steps):
        support = step.get("paragraph_support_idx")
        if support is None:
            raise PlanError(f"sub-question {j + 1} has no paragraph_support_idx")
        gold = f"{qid}::{support}"
        refs = tuple(int(k) - 1 for k in re.findall(r"#(\d+)", str(step.get("question", ""))))
        if any(not 0 <= k < j for k in refs):
            raise PlanError(f"sub-question {j + 1} refers to a later or missing answer")
        text = re.sub(r"#(\d+)", lambda m: answers[int(m.group(1)) - 1], str(step["question"]))
        if ">>" in text:
            subject, _, relation = text.partition(">>")
            query = f"{subject.strip()} {relation.strip()}"
            need = f"the {relation.strip()} of {subject.strip()}"
        else:
            query = re.sub(r"[\s.?]+$", "", text.strip()) + "?"
            need = f"to know {query[0].lower()}{query[1:-1]}"
        value = str(step.get("answer", ""))
        passage = _passage(example, gold)
        sentences = _SENTENCE.split(passage.text)
        sentence = _sentence_with([s for s in sentences if value.lower() in s.lower()], value)
        fact = clip(sentence, value) if sentence else f"{query.rstrip('?')}: {value}"
        queries = [query]
        if j == 0 and query != example.question:
            queries.append(example.question)
        queries.append(keywords(query))
        hops.append(Hop(gold, queries, need, fact, refs))
        answers.append(value)
    return hops


def plan(example: QAExample, dataset: str) -> list[Hop]:
    """The hops of ``example`` from its annotation (see the module doc); :class:`PlanError`
    when the annotation gives none."""
    if dataset == "hotpotqa":
        return _plan_hotpotqa(example)
    if dataset == "2wikimultihopqa":
        return _plan_2wiki(example)
    if dataset == "musique":
        return _plan_musique(example)
    raise ValueError(f"expected a dataset in {DATASETS}, got {dataset!r}")


# -- playing ----------------------------------------------------------------------------------
class AnnotationExpert(TranscriptWriter):
    """Writes transcripts of real benchmark questions from their annotations (see the module
    doc), in a :class:`~rag_gym.wrappers.TextActions` env over HotpotQA, 2WikiMultiHopQA or
    MuSiQue.

    Args:
        tags: the env's tag set.
        seed: seed of the phrasing choices.
        max_attempts: searches per hop before the question is dropped.
    """

    def __init__(self, tags: TagSet, seed: int = 0, max_attempts: int = MAX_ATTEMPTS) -> None:
        super().__init__(tags, seed, max_attempts)

    def play(self, env: gym.Env, index: int) -> tuple[Demonstration | None, str]:
        """Play question ``index`` of ``env``'s split: the demonstration and ``"kept"``, or
        ``None`` and the reason it was dropped (:data:`DROP_REASONS`)."""
        obs, _ = env.reset(options={"question_index": int(index)})
        base = env.unwrapped
        example = base.current_example
        try:
            hops = plan(example, base.dataset)
        except PlanError:
            return None, "no_plan"
        demo = Demonstration(index=int(index), messages=_messages(env, obs))
        done: list[bool] = [False] * len(hops)
        attempts = [0] * len(hops)
        text = self._think(self._need(hops[0], first=True, question=example.question))
        readings = ""
        while not all(done):
            hop = _next_hop(hops, done)
            query = hops[hop].queries[min(attempts[hop], len(hops[hop].queries) - 1)]
            text += self._search(query)
            info = self._search_step(env, demo, text)
            if info is None:
                return None, "step_limit"
            retrieved = list(info.get("retrieved_ids", []))
            read = self._read_all(hops, done, retrieved)
            if read:
                readings = read
                if all(done):
                    break
                text = self._think(f"{read} {self._need(hops[_next_hop(hops, done)])}")
                continue
            attempts[hop] += 1
            if attempts[hop] >= self.max_attempts:
                return None, "not_retrieved"
            text = self._think(self._pick(_MISS).format(need=hops[hop].need))
        answer = example.answer
        closing = _COMPARE if _is_comparison(example) else _FINAL
        final = self._think(f"{readings} {self._pick(closing).format(A=answer)}")
        info = self._finish(env, demo, final + self._answer(answer)).info
        gold = set(example.supporting_ids)
        demo.gold_found = gold <= set(info.get("gold_found", []))
        if not demo.gold_found:
            return None, "not_retrieved"
        if info.get("scores", {}).get("em", 0.0) != 1.0:
            return None, "wrong_answer"
        return demo, "kept"

    def _need(self, hop: Hop, first: bool = False, question: str = "") -> str:
        """The plan sentence before ``hop``'s search: the question searched as it is, the
        first need, or the next one."""
        if first and hop.queries[0] == question:
            return self._pick(_PLAN_FIRST)
        if first:
            return f"I need {hop.need}."
        return self._pick(_NEXT).format(need=hop.need)

    def _read_all(self, hops: list[Hop], done: list[bool], retrieved: list[str]) -> str:
        """Read every readable gold passage of ``retrieved`` (marking its hop done), in hop
        order, again after each reading (a hop that waited for it may now be readable)."""
        sentences = []
        progress = True
        while progress:
            progress = False
            for i, h in enumerate(hops):
                if done[i] or h.gold not in retrieved or not all(done[k] for k in h.after):
                    continue
                rank = retrieved.index(h.gold) + 1
                sentences.append(self._pick(_READ).format(r=rank, fact=h.fact))
                done[i] = progress = True
        return " ".join(sentences)


def _next_hop(hops: list[Hop], done: list[bool]) -> int:
    """The first hop not read yet whose earlier hops are read."""
    return next(i for i, h in enumerate(hops) if not done[i] and all(done[k] for k in h.after))


def _is_comparison(example: QAExample) -> bool:
    return "comparison" in example.type


def play_split(
    env: gym.Env, expert: AnnotationExpert, indices: list[int] | None = None
) -> tuple[list[Demonstration], ExpertReport]:
    """The expert's transcripts of ``indices`` (default: every question of ``env``'s split) and
    the report of what was kept and dropped."""
    base = env.unwrapped
    report = ExpertReport()
    demos = []
    for index in range(len(base.examples)) if indices is None else indices:
        demo, outcome = expert.play(env, int(index))
        example = base.examples[int(index)]
        key = (base.dataset, example.type or "-")
        if demo is None:
            report.dropped[(*key, outcome)] += 1
        else:
            report.kept[key] += 1
            demos.append(demo)
    return demos, report
