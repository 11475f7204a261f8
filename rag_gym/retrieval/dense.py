"""Dense retrieval: a sentence-transformers encoder and a FAISS index.

The default encoder is the embedded all-MiniLM-L6-v2 (offline); any model id or local path
works, with query and passage prefixes for e5/bge-style models (``query_prefix="query: "``,
``passage_prefix="passage: "``). Embeddings are L2-normalised, so inner product is cosine. The
index is exact inner product by default (``index="flat"``), or IVF (``"ivf"``, ``nlist`` lists,
``nprobe`` probed) or HNSW (``"hnsw"``); ``fp16=True`` stores the embeddings kept for
``within`` scoring in float16. GPU FAISS and GPU encoding are used when present, never required.
Ties in score are broken by passage id, as for every rag-gym retriever.

Needs ``pip install torch==2.13.0 'rag-gym[dense]'``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

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
from rag_gym.retrieval.persist import read_index, write_index


def default_query_prefix(model: str | None) -> str:
    """The query prefix a model was trained with, by its name: ``"query: "`` for e5 (Search-R1's
    and FlashRAG's ``e5_Flat.index``), BGE's English instruction for bge, else none.

    >>> default_query_prefix("intfloat/e5-base-v2"), default_query_prefix(None)
    ('query: ', '')
    """
    name = (model or "").lower().replace("\\", "/").rsplit("/", 1)[-1]
    if name.startswith("e5") or "-e5" in name or "_e5" in name:
        return "query: "
    if name.startswith("bge") and "m3" not in name:
        return "Represent this sentence for searching relevant passages: "
    return ""


@dataclass(frozen=True)
class DenseConfig:
    """Dense retriever options."""

    model: str | None = None
    """Encoder id or path; ``None`` is the embedded all-MiniLM-L6-v2."""
    index: str = "flat"
    """``"flat"`` (exact inner product), ``"ivf"`` or ``"hnsw"``."""
    nlist: int = 256
    """IVF lists (``index="ivf"``)."""
    nprobe: int = 16
    """IVF lists probed per query."""
    hnsw_m: int = 32
    """HNSW neighbours per node."""
    fp16: bool = False
    """Keep the passage embeddings in float16."""
    query_prefix: str = ""
    """Prepended to every query (e5: ``"query: "``)."""
    passage_prefix: str = ""
    """Prepended to every passage (e5: ``"passage: "``)."""
    batch_size: int = 64
    """Texts per encoder forward pass."""

    def __post_init__(self) -> None:
        if self.index not in ("flat", "ivf", "hnsw"):
            raise ValueError(f"expected index 'flat', 'ivf' or 'hnsw', got {self.index!r}")
        if self.nlist < 1 or self.nprobe < 1 or self.hnsw_m < 2 or self.batch_size < 1:
            raise ValueError("expected nlist >= 1, nprobe >= 1, hnsw_m >= 2 and batch_size >= 1")


def exact_scores(vectors: np.ndarray, query: np.ndarray) -> np.ndarray:
    """Inner products of ``vectors`` (rows) with ``query``, in float64: each row's products are
    exact and summed by numpy's pairwise sum over that row alone, so a passage's score does not
    depend on which other passages, or how many, are scored with it (FAISS's and BLAS's float32
    products change in the last bits with the matrix shapes)."""
    return (np.asarray(vectors, dtype=np.float64) * np.asarray(query, dtype=np.float64)).sum(axis=1)


class DenseRetriever(BaseRetriever):
    """Embeddings + FAISS over a :class:`Corpus` (title and text encoded together).

    FAISS finds each query's candidates (``k`` plus the excluded ids plus a margin of 16); a
    rag-gym index then scores them exactly (:func:`exact_scores`, in float64), so a passage's
    score is the same in any batch of queries and on any shard of the corpus. An index served
    from a FAISS file alone (:meth:`from_faiss`) keeps FAISS's scores."""

    def __init__(
        self,
        corpus: Corpus | None = None,
        config: DenseConfig | None = None,
        encoder: Callable[[list[str]], np.ndarray] | None = None,
        show_progress: bool = False,
    ) -> None:
        try:
            import faiss
        except ImportError as exc:
            raise ImportError(
                "dense retrieval needs faiss: pip install torch==2.13.0 'rag-gym[dense]'"
            ) from exc
        self._faiss = faiss
        self.config = config or DenseConfig()
        self.show_progress = show_progress
        if encoder is None:
            from rag_gym.retrieval.encoders import SentenceEncoder, default_encoder

            encoder = (
                default_encoder()
                if self.config.model is None
                else SentenceEncoder(self.config.model, batch_size=self.config.batch_size)
            )
        self.encoder = encoder
        self.corpus = Corpus(name="empty")
        self._index = None
        if corpus is not None:
            self.index(corpus)

    def _encode(self, texts: list[str], prefix: str) -> np.ndarray:
        emb = np.asarray(self.encoder([prefix + t for t in texts]), dtype=np.float32)
        norms = np.linalg.norm(emb, axis=1, keepdims=True)
        return emb / np.maximum(norms, 1e-12)

    def index(self, corpus: Corpus) -> None:
        if not isinstance(corpus, Corpus):
            raise TypeError(f"expected a rag_gym.data.Corpus, got {type(corpus).__name__}")
        if len(corpus) == 0:
            raise ValueError(f"expected a non-empty corpus, got {corpus!r}")
        texts = corpus.contents()
        chunks = []
        step = max(self.config.batch_size * 16, 1)
        for start in range(0, len(texts), step):
            chunks.append(self._encode(texts[start : start + step], self.config.passage_prefix))
        self._install(np.concatenate(chunks), corpus)

    def _install(self, embeddings: np.ndarray, corpus: Corpus, faiss_index=None) -> None:
        faiss = self._faiss
        dim = embeddings.shape[1]
        if faiss_index is None:
            cfg = self.config
            if cfg.index == "flat":
                faiss_index = faiss.IndexFlatIP(dim)
            elif cfg.index == "hnsw":
                faiss_index = faiss.IndexHNSWFlat(dim, cfg.hnsw_m, faiss.METRIC_INNER_PRODUCT)
            else:
                quantizer = faiss.IndexFlatIP(dim)
                faiss_index = faiss.IndexIVFFlat(
                    quantizer, dim, min(cfg.nlist, len(corpus)), faiss.METRIC_INNER_PRODUCT
                )
                faiss_index.train(embeddings.astype(np.float32))
            faiss_index.add(embeddings.astype(np.float32))
        if self.config.index == "ivf":
            faiss_index.nprobe = self.config.nprobe
        self._index = faiss_index
        self.embeddings = embeddings.astype(np.float16 if self.config.fp16 else np.float32)
        self.corpus = corpus
        self._id_rank = id_ranks(corpus)
        self._ids = IdColumn(corpus)

    def searchable(self) -> int:
        if self._index is None:
            raise RuntimeError("the retriever has no index yet; call index(corpus) first")
        return len(self.corpus)

    def _retrieve(self, queries, k, excl, pools) -> RetrievalResult:
        self.searchable()  # an index to search
        q = (
            self._encode(queries, self.config.query_prefix)
            if queries
            else np.zeros((0, 1), np.float32)
        )
        out_ids, out_scores = [], []
        # one FAISS search for the queries without a pool, over k + excluded + a tie margin
        free = [i for i, p in enumerate(pools) if p is None]
        found: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        if free:
            extra = max((len(list(excl[i] or [])) for i in free), default=0)
            depth = min(len(self.corpus), k + extra + 16)
            scores, idx = self._index.search(q[free], depth)
            for row, i in enumerate(free):
                found[i] = (scores[row], idx[row])
        index_of = self.corpus._index
        for i in range(len(queries)):
            banned = {index_of[x] for x in (excl[i] or []) if x in index_of}
            if pools[i] is not None:
                pos = positions(self.corpus, pools[i])
                check_k(k, len(pos), "the candidate pool")
                sub = exact_scores(self._pool_vectors(pos), q[i])
                if banned:
                    sub[np.isin(pos, list(banned))] = -np.inf
                picked = pos[top_k(sub, k, self._id_rank[pos])]
                score_of = dict(zip(pos.tolist(), sub.tolist(), strict=True))
                scores_i = [score_of[p] for p in picked.tolist()]
            else:
                s, ix = found[i]
                if self.embeddings is not None:  # FAISS finds, the exact score ranks
                    s = exact_scores(self.embeddings[np.maximum(ix, 0)], q[i])
                keep = [
                    (float(sc), int(p))
                    for sc, p in zip(s, ix, strict=True)
                    if p >= 0 and int(p) not in banned
                ]
                keep.sort(key=lambda t: (-t[0], self._id_rank[t[1]]))
                picked = np.array([p for _, p in keep[:k]], dtype=np.int64)
                scores_i = [sc for sc, _ in keep[:k]]
            out_ids.append(self._ids.take(picked))
            out_scores.append(scores_i)
        return RetrievalResult(out_ids, out_scores)

    def _pool_vectors(self, pos: np.ndarray) -> np.ndarray:
        """The passage vectors at corpus positions ``pos`` (for ``within`` scoring)."""
        if self.embeddings is not None:
            return self.embeddings[pos].astype(np.float32)
        try:  # an index loaded by from_faiss: its own vectors (flat and HNSW-flat give them)
            return self._index.reconstruct_batch(pos.astype(np.int64))
        except Exception as exc:
            raise ValueError(
                f"within= needs the passage vectors, which this {type(self._index).__name__} "
                f"cannot give back ({str(exc)[:80]}); use a flat or HNSW index for pool mode"
            ) from None

    # ---- prebuilt FAISS indexes (FlashRAG, Search-R1) -------------------------------------------
    @classmethod
    def from_faiss(
        cls,
        index_path: str | Path,
        corpus_jsonl: str | Path,
        encoder: str | Callable[[list[str]], np.ndarray] | None = None,
        *,
        query_prefix: str | None = None,
        mmap: bool = True,
        corpus: Corpus | None = None,
        nprobe: int | None = None,
        batch_size: int = 64,
    ) -> DenseRetriever:
        """Serve a FAISS index written by ``faiss.write_index`` over its ``{id, contents}`` corpus.

        This is how FlashRAG's index builder and Search-R1 (``e5_Flat.index`` over
        ``wiki-18.jsonl``) store theirs: row ``i`` of the corpus file is vector ``i`` of the
        index. The index is memory-mapped where FAISS can (``IO_FLAG_MMAP_IFC``: flat indexes,
        whose vectors then stay on disk until read; others are read into memory).

        >>> r = DenseRetriever.from_faiss("e5_Flat.index", "wiki-18.jsonl", "intfloat/e5-base-v2")  # doctest: +SKIP

        Args:
            index_path: the FAISS index file (inner product, as both projects build them).
            corpus_jsonl: the corpus, one passage per vector, in index order.
            encoder: the query encoder: a sentence-transformers model id or path, a callable
                ``texts -> (n, d) array``, or ``None`` for the embedded all-MiniLM-L6-v2.
            query_prefix: prepended to every query; default by model name: ``"query: "`` for
                e5, BGE's ``"Represent this sentence for searching relevant passages: "`` for
                bge, none otherwise.
            mmap: memory-map the index where FAISS can.
            corpus: the corpus already loaded (then ``corpus_jsonl`` only names it).
            nprobe: lists probed per query, for an IVF index (default: the file's).

        Raises:
            ValueError: the corpus size is not the index's ``ntotal``, the encoder's dimension
                is not the index's ``d``, the index is not inner product, or the file is not a
                FAISS index.
        """
        import faiss

        index_path = Path(index_path)
        if not index_path.is_file():
            raise FileNotFoundError(f"{index_path}: no such FAISS index file")
        if corpus is None:
            corpus = Corpus.from_jsonl(corpus_jsonl)
        flags = 0
        if mmap:
            flags = getattr(faiss, "IO_FLAG_MMAP_IFC", faiss.IO_FLAG_MMAP) | faiss.IO_FLAG_READ_ONLY
        try:
            faiss_index = faiss.read_index(str(index_path), flags)
        except RuntimeError as exc:
            raise ValueError(
                f"{index_path}: cannot read a FAISS index ({str(exc).strip()[:160]}); expected "
                "a file written by faiss.write_index"
            ) from None
        if faiss_index.ntotal != len(corpus):
            raise ValueError(
                f"{index_path} holds {faiss_index.ntotal} vectors but {corpus_jsonl} has "
                f"{len(corpus)} passages: expected one passage per vector, in index order; give "
                "the corpus file the index was built from"
            )
        if faiss_index.metric_type != faiss.METRIC_INNER_PRODUCT:
            raise ValueError(
                f"{index_path}: expected an inner-product index (faiss.METRIC_INNER_PRODUCT, as "
                f"FlashRAG and Search-R1 build them), got metric {faiss_index.metric_type}"
            )
        name = encoder if isinstance(encoder, str) else None
        if query_prefix is None:
            query_prefix = default_query_prefix(name)
        kind = (
            "ivf"
            if isinstance(faiss_index, faiss.IndexIVF)
            else "hnsw"
            if isinstance(faiss_index, faiss.IndexHNSW)
            else "flat"
        )
        config = DenseConfig(
            model=name, index=kind, query_prefix=query_prefix, batch_size=batch_size
        )
        retriever = cls(config=config, encoder=None if name else encoder)
        dim = retriever._encode(["dimension check"], query_prefix).shape[1]
        if dim != faiss_index.d:
            raise ValueError(
                f"the encoder {name or 'given'} gives {dim}-dimensional vectors, the index "
                f"{index_path} holds {faiss_index.d}-dimensional ones; give the encoder that "
                "built the index"
            )
        if nprobe is not None and hasattr(faiss_index, "nprobe"):
            faiss_index.nprobe = nprobe
        retriever._index = faiss_index
        retriever.embeddings = None  # within= reads the index's own vectors
        retriever.corpus = corpus
        retriever._id_rank = id_ranks(corpus)
        retriever._ids = IdColumn(corpus)
        return retriever

    # ---- persistence ----------------------------------------------------------------------------
    def save(self, out_dir: str | Path, force: bool = False) -> Path:
        """Write ``params.json`` (with every file's checksum and the encoder's embeddings of
        :data:`ENCODER_PROBE`), ``corpus.jsonl``, ``embeddings.npy`` and ``faiss.index`` (FAISS's
        own binary format; no pickle), atomically (:mod:`rag_gym.retrieval.persist`). An
        existing ``out_dir`` that is not a rag-gym index (nor empty) is a ``FileExistsError``
        unless ``force``."""
        self.searchable()  # an index to save
        if self.embeddings is None:
            raise ValueError(
                "a retriever made by from_faiss serves its index file as it is; save() writes "
                "rag-gym's own folder: build one with rag-gym index build --kind dense"
            )

        def files(tmp: Path) -> None:
            np.save(tmp / "embeddings.npy", self.embeddings, allow_pickle=False)
            self._faiss.write_index(self._index, str(tmp / "faiss.index"))

        params = {
            "config": asdict(self.config),
            "dim": int(self.embeddings.shape[1]),
            "encoder": self.config.model or "sentence-transformers/all-MiniLM-L6-v2 (embedded)",
            "encoder_probe": np.round(
                self._encode(list(ENCODER_PROBE), self.config.passage_prefix), 6
            ).tolist(),
        }
        return write_index(out_dir, "dense", self.corpus, params, files, force=force)

    @classmethod
    def load(
        cls,
        in_dir: str | Path,
        encoder: Callable | None = None,
        verify: bool = False,
        check_encoder: bool = True,
    ) -> DenseRetriever:
        """Load an index written by :meth:`save`; a mismatched or damaged folder raises
        ``ValueError`` naming the file (every file's size and sampled checksum are checked,
        the full SHA-256 with ``verify=True``).

        The query encoder is the one that built the index (``params.json`` names it), or
        ``encoder``. Either must give the embeddings of :data:`ENCODER_PROBE` that the index
        recorded, else ``ValueError``: another encoder ranks silently wrong. To query with
        another encoder on purpose, pass it and ``check_encoder=False``.
        """
        d = Path(in_dir)
        params, corpus = read_index(d, "dense", verify=verify)
        try:
            embeddings = np.load(d / "embeddings.npy", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"{d / 'embeddings.npy'}: cannot load the embeddings ({exc}); rebuild the index"
            ) from None
        if embeddings.shape != (len(corpus), params.get("dim")):
            raise ValueError(
                f"{d / 'embeddings.npy'} has shape {embeddings.shape}, expected "
                f"({len(corpus)}, {params.get('dim')}); rebuild the index"
            )
        try:
            config = DenseConfig(**params["config"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{d / 'params.json'}: bad dense config ({exc}); rebuild") from None
        retriever = cls(config=config, encoder=encoder)
        if check_encoder:
            _check_encoder(retriever, params, d / "params.json", given=encoder is not None)
        try:
            faiss_index = retriever._faiss.read_index(str(d / "faiss.index"))
        except RuntimeError as exc:
            raise ValueError(
                f"{d / 'faiss.index'}: cannot read the FAISS index ({str(exc)[:120]}); rebuild it"
            ) from None
        if faiss_index.ntotal != len(corpus):
            raise ValueError(
                f"{d / 'faiss.index'} holds {faiss_index.ntotal} vectors, the corpus has {len(corpus)}"
            )
        retriever._install(embeddings.astype(np.float32), corpus, faiss_index=faiss_index)
        return retriever

    def __repr__(self) -> str:
        return f"DenseRetriever(corpus={self.corpus!r}, config={self.config})"


#: Texts a saved dense index records its encoder's embeddings of, to recognise that encoder.
ENCODER_PROBE = (
    "Ada Lovelace wrote the first published algorithm for a computing machine.",
    "Which river flows through the capital of the country where the author was born?",
    "Orrin is a small town in Tamaria, founded in 900 by weavers.",
)


def _check_encoder(retriever: DenseRetriever, params: dict, params_path: Path, given: bool) -> None:
    """``ValueError`` unless the retriever's encoder embeds :data:`ENCODER_PROBE` as the
    encoder that built the index did (cosine >= 0.999 on each text)."""
    recorded = np.asarray(params.get("encoder_probe") or [], dtype=np.float32)
    which = "the encoder given" if given else f"the encoder {params.get('encoder')!r}"
    got = retriever._encode(list(ENCODER_PROBE), retriever.config.passage_prefix)
    if recorded.shape != got.shape:
        raise ValueError(
            f"{params_path}: the index was built by {params.get('encoder')!r} "
            f"({recorded.shape[-1] if recorded.ndim == 2 else '?'}-dimensional), {which} gives "
            f"{got.shape[1]}-dimensional vectors; pass the encoder that built it, or "
            "check_encoder=False to query with another one on purpose"
        )
    cosine = float(np.min(np.sum(recorded * got, axis=1)))
    if cosine < 0.999:
        raise ValueError(
            f"{params_path}: the index was built by {params.get('encoder')!r}, and {which} "
            f"embeds its probe texts differently (cosine {cosine:.3f}); pass the encoder that "
            "built it, or check_encoder=False to query with another one on purpose"
        )
