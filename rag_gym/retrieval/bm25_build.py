"""Building a BM25 index in bounded memory, from a corpus of any size.

One code path builds every BM25 index, in memory (``BM25Retriever.index``) or out of core
(:func:`build_bm25_index`, ``rag-gym index build --memory``):

1. **Collect.** Passages are read one at a time and tokenised as bm25s does (lower case, its token
   pattern, its stop words, PyStemmer); a token's id is the order in which its stem first
   appears in the corpus. Each passage's (token, term frequency) pairs go to a buffer; when the
   buffer reaches the memory budget it is sorted by token and written out as a *run*.
2. **Merge.** Runs cover consecutive passages, so a token's postings are its slices of the runs
   in run order, already sorted by passage. Columns are merged in groups that fit the budget,
   scored with bm25s's own scoring functions (the same float32 values as ``bm25s.BM25.index``)
   and written to memory-mapped ``.npy`` files.

The budget bounds the postings held at once (buffers, sorts and merge groups). The vocabulary
and the passage ids are held whole (for wiki-18: a few million tokens and 21M ids), outside it.
An in-memory and an out-of-core build of one corpus write byte-identical files.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from array import array
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rag_gym.data.mapped import CorpusFileWriter
from rag_gym.data.types import Passage
from rag_gym.retrieval.bm25_format import BLOCK_ARRAYS, SERVING, BM25Config, tokenizer_steps
from rag_gym.retrieval.persist import write_index

# bytes of memory a buffered posting costs while collecting (buffers, then the sort that spills
# them) and while merging (its slices, the sort, the scores in float64)
_COLLECT_BYTES = 48
_MERGE_BYTES = 64
_MIN_MEMORY = 1 << 20


def parse_memory(text: str | int) -> int:
    """Bytes in a memory budget: an int, or a number with a unit (``"4GB"``, ``"512MB"``,
    ``"1.5G"``, ``"800k"``; powers of 1024).

    >>> parse_memory("2GB"), parse_memory("512m"), parse_memory(4096 * 1024)
    (2147483648, 536870912, 4194304)
    """
    if isinstance(text, bool) or not isinstance(text, (int, str)):
        raise TypeError(f"expected a memory budget such as '4GB', got {type(text).__name__}")
    if isinstance(text, int):
        value = text
    else:
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)i?b?\s*", text.lower())
        if not match:
            raise ValueError(
                f"expected a memory budget such as '4GB', '512MB' or a number of bytes, got {text!r}"
            )
        scale = 1024 ** " kmgt".index(match.group(2) or " ")
        value = int(float(match.group(1)) * scale)
    if value < _MIN_MEMORY:
        raise ValueError(f"expected a memory budget of at least 1MB, got {value} bytes; raise it")
    return value


class _Collector:
    """Pass 1: tokens, document lengths, postings in sorted runs (in memory or spilled)."""

    def __init__(
        self,
        config,
        run_postings: int | None,
        spill_dir: Path | None,
        vocab: dict[str, int] | None = None,
    ) -> None:
        self.split, self.stop, stemmer = tokenizer_steps(config)
        # stem -> token id, by first appearance (or a whole corpus's, for one shard of it)
        self.vocab: dict[str, int] = dict(vocab) if vocab is not None else {}
        vocab = self.vocab

        class WordIds(dict):  # word -> token id, stemming each word once
            def __missing__(self, word: str) -> int:
                stem = stemmer.stemWord(word) if stemmer is not None else word
                tid = vocab.setdefault(stem, len(vocab))
                self[word] = tid
                return tid

        self.word_ids = WordIds()
        self.run_postings = run_postings
        self.spill_dir = spill_dir
        self.doc_len = array("i")
        self.runs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.df = np.zeros(0, dtype=np.int64)
        self._new_buffers()

    def _new_buffers(self) -> None:
        self.cols, self.tfs, self.counts = array("i"), array("i"), array("i")
        self.first_doc = len(self.doc_len)

    def add(self, contents: str) -> None:
        word_ids, stop = self.word_ids, self.stop
        ids = [word_ids[w] for w in self.split(contents.lower()) if w not in stop]
        counts = Counter(ids)
        self.cols.extend(counts.keys())
        self.tfs.extend(counts.values())
        self.counts.append(len(counts))
        self.doc_len.append(len(ids))
        if self.run_postings is not None and len(self.cols) >= self.run_postings:
            self.spill()

    def spill(self) -> None:
        """Sort the buffered postings by token (passages stay in order) into one run."""
        n_vocab = len(self.vocab)
        cols = np.frombuffer(self.cols, dtype=np.int32).copy()
        tfs = np.frombuffer(self.tfs, dtype=np.int32).copy()
        counts = np.frombuffer(self.counts, dtype=np.int32).copy()
        first = self.first_doc
        self._new_buffers()
        if not len(counts):
            return
        rows = np.repeat(np.arange(first, first + len(counts), dtype=np.int32), counts)
        order = np.argsort(cols, kind="stable")
        per_token = np.bincount(cols, minlength=n_vocab)
        ptr = np.zeros(n_vocab + 1, dtype=np.int64)
        np.cumsum(per_token, out=ptr[1:])
        df = np.zeros(n_vocab, dtype=np.int64)
        df[: len(self.df)] = self.df
        self.df = df + per_token
        rows, tfs = rows[order], tfs[order]
        del cols, order
        if self.spill_dir is not None:
            i = len(self.runs)
            paths = [self.spill_dir / f"run{i:05d}-{name}.npy" for name in ("rows", "tfs", "ptr")]
            for path, arr in zip(paths, (rows, tfs, ptr), strict=True):
                np.save(path, arr)
            del rows, tfs
            rows, tfs, ptr = (np.load(path, mmap_mode="r") for path in paths)
        self.runs.append((rows, tfs, ptr))


@dataclass
class CorpusStats:
    """What BM25 scores with, over a whole corpus: its vocabulary (stem -> column, in order of
    first appearance), each stem's document frequency, the passage count and the summed
    length. Collected over consecutive ranges (:func:`collect_stats`) and merged in corpus order
    (:func:`merge_stats`), they equal one pass over the corpus, so a range's index built with
    them (``build_arrays(stats=...)``) holds the same contributions as the whole corpus's."""

    vocab: dict[str, int]
    df: np.ndarray
    n_docs: int
    total_len: int

    @property
    def avg_doc_len(self) -> np.float64:
        """The average passage length exactly as ``doc_len.astype(np.int64).mean()`` gives it
        (an integer sum below 2**53 is exact in float64)."""
        return np.float64(self.total_len) / self.n_docs if self.n_docs else np.float64(0)

    def digest(self) -> str:
        """SHA-256 of the statistics: shards scored with the same statistics share it."""
        h = hashlib.sha256()
        h.update(json.dumps([self.n_docs, self.total_len], separators=(",", ":")).encode())
        h.update("\x00".join(self.vocab).encode("utf-8", "surrogatepass"))
        h.update(np.ascontiguousarray(self.df, dtype="<i8").tobytes())
        return h.hexdigest()


