"""What ``rag-gym serve`` serves (:class:`Serve`): an index folder, a sharded index on Ray, a
FAISS index file or an OpenSearch/Elasticsearch index, behind Search-R1's ``/retrieve`` API
(:func:`~rag_gym.retrieval.server.create_app`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Serve:
    """The index to serve, where, and the server's limits."""

    index: str | None = None
    """An index directory (``rag-gym index build``), or an OpenSearch or Elasticsearch index to
    search in place (``opensearch+http://127.0.0.1:9200/wiki18``)."""
    faiss_index: str | None = None
    """Or a FAISS index file written by ``faiss.write_index`` (FlashRAG, Search-R1's
    ``e5_Flat.index``); needs ``corpus`` and ``encoder``."""
    corpus: str | None = None
    """The ``{id, contents}`` corpus JSONL: with ``faiss_index``, one row per vector; with
    ``index``, the file it was built from, to serve its contents verbatim."""
    encoder: str | None = None
    """Query encoder for ``faiss_index``: a sentence-transformers id or path (e5/bge get their
    query prefixes); ``minilm`` is the embedded all-MiniLM-L6-v2."""
    host: str = "127.0.0.1"
    """Address to bind; 127.0.0.1 keeps it local."""
    port: int = 8000
    """Port."""
    token: str | None = None
    """Bearer token (default: ``$RAG_GYM_TOKEN``; none if unset or empty). Whitespace around it
    (a pasted space, a newline) is stripped with a warning."""
    max_queries: int = 4096
    """Most queries per request."""
    max_topk: int = 100
    """Largest topk."""
    head_timeout: float = 10.0
    """Seconds a request head may take (then the connection closes)."""
    body_timeout: float = 30.0
    """Seconds a request body may take (then 408)."""
    max_connections: int = 1024
    """Open connections and requests in progress (then 503)."""
    batch_window_ms: float = 0.0
    """How long an idle server waits for more requests to batch (a busy one batches what
    queues while it retrieves)."""
    ray: str | None = None
    """Serve a sharded ``index`` from replicas on this Ray cluster (``auto``, ``HOST:PORT``,
    ``ray://HOST:PORT``, or ``local`` to start one here); this process routes and merges."""
    shards: int | None = None
    """With ``ray``: the shard count the index must have (checked)."""
    replicas: int = 1
    """With ``ray``: replicas of each shard (throughput and failover)."""
    cpus_per_replica: float = 1.0
    """With ``ray``: CPUs Ray reserves for each replica."""

    def __post_init__(self) -> None:
        from rag_gym._http import is_engine_url

        if (self.index is None) == (self.faiss_index is None):
            raise ValueError(
                "give --index DIR (rag-gym index build) or --faiss-index FILE, one of them"
            )
        if self.faiss_index is not None and (self.corpus is None or self.encoder is None):
            raise ValueError(
                "--faiss-index needs --corpus (its {id, contents} JSONL) and --encoder (its model)"
            )
        if self.faiss_index is None and self.encoder is not None:
            raise ValueError(
                "--encoder goes with --faiss-index (an index directory names its own encoder)"
            )
        if is_engine_url(self.index) and self.corpus is not None:
            raise ValueError(
                "--corpus goes with an index directory (a cluster's index serves its own passages)"
            )
        if self.ray is None and (self.shards is not None or self.replicas != 1):
            raise ValueError(
                "--shards and --replicas go with --ray (a sharded index served on Ray)"
            )


def open_retriever(config: Serve) -> tuple[Any, str, str, str | None, Any]:
    """The retriever ``config`` serves, its kind, where it comes from, the index id clients
    see (``None``: a random one per start) and the watch on its files (``None``: none)."""
    from rag_gym._http import is_engine_url
    from rag_gym.retrieval import load_index
    from rag_gym.retrieval.persist import IndexWatch, read_params
    from rag_gym.retrieval.search_engine import SearchEngineRetriever
    from rag_gym.retrieval.shards import ShardedRetriever, is_sharded, read_shards

    index = config.index
    if config.ray is not None:
        from rag_gym.retrieval.ray_shards import RayShardedRetriever

        if config.corpus is not None:
            raise ValueError("--corpus goes with an unsharded index directory, not with --ray")
        if index is None or is_engine_url(index) or not is_sharded(index):
            raise ValueError(
                "--ray serves a sharded index folder: give --index DIR built by "
                "rag-gym index build --shards S"
            )
        retriever = RayShardedRetriever(
            index, shards=config.shards, replicas=config.replicas, address=config.ray,
            cpus_per_replica=config.cpus_per_replica,
        )  # fmt: skip
        manifest, watch = retriever.manifest, None
    elif config.faiss_index is not None:
        from rag_gym.retrieval.dense import DenseRetriever

        encoder = None if config.encoder == "minilm" else config.encoder
        retriever = DenseRetriever.from_faiss(config.faiss_index, config.corpus, encoder)
        return retriever, "dense", config.faiss_index, None, None
    elif is_engine_url(index):
        retriever = SearchEngineRetriever(index)
        return retriever, retriever.flavor, retriever.url, None, None
    elif is_sharded(index):  # every shard in this process (--ray spreads them)
        retriever, manifest = ShardedRetriever.load(index), read_shards(index)
        watch = IndexWatch(index)
    else:
        retriever, kind = load_index(str(index))
        # files changed in place: 503 and a log line, not SIGBUS
        return retriever, kind, index, read_params(index)["params_sha256"][:16], IndexWatch(index)
    source = f"{index} ({retriever!r})"
    return retriever, manifest["kind"], source, manifest["manifest_sha256"][:16], watch


def open_app(config: Serve) -> tuple[Any, Any, str]:
    """The server app of ``config`` (:func:`~rag_gym.retrieval.server.create_app`), its limits,
    and the line that says what it serves and where."""
    from rag_gym.retrieval.base import corpus_size
    from rag_gym.retrieval.server import ServerLimits, VerbatimContents, create_app

    limits = ServerLimits(
        max_queries=config.max_queries,
        max_topk=config.max_topk,
        head_timeout=config.head_timeout,
        body_timeout=config.body_timeout,
        max_connections=config.max_connections,
    )
    retriever, kind, source, index_id, watch = open_retriever(config)
    contents = (
        VerbatimContents.from_jsonl(config.corpus, retriever.corpus) if config.corpus else None
    )
    app = create_app(
        retriever,
        token=config.token,
        limits=limits,
        batch_window_ms=config.batch_window_ms,
        kind=kind,
        contents=contents,
        index_id=index_id,
        watch=watch,
    )
    where = f"http://{config.host}:{config.port}"
    return (
        app,
        limits,
        f"serving {kind} index {source} ({corpus_size(retriever)} passages) on {where}",
    )
