"""BM25 on an OpenSearch or Elasticsearch cluster, behind the :class:`Retriever` protocol.

:class:`SearchEngineRetriever` drives a cluster through its official Python client
(``opensearch-py`` or ``elasticsearch``; ``pip install 'rag-gym[search-engine]'``). The URL's
scheme picks the engine and its path names the index::

    opensearch+http://127.0.0.1:9200/wiki18
    elasticsearch+https://es.example.org:9200/wiki18

Credentials come from ``auth=``, the URL (``https://user:password@host``) or
``$RAG_GYM_SEARCH_AUTH`` (``user:password``; ``$RAG_GYM_SEARCH_API_KEY`` for an Elasticsearch API
key), which keeps them out of an env's kwargs.

What the engine computes is Lucene's ``BM25Similarity``: ``idf(t) * tf / (tf + k1 * (1 - b + b *
dl / avgdl))`` with ``idf(t) = ln(1 + (N - n(t) + 0.5) / (n(t) + 0.5))``, the formula of bm25s's
``"lucene"`` variant that :class:`~rag_gym.retrieval.bm25.BM25Retriever` uses, with the same
defaults (``k1`` = 1.5, ``b`` = 0.75, set as the index's ``similarity``). Lucene stores each
document's length in one byte (``SmallFloat``), so scores differ from bm25s's in the last
digits and a near tie may rank the other way. The index's analyzer follows bm25s's tokenizer:
Unicode word tokens (Lucene's ``standard`` tokenizer), lower case, tokens of two characters or
more, bm25s's English stop words and the Snowball English stemmer (PyStemmer's ``"english"``).
Title and text are indexed together in one field, ``contents`` (``copy_to``), as bm25s indexes
``"title\\ntext"``.

Each batch of queries is one ``_msearch`` request. A query's ``within`` pool is a ``terms``
filter on ``id`` (the pool's passages all match, scored 0 when they share no term, as in
:class:`BM25Retriever`); ``exclude`` is a ``must_not`` ``terms`` clause; hits are sorted by
``_score`` descending, then ``id`` ascending, so ties are broken by passage id. Over the whole
corpus only passages that share a term with the query are returned (an in-process BM25Retriever
fills the top ``k`` with zero-score passages by id).

``corpus`` holds the passages received so far (from each hit's ``_source``), which is what an env
renders, as :class:`~rag_gym.retrieval.http.HttpRetriever`'s does; its ``server_size`` is the
index's document count.
"""

from __future__ import annotations

import os
import re
import threading
import urllib.parse
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rag_gym._http import is_engine_url
from rag_gym.data.types import Corpus, Passage
from rag_gym.retrieval.base import BaseRetriever, RetrievalResult, check_k
from rag_gym.retrieval.bm25_format import BM25Config, bm25s_stopwords
from rag_gym.retrieval.http import _RemoteCorpus, split_contents

IF_EXISTS = ("check", "reuse", "overwrite")
_EXTRA = "pip install 'rag-gym[search-engine]'"
_START = {
    "opensearch": "docker run -d -p 9200:9200 -e discovery.type=single-node "
    "-e DISABLE_SECURITY_PLUGIN=true opensearchproject/opensearch:latest",
    "elasticsearch": "docker run -d -p 9200:9200 -e discovery.type=single-node "
    "-e xpack.security.enabled=false docker.elastic.co/elasticsearch/elasticsearch:9.0.0",
}
_NAME = "rag_gym_bm25"  # the analyzer's and the similarity's name in the index settings
# what Elasticsearch and OpenSearch refuse in an index name
_BAD_INDEX = re.compile(r'[\\/*?"<>| ,#:A-Z]|^[-_+]|^\.{1,2}$')