def collect_stats(contents: Iterable[str], config) -> CorpusStats:
    """:class:`CorpusStats` of one range of passages (``"title\\ntext"`` each), tokenised as the
    index build tokenises them."""
    collector = _Collector(config, None, None)
    word_ids, split, stop = collector.word_ids, collector.split, collector.stop
    vocab = collector.vocab
    df: list[int] = []
    n = total = 0
    for text in contents:
        ids = [word_ids[w] for w in split(text.lower()) if w not in stop]
        if len(df) < len(vocab):
            df.extend([0] * (len(vocab) - len(df)))
        for t in set(ids):
            df[t] += 1
        n += 1
        total += len(ids)
    return CorpusStats(vocab, np.asarray(df, dtype=np.int64), n, total)


def merge_stats(parts: Iterable[CorpusStats]) -> CorpusStats:
    """The statistics of consecutive ranges, given in corpus order, as one corpus's: a stem's
    column is its first appearance in the first range that has it."""
    vocab: dict[str, int] = {}
    columns = []
    n = total = 0
    for part in parts:
        columns.append(
            (np.fromiter((vocab.setdefault(s, len(vocab)) for s in part.vocab), np.int64), part)
        )
        n += part.n_docs
        total += part.total_len
    df = np.zeros(len(vocab), dtype=np.int64)
    for cols, part in columns:
        df[cols] += part.df
    return CorpusStats(vocab, df, n, total)


