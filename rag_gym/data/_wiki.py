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

from rag_gym.data._io import join_sentences, require
from rag_gym.data.errors import DataFormatError
from rag_gym.data.types import Passage


def parse_common(
    record: dict[str, Any], path: Path, where: str
) -> tuple[str, str, tuple[str, ...], tuple[Passage, ...], tuple[str, ...]]:
    """The fields HotpotQA and 2WikiMultiHopQA records share.

    Returns ``(id, question, answers, passages, gold ids)``; an unlabelled record (no
    ``answer``) has no answers.
    """
    qid = require(record, "_id" if "_id" in record else "id", str, path, where)
    question = require(record, "question", str, path, where)
    answer = record.get("answer")
    if answer is not None and not isinstance(answer, str):
        raise DataFormatError(path, where, "answer", "a string", answer)
    passages = context_passages(record, path, where)
    gold = gold_ids(supporting_titles(record, path, where), passages, path, where)
    return qid, question, (answer,) if answer is not None else (), passages, gold


def context_passages(record: dict[str, Any], path: Path, where: str) -> tuple[Passage, ...]:
    """The question's own paragraphs as passages."""
    context = record.get("context")
    if context is None:
        return ()
    if isinstance(context, dict):  # Hugging Face layout
        titles, sentences = context.get("title"), context.get("sentences")
        if (
            not isinstance(titles, list)
            or not isinstance(sentences, list)
            or len(titles) != len(sentences)
        ):
            raise DataFormatError(
                path,
                where,
                "context",
                "{'title': [...], 'sentences': [[...]]} of equal length",
                context,
            )
        pairs = list(zip(titles, sentences, strict=True))
    elif isinstance(context, list):
        pairs = context
    else:
        raise DataFormatError(path, where, "context", "a list of [title, sentences] pairs", context)

    passages: list[Passage] = []
    by_id: dict[str, str] = {}
    for j, pair in enumerate(pairs):
        if (
            not isinstance(pair, (list, tuple))
            or len(pair) != 2
            or not isinstance(pair[0], str)
            or not isinstance(pair[1], (list, tuple))
            or not all(isinstance(s, str) for s in pair[1])
        ):
            raise DataFormatError(path, where, f"context[{j}]", "[title, [sentence, ...]]", pair)
        title, text = pair[0], join_sentences(pair[1])
        pid, n = title, 1
        while pid in by_id and by_id[pid] != text:
            n += 1
            pid = f"{title} ({n})"
        if pid in by_id:
            continue
        by_id[pid] = text
        passages.append(Passage(pid, title, text))
    return tuple(passages)


def supporting_titles(record: dict[str, Any], path: Path, where: str) -> tuple[str, ...]:
    """Distinct supporting-fact titles in order of first appearance."""
    facts = record.get("supporting_facts")
    if facts is None:
        return ()
    if isinstance(facts, dict):
        titles = facts.get("title")
        if not isinstance(titles, list):
            raise DataFormatError(
                path, where, "supporting_facts", "{'title': [...], 'sent_id': [...]}", facts
            )
    elif isinstance(facts, list):
        titles = []
        for j, fact in enumerate(facts):
            if (
                not isinstance(fact, (list, tuple))
                or len(fact) != 2
                or not isinstance(fact[0], str)
            ):
                raise DataFormatError(
                    path, where, f"supporting_facts[{j}]", "[title, sentence index]", fact
                )
            titles.append(fact[0])
    else:
        raise DataFormatError(
            path, where, "supporting_facts", "a list of [title, sentence index]", facts
        )
    return tuple(dict.fromkeys(titles))


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
