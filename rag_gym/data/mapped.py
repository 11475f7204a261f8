"""A corpus read lazily from its JSONL file, for corpora the size of Wikipedia.

A :class:`~rag_gym.data.types.Corpus` holds every id, title and text as a Python string: at
wiki-18's 21M passages that is about the size of the text itself, and reading it takes minutes.
An index folder therefore keeps, beside its ``corpus.jsonl``, a *corpus map*: four arrays that
let a :class:`MappedCorpus` find any passage without reading the others.

::

    corpus_map/
      offsets.npy   int64, n + 1: the byte offset of each line of corpus.jsonl, then its size
      ids.npy       uint8: every id in UTF-8, in corpus order, end to end
      id_ptr.npy    int64, n + 1: where each id starts in ids.npy, then its length
      by_id.npy     int64, n: the corpus positions in id order (UTF-8 byte order, which is
                    Python's code-point order: the order retrievers break ties in)
      crc.npy       uint32, n: the CRC-32 of each line
      facts.json    {"size", "checksum"}: the passage count and Corpus.checksum() of the file,
                    so that a load checks them against the index's params without reading it

Every line read is checked against its CRC-32 and its id against ``ids.npy``: a damaged
passage is a ``ValueError`` naming the file when it is read, never a wrong passage served. (A
load checks sampled blocks of each file only, which is what keeps it fast at 21M.)

:class:`CorpusFileWriter` writes ``corpus.jsonl`` and the map in one pass, one passage at a time,
so that a corpus of any size is written in bounded memory. :class:`MappedCorpus` maps the
arrays and the file (nothing is read until asked for):

- a passage is one slice of the mapped file, parsed when asked for;
- an id is a slice of ``ids.npy``;
- ``position(id)`` is a binary search over ``by_id.npy``: about 25 comparisons at 21M; an id
  that ``ids_at`` returned lately (a retriever's results, which an env then reads by id) is
  found in a bounded memory instead, and the rows read lately are kept too.

>>> import tempfile
>>> from rag_gym.data.types import Passage
>>> folder = Path(tempfile.mkdtemp())
>>> writer = CorpusFileWriter(folder)
>>> for p in [Passage("b", "Vell", "A town."), Passage("a", "Ada", "Ada was born in Vell.")]:
...     _ = writer.add(p)
>>> facts = writer.finish()
>>> corpus = MappedCorpus(folder, name="demo")
>>> len(corpus), corpus["a"].title, corpus.position("b"), corpus.ids[1], "c" in corpus
(2, 'Ada', 0, 'a', False)
"""

from __future__ import annotations

import bisect
import hashlib
import json
import mmap
import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rag_gym.data.types import Corpus, Passage, hash_passage


def plain_view(array):
    """``array`` as a plain ndarray view when it is an ``np.memmap`` (the same mapped pages, not
    a copy): ``np.memmap`` reads every scalar through a Python-level ``__getitem__``, and a numba
    kernel call types each memmap argument in Python (~0.8 us), a plain array in C."""
    return array.view(np.ndarray) if isinstance(array, np.memmap) else array


#: How many recently returned ids (``MappedCorpus.ids_at``) and parsed rows a corpus remembers.
_RECENT_IDS = 1 << 16
_RECENT_ROWS = 1024

#: The folder of the corpus map, beside ``corpus.jsonl``.
CORPUS_MAP = "corpus_map"
#: Its files.
MAP_FILES = ("offsets.npy", "ids.npy", "id_ptr.npy", "by_id.npy", "crc.npy", "facts.json")


