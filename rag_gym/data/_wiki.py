"""Wikipedia-paragraph records shared by HotpotQA and 2WikiMultiHopQA.

Both give each question a ``context`` of ``[title, [sentences]]`` pairs (or the Hugging Face
column layout ``{"title": [...], "sentences": [[...]]}``) and ``supporting_facts`` as
``[title, sentence index]`` pairs (or ``{"title": [...], "sent_id": [...]}``). A passage's id is
its title, which is how both datasets name gold paragraphs; a repeated title with identical text
is dropped, one with different text gets the id ``"title (2)"``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_gym.data._io import check_answer, join_sentences, require
from rag_gym.data.errors import DataFormatError
from rag_gym.data.types import Passage


def parse_common(
    record: dict[str, Any], path: Path, where: str
) -> tuple[
    str, str, tuple[str, ...], tuple[Passage, ...], tuple[str, ...], tuple[tuple[str, str], ...]
]:
    """The fields HotpotQA and 2WikiMultiHopQA records share.

    Returns ``(id, question, answers, passages, gold ids, supporting sentences)``; an unlabelled
    record (no ``answer``) has no answers. The supporting sentences are ``(passage id,
    sentence)`` pairs in ``supporting_facts`` order (a fact whose sentence index is past its
    paragraph's end, as a few HotpotQA records have, is left out).
    """
    qid = require(record, "_id" if "_id" in record else "id", str, path, where)
    question = require(record, "question", str, path, where)
    answer = record.get("answer")
    if answer is not None and not isinstance(answer, str):
        raise DataFormatError(path, where, "answer", "a string", answer)
    kept = paragraphs(context_pairs(record, path, where))
    passages = tuple(Passage(pid, title, join_sentences(sents)) for pid, title, sents in kept)
    facts = supporting_facts(record, path, where)
    gold = gold_ids(tuple(dict.fromkeys(t for t, _ in facts)), passages, path, where)
    first: dict[str, tuple[str, list[str]]] = {}
    for pid, title, sentences in kept:
        first.setdefault(title, (pid, sentences))
    support = tuple(
        (first[t][0], first[t][1][i].strip())
        for t, i in facts
        if t in first and 0 <= i < len(first[t][1])
    )
    if answer is not None:
        check_answer(answer, path, where, "answer")
    return qid, question, (answer,) if answer is not None else (), passages, gold, support


def context_pairs(record: dict[str, Any], path: Path, where: str) -> list[tuple[str, list[str]]]:
    """The record's ``context`` as ``(title, sentences)`` pairs (either layout), checked."""
    context = record.get("context")
    if context is None:
        return []
    if isinstance(context, dict):  # Hugging Face layout
        expected = "{'title': [...], 'sentences': [[...]]} of equal length"
        raw = _column_pairs(context, "title", "sentences", "context", expected, path, where)
    elif isinstance(context, list):
        raw = context
    else:
        raise DataFormatError(path, where, "context", "a list of [title, sentences] pairs", context)
    pairs = []
    for j, pair in enumerate(raw):
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], (list, tuple))
            or not all(isinstance(s, str) for s in pair[1])
        ):
            raise DataFormatError(path, where, f"context[{j}]", "[title, [sentence, ...]]", pair)
        pairs.append((pair[0], list(pair[1])))
    return pairs


def paragraphs(pairs: list[tuple[str, list[str]]]) -> list[tuple[str, str, list[str]]]:
    """``(passage id, title, sentences)`` of each paragraph kept: a repeated title with the same
    text is dropped, one with another text gets the id ``"title (2)"``."""
    kept: list[tuple[str, str, list[str]]] = []
    by_id: dict[str, str] = {}
    for title, sentences in pairs:
        text = join_sentences(sentences)
        pid, n = title, 1
        while pid in by_id and by_id[pid] != text:
            n += 1
            pid = f"{title} ({n})"
        if pid in by_id:
            continue
        by_id[pid] = text
        kept.append((pid, title, sentences))
    return kept


def supporting_facts(record: dict[str, Any], path: Path, where: str) -> list[tuple[str, int]]:
    """The ``supporting_facts`` as ``(title, sentence index)`` pairs, in file order (either
    layout); a title that is not a string, or an index that is not an integer, names the fact."""
    facts = record.get("supporting_facts")
    if facts is None:
        return []
    if isinstance(facts, dict):
        titles = facts.get("title")
        if facts.get("sent_id") is None and isinstance(titles, list):
            facts = {**facts, "sent_id": [-1] * len(titles)}  # titles alone: no sentence is named
        expected = "{'title': [...], 'sent_id': [...]} of equal length"
        pairs = _column_pairs(facts, "title", "sent_id", "supporting_facts", expected, path, where)
        raw: list[Any] = [list(pair) for pair in pairs]
    elif isinstance(facts, list):
        raw = facts
    else:
        raise DataFormatError(
            path, where, "supporting_facts", "a list of [title, sentence index]", facts
        )
    out = []
    for j, fact in enumerate(raw):
        if (
            not isinstance(fact, (list, tuple))
            or len(fact) != 2
            or not isinstance(fact[0], str)
            or isinstance(fact[1], bool)
            or not isinstance(fact[1], int)
        ):
            raise DataFormatError(
                path, where, f"supporting_facts[{j}]", "[title, sentence index]", fact
            )
        out.append((fact[0], fact[1]))
    return out


def _column_pairs(
    value: dict[str, Any],
    first: str,
    second: str,
    field: str,
    expected: str,
    path: Path,
    where: str,
) -> list[tuple[Any, Any]]:
    """The Hugging Face layout's two equal-length columns ``value[first]`` and
    ``value[second]`` as ``(a, b)`` pairs; a :class:`DataFormatError` naming ``field`` else."""
    a, b = value.get(first), value.get(second)
    if not isinstance(a, list) or not isinstance(b, list) or len(a) != len(b):
        raise DataFormatError(path, where, field, expected, value)
    return list(zip(a, b, strict=True))


def gold_ids(
    titles: tuple[str, ...], passages: tuple[Passage, ...], path: Path, where: str
) -> tuple[str, ...]:
    """Map supporting titles to passage ids of the pool (the first passage with that title)."""
    if not passages:
        return titles
    first: dict[str, str] = {}
    for p in passages:
        first.setdefault(p.title, p.id)
    missing = [t for t in titles if t not in first]
    if missing:
        raise DataFormatError(
            path, where, "supporting_facts", "titles that appear in 'context'", missing
        )
    return tuple(first[t] for t in titles)