@dataclass(frozen=True)
class EngineURL:
    """An index on a cluster, parsed from ``<flavor>+<http|https>://[user:password@]host:port
    [/path]/<index>``."""

    flavor: str
    """``"opensearch"`` or ``"elasticsearch"``."""
    base: str
    """The node's URL for the client (``http://127.0.0.1:9200``, with any path prefix)."""
    index: str
    """The index name."""
    auth: tuple[str, str] | None
    """User and password from the URL, if any."""

    @classmethod
    def parse(cls, url: str) -> EngineURL:
        """Read ``url``; a ``ValueError`` shows the expected shape.

        >>> u = EngineURL.parse("elasticsearch+https://ann:pw@es.local:9200/wiki18")
        >>> u.flavor, u.base, u.index, u.auth, u.redacted
        ('elasticsearch', 'https://es.local:9200', 'wiki18', ('ann', 'pw'), 'elasticsearch+https://ann:***@es.local:9200/wiki18')
        """
        shape = "opensearch+http://127.0.0.1:9200/wiki18 (or elasticsearch+https://...)"
        if not is_engine_url(url):
            raise ValueError(f"expected an index URL such as {shape}, got {url!r}")
        flavor, _, rest = url.partition("+")
        parts = urllib.parse.urlsplit(rest)
        path = parts.path.rstrip("/")
        prefix, _, index = path.rpartition("/")
        if not index or not parts.hostname:
            raise ValueError(f"expected the index name last, as in {shape}, got {url!r}")
        if _BAD_INDEX.search(index) or len(index.encode()) > 255:
            raise ValueError(
                f'expected an index name in lower case without \\ / * ? " < > | , # : or '
                f"spaces, not starting with - _ +, got {index!r}"
            )
        auth = None
        if parts.username is not None:
            auth = (
                urllib.parse.unquote(parts.username),
                urllib.parse.unquote(parts.password or ""),
            )
        netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        if parts.port is not None:
            netloc += f":{parts.port}"
        return cls(flavor, f"{parts.scheme}://{netloc}{prefix}", index, auth)

    @property
    def redacted(self) -> str:
        """The URL without its password, for messages and names."""
        user = f"{urllib.parse.quote(self.auth[0])}:***@" if self.auth else ""
        scheme, _, host = self.base.partition("://")
        return f"{self.flavor}+{scheme}://{user}{host}/{self.index}"