def _scorer(config):
    """A bm25s model with these parameters (its idf method, delta, dtypes, backend)."""
    import bm25s

    return bm25s.BM25(k1=config.k1, b=config.b, method=config.method)


def build_arrays(
    contents: Iterable[str],
    config,
    memory: int | None = None,
    work_dir: Path | None = None,
    allocate: Callable[[str, np.dtype, int], np.ndarray] | None = None,
    stats: CorpusStats | None = None,
) -> dict[str, Any]:
    """bm25s's index arrays for ``contents`` (each passage's ``"title\\ntext"``): ``{"data",
    "indices", "indptr", "num_docs", "vocab", "nonoccurrence", "model"}``.

    With ``memory`` (bytes), postings beyond the budget are spilled as runs under ``work_dir``;
    ``allocate(name, dtype, n)`` makes the ``data`` and ``indices`` arrays (default: in memory;
    out of core: memory-mapped files).

    With ``stats`` (a whole corpus's, :class:`CorpusStats`), ``contents`` is one consecutive
    range of that corpus: its columns are the corpus's vocabulary, and its contributions are
    scored with the corpus's document frequencies, passage count and average length, so they
    are the same float32 values as the whole corpus's index holds for these passages.
    """
    from bm25s.scoring import (
        _build_idf_array,
        _build_nonoccurrence_array,
        _select_idf_scorer,
        _select_tfc_scorer,
    )

    run_postings = None if memory is None else max(1, memory // _COLLECT_BYTES)
    collector = _Collector(
        config,
        run_postings,
        work_dir if memory is not None else None,
        vocab=None if stats is None else stats.vocab,
    )
    for text in contents:
        collector.add(text)
    collector.spill()
    n_vocab = len(collector.vocab)
    n_docs = len(collector.doc_len)
    if n_docs == 0:
        raise ValueError("the corpus has no passages; expected at least one")
    if n_vocab == 0:
        raise ValueError(
            "the corpus has no indexable words (every passage is empty, stop words or one-letter "
            "tokens); check the corpus text"
        )
    model = _scorer(config)
    doc_len = np.frombuffer(collector.doc_len, dtype=np.int32)
    # exactly bm25s's figures: np.array([len(doc) ...]).mean(), its idf and non-occurrence
    avg_doc_len = doc_len.astype(np.int64).mean()
    df = np.zeros(n_vocab, dtype=np.int64)
    df[: len(collector.df)] = collector.df
    n_scored = n_docs
    doc_frequencies = dict(enumerate(df.tolist()))
    if stats is not None:
        if len(stats.vocab) != n_vocab:
            raise ValueError(
                "the passages hold words the corpus statistics do not: they are not a range of "
                "the corpus the statistics were collected from; collect them again"
            )
        avg_doc_len, n_scored = stats.avg_doc_len, stats.n_docs
        doc_frequencies = dict(enumerate(stats.df.tolist()))
    idf_fn = _select_idf_scorer(model.idf_method)
    tfc_fn = _select_tfc_scorer(model.method)
    idf = _build_idf_array(doc_frequencies, n_scored, compute_idf_fn=idf_fn, dtype=model.dtype)
    nonocc = None
    if model.method in model.methods_requiring_nonoccurrence:
        nonocc = _build_nonoccurrence_array(
            doc_frequencies,
            n_scored,
            compute_idf_fn=idf_fn,
            calculate_tfc_fn=tfc_fn,
            l_d=avg_doc_len,
            l_avg=avg_doc_len,
            k1=model.k1,
            b=model.b,
            delta=model.delta,
            dtype=model.dtype,
        )
    del doc_frequencies
    indptr = np.zeros(n_vocab + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    nnz = int(indptr[-1])
    allocate = allocate or (lambda name, dtype, n: np.empty(n, dtype=dtype))
    data = allocate("data", np.dtype(model.dtype), nnz)
    indices = allocate("indices", np.dtype(model.int_dtype), nnz)
    group = nnz if memory is None else max(1, memory // _MERGE_BYTES)
    c0 = 0
    while c0 < n_vocab:
        # the most columns whose postings fit the group (at least one)
        c1 = int(np.searchsorted(indptr, indptr[c0] + group, side="right")) - 1
        c1 = min(max(c1, c0 + 1), n_vocab)
        rows, tfs, cols = [], [], []
        for run_rows, run_tfs, ptr in collector.runs:
            a, b = min(c0, len(ptr) - 1), min(c1, len(ptr) - 1)
            lo, hi = int(ptr[a]), int(ptr[b])
            rows.append(np.asarray(run_rows[lo:hi]))
            tfs.append(np.asarray(run_tfs[lo:hi]))
            cols.append(np.repeat(np.arange(a, b, dtype=np.int64), np.diff(ptr[a : b + 1])))
        cols_all = np.concatenate(cols)
        order = np.argsort(cols_all, kind="stable")  # runs are in passage order
        cols_all = cols_all[order]
        rows_all = np.concatenate(rows)[order]
        tf = np.concatenate(tfs)[order].astype(model.dtype)
        del rows, tfs, cols, order
        # bm25s's formula, element by element as it computes it per passage (see the docs)
        tfc = tfc_fn(
            tf_array=tf,
            l_d=doc_len[rows_all].astype(np.float64),
            l_avg=avg_doc_len,
            k1=model.k1,
            b=model.b,
            delta=model.delta,
        )
        scores = idf[cols_all] * tfc
        if nonocc is not None:
            scores -= nonocc[cols_all]
        lo, hi = int(indptr[c0]), int(indptr[c1])
        data[lo:hi] = scores
        indices[lo:hi] = rows_all
        del tfc, scores, tf, rows_all, cols_all
        c0 = c1
    vocab = collector.vocab
    vocab[""] = n_vocab  # bm25s's empty token, after the last column
    return {
        "data": data,
        "indices": indices,
        "indptr": indptr,
        "doc_len": doc_len.copy(),
        "num_docs": n_docs,
        "vocab": vocab,
        "nonoccurrence": nonocc,
        "model": model,
    }


def bm25s_model(arrays: dict[str, Any]):
    """A ``bm25s.BM25`` holding :func:`build_arrays`'s result (what ``BM25.index`` sets)."""
    model = arrays["model"]
    model.scores = {key: arrays[key] for key in ("data", "indices", "indptr", "num_docs")}
    model.vocab_dict = arrays["vocab"]
    model.nonoccurrence_array = arrays["nonoccurrence"]
    model.unique_token_ids_set = set(model.vocab_dict.values())
    return model


def write_bm25s_metadata(arrays: dict[str, Any], out: Path) -> None:
    """The files ``bm25s.BM25.save`` writes beside the three arrays, byte for byte as it writes
    them: the vocabulary, the parameters and the non-occurrence array."""
    import bm25s
    from bm25s.utils import json_functions

    model = arrays["model"]
    if arrays["nonoccurrence"] is not None:
        np.save(out / "nonoccurrence_array.index.npy", arrays["nonoccurrence"])
    with open(out / "vocab.index.json", "w", encoding="utf-8") as f:
        f.write(json_functions.dumps(arrays["vocab"], ensure_ascii=False))
    params = dict(
        k1=model.k1,
        b=model.b,
        delta=model.delta,
        method=model.method,
        idf_method=model.idf_method,
        dtype=model.dtype,
        int_dtype=model.int_dtype,
        num_docs=arrays["num_docs"],
        version=bm25s.__version__,
        backend=model.backend,
    )
    with open(out / "params.index.json", "w") as f:
        json.dump(params, f, indent=4)


def write_serving_files(
    out: Path,
    data,
    indices,
    indptr,
    id_rank: np.ndarray,
    vocab: dict[str, int],
    doc_len: np.ndarray | None = None,
) -> dict[str, Any]:
    """``serving/``: the tie-break ranks and the pruning bounds, so that a loaded index maps
    them instead of recomputing them (which would read every posting), and the vocabulary as
    mapped arrays (:mod:`rag_gym.retrieval._vocab_numba`), so that a load parses no JSON
    dictionary. Returns the params entry that describes them. Needs numba; without it,
    nothing is written and ``{}``."""
    try:
        from rag_gym.retrieval import _bm25_numba, _vocab_numba
    except ImportError:
        return {}
    blocks = _bm25_numba.compute_blocks(data, indices, indptr)
    folder = out / SERVING
    folder.mkdir()
    by_rank = np.empty_like(id_rank)
    by_rank[id_rank] = np.arange(len(id_rank))
    np.save(folder / "id_rank.npy", id_rank)
    np.save(folder / "by_rank.npy", by_rank)
    for name in BLOCK_ARRAYS:
        np.save(folder / f"{name}.npy", blocks[name])
    np.save(folder / "block_rank.npy", _bm25_numba.block_min_rank(indices, indptr, blocks, id_rank))
    if doc_len is not None:  # the length bounds of the block-max kernel
        np.save(folder / "doc_len.npy", np.asarray(doc_len, dtype=np.int32))
    mapped_vocab = _vocab_numba.write_vocab(folder, vocab)
    return {
        SERVING: {"block": blocks["block"], "prunable": blocks["prunable"], "vocab": mapped_vocab}
    }


def build_bm25_index(
    passages: Iterable[Passage],
    out_dir: str | Path,
    config=None,
    memory: int | str = "2GB",
    corpus_name: str = "corpus",
    force: bool = False,
    source: str = "the corpus",
    stats: CorpusStats | None = None,
    extra_params: dict[str, Any] | None = None,
) -> Path:
    """Write a BM25 index of ``passages`` (read once, in order) to ``out_dir`` within about
    ``memory`` of postings, byte-identical to ``BM25Retriever(corpus).save(out_dir)``.

    The folder is built under a temporary name and renamed into place
    (:func:`rag_gym.retrieval.persist.write_index`): a killed build leaves nothing at
    ``out_dir``, and the next build removes its leftovers. Spilled runs live inside the
    temporary folder and are deleted before the manifest is written.
    """
    config = config or BM25Config()
    budget = parse_memory(memory)

    def write_files(tmp: Path) -> dict[str, Any]:
        work = tmp / ".runs"
        work.mkdir()
        folder = tmp / "bm25s"
        folder.mkdir()
        writer = CorpusFileWriter(tmp)

        def allocate(name: str, dtype: np.dtype, n: int) -> np.ndarray:
            return np.lib.format.open_memmap(
                folder / f"{name}.csc.index.npy", mode="w+", dtype=dtype, shape=(n,)
            )

        try:
            arrays = build_arrays(
                (writer.add(p) for p in passages), config, budget, work, allocate, stats=stats
            )
        except BaseException:
            writer.close()
            raise
        written = writer.finish(source)
        shutil.rmtree(work)
        np.save(folder / "indptr.csc.index.npy", arrays["indptr"])
        write_bm25s_metadata(arrays, folder)
        id_rank = written["id_rank"]
        data, indices = arrays["data"], arrays["indices"]
        data.flush()
        indices.flush()
        serving = write_serving_files(
            tmp, data, indices, arrays["indptr"], id_rank, arrays["vocab"], arrays["doc_len"]
        )
        del data, indices, arrays
        return {
            "params": serving,
            "corpus": {
                "corpus_name": corpus_name,
                "corpus_size": written["size"],
                "corpus_checksum": written["checksum"],
            },
        }

    params = {"config": asdict(config), **(extra_params or {})}
    return write_index(out_dir, "bm25", None, params, write_files, force=force)
