"""BM25 retrieval through `bm25s <https://github.com/xhluca/bm25s>`_ (sparse, eager scoring).

rag-gym does not re-implement BM25's scoring: it tokenises as ``bm25s.tokenize`` does (English
stop words, Snowball English stemmer from PyStemmer) and scores with bm25s's own functions into
bm25s's eager index, which holds every token's score contribution to every passage
(:mod:`rag_gym.retrieval.bm25_build` builds it, in memory or out of core, with the same float32
contributions as ``bm25s.BM25.index``, in the format of :mod:`rag_gym.retrieval.bm25_format`,
where :class:`BM25Config` lives). It adds what an environment needs on top:
batched retrieval that returns passage ids, per-query exclusion of ids, restriction to a candidate
pool, and ties broken by passage id.

Two backends sum those contributions and select the top ``k``, with identical results (the same
float32 scores, the same ids, the same tie-breaks):

* ``"numba"`` (``pip install 'rag-gym[fast]'``): a compiled kernel that reads only what can
  change the top ``k`` (block-max MaxScore), keeps the best ``k`` in a heap ordered by
  (score, id), and runs a batch on ``n_threads`` threads
  (:mod:`rag_gym.retrieval._bm25_numba`). It is compiled, or loaded from numba's cache, when the
  index is built or loaded, never during ``retrieve``.
* ``"numpy"``: bm25s's own ``get_scores_from_ids`` and :func:`~rag_gym.retrieval.base.top_k`
  over the full score array, one query at a time.

``backend="auto"`` (the default) takes numba when it is installed.

>>> from rag_gym.data import Corpus, Passage
>>> corpus = Corpus([Passage("d1", "Ada", "Ada was born in Vell."),
...                  Passage("d2", "Vell", "Vell is a town in Orra."),
...                  Passage("d3", "Orra", "Orra is a country.")])
>>> bm25 = BM25Retriever(corpus)
>>> bm25.retrieve(["where was Ada born"], k=2).ids
[['d1', 'd2']]
>>> bm25.retrieve(["where was Ada born"], k=2, exclude=[["d1"]]).ids
[['d2', 'd3']]
"""

from __future__ import annotations

import itertools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np

from rag_gym._names import unknown_name
from rag_gym.data.mapped import plain_view
from rag_gym.data.types import Corpus
from rag_gym.retrieval.base import (
    BaseRetriever,
    IdColumn,
    RetrievalResult,
    check_k,
    id_ranks,
    positions,
    top_k,
)
from rag_gym.retrieval.bm25_build import bm25s_model, build_arrays, write_serving_files
from rag_gym.retrieval.bm25_format import (
    BLOCK_ARRAYS,
    SERVING,
    SERVING_ARRAYS,
    BM25Config,
    block_pointers,
    tokenizer_steps,
)
from rag_gym.retrieval.persist import read_index, write_index

BACKENDS = ("auto", "numba", "numpy")

# a batch is split across threads only when it reads at least this many postings
_POSTINGS_PER_THREAD = 200_000


def _numba_kernels():
    """The numba kernels module, or ``None`` when numba is not installed (or does not import)."""
    try:
        from rag_gym.retrieval import _bm25_numba
    except ImportError:
        return None
    return _bm25_numba