class CorpusFileWriter:
    """Writes ``FOLDER/corpus.jsonl`` (``{"id", "title", "text"}`` per line, as
    ``Corpus.to_jsonl(fmt="title_text")`` writes it) and ``FOLDER/corpus_map/``, one passage at a
    time, with :meth:`Corpus.checksum`'s digest.

    What it holds is about 20 bytes per passage plus the ids themselves: the line offsets, the
    CRC-32s, the id lengths and the UTF-8 ids, which the map needs whole to sort them.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / "corpus.jsonl"
        self._f = open(self.path, "wb")  # noqa: SIM115 (closed in finish() or close())
        self._h = hashlib.sha256()
        self._ids = bytearray()
        self._id_lengths = array("q")
        self._offsets = array("q", [0])
        self._crc = array("I")

    def add(self, p: Passage) -> str:
        """Write one passage; returns its ``"title\\ntext"`` contents (what BM25 indexes)."""
        line = (
            json.dumps({"id": p.id, "title": p.title, "text": p.text}, ensure_ascii=False) + "\n"
        ).encode()
        self._f.write(line)
        self._offsets.append(self._offsets[-1] + len(line))
        self._crc.append(zlib.crc32(line))
        hash_passage(self._h, p.id, p.title, p.text)
        pid = p.id.encode()
        self._ids += pid
        self._id_lengths.append(len(pid))
        return f"{p.title}\n{p.text}" if p.title else p.text

    def close(self) -> None:
        """Close the file without writing the map (a build that failed)."""
        self._f.close()

    def finish(self, source: str = "the corpus") -> dict[str, Any]:
        """Close the file and write the map. Returns ``{"size", "checksum", "id_rank"}``:
        ``id_rank`` is each passage's rank in id order (``base.id_ranks``). A repeated id is a
        ``ValueError`` naming it and ``source``."""
        self._f.close()
        n = len(self._id_lengths)
        lengths = np.frombuffer(self._id_lengths, dtype=np.int64)
        id_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lengths, out=id_ptr[1:])
        ids = np.frombuffer(self._ids, dtype=np.uint8)
        if (ids == 0).any():
            at = int(np.searchsorted(id_ptr, int(np.argmax(ids == 0)), side="right")) - 1
            raise ValueError(f"{source}: the id {_id_bytes(ids, id_ptr, at)!r} holds a NUL byte")
        by_id, sorted_keys = _id_order(ids, id_ptr)
        same = np.flatnonzero(sorted_keys[1:] == sorted_keys[:-1])
        del sorted_keys
        if len(same):
            pid = _id_bytes(ids, id_ptr, by_id[same[0]]).decode()
            raise ValueError(f"{source}: the id {pid!r} appears more than once; ids must be unique")
        folder = self.folder / CORPUS_MAP
        folder.mkdir(exist_ok=True)
        np.save(folder / "offsets.npy", np.frombuffer(self._offsets, dtype=np.int64))
        np.save(folder / "ids.npy", ids)
        np.save(folder / "id_ptr.npy", id_ptr)
        np.save(folder / "by_id.npy", by_id)
        np.save(folder / "crc.npy", np.frombuffer(self._crc, dtype=np.uint32))
        checksum = self._h.hexdigest()
        (folder / "facts.json").write_text(json.dumps({"size": n, "checksum": checksum}) + "\n")
        id_rank = np.empty(n, dtype=np.int64)
        id_rank[by_id] = np.arange(n)
        return {"size": n, "checksum": checksum, "id_rank": id_rank}


def write_corpus_files(corpus: Iterable[Passage], folder: str | Path) -> dict[str, Any]:
    """Write ``corpus.jsonl`` and its map into ``folder`` (:class:`CorpusFileWriter`)."""
    writer = CorpusFileWriter(folder)
    try:
        for p in corpus:
            writer.add(p)
    except BaseException:
        writer.close()
        raise
    return writer.finish(getattr(corpus, "name", "the corpus"))


def _id_order(ids: np.ndarray, id_ptr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions sorted by id (UTF-8 byte order, ties by position), and the sorted keys."""
    n = len(id_ptr) - 1
    lengths = np.diff(id_ptr)
    width = max(1, int(lengths.max()) if n else 1)
    table = np.zeros((n, width), dtype=np.uint8)
    row = np.repeat(np.arange(n), lengths)
    col = np.arange(len(ids)) - np.repeat(id_ptr[:-1], lengths)
    table[row, col] = ids
    # fixed-width byte strings compare as the ids do: a shorter id pads with NUL, which sorts
    # before every byte a UTF-8 id can hold (ids never contain NUL: checked by MappedCorpus)
    keys = table.view(f"S{width}").ravel()
    order = np.argsort(keys, kind="stable").astype(np.int64)
    return order, keys[order]


def _id_bytes(ids: np.ndarray, id_ptr: np.ndarray, i) -> bytes:
    return ids[id_ptr[i] : id_ptr[i + 1]].tobytes()


class _Column(Sequence):
    """A read-only column of a :class:`MappedCorpus` (ids, titles or texts), read on access."""

    __slots__ = ("_get", "_n")

    def __init__(self, n: int, get) -> None:
        self._n = n
        self._get = get

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._get(j) for j in range(*i.indices(self._n))]
        i = int(i)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(f"row {i} is outside the corpus's {self._n} passages")
        return self._get(i)

    def __iter__(self) -> Iterator:
        return (self._get(i) for i in range(self._n))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{self._n} rows, read on access>"