@dataclass(frozen=True)
class SearchEngineConfig:
    """How :meth:`SearchEngineRetriever.index` builds an index, and how the client talks to the
    cluster. The BM25 and tokenizer fields default to
    :class:`~rag_gym.retrieval.bm25_format.BM25Config`'s, so the engine ranks as rag-gym's own BM25
    does."""

    k1: float = BM25Config.k1
    """Lucene BM25's term-frequency saturation (the ``similarity``'s ``k1``)."""
    b: float = BM25Config.b
    """Lucene BM25's length normalisation (the ``similarity``'s ``b``)."""
    stopwords: str | None = BM25Config.stopwords
    """bm25s's stop-word list (``"en"``), given to the analyzer's ``stop`` filter; ``None``
    keeps every token."""
    stemmer: str | None = BM25Config.stemmer
    """A Snowball language for the analyzer's ``snowball`` filter (``"english"``, PyStemmer's
    name; the engine's is capitalised); ``None``: no stemming."""
    shards: int = 1
    """Primary shards of a new index. With more than one, each shard has its own term
    statistics unless ``dfs`` is set."""
    replicas: int = 0
    """Replica shards of a new index (0 suits one node; raise it on a cluster)."""
    dfs: bool = False
    """Search with ``dfs_query_then_fetch``: the term statistics of every shard, so a
    several-shard index scores as one shard does (one more round trip per search)."""
    chunk_size: int = 2000
    """Passages per ``_bulk`` request while indexing."""
    timeout: float = 30.0
    """Seconds per request."""
    max_retries: int = 3
    """Retries of a request on a connection error or timeout (the client's own)."""

    def __post_init__(self) -> None:
        if self.k1 < 0 or not 0 <= self.b <= 1:
            raise ValueError(f"expected k1 >= 0 and 0 <= b <= 1, got k1={self.k1}, b={self.b}")
        for name in ("shards", "chunk_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"expected {name} >= 1, got {getattr(self, name)}")
        for name in ("replicas", "max_retries"):
            if getattr(self, name) < 0:
                raise ValueError(f"expected {name} >= 0, got {getattr(self, name)}")
        if not self.timeout > 0:
            raise ValueError(f"expected timeout > 0 seconds, got {self.timeout}")
        if self.stemmer is not None and not re.fullmatch(r"[a-z0-9]+", self.stemmer):
            raise ValueError(
                f"expected stemmer to be a Snowball language name, got {self.stemmer!r}"
            )

    def index_body(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The ``PUT /<index>`` body: the BM25 similarity, the analyzer and the mapping.

        >>> body = SearchEngineConfig().index_body({})
        >>> body["settings"]["similarity"]
        {'rag_gym_bm25': {'type': 'BM25', 'k1': 1.5, 'b': 0.75}}
        >>> body["mappings"]["properties"]["id"]
        {'type': 'keyword'}
        """
        filters: dict[str, Any] = {f"{_NAME}_min2": {"type": "length", "min": 2}}
        chain = ["lowercase", f"{_NAME}_min2"]
        if self.stopwords is not None:
            words = list(bm25s_stopwords(self.stopwords))
            filters[f"{_NAME}_stop"] = {"type": "stop", "stopwords": words}
            chain.append(f"{_NAME}_stop")
        if self.stemmer is not None:
            filters[f"{_NAME}_stem"] = {"type": "snowball", "language": self.stemmer.capitalize()}
            chain.append(f"{_NAME}_stem")
        text = {"type": "text", "analyzer": _NAME, "similarity": _NAME}
        return {
            "settings": {
                "number_of_shards": self.shards,
                "number_of_replicas": self.replicas,
                "refresh_interval": "-1",  # no refresh while loading; set back afterwards
                "similarity": {_NAME: {"type": "BM25", "k1": self.k1, "b": self.b}},
                "analysis": {
                    "filter": filters,
                    "analyzer": {
                        _NAME: {"type": "custom", "tokenizer": "standard", "filter": chain}
                    },
                },
            },
            "mappings": {
                "_meta": {"rag_gym": meta},
                "properties": {
                    "id": {"type": "keyword"},
                    "title": {**text, "copy_to": "contents"},
                    "text": {**text, "copy_to": "contents"},
                    "contents": text,
                },
            },
        }


class SearchEngineRetriever(BaseRetriever):
    """The retriever protocol over an index on an OpenSearch or Elasticsearch cluster.

    ``SearchEngineRetriever("opensearch+http://127.0.0.1:9200/wiki18")`` connects to an index
    that exists (built by :meth:`index`, or any index with a keyword ``id`` and a text
    ``contents`` field) without indexing anything; with ``corpus=`` it indexes the corpus first
    (see :meth:`index`). See the module doc for the query each search sends.

    Args:
        url: ``<opensearch|elasticsearch>+<http|https>://[user:password@]host:port/<index>``.
        corpus: passages to index (:meth:`index` with ``if_exists``).
        config: index settings and client options (:class:`SearchEngineConfig`).
        if_exists: with ``corpus``: ``"check"`` (the default) reuses an index built from the
            same corpus with the same settings and refuses any other, ``"reuse"`` searches the
            index as it is, ``"overwrite"`` deletes it and indexes the corpus.
        auth: ``(user, password)`` for basic authentication (default: the URL's, else
            ``$RAG_GYM_SEARCH_AUTH`` as ``user:password``, which keeps the password out of an
            env's kwargs and the run folders that record them).
        api_key: an Elasticsearch API key (default: ``$RAG_GYM_SEARCH_API_KEY``).
        client_kwargs: more keyword arguments for the client (``ca_certs``, ``verify_certs``...).

    Raises:
        ImportError: the engine's client is not installed (the message names the extra).
        ConnectionError: the cluster cannot be reached (the message names the URL and how to
            start a server).
        PermissionError: the cluster refused the credentials (401) or the action (403).
        ValueError: no such index, an index of another corpus, or another engine at the URL.
    """

    def __init__(
        self,
        url: str,
        corpus: Corpus | None = None,
        *,
        config: SearchEngineConfig | None = None,
        if_exists: str = "check",
        auth: tuple[str, str] | None = None,
        api_key: str | None = None,
        client_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if config is not None and not isinstance(config, SearchEngineConfig):
            raise TypeError(
                f"expected config to be a SearchEngineConfig, got {type(config).__name__}"
            )
        self.target = EngineURL.parse(url)
        self.flavor = self.target.flavor
        self.url = self.target.redacted
        self.index_name = self.target.index
        self.config = config or SearchEngineConfig()
        self._lock = threading.Lock()
        self._corpus = _RemoteCorpus(None, name=self.url)
        #: the index's document count
        self.corpus_size = 0
        self.id_field = "id"
        if auth is None:
            auth = self.target.auth
        if auth is None and os.environ.get("RAG_GYM_SEARCH_AUTH"):
            user, _, password = os.environ["RAG_GYM_SEARCH_AUTH"].partition(":")
            auth = (user, password)
        self.client, self._helpers, self._errors_of = _make_client(
            self.target, self.config, auth, api_key, client_kwargs or {}
        )
        with self._translated("connect"):
            info = _body(self.client.info())
        distribution = (info.get("version") or {}).get("distribution", "elasticsearch")
        if distribution != self.flavor:
            raise ValueError(
                f"{self.url}: the server is {distribution}, not {self.flavor}; use "
                f"{distribution}+{self.target.base.partition('://')[0]}://... (or the other "
                "server's URL)"
            )
        if corpus is not None:
            self.index(corpus, if_exists=if_exists)
        else:
            self._connect()

    # ---- errors ----------------------------------------------------------------------------
    @contextmanager
    def _translated(self, what: str):
        """The client's exceptions as typed errors naming the URL and the fix."""
        connection, api = self._errors_of
        try:
            yield
        except connection as exc:
            raise ConnectionError(
                f"cannot reach {self.flavor} at {self.url} ({what}: {_reason(exc)}); start a "
                f"server (for one node: {_START[self.flavor]}) or check the URL"
            ) from None
        except api as exc:
            status = _status(exc)
            reason = _reason(exc)
            if status == 401:
                raise PermissionError(
                    f"{self.url} refused the credentials (401, {what}): set "
                    "RAG_GYM_SEARCH_AUTH=user:password, or give them in the URL "
                    f"({self.flavor}+https://user:password@host:9200/{self.index_name}) or as "
                    "auth=(user, password)"
                ) from None
            if status == 403:
                raise PermissionError(
                    f"{self.url} does not allow this user to {what} (403): {reason}"
                ) from None
            hint = ""
            if "compatible-with" in reason or "media_type_header" in reason:
                hint = (
                    "; the elasticsearch client's major version must be the server's: "
                    "pip install 'elasticsearch>=8,<9' for an 8.x server"
                )
            elif type(exc).__name__ == "UnsupportedProductError":
                hint = f"; if it is OpenSearch, use opensearch+{self.target.base}/{self.index_name}"
            raise ValueError(f"{self.url}: {what} failed ({status}): {reason}{hint}") from None

    # ---- index -----------------------------------------------------------------------------
    def _exists(self) -> bool:
        with self._translated("check the index"):
            return bool(self.client.indices.exists(index=self.index_name))

    def _mapping(self) -> dict[str, Any]:
        with self._translated("read the index mapping"):
            reply = _body(self.client.indices.get_mapping(index=self.index_name))
        # an alias answers under its concrete index's name
        return next(iter(reply.values()), {}).get("mappings", {}) if reply else {}

    def _count(self) -> int:
        with self._translated("count the documents"):
            return int(_body(self.client.count(index=self.index_name))["count"])

    def _connect(self) -> None:
        """Check an existing index has the fields searched, and read its size."""
        if not self._exists():
            raise ValueError(
                f"{self.url}: there is no index {self.index_name!r}; build it with "
                f"SearchEngineRetriever({self.url!r}, corpus=Corpus.from_jsonl(...))"
            )
        props = self._mapping().get("properties", {})
        id_map = props.get("id", {})
        if id_map.get("type") == "keyword":
            self.id_field = "id"
        elif (id_map.get("fields") or {}).get("keyword", {}).get("type") == "keyword":
            self.id_field = "id.keyword"  # a dynamic mapping's keyword sub-field
        else:
            raise ValueError(
                f"{self.url}: expected a keyword field 'id' (pool filters and the tie-break "
                f"sort on it), got {id_map or 'none'}; re-index with if_exists='overwrite'"
            )
        if props.get("contents", {}).get("type") != "text":
            raise ValueError(
                f"{self.url}: expected a text field 'contents' (what is searched), got "
                f"{props.get('contents') or 'none'}; re-index with if_exists='overwrite'"
            )
        self.corpus_size = self._count()
        self._corpus.server_size = self.corpus_size

    def _meta(self, corpus: Corpus) -> dict[str, Any]:
        from rag_gym import __version__

        cfg = self.config
        return {
            "version": __version__,
            "corpus_name": corpus.name,
            "corpus_size": len(corpus),
            "corpus_checksum": corpus.checksum(),
            "k1": cfg.k1,
            "b": cfg.b,
            "stopwords": cfg.stopwords,
            "stemmer": cfg.stemmer,
        }

    def index(self, corpus: Corpus, if_exists: str = "check") -> None:
        """Index ``corpus``: create the index (BM25 similarity, analyzer, a keyword ``id``, text
        ``title``, ``text`` and ``contents``), load the passages with the client's bulk helper
        in chunks of ``config.chunk_size``, then refresh.

        An index of that name that exists is reused when it was built from this corpus with
        these settings (``if_exists="check"``) and refused otherwise, with the fix; ``"reuse"``
        takes it as it is, ``"overwrite"`` deletes it first.
        """
        if not isinstance(corpus, Corpus):
            raise TypeError(f"expected a Corpus, got {type(corpus).__name__}")
        if if_exists not in IF_EXISTS:
            from rag_gym._names import unknown_name

            raise unknown_name("if_exists", if_exists, IF_EXISTS)
        meta = self._meta(corpus)
        if self._exists():
            if if_exists == "reuse":
                return self._connect()
            if if_exists == "check":
                found = self._mapping().get("_meta", {}).get("rag_gym", {})
                found_size = self._count()
                wrong = [("passages", found_size, len(corpus))] if found_size != len(corpus) else []
                for key in ("corpus_checksum", "k1", "b", "stopwords", "stemmer"):
                    if key in found and found[key] != meta[key]:
                        cut = 12 if key == "corpus_checksum" else None  # enough to tell apart
                        wrong.append((key, str(found[key])[:cut], str(meta[key])[:cut]))
                if not wrong:
                    return self._connect()
                said = "; ".join(f"{k} {a}, not {b}" for k, a, b in wrong)
                raise ValueError(
                    f"{self.url}: the index {self.index_name!r} exists with {said}; pass "
                    "if_exists='overwrite' to delete and rebuild it (a load that stopped half "
                    "way looks like this too), or if_exists='reuse' to search it as it is"
                )
            with self._translated("delete the index"):
                self.client.indices.delete(index=self.index_name)
        with self._translated("create the index"):
            self.client.indices.create(index=self.index_name, body=self.config.index_body(meta))
        name = self.index_name
        actions = (
            {
                "_op_type": "index",
                "_index": name,
                "_id": p.id,
                "_source": {"id": p.id, "title": p.title, "text": p.text},
            }
            for p in corpus
        )
        failed: list[dict] = []
        with self._translated("load the passages"):
            for ok, item in self._helpers.streaming_bulk(
                self.client,
                actions,
                chunk_size=self.config.chunk_size,
                raise_on_error=False,
                max_retries=self.config.max_retries,
            ):
                if not ok:
                    failed.append(item)
            self.client.indices.put_settings(index=name, body={"index": {"refresh_interval": None}})
            self.client.indices.refresh(index=name)
        if failed:
            first = next(iter(failed[0].values()), {})
            raise ValueError(
                f"{self.url}: {len(failed)} passages were not indexed; the first, "
                f"{first.get('_id')!r}: {first.get('error')}"
            )
        self._connect()
        if self.corpus_size != len(corpus):
            raise ValueError(
                f"{self.url}: the index holds {self.corpus_size} documents after loading "
                f"{len(corpus)} passages; rebuild it with if_exists='overwrite'"
            )

    # ---- retrieval -------------------------------------------------------------------------
    @property
    def corpus(self) -> Corpus:
        """The passages received so far (``len`` counts them; ``server_size`` is the index's
        document count, what :func:`~rag_gym.retrieval.base.corpus_size` reports)."""
        return self._corpus

    def _search_body(self, query: str, k: int, banned: list[str], pool: list[str] | None):
        match = {"match": {"contents": {"query": query}}}
        clause: dict[str, Any]
        if pool is not None:  # every pool passage matches; the query only scores them
            clause = {"filter": [{"terms": {self.id_field: pool}}], "should": [match]}
        else:
            clause = {"must": [match]}
        if banned:
            clause["must_not"] = [{"terms": {self.id_field: banned}}]
        return {
            "query": {"bool": clause},
            "size": k,
            "sort": [{"_score": {"order": "desc"}}, {self.id_field: {"order": "asc"}}],
            "track_scores": True,
            "track_total_hits": pool is not None,
            "_source": ["id", "title", "text", "contents"],
        }

    def searchable(self) -> int:
        return self.corpus_size

    def _retrieve(self, queries, k, exclude, within) -> RetrievalResult:
        """Top ``k`` ids and scores per query, in one ``_msearch`` request (see the module doc).

        ``k`` is checked against the index's size, or against a ``within`` pool's; a pool id
        that is not in the index is a ``KeyError``, as in :class:`BM25Retriever`."""
        excl = [sorted(set(e or ())) for e in exclude]
        pools = [list(dict.fromkeys(w)) if w is not None else None for w in within]
        for pool in pools:
            if pool is not None:
                check_k(k, len(pool), "the candidate pool")
        if not queries:
            return RetrievalResult([], [])
        header = {"search_type": "dfs_query_then_fetch"} if self.config.dfs else {}
        lines: list[dict] = []
        for q, banned, pool in zip(queries, excl, pools, strict=True):
            lines += [header, self._search_body(q, k, banned, pool)]
        with self._translated("search"):
            reply = _body(self.client.msearch(index=self.index_name, body=lines))
        responses = reply.get("responses")
        if not isinstance(responses, list) or len(responses) != len(queries):
            raise ValueError(
                f"{self.url}: expected one _msearch response per query ({len(queries)}), got "
                f"{str(reply)[:200]}"
            )
        ids: list[list[str]] = []
        scores: list[list[float]] = []
        received: list[Passage] = []
        for i, resp in enumerate(responses):
            if "error" in resp:
                err = resp["error"]
                reason = err.get("reason", err) if isinstance(err, dict) else err
                raise ValueError(f"{self.url}: search {i} ({queries[i][:80]!r}) failed: {reason}")
            hits = resp["hits"]
            pool = pools[i]
            if pool is not None:
                total = hits["total"]["value"] if isinstance(hits["total"], dict) else hits["total"]
                if total < len(set(pool) - set(excl[i])):
                    raise KeyError(self._not_indexed(pool))
            row_ids, row_scores = [], []
            for hit in hits["hits"]:
                passage = _passage(hit)
                score = hit.get("_score")
                row_ids.append(passage.id)
                row_scores.append(float(score if score is not None else hit["sort"][0]))
                received.append(passage)
            ids.append(row_ids)
            scores.append(row_scores)
        corpus = self.corpus
        with self._lock:  # the server retrieves in several threads
            for passage in received:
                if passage.id not in corpus:
                    corpus.add(passage)
        return RetrievalResult(ids, scores)

    def _not_indexed(self, pool: list[str]) -> str:
        """The message for a pool that names a passage the index does not hold."""
        body = {"query": {"terms": {self.id_field: pool}}, "size": len(pool), "_source": ["id"]}
        with self._translated("search"):
            reply = _body(self.client.search(index=self.index_name, body=body))
        found = {_passage(h).id for h in reply["hits"]["hits"]}
        missing = [p for p in pool if p not in found]
        return f"id {missing[0] if missing else pool[0]!r} is not in the index {self.url}"


def _passage(hit: dict) -> Passage:
    """The passage of one hit: ``{id, title, text}`` or ``{id, contents}`` in its ``_source``."""
    source = hit.get("_source") or {}
    pid = str(source.get("id", hit.get("_id")))
    if "text" in source:
        return Passage(pid, source.get("title") or "", source["text"])
    return Passage(pid, *split_contents(source.get("contents", "")))


def _body(reply: Any) -> dict:
    """The JSON of a client's reply (elasticsearch's ``ObjectApiResponse`` or a dict)."""
    return getattr(reply, "body", reply)


def _status(exc: Exception) -> int | None:
    meta = getattr(exc, "meta", None)
    status = getattr(meta, "status", None) if meta is not None else None
    if status is None:
        status = getattr(exc, "status_code", None)
    return status if isinstance(status, int) else None


def _reason(exc: Exception) -> str:
    """The server's own reason, where the exception carries one."""
    info = getattr(exc, "body", None) or getattr(exc, "info", None)
    if isinstance(info, dict) and isinstance(info.get("error"), dict):
        err = info["error"]
        return f"{err.get('type', '')}: {err.get('reason', '')}".strip(": ")
    return str(getattr(exc, "message", "") or exc)[:300]


def _make_client(target: EngineURL, config: SearchEngineConfig, auth, api_key, kwargs):
    """The engine's official client, its bulk helpers, and (connection errors, API errors)."""
    if target.flavor == "opensearch":
        try:
            import opensearchpy
            from opensearchpy import helpers
        except ImportError as exc:
            raise ImportError(f"an OpenSearch index needs opensearch-py: {_EXTRA}") from exc
        if api_key is not None:
            raise ValueError("api_key= is Elasticsearch's; give OpenSearch auth=(user, password)")
        opts = {"timeout": config.timeout, "max_retries": config.max_retries}
        opts["retry_on_timeout"] = True
        if auth is not None:
            opts["http_auth"] = auth
        client = opensearchpy.OpenSearch(hosts=[target.base], **{**opts, **kwargs})
        return client, helpers, (opensearchpy.ConnectionError, opensearchpy.TransportError)
    try:
        import elastic_transport
        import elasticsearch
        from elasticsearch import helpers
    except ImportError as exc:
        raise ImportError(f"an Elasticsearch index needs elasticsearch: {_EXTRA}") from exc
    opts = {"request_timeout": config.timeout, "max_retries": config.max_retries}
    opts["retry_on_timeout"] = True
    api_key = api_key or os.environ.get("RAG_GYM_SEARCH_API_KEY") or None
    if auth is not None:
        opts["basic_auth"] = auth
    if api_key is not None:
        opts["api_key"] = api_key
    client = elasticsearch.Elasticsearch(target.base, **{**opts, **kwargs})
    # a transport error that is not an API reply (refused, timed out, TLS) is a connection error
    return client, helpers, (elastic_transport.TransportError, elasticsearch.ApiError)
