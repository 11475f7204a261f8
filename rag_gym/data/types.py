"""The data model shared by every loader, retriever and environment.

A :class:`Passage` is one retrievable unit (a Wikipedia paragraph, a SynthHop entity page).
A :class:`QAExample` is one question with every accepted answer alias, its gold passages and,
where the dataset has one, its own passage pool. A :class:`Corpus` is an id-indexed collection
of passages stored column-wise (three lists of strings), so a million passages cost three lists
rather than a million objects.

>>> corpus = Corpus([Passage("d1", "Ada", "Ada was born in Vell."), Passage("d2", "Vell", "A town.")])
>>> len(corpus), corpus["d2"].title, "d1" in corpus
(2, 'Vell', True)
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rag_gym.data._io import iter_jsonl, require
from rag_gym.data.errors import DataFormatError
from rag_gym.metrics import normalize_answer


@dataclass(frozen=True, slots=True)
class Passage:
    """One retrievable passage.

    Attributes:
        id: Unique id within its corpus (retrievers break score ties by this id).
        title: Title of the page the passage comes from (may be empty).
        text: The passage body, without the title.
    """

    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """``"title\\ntext"``, the FlashRAG / Search-R1 ``contents`` convention."""
        return f"{self.title}\n{self.text}" if self.title else self.text


@dataclass(frozen=True, slots=True)
class QAExample:
    """One question of a QA benchmark.

    Attributes:
        id: The dataset's own question id.
        question: The question text.
        answers: Every accepted answer alias; the first is the canonical answer. Empty only for
            unlabelled test files (and unanswerable questions without one). An alias must keep
            a word after :func:`~rag_gym.metrics.normalize_answer` (``"The"`` is a
            ``ValueError``).
        supporting_ids: Ids of the gold passages, in hop order where the dataset gives it.
        passages: The question's own passage pool (distractor setting); empty when the dataset
            has none (Bamboogle, FlashRAG files).
        hops: Number of reasoning hops, ``None`` when the dataset does not say.
        answerable: ``False`` for questions whose evidence is missing on purpose
            (MuSiQue-Full, SynthHop-Hard); the right behaviour is then to refuse.
        type: The dataset's question type (``"bridge"``, ``"comparison"``, ``"compositional"``…).
        meta: Everything else the source record carries that a user may want (level,
            decomposition, evidences…).
    """

    id: str
    question: str
    answers: tuple[str, ...]
    supporting_ids: tuple[str, ...] = ()
    passages: tuple[Passage, ...] = ()
    hops: int | None = None
    answerable: bool = True
    type: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        for answer in self.answers:
            if not isinstance(answer, str) or not normalize_answer(answer):
                raise ValueError(
                    f"expected question {self.id!r}'s answers to be strings that keep a word "
                    f"after normalisation, got {answer!r}: an answer that normalises to '' "
                    "(articles and punctuation only) would score 'an' as exactly right; fix "
                    "the answer or drop it"
                )

    @property
    def answer(self) -> str:
        """The canonical answer (first alias), ``""`` when unlabelled."""
        return self.answers[0] if self.answers else ""


class Corpus:
    """An in-memory, id-indexed passage collection.

    Passages keep their insertion order; ``corpus.ids``, ``corpus.titles`` and ``corpus.texts``
    are aligned lists, which is what retrievers index. Duplicate ids are an error.

    Args:
        passages: Passages to hold.
        name: A label used in messages and index metadata.
    """

    __slots__ = ("_index", "ids", "name", "texts", "titles")

    def __init__(self, passages: Iterable[Passage] = (), name: str = "corpus") -> None:
        self.name = name
        self.ids: list[str] = []
        self.titles: list[str] = []
        self.texts: list[str] = []
        self._index: dict[str, int] = {}
        for passage in passages:
            self.add(passage)

    @classmethod
    def from_columns(
        cls, ids: Sequence[str], titles: Sequence[str], texts: Sequence[str], name: str = "corpus"
    ) -> Corpus:
        """Build a corpus from three aligned sequences (the fast path for generated worlds)."""
        if not len(ids) == len(titles) == len(texts):
            raise ValueError(
                f"expected ids, titles and texts of equal length, got {len(ids)}, {len(titles)}, {len(texts)}"
            )
        corpus = cls(name=name)
        corpus.ids = list(ids)
        corpus.titles = list(titles)
        corpus.texts = list(texts)
        corpus._index = {pid: i for i, pid in enumerate(corpus.ids)}
        if len(corpus._index) != len(corpus.ids):
            seen: set[str] = set()
            dup = next(pid for pid in corpus.ids if pid in seen or seen.add(pid))
            raise ValueError(f"duplicate passage id {dup!r} in corpus {name!r}; ids must be unique")
        return corpus

    def add(self, passage: Passage) -> None:
        """Append a passage; raises ``ValueError`` on a duplicate id."""
        if passage.id in self._index:
            raise ValueError(
                f"duplicate passage id {passage.id!r} in corpus {self.name!r}; ids must be unique"
            )
        self._index[passage.id] = len(self.ids)
        self.ids.append(passage.id)
        self.titles.append(passage.title)
        self.texts.append(passage.text)

    def __len__(self) -> int:
        return len(self.ids)

    def __contains__(self, pid: object) -> bool:
        return pid in self._index

    def __iter__(self) -> Iterator[Passage]:
        for pid, title, text in zip(self.ids, self.titles, self.texts, strict=True):
            yield Passage(pid, title, text)

    def __getitem__(self, pid: str) -> Passage:
        try:
            i = self._index[pid]
        except KeyError:
            raise KeyError(f"no passage with id {pid!r} in corpus {self.name!r}") from None
        return self._passage(pid, i)

    def _passage(self, pid: str, i: int) -> Passage:
        """The passage ``pid`` at row ``i``."""
        return Passage(pid, self.titles[i], self.texts[i])

    def position(self, pid: str) -> int:
        """Row of ``pid`` in the aligned lists."""
        return self._index[pid]

    def ids_at(self, positions: Iterable[int]) -> list[str]:
        """The ids at ``positions`` (rows of the aligned lists)."""
        ids = self.ids
        return [ids[int(i)] for i in positions]

    def get(self, pid: str, default: Passage | None = None) -> Passage | None:
        return self[pid] if pid in self._index else default

    def contents(self) -> list[str]:
        """``"title\\ntext"`` per passage, aligned with :attr:`ids`."""
        return [
            f"{title}\n{text}" if title else text
            for title, text in zip(self.titles, self.texts, strict=True)
        ]

    def checksum(self) -> str:
        """SHA-256 over ids, titles and texts, for index metadata."""
        h = hashlib.sha256()
        for pid, title, text in zip(self.ids, self.titles, self.texts, strict=True):
            hash_passage(h, pid, title, text)
        return h.hexdigest()

    def __repr__(self) -> str:
        return f"Corpus(name={self.name!r}, passages={len(self)})"

    # ---- JSONL ---------------------------------------------------------------------------------
    @classmethod
    def from_jsonl(cls, path: str | Path, name: str | None = None) -> Corpus:
        """Read a corpus JSONL file in either common format.

        * ``{"id", "contents"}`` with ``contents = "title\\ntext"`` (FlashRAG, Search-R1, Pyserini);
        * ``{"id", "title", "text"}`` (DPR, BEIR style).

        A malformed line, or a file with no passages, raises
        :class:`~rag_gym.data.errors.DataFormatError` naming the file, the line and the field.
        """
        path = Path(path)
        corpus = cls(name=name or path.stem)
        for lineno, passage in iter_corpus_jsonl(path):
            try:
                corpus.add(passage)
            except ValueError as exc:
                raise DataFormatError(
                    path, f"line {lineno}", "id", "a unique id", passage.id
                ) from exc
        if not len(corpus):
            raise DataFormatError(path, "(file)", "(records)", "at least one passage", "no records")
        return corpus

    def to_jsonl(self, path: str | Path, fmt: str = "contents") -> None:
        """Write the corpus as JSONL: ``fmt="contents"`` (``{id, contents}``) or ``"title_text"``."""
        if fmt not in ("contents", "title_text"):
            raise ValueError(f"expected fmt 'contents' or 'title_text', got {fmt!r}")
        with open(path, "w", encoding="utf-8") as f:
            for pid, title, text in zip(self.ids, self.titles, self.texts, strict=True):
                if fmt == "contents":
                    rec: dict[str, str] = {"id": pid, "contents": f"{title}\n{text}"}
                else:
                    rec = {"id": pid, "title": title, "text": text}
                f.write(json.dumps(rec, ensure_ascii=False) + "\n")


def hash_passage(h: Any, pid: str, title: str, text: str) -> None:
    """Feed one passage into a SHA-256 as :meth:`Corpus.checksum` does (a streamed corpus is
    hashed passage by passage with it)."""
    h.update(pid.encode())
    h.update(b"\x00")
    h.update(title.encode())
    h.update(b"\x00")
    h.update(text.encode())
    h.update(b"\x01")


def iter_corpus_jsonl(path: str | Path) -> Iterator[tuple[int, Passage]]:
    """``(line number, passage)`` for each record of a corpus JSONL file, read one line at a time
    (any size of file), parsed as :meth:`Corpus.from_jsonl` parses it: ``{"id", "contents"}``
    (the title is the first line, its quotes dropped) or ``{"id", "title", "text"}``. A malformed
    line raises :class:`~rag_gym.data.errors.DataFormatError` naming the file, line and field;
    duplicate ids are the caller's to check."""
    path = Path(path)
    for lineno, record in iter_jsonl(path):
        yield lineno, passage_from_record(record, path, f"line {lineno}")


def passage_from_record(record: dict, path: Path, where: str) -> Passage:
    """The passage of one corpus record, ``{"id", "contents"}`` (the title is the first line,
    its quotes dropped) or ``{"id", "title", "text"}``; a malformed record raises
    :class:`~rag_gym.data.errors.DataFormatError` naming ``path`` and ``where``."""
    pid = require(record, "id", (str, int), path, where)
    if "contents" in record:
        contents = require(record, "contents", str, path, where)
        title, sep, text = contents.partition("\n")
        if not sep:
            title, text = "", contents
        title = title.strip('"')
    elif "text" in record:
        text = require(record, "text", str, path, where)
        title = record.get("title") or ""
        if not isinstance(title, str):
            raise DataFormatError(path, where, "title", "a string", title)
    else:
        raise DataFormatError(path, where, "contents", "a 'contents' or a 'text' field", "neither")
    return Passage(str(pid), title, text)