class _IdLookup:
    """``id -> position`` by binary search over ``by_id``: what ``Corpus._index`` (a dict) is
    for an in-memory corpus, without 21M Python strings."""

    __slots__ = ("_corpus",)

    def __init__(self, corpus: MappedCorpus) -> None:
        self._corpus = corpus

    def find(self, pid: object) -> int:
        if not isinstance(pid, str):
            return -1
        c = self._corpus
        i = c._recent.get(pid)
        if i is not None:  # an id a retriever has just returned (see MappedCorpus.ids_at)
            return i
        key = pid.encode()
        by_id = c._by_id
        r = bisect.bisect_left(_SortedIds(c), key)
        if r < len(by_id):
            i = int(by_id[r])
            if c._id_bytes(i) == key:
                return i
        return -1

    def __getitem__(self, pid: str) -> int:
        i = self.find(pid)
        if i < 0:
            raise KeyError(pid)
        return i

    def __contains__(self, pid: object) -> bool:
        return self.find(pid) >= 0

    def get(self, pid: str, default: int | None = None) -> int | None:
        i = self.find(pid)
        return default if i < 0 else i

    def __len__(self) -> int:
        return len(self._corpus)


class _SortedIds:
    """The ids in id order, as bytes, for :func:`bisect.bisect_left`."""

    __slots__ = ("_c",)

    def __init__(self, corpus: MappedCorpus) -> None:
        self._c = corpus

    def __len__(self) -> int:
        return len(self._c._by_id)

    def __getitem__(self, r: int) -> bytes:
        return self._c._id_bytes(int(self._c._by_id[r]))