class BM25Retriever(BaseRetriever):
    """BM25 over a :class:`Corpus` (title and text are indexed together).

    Args:
        corpus: indexed at once when given.
        config: BM25 parameters and tokenisation.
        show_progress: bm25s's progress bars while indexing.
        backend: ``"numba"``, ``"numpy"`` or ``"auto"`` (numba when installed); same results.
            With numba, an index the block-max kernel does not accept (a negative contribution
            or an unsorted posting list, which bm25s never writes) is scored whole, one query
            at a time.
        n_threads: threads for a batch with the numba backend (default: the CPUs this process
            may use). A batch too small to gain from threads runs in the calling thread.
    """

    def __init__(
        self,
        corpus: Corpus | None = None,
        config: BM25Config | None = None,
        show_progress: bool = False,
        backend: str = "auto",
        n_threads: int | None = None,
    ) -> None:
        import bm25s

        if backend not in BACKENDS:
            raise unknown_name("BM25 backend", backend, BACKENDS)
        kernels = _numba_kernels() if backend != "numpy" else None
        if backend == "numba" and kernels is None:
            raise ImportError(
                "backend='numba' needs numba: pip install 'rag-gym[fast]' (or use backend='numpy')"
            )
        if n_threads is not None and (
            not isinstance(n_threads, int) or isinstance(n_threads, bool) or n_threads < 1
        ):
            raise ValueError(f"expected n_threads to be an int >= 1 or None, got {n_threads!r}")
        self._kernels = kernels
        self._prunable = False
        self.backend = "numba" if kernels is not None else "numpy"
        self.n_threads = n_threads or len(os.sched_getaffinity(0))
        self._bm25s = bm25s
        self.config = config or BM25Config()
        self.show_progress = show_progress
        self._lock = threading.Lock()
        self._scratch: list[tuple] = []
        self._doc_len: np.ndarray | None = None
        self._lengths: dict = {}  # the length bounds' tables (_bm25_numba.length_bounds)
        # posting lists are checked when a query first reads them (an index loaded unverified)
        self._lazy_checks = False
        self._pool: ThreadPoolExecutor | None = None
        # bm25s.tokenize's own steps (see tokenize)
        self._split, self._stopwords, self._stemmer = tokenizer_steps(self.config)
        self.corpus = Corpus(name="empty")
        self.model: bm25s.BM25 | None = None
        if corpus is not None:
            self.index(corpus)

    def tokenize(self, texts: list[str]) -> list[list[str]]:
        """Tokens exactly as the index saw them (lower-case, stop words out, stemmed): what
        ``bm25s.tokenize(texts, stopwords, stemmer, return_ids=False)`` returns.

        bm25s's function builds three (disabled) progress bars and a vocabulary per call, which
        costs more than scoring a query; this runs its steps alone: lower-case, its token
        pattern, its stop-word list, PyStemmer. A test holds the two equal.
        """
        split, stop, stemmer = self._split, self._stopwords, self._stemmer
        out = []
        for text in texts:
            tokens = [t for t in split(text.lower()) if t not in stop]
            out.append(stemmer.stemWords(tokens) if stemmer is not None and tokens else tokens)
        return out

    def index(self, corpus: Corpus) -> None:
        """(Re)build the index over ``corpus``."""
        if not isinstance(corpus, Corpus):
            raise TypeError(f"expected a rag_gym.data.Corpus, got {type(corpus).__name__}")
        if len(corpus) == 0:
            raise ValueError(f"expected a non-empty corpus, got {corpus!r}")
        try:
            arrays = build_arrays(corpus.contents(), self.config)
        except ValueError as exc:
            raise ValueError(f"corpus {corpus.name!r}: {exc}") from None
        self._install(bm25s_model(arrays), corpus, doc_len=arrays["doc_len"])

    def _install(
        self,
        model,
        corpus: Corpus,
        blocks: dict | None = None,
        id_rank: np.ndarray | None = None,
        by_rank: np.ndarray | None = None,
        doc_len: np.ndarray | None = None,
    ) -> None:
        self.model = model
        # each passage's BM25 length (the block-max kernel's length bounds); None for an index
        # saved without it
        self._doc_len = None if doc_len is None else plain_view(doc_len)
        self.corpus = corpus
        self._lazy_checks = False
        # rank of each position by passage id: the tie-breaker
        self._id_rank = id_ranks(corpus) if id_rank is None else plain_view(id_rank)
        self._ids = IdColumn(corpus)
        # plain ndarray views of bm25s's arrays (memory maps stay mapped, never copied; numba's
        # dispatcher types a plain ndarray in C, an np.memmap in Python: ~0.8 us an argument)
        self._data = np.asarray(model.scores["data"])
        self._indices = np.asarray(model.scores["indices"])
        self._indptr = np.asarray(model.scores["indptr"])
        with self._lock:
            self._scratch = []
            self._lengths = {}
        if self._kernels is not None:
            kernels = self._kernels
            kernels.warm_up(self._data, self._indices, self._indptr, self._id_rank, self._doc_len)
            if by_rank is None:
                by_rank = np.empty_like(self._id_rank)
                by_rank[self._id_rank] = np.arange(len(corpus))
            self._by_rank = plain_view(by_rank)
            if blocks is None:
                blocks = kernels.compute_blocks(self._data, self._indices, self._indptr)
            self._blocks = {name: plain_view(value) for name, value in blocks.items()}
            blocks = self._blocks
            self._token_max = blocks["token_max"]
            self._prunable = bool(blocks["prunable"])

    def scores(self, query: str) -> np.ndarray:
        """BM25 score of every passage for one query (aligned with ``corpus.ids``)."""
        assert self.model is not None
        return self._scores_from_ids(self._token_ids(self.tokenize([query]))[0])

    def _token_ids(self, tokens: list[list[str]]) -> list[list[int]]:
        # bm25s.BM25.get_tokens_ids per query; a mapped vocabulary looks all of them up at once
        vocab = self.model.vocab_dict
        if not hasattr(vocab, "columns"):  # a dict, not a _vocab_numba.MappedVocab
            return [self.model.get_tokens_ids(toks) for toks in tokens]
        cols = vocab.columns([t for toks in tokens for t in toks]).tolist()
        out, at = [], 0
        for toks in tokens:
            out.append([c for c in cols[at : at + len(toks)] if c >= 0])
            at += len(toks)
        return out

    def _base(self, ids: list[int]) -> np.float32:
        # the score of a passage no query token occurs in (non-zero for bm25l and bm25+ only),
        # computed exactly as bm25s.BM25.get_scores_from_ids does
        nonoccurrence = self.model.nonoccurrence_array
        if not ids or nonoccurrence is None:
            return self._data.dtype.type(0)
        return nonoccurrence[np.asarray(ids, dtype=self.model.int_dtype)].sum()

    def _scores_from_ids(self, ids: list[int]) -> np.ndarray:
        assert self.model is not None
        if not ids:
            return np.zeros(len(self.corpus), dtype=self._data.dtype)
        if self._kernels is None:
            return self.model.get_scores_from_ids(ids)
        scores = np.zeros(len(self.corpus), dtype=self._data.dtype)
        columns = np.asarray(ids, dtype=np.int64)
        self._check_lists(columns)
        self._kernels.full_scores(self._data, self._indices, self._indptr, columns, scores)
        if self.model.nonoccurrence_array is not None:
            scores += self._base(ids)
        return scores

    def searchable(self) -> int:
        if self.model is None:
            raise RuntimeError("the retriever has no index yet; call index(corpus) first")
        return len(self.corpus)

    def _retrieve(self, queries, k, excl, pools) -> RetrievalResult:
        self.searchable()  # an index to search
        tokens = self.tokenize(queries) if queries else []
        token_ids = self._token_ids(tokens)
        n_columns = len(self._indptr) - 1
        if max((max(ids) for ids in token_ids if ids), default=-1) >= n_columns:  # as bm25s
            raise ValueError("a query token maps outside the index's columns; rebuild the index")
        out_ids: list[list[str]] = [[] for _ in queries]
        out_scores: list[list[float]] = [[] for _ in queries]
        todo = range(len(queries))
        if self._kernels is not None and self._prunable:
            free = [i for i in todo if pools[i] is None]
            self._numba_top_k(free, token_ids, excl, k, out_ids, out_scores)
            todo = [i for i in todo if pools[i] is not None]
        for i in todo:
            ex, pool = excl[i], pools[i]
            scores = self._scores_from_ids(token_ids[i])
            if pool is not None:
                pos = positions(self.corpus, pool)
                check_k(k, len(pos), "the candidate pool")
                sub = scores[pos].astype(np.float64)
                if ex:
                    sub[np.isin(pos, positions(self.corpus, ex, strict=False))] = -np.inf
                picked = pos[top_k(sub, k, self._id_rank[pos])]
            else:
                if ex:
                    scores = scores.astype(np.float64)
                    scores[positions(self.corpus, ex, strict=False)] = -np.inf
                picked = top_k(scores, k, self._id_rank)
            out_ids[i] = self._ids.take(picked)
            out_scores[i] = scores[picked].astype(float).tolist()
        return RetrievalResult(out_ids, out_scores)

    def _numba_top_k(self, rows, token_ids, excl, k, out_ids, out_scores) -> None:
        """Top-``k`` of the queries ``rows`` (no pool) through the block-max kernel, on threads."""
        if not rows:
            return
        n = len(rows)
        token_ptr = np.fromiter(  # np.cumsum costs more than the kernel on a query or two
            itertools.accumulate((len(token_ids[i]) for i in rows), initial=0),
            dtype=np.int64,
            count=n + 1,
        )
        tokens = np.fromiter(
            (t for i in rows for t in token_ids[i]), dtype=np.int64, count=int(token_ptr[-1])
        )
        # BM25 proper: a passage without the query's tokens scores 0
        if self.model.nonoccurrence_array is None:
            base = np.zeros(n, dtype=self._data.dtype)
        else:
            base = np.array([self._base(token_ids[i]) for i in rows], dtype=self._data.dtype)
        excluded_ptr = np.zeros(n + 1, dtype=np.int64)
        if any(excl[i] for i in rows):
            banned = [
                positions(self.corpus, excl[i], strict=False) if excl[i] else np.zeros(0, np.int64)
                for i in rows
            ]
            np.cumsum([len(b) for b in banned], out=excluded_ptr[1:])
            excluded = np.concatenate(banned)
        else:
            excluded = np.zeros(0, np.int64)
        self._check_lists(tokens)
        limits = self._length_bounds(tokens, token_ptr)
        out_pos = np.empty((n, k), dtype=np.int64)
        out_val = np.empty((n, k), dtype=self._data.dtype)
        out_n = np.empty(n, dtype=np.int64)

        kernels = self._kernels
        # plain tuples in the kernels' field order: numba types them in C (see Postings)
        index = tuple(
            kernels.Postings(
                self._data,
                self._indices,
                self._indptr,
                self._token_max,
                self._id_rank,
                self._by_rank,
            )
        )
        blocks = tuple(self._block_arrays())
        limits = tuple(limits)

        def run(lo: int, hi: int) -> None:
            scratch = self._take_scratch()
            queries = (
                tokens,
                token_ptr[lo : hi + 1],
                base[lo:hi],
                excluded,
                excluded_ptr[lo : hi + 1],
            )
            out = (out_pos[lo:hi], out_val[lo:hi], out_n[lo:hi])  # a TopK's fields
            try:
                kernels.top_k_blockmax(index, blocks, limits, queries, k, *scratch, out)
            finally:
                with self._lock:
                    self._scratch.append(scratch)

        # split by work (postings read), not by query count, and only when it pays
        postings = self._indptr[tokens + 1] - self._indptr[tokens]
        total = int(postings.sum())
        parts = max(1, min(self.n_threads, n, total // _POSTINGS_PER_THREAD))
        if parts == 1:
            run(0, n)
        else:
            done = np.concatenate([[0], np.cumsum(postings)])[token_ptr]  # work before query q
            cuts = np.searchsorted(done, np.arange(1, parts) * total / parts).tolist()
            bounds = sorted({0, n, *cuts})
            if self._pool is None:
                with self._lock:
                    if self._pool is None:
                        self._pool = ThreadPoolExecutor(self.n_threads, "rag-gym-bm25")
            # the first part runs on this thread while the pool runs the others
            futures = [self._pool.submit(run, lo, hi) for lo, hi in itertools.pairwise(bounds[1:])]
            run(bounds[0], bounds[1])
            for future in futures:
                future.result()
        if (out_n == k).all():  # the usual case: every row full, converted in one go
            for i, ids, scores in zip(
                rows, self._ids.take(out_pos), out_val.astype(float).tolist(), strict=True
            ):
                out_ids[i], out_scores[i] = ids, scores
            return
        for row, i in enumerate(rows):
            m = int(out_n[row])
            out_ids[i] = self._ids.take(out_pos[row, :m])
            out_scores[i] = out_val[row, :m].astype(float).tolist()

    def _block_arrays(self):
        """The block-max kernel's block arrays (a ``Blocks``), with each block's smallest id rank
        (the kernel's exact tie skip; stored in an index saved since it existed, else computed
        once from every posting and kept) and each token's best block (where its head start
        begins; :meth:`_check_lists` fills it)."""
        self._block_ranks(self._blocks)
        return self._kernels.block_arrays(self._blocks)

    def _block_ranks(self, blocks: dict) -> None:
        """Compute ``blocks["block_rank"]`` once, where the index was saved without it."""
        if blocks.get("block_rank") is None:
            blocks["block_rank"] = self._kernels.block_min_rank(
                self._indices, self._indptr, blocks, self._id_rank
            )

    def _check_lists(self, tokens: np.ndarray) -> None:
        """Check the posting lists of ``tokens`` (columns) that no query has read yet, before a
        kernel reads them (:func:`~rag_gym.retrieval._bm25_numba.check_lists`): a damaged list
        is a ``ValueError`` naming the file, never a read outside an array."""
        blocks = self._blocks
        if not self._lazy_checks:  # every list is sound: built here, or checked at load
            if "best_block" not in blocks:
                with self._lock:
                    if "best_block" not in blocks:
                        blocks["best_block"] = self._kernels.best_blocks(blocks)
            return
        with self._lock:
            if "checked" not in blocks:  # the lists found sound, and their best blocks
                n_tokens = len(self._indptr) - 1
                blocks["best_block"] = np.empty(n_tokens, dtype=np.int64)
                blocks["checked"] = np.zeros(n_tokens, dtype=np.uint8)
            bad = self._kernels.check_lists(
                tokens, self._indptr, self._indices, len(self.corpus), blocks, blocks["checked"]
            )
        if bad >= 0:
            raise ValueError(
                f"the posting list of token column {bad} is damaged (indices.csc.index.npy, "
                "indptr.csc.index.npy or serving/block_*.npy point outside their arrays); "
                "rebuild the index"
            )

    def _length_bounds(self, tokens: np.ndarray, token_ptr: np.ndarray) -> tuple:
        """The block-max kernel's length- and pair-bound arguments for the queries
        ``tokens``/``token_ptr`` (:func:`~rag_gym.retrieval._bm25_numba.length_bounds` and
        :func:`~rag_gym.retrieval._bm25_numba.pair_bounds`: each list's table and block
        lengths, and each pair of lists' bounds, are computed the first time a query reads
        them, with each list's superblocks); none for an index without passage lengths."""
        kernels = self._kernels
        if self._doc_len is None:
            return kernels.no_length_bounds(self._data.dtype)
        arrays = (self._data, self._indices, self._indptr)
        self._block_ranks(self._blocks)  # the block ranks, which the superblocks keep
        with self._lock:
            minlen, rows, table = kernels.length_bounds(
                tokens, *arrays, self._blocks, self._doc_len, self._lengths
            )
            pairs = kernels.pair_bounds(tokens, token_ptr, rows, *arrays, self._lengths)
            supers = kernels.super_blocks(tokens, rows, self._blocks, self._lengths)
        return kernels.Bounds(self._doc_len, minlen, rows, table, pairs, *supers)

    def _take_scratch(self) -> tuple:
        # one scratch set per concurrent batch part, kept for the next call (no re-zeroing)
        n = len(self.corpus)
        with self._lock:
            while self._scratch:
                scratch = self._scratch.pop()
                if scratch[0].shape[0] == n:  # not left over from a previous index
                    return scratch
        return self._kernels.new_scratch(n)

    # ---- persistence --------------------------------------------------------------------------
    def save(self, out_dir: str | Path, force: bool = False) -> Path:
        """Write the index to ``out_dir``: ``params.json`` (with every file's checksum),
        ``corpus.jsonl`` and bm25s's arrays (numpy and JSON, no pickle), atomically
        (:mod:`rag_gym.retrieval.persist`). An existing ``out_dir`` that is not a rag-gym index
        (nor empty) is a ``FileExistsError`` unless ``force``."""
        self.searchable()  # an index to save
        model = self.model

        def write_files(tmp: Path) -> dict:
            model.save(str(tmp / "bm25s"), show_progress=False)
            serving = write_serving_files(
                tmp,
                self._data,
                self._indices,
                self._indptr,
                np.asarray(self._id_rank),
                dict(model.vocab_dict),
                self._doc_len,
            )
            return {"params": serving}

        return write_index(
            out_dir, "bm25", self.corpus, {"config": asdict(self.config)}, write_files, force=force
        )

    @classmethod
    def load(
        cls,
        in_dir: str | Path,
        mmap: bool = True,
        backend: str = "auto",
        n_threads: int | None = None,
        verify: bool = False,
    ) -> BM25Retriever:
        """Load an index written by :meth:`save`; ``mmap=True`` maps the arrays read-only, so
        processes that load the same directory share its memory through the page cache.
        ``backend`` and ``n_threads`` are as for the constructor.

        Every file is checked against ``params.json``: its size and a checksum of sampled
        blocks (small files whole), or its full SHA-256 with ``verify=True``. A directory that
        is not a rag-gym BM25 index, a file missing, replaced or damaged, a corpus that does not
        match, or arrays that are inconsistent raise ``ValueError`` naming the file.

        Without ``verify`` (and with the numba backend) nothing is read whole: shapes and ends
        are checked here, and each posting list when a query first reads it, so that a damaged
        list is a ``ValueError`` at that query, never a read outside an array. ``verify=True``
        checks every value here. The vocabulary is mapped from ``serving/`` where the index
        has it (docs/retrieval-scale.md).
        """
        d = Path(in_dir)
        params, corpus = read_index(d, "bm25", verify=verify)
        try:
            config = BM25Config(**params["config"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{d / 'params.json'}: bad BM25 config ({exc}); rebuild") from None
        retriever = cls(config=config, backend=backend, n_threads=n_threads)
        # with the numba backend, a vocabulary stored as arrays is mapped, not parsed
        mapped_vocab = retriever._kernels is not None and bool(
            (params.get(SERVING) or {}).get("vocab")
        )
        try:
            model = retriever._bm25s.BM25.load(
                str(d / "bm25s"), mmap=mmap, load_vocab=not mapped_vocab
            )
            if mapped_vocab:
                from rag_gym.retrieval._vocab_numba import MappedVocab

                model.vocab_dict = MappedVocab.load(d / SERVING, mmap=mmap)
                model.unique_token_ids_set = range(len(model.vocab_dict))
        except (OSError, ValueError, KeyError, TypeError, IndexError, RecursionError) as exc:
            raise ValueError(
                f"{d / 'bm25s'}: cannot load the BM25 arrays ({exc}); rebuild the index"
            ) from None
        if model.scores["num_docs"] != len(corpus):
            raise ValueError(
                f"{d / 'bm25s'} indexes {model.scores['num_docs']} documents, the corpus has {len(corpus)}"
            )
        # the numba kernels check each posting list before they first read it; numpy's
        # indexing checks its own bounds, so a full read of every posting happens only there
        # and with ``verify``
        problem = _check_arrays(model, full=verify or retriever._kernels is None)
        if problem:
            raise ValueError(f"{d / 'bm25s'}: {problem}; rebuild the index")
        serving = {}
        if retriever._kernels is not None:
            serving = _load_serving(d, params, model, len(corpus), mmap, full=verify)
        retriever._install(model, corpus, **serving)
        retriever._lazy_checks = not verify
        return retriever

    def __repr__(self) -> str:
        return (
            f"BM25Retriever(corpus={self.corpus!r}, config={self.config}, backend={self.backend!r})"
        )


def _check_arrays(model, full: bool = True) -> str | None:
    """What is wrong with a loaded bm25s index's arrays, or ``None``: a file edited by hand must
    not make a compiled kernel read or write outside its arrays. Shapes and ends are checked
    always; every posting and pointer (a read of the whole index) only when ``full``."""
    data, indices, indptr = (model.scores[key] for key in ("data", "indices", "indptr"))
    n_docs = model.scores["num_docs"]
    if data.ndim != 1 or indices.ndim != 1 or indptr.ndim != 1 or len(indptr) < 1:
        return "data.csc.index.npy, indices.csc.index.npy and indptr.csc.index.npy must be 1-D"
    if len(data) != len(indices) or indptr[0] != 0 or indptr[-1] != len(data):
        return (
            f"indptr.csc.index.npy spans {int(indptr[-1]) - int(indptr[0])} entries, "
            f"data.csc.index.npy has {len(data)} and indices.csc.index.npy {len(indices)}"
        )
    if not full:
        return None
    if (np.diff(indptr) < 0).any():
        return "indptr.csc.index.npy is not non-decreasing"
    if len(indices) and (indices.min() < 0 or indices.max() >= n_docs):
        return f"indices.csc.index.npy holds passage numbers outside [0, {n_docs})"
    if hasattr(model.vocab_dict, "columns"):
        # a mapped vocabulary checks each column it reads, and retrieve checks every query
        # token's column against the index: nothing to read whole here
        return None
    # bm25s gives the empty token the id after the last column
    ids = [i for token, i in model.vocab_dict.items() if token != ""]
    if ids and (min(ids) < 0 or max(ids) >= len(indptr) - 1):
        return f"vocab.index.json maps tokens outside the {len(indptr) - 1} columns of the index"
    return None


def _load_serving(d: Path, params: dict, model, n_docs: int, mmap: bool, full: bool) -> dict:
    """``serving/``'s arrays (mapped with ``mmap``), checked so that no kernel can read outside
    an array; ``{}`` for an index without them (they are then computed from the postings).

    Shapes are checked always; the values (a read of every array) only when ``full``. Without
    it, each posting list's blocks are checked the first time a query reads them
    (:meth:`BM25Retriever._check_lists`), and ranks are only ever compared, never used to
    index an array."""
    info = params.get(SERVING)
    if not info:
        return {}
    folder = d / SERVING
    mode = "r" if mmap else None
    try:
        arrays = {
            name: np.load(folder / f"{name}.npy", mmap_mode=mode, allow_pickle=False)
            for name in SERVING_ARRAYS
        }
        block = int(info["block"])
        prunable = bool(info["prunable"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{folder}: cannot load the serving arrays ({exc}); rebuild") from None
    indptr = np.asarray(model.scores["indptr"])
    n_tok = len(indptr) - 1
    problem = None
    if any(arr.ndim != 1 for arr in arrays.values()):
        problem = "every array must be 1-D"
    elif block < 1:
        problem = f"blocks of {block} postings"
    elif len(arrays["id_rank"]) != n_docs or len(arrays["by_rank"]) != n_docs:
        problem = f"id_rank.npy and by_rank.npy must hold {n_docs} ranks"
    elif len(arrays["block_ptr"]) != n_tok + 1 or int(arrays["block_ptr"][0]) != 0:
        problem = f"block_ptr.npy must hold {n_tok + 1} block pointers from 0"
    elif len(arrays["token_max"]) != n_tok:
        problem = f"token_max.npy must hold {n_tok} bounds"
    elif not len(arrays["block_max"]) == len(arrays["block_last"]) == int(arrays["block_ptr"][-1]):
        problem = "block_max.npy and block_last.npy must hold one entry per block"
    elif not full:
        pass
    elif not np.array_equal(arrays["block_ptr"], block_pointers(indptr, block)):
        problem = f"block_ptr.npy does not match blocks of {block} postings"
    elif n_docs and (arrays["by_rank"].min() < 0 or arrays["by_rank"].max() >= n_docs):
        problem = f"by_rank.npy holds passage numbers outside [0, {n_docs})"
    elif not np.array_equal(np.asarray(arrays["id_rank"])[arrays["by_rank"]], np.arange(n_docs)):
        problem = "id_rank.npy and by_rank.npy are not inverse permutations"
    elif len(arrays["block_last"]) and (
        arrays["block_last"].min() < 0 or arrays["block_last"].max() >= n_docs
    ):
        problem = f"block_last.npy holds passage numbers outside [0, {n_docs})"
    if problem:
        raise ValueError(f"{folder}: {problem}; rebuild the index")
    blocks = {
        "block": block,
        "prunable": prunable,
        **{name: arrays[name] for name in BLOCK_ARRAYS},
    }
    rank_file = folder / "block_rank.npy"
    if rank_file.is_file():  # absent from indexes saved before it existed: then computed
        try:
            rank = np.load(rank_file, mmap_mode=mode, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{folder}: cannot load block_rank.npy ({exc}); rebuild") from None
        if rank.ndim != 1 or len(rank) != len(arrays["block_max"]):
            raise ValueError(f"{folder}: block_rank.npy must hold one rank per block; rebuild")
        blocks["block_rank"] = rank
    out = {"blocks": blocks, "id_rank": arrays["id_rank"], "by_rank": arrays["by_rank"]}
    len_file = folder / "doc_len.npy"
    if len_file.is_file():  # absent from indexes saved before it existed: no length bounds
        try:
            doc_len = np.load(len_file, mmap_mode=mode, allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{folder}: cannot load doc_len.npy ({exc}); rebuild") from None
        if doc_len.ndim != 1 or len(doc_len) != n_docs or doc_len.dtype != np.int32:
            raise ValueError(f"{folder}: doc_len.npy must hold {n_docs} int32 lengths; rebuild")
        out["doc_len"] = doc_len
    return out