class MappedCorpus(Corpus):
    """A read-only corpus over ``FOLDER/corpus.jsonl`` and ``FOLDER/corpus_map/``, mapped and
    read on access (see the module docstring for the layout).

    It answers with :class:`~rag_gym.data.types.Corpus`'s own methods (``len``, ``in``,
    ``corpus[id]``, ``position``, iteration, ``contents()``, ``checksum()``), over ``ids``,
    ``titles`` and ``texts`` sequences read on access and an id lookup by binary search;
    iteration, ``contents()`` and ``checksum()`` read the whole file. Loading costs the time to
    map the files and check the map's shape: no passage is read.

    Args:
        folder: The folder that holds ``corpus.jsonl`` and ``corpus_map/``.
        name: A label used in messages.
        size: The number of passages the caller expects (an index's ``corpus_size``); a map of
            another size is a ``ValueError``.

    Raises:
        ValueError: a map whose arrays do not fit each other or the file, naming the file.
    """

    __slots__ = (
        "_by_id",
        "_crc",
        "_file",
        "_folder",
        "_id_ptr",
        "_ids_blob",
        "_mm",
        "_offsets",
        "_recent",
        "_rows",
    )

    def __init__(self, folder: str | Path, name: str = "corpus", size: int | None = None) -> None:
        folder = Path(folder)
        self.name = name
        self._folder = folder
        where = folder / CORPUS_MAP
        try:
            arrays = {
                key: np.load(where / f"{key}.npy", mmap_mode="r", allow_pickle=False)
                for key in ("offsets", "ids", "id_ptr", "by_id", "crc")
            }
        except (OSError, ValueError) as exc:
            raise ValueError(f"{where}: cannot map the corpus map ({exc}); rebuild") from None
        # plain views: a binary search makes ~20 scalar reads
        self._offsets = plain_view(arrays["offsets"])
        self._ids_blob = plain_view(arrays["ids"])
        self._id_ptr = plain_view(arrays["id_ptr"])
        self._by_id = plain_view(arrays["by_id"])
        self._crc = plain_view(arrays["crc"])
        path = folder / "corpus.jsonl"
        problem = self._check(path.stat().st_size if path.is_file() else -1, size)
        if problem:
            raise ValueError(f"{where}: {problem}; rebuild the index")
        self._file = open(path, "rb")  # noqa: SIM115 (kept open: the map reads it)
        n = len(self._by_id)
        self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if n else b""
        #: ``id -> position`` of the ids ``ids_at`` returned lately (a retriever's results,
        #: which an env then looks up by id), and the rows read lately: bounded, emptied when
        #: full; a dict's get and set are atomic, so a reader on another thread is safe
        self._recent: dict[str, int] = {}
        self._rows: dict[int, tuple[int, str, str]] = {}
        self.ids = _Column(n, self._id)  # type: ignore[assignment]
        self.titles = _Column(n, lambda i: self._row(i)[1])  # type: ignore[assignment]
        self.texts = _Column(n, lambda i: self._row(i)[2])  # type: ignore[assignment]
        self._index = _IdLookup(self)  # type: ignore[assignment]

    def _check(self, file_size: int, size: int | None) -> str | None:
        offsets, ids, id_ptr, by_id = self._offsets, self._ids_blob, self._id_ptr, self._by_id
        n = len(by_id)
        if any(a.ndim != 1 for a in (offsets, ids, id_ptr, by_id, self._crc)):
            return "every array must be 1-D"
        if self._crc.dtype != np.uint32 or len(self._crc) != n:
            return f"crc.npy must hold {n} uint32s"
        if offsets.dtype != np.int64 or id_ptr.dtype != np.int64 or by_id.dtype != np.int64:
            return "offsets, id_ptr and by_id must be int64"
        if ids.dtype != np.uint8:
            return "ids.npy must be uint8"
        if size is not None and n != size:
            return f"it maps {n} passages, the index has {size}"
        if len(offsets) != n + 1 or len(id_ptr) != n + 1:
            return f"offsets.npy and id_ptr.npy must have {n + 1} entries"
        if file_size < 0:
            return "corpus.jsonl is missing"
        if offsets[0] != 0 or offsets[-1] != file_size or (np.diff(offsets) <= 0).any():
            return f"offsets.npy does not cut corpus.jsonl ({file_size} bytes) into lines"
        if id_ptr[0] != 0 or id_ptr[-1] != len(ids) or (np.diff(id_ptr) <= 0).any():
            return "id_ptr.npy does not cut ids.npy into non-empty ids"
        if n and (by_id.min() < 0 or by_id.max() >= n):
            return f"by_id.npy holds positions outside [0, {n})"
        if n and not (ids != 0).all():
            return "ids.npy holds a NUL byte"
        return None

    # ---- columns -------------------------------------------------------------------------------
    def _id_bytes(self, i: int) -> bytes:
        return self._ids_blob[self._id_ptr[i] : self._id_ptr[i + 1]].tobytes()

    def _id(self, i: int) -> str:
        return self._id_bytes(i).decode()

    def _row(self, i: int) -> tuple[int, str, str]:
        cached = self._rows.get(i)
        if cached is not None:
            return cached
        line = self._mm[int(self._offsets[i]) : int(self._offsets[i + 1])]
        problem = None
        if zlib.crc32(line) != int(self._crc[i]):
            problem = "its CRC-32 does not match the one written at build time"
        else:
            try:
                rec = json.loads(line.decode())  # str: json skips detecting the encoding
                row = (i, rec["title"], rec["text"])
                if rec["id"] != self._id(i):
                    problem = f"its id {rec['id']!r} is not corpus_map/ids.npy's {self._id(i)!r}"
            except (ValueError, KeyError, TypeError) as exc:
                problem = str(exc)
        if problem:
            raise ValueError(
                f"{self._folder / 'corpus.jsonl'} line {i + 1} is damaged ({problem}); "
                "rebuild the index"
            )
        rows = self._rows
        if len(rows) >= _RECENT_ROWS:
            rows.clear()
        rows[i] = row
        return row

    def ids_at(self, positions: Iterable[int]) -> list[str]:
        """The ids at ``positions``; each is remembered, so that looking it up by id next (as
        an env does with a retriever's results) costs a dict lookup, not a binary search."""
        positions = [int(i) for i in positions]
        ids = [self._id(i) for i in positions]
        recent = self._recent
        if len(recent) >= _RECENT_IDS:
            recent.clear()
        recent.update(zip(ids, positions, strict=True))
        return ids

    def facts(self) -> dict[str, Any]:
        """``{"size", "checksum"}`` as written at build time (``corpus_map/facts.json``)."""
        path = self._folder / CORPUS_MAP / "facts.json"
        try:
            facts = json.loads(path.read_text())
            return {"size": int(facts["size"]), "checksum": str(facts["checksum"])}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path} is damaged ({exc}); rebuild the index") from None

    @property
    def id_rank(self) -> np.ndarray:
        """Each position's rank in id order (computed from ``by_id``: ``n`` int64s)."""
        ranks = np.empty(len(self._by_id), dtype=np.int64)
        ranks[self._by_id] = np.arange(len(self._by_id))
        return ranks

    # ---- the Corpus interface ------------------------------------------------------------------
    def _passage(self, pid: str, i: int) -> Passage:
        _, title, text = self._row(i)  # one read for both columns
        return Passage(pid, title, text)

    def add(self, passage: Passage) -> None:
        raise TypeError(
            f"{self!r} is read-only (mapped from an index folder); build a Corpus to add passages"
        )

    def __repr__(self) -> str:
        return f"MappedCorpus(name={self.name!r}, passages={len(self)})"

    def __reduce__(self):
        return (type(self), (self._folder, self.name, len(self)))
