"""SearchEngineRetriever: BM25 on OpenSearch or Elasticsearch through their official clients.

No OpenSearch or Elasticsearch server can be installed on the machine these tests were written
on, so the contract tests run the REAL clients (opensearch-py, elasticsearch) against a stand-in
on 127.0.0.1 that speaks just enough of the REST API (``HEAD``/``PUT``/``DELETE`` an index,
``_mapping``, ``_settings``, ``_bulk``, ``_refresh``, ``_count``, ``_search``, ``_msearch``). They
check what the clients send (the BM25 similarity and analyzer, ``terms`` pool filters,
``must_not`` exclusions, ``size``, the sort that breaks ties by id) and how replies are read.
The stand-in's scoring is a plain term count, not BM25: agreement with rag-gym's own BM25 is
checked only by ``test_real_server`` (set ``RAG_GYM_OPENSEARCH_URL`` or
``RAG_GYM_ELASTICSEARCH_URL``)."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import pytest

from rag_gym.data import Corpus, Passage
from rag_gym.retrieval.search_engine import (
    EngineURL,
    SearchEngineConfig,
    SearchEngineRetriever,
    is_engine_url,
)
from tests.conftest import SMALL_WORLD

CLIENTS = {"opensearch": "opensearchpy", "elasticsearch": "elasticsearch"}


def _client_or_skip(flavor: str) -> None:
    pytest.importorskip(
        CLIENTS[flavor], reason=f"needs the {flavor} client: pip install 'rag-gym[search-engine]'"
    )


@pytest.fixture(params=list(CLIENTS))
def flavor(request) -> str:
    _client_or_skip(request.param)
    return request.param


TINY = Corpus(
    [
        Passage("d1", "Ada", "Ada was born in Vell."),
        Passage("d2", "Vell", "Vell is a town in Orra. Ada lived in Vell."),
        Passage("d3", "Orra", "Orra is a country."),
        Passage("d4", "Bo", "Bo was born in Orra."),
        Passage("d5", "Cy", "Cy was born in Orra."),
        Passage("d6", "Dee", "Dee wrote a book."),
    ],
    name="tiny",
)


class FakeEngine:
    """OpenSearch or Elasticsearch, as far as the official clients' calls go. Every request is
    kept in ``requests`` as ``(method, path, body)``; documents become visible to ``_count``
    and searches only at ``_refresh``; a search scores each document by how often the query's
    words (2+ characters, lower case) occur in its title and text, and honours ``bool``
    ``must``/``should``/``filter``/``must_not`` with ``terms``, ``size``, ``sort``,
    ``track_scores``, ``track_total_hits`` and ``_source`` includes."""

    def __init__(self, flavor: str = "opensearch", auth: tuple[str, str] | None = None) -> None:
        self.flavor = flavor
        self.auth = auth
        self.indices: dict[str, dict] = {}
        self.requests: list[tuple[str, str, object]] = []
        self.reject_ids: set[str] = set()  # _bulk items refused
        self.fail_search = False  # every search answers an error
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def handle_one(self, method: str) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                code, obj = fake.answer(method, self.path, raw, self.headers)
                data = b"" if method == "HEAD" or obj is None else json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if fake.flavor == "elasticsearch":
                    self.send_header("X-Elastic-Product", "Elasticsearch")
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.handle_one("GET")

            def do_HEAD(self):
                self.handle_one("HEAD")

            def do_PUT(self):
                self.handle_one("PUT")

            def do_POST(self):
                self.handle_one("POST")

            def do_DELETE(self):
                self.handle_one("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def url(self, index: str = "tiny", auth: str = "") -> str:
        return f"{self.flavor}+http://{auth}127.0.0.1:{self.port}/{index}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def paths(self, method: str | None = None) -> list[str]:
        return [p for m, p, _ in self.requests if method is None or m == method]

    def bodies(self, suffix: str) -> list:
        return [b for _, p, b in self.requests if p.endswith(suffix)]

    # ---- the REST API --------------------------------------------------------------------
    @staticmethod
    def error(code: int, kind: str, reason: str) -> tuple[int, dict]:
        return code, {"error": {"type": kind, "reason": reason}, "status": code}

    def answer(self, method: str, target: str, raw: bytes, headers) -> tuple[int, object]:
        path = urlsplit(target).path
        nd = path.endswith(("_bulk", "_msearch"))
        text = raw.decode()
        body = [json.loads(x) for x in text.splitlines() if x.strip()] if nd else None
        if not nd and text:
            body = json.loads(text)
        self.requests.append((method, path, body))
        if self.auth is not None:
            token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            if headers.get("Authorization") != f"Basic {token}":
                return self.error(401, "security_exception", "missing authentication credentials")
        parts = [p for p in path.split("/") if p]
        if not parts:
            version = {"number": "9.0.0", "lucene_version": "10.1.0"}
            if self.flavor == "opensearch":
                version = {"distribution": "opensearch", "number": "2.19.0"}
            return 200, {"name": "fake", "cluster_name": "fake", "version": version}
        if parts == ["_bulk"] or parts[1:] == ["_bulk"]:
            return self.bulk(body)
        name, rest = parts[0], parts[1:]
        index = self.indices.get(name)
        if not rest and method == "PUT":
            if index is not None:
                return self.error(400, "resource_already_exists_exception", f"[{name}] exists")
            self.indices[name] = {"body": body, "docs": {}, "pending": {}, "settings": []}
            return 200, {"acknowledged": True, "index": name}
        if index is None:
            return self.error(404, "index_not_found_exception", f"no such index [{name}]")
        if not rest and method == "HEAD":
            return 200, None
        if not rest and method == "DELETE":
            del self.indices[name]
            return 200, {"acknowledged": True}
        if rest == ["_mapping"]:
            return 200, {name: {"mappings": index["body"]["mappings"]}}
        if rest == ["_settings"]:
            index["settings"].append(body)
            return 200, {"acknowledged": True}
        if rest == ["_refresh"]:
            index["docs"].update(index.pop("pending"))
            index["pending"] = {}
            return 200, {"_shards": {"total": 1, "successful": 1, "failed": 0}}
        if rest == ["_count"]:
            return 200, {"count": len(index["docs"])}
        if rest == ["_search"]:
            return 200, self.search(index, body)
        if rest == ["_msearch"]:
            return 200, {"responses": [self.search(index, b) for b in body[1::2]]}
        return self.error(400, "illegal_argument_exception", f"no handler for {method} {path}")

    def bulk(self, lines: list[dict]) -> tuple[int, dict]:
        items = []
        for action, source in zip(lines[::2], lines[1::2], strict=True):
            meta = action["index"]
            pid = meta["_id"]
            if pid in self.reject_ids:
                err = {"type": "mapper_parsing_exception", "reason": "failed to parse"}
                items.append({"index": {"_id": pid, "status": 400, "error": err}})
                continue
            self.indices[meta["_index"]]["pending"][pid] = source
            items.append({"index": {"_id": pid, "status": 201, "result": "created"}})
        errors = any("error" in i["index"] for i in items)
        return 200, {"took": 1, "errors": errors, "items": items}

    def search(self, index: dict, body: dict) -> dict:
        if self.fail_search:
            return {"error": {"type": "query_shard_exception", "reason": "broken"}, "status": 400}
        clause = body["query"]["bool"] if "bool" in body["query"] else {"filter": [body["query"]]}

        def terms(clauses):
            out = None
            for c in clauses or ():
                ids = next(iter(c["terms"].values()))
                out = set(ids) if out is None else out & set(ids)
            return out

        scored = clause.get("must") or clause.get("should") or []
        words = []
        for c in scored:
            q = next(iter(c["match"].values()))
            words += re.findall(r"\w\w+", q["query"].lower())
        allowed, banned = terms(clause.get("filter")), terms(clause.get("must_not")) or set()
        hits = []
        for pid, src in index["docs"].items():
            if (allowed is not None and pid not in allowed) or pid in banned:
                continue
            tokens = re.findall(r"\w\w+", f"{src['title']} {src['text']}".lower())
            score = float(sum(tokens.count(w) for w in words))
            if clause.get("must") and score == 0:
                continue
            hits.append((score, pid, src))
        for spec in reversed(body.get("sort", [])):
            key, order = next(iter(spec.items()))
            pos = 0 if key == "_score" else 1
            hits.sort(key=lambda h, p=pos: h[p], reverse=order["order"] == "desc")
        keep = body.get("_source", True)
        out = []
        for score, pid, src in hits[: body.get("size", 10)]:
            hit = {"_index": "i", "_id": pid, "sort": [score, pid]}
            hit["_score"] = score if "sort" not in body or body.get("track_scores") else None
            hit["_source"] = {k: v for k, v in src.items() if keep is True or k in keep}
            out.append(hit)
        reply: dict = {"hits": out}
        if body.get("track_total_hits"):
            reply["total"] = {"value": len(hits), "relation": "eq"}
        return {"hits": reply}


@pytest.fixture
def fake(flavor):
    engine = FakeEngine(flavor)
    yield engine
    engine.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- indexing ----------------------------------------------------------------------------------
def test_index_creates_bm25_index_and_bulk_loads(fake):
    config = SearchEngineConfig(chunk_size=4)
    r = SearchEngineRetriever(fake.url(), TINY, config=config)
    (create,) = [b for m, p, b in fake.requests if m == "PUT" and p == "/tiny"]
    settings, mappings = create["settings"], create["mappings"]
    assert settings["similarity"] == {"rag_gym_bm25": {"type": "BM25", "k1": 1.5, "b": 0.75}}
    analyzer = settings["analysis"]["analyzer"]["rag_gym_bm25"]
    assert analyzer["tokenizer"] == "standard"
    filters = settings["analysis"]["filter"]
    assert [filters.get(f, {}).get("type", f) for f in analyzer["filter"]] == [
        "lowercase", "length", "stop", "snowball",
    ]  # fmt: skip
    assert filters["rag_gym_bm25_stem"]["language"] == "English"
    assert "the" in filters["rag_gym_bm25_stop"]["stopwords"]
    props = mappings["properties"]
    assert props["id"] == {"type": "keyword"}
    assert props["title"]["copy_to"] == props["text"]["copy_to"] == "contents"
    assert props["contents"]["similarity"] == "rag_gym_bm25"
    assert mappings["_meta"]["rag_gym"]["corpus_checksum"] == TINY.checksum()
    # two chunks of at most 4 passages, every passage once, then refresh on, and a refresh
    bulks = fake.bodies("/_bulk")
    assert [len(b) // 2 for b in bulks] == [4, 2]
    assert sorted(s["_id"] for b in bulks for s in (a["index"] for a in b[::2])) == TINY.ids
    assert bulks[0][1] == {"id": "d1", "title": "Ada", "text": "Ada was born in Vell."}
    paths = fake.paths()
    last_bulk = max(i for i, p in enumerate(paths) if p.endswith("/_bulk"))
    assert paths[last_bulk + 1 : last_bulk + 3] == ["/tiny/_settings", "/tiny/_refresh"]
    assert fake.indices["tiny"]["settings"] == [{"index": {"refresh_interval": None}}]
    assert r.corpus_size == len(TINY) and r.corpus.server_size == len(TINY)


def test_custom_bm25_parameters_reach_the_index(fake):
    config = SearchEngineConfig(k1=0.9, b=0.4, shards=3, replicas=1, stopwords=None, stemmer=None)
    SearchEngineRetriever(fake.url(), TINY, config=config)
    (create,) = [b for m, p, b in fake.requests if m == "PUT" and p == "/tiny"]
    assert create["settings"]["similarity"]["rag_gym_bm25"] == {"type": "BM25", "k1": 0.9, "b": 0.4}
    assert (create["settings"]["number_of_shards"], create["settings"]["number_of_replicas"]) == (
        3,
        1,
    )
    chain = create["settings"]["analysis"]["analyzer"]["rag_gym_bm25"]["filter"]
    assert chain == ["lowercase", "rag_gym_bm25_min2"]


def test_existing_index_is_reused_refused_or_overwritten(fake):
    SearchEngineRetriever(fake.url(), TINY)
    n = len(fake.requests)
    again = SearchEngineRetriever(fake.url(), TINY)  # the same corpus: nothing re-indexed
    assert not [p for _, p, _ in fake.requests[n:] if p.endswith("_bulk")]
    assert again.corpus_size == len(TINY)
    smaller = Corpus(list(TINY)[:4], name="smaller")
    with pytest.raises(
        ValueError, match=r"exists with passages 6, not 4; .* pass if_exists='overwrite'"
    ):
        SearchEngineRetriever(fake.url(), smaller)
    same_size = Corpus([*list(TINY)[:5], Passage("d6", "Dee", "Dee wrote two books.")])
    with pytest.raises(ValueError, match=r"exists with corpus_checksum \w{12}, not \w{12};"):
        SearchEngineRetriever(fake.url(), same_size)
    with pytest.raises(ValueError, match=r"k1 1\.5, not 2\.0"):
        SearchEngineRetriever(fake.url(), TINY, config=SearchEngineConfig(k1=2.0))
    reused = SearchEngineRetriever(fake.url(), smaller, if_exists="reuse")
    assert reused.corpus_size == 6
    n = len(fake.requests)
    over = SearchEngineRetriever(fake.url(), smaller, if_exists="overwrite")
    assert ("DELETE", "/tiny") in [(m, p) for m, p, _ in fake.requests[n:]]
    assert over.corpus_size == 4 and sorted(fake.indices["tiny"]["docs"]) == smaller.ids
    with pytest.raises(ValueError, match="did you mean 'overwrite'"):
        over.index(TINY, if_exists="overwrit")
    with pytest.raises(TypeError, match="expected a Corpus, got list"):
        over.index(list(TINY))


def test_connects_to_an_existing_index_without_indexing(fake):
    with pytest.raises(ValueError, match=r"there is no index 'tiny'.*corpus=Corpus\.from_jsonl"):
        SearchEngineRetriever(fake.url())
    SearchEngineRetriever(fake.url(), TINY)
    n = len(fake.requests)
    r = SearchEngineRetriever(fake.url())
    assert r.corpus_size == 6 and len(r.corpus) == 0
    assert not [p for m, p, _ in fake.requests[n:] if m == "PUT" or p.endswith("_bulk")]


def test_an_index_with_a_dynamic_mapping_is_searched_by_id_keyword(fake):
    # another tool's index: {id, contents} documents, strings mapped dynamically
    mapping = {"properties": {
        "id": {"type": "text", "fields": {"keyword": {"type": "keyword"}}},
        "contents": {"type": "text", "fields": {"keyword": {"type": "keyword"}}},
    }}  # fmt: skip
    docs = {"w1": {"id": "w1", "contents": '"Ada"\nAda was born in Vell.'}}
    fake.indices["wiki"] = {"body": {"mappings": mapping}, "docs": docs, "pending": {}}
    fake.indices["wiki"]["docs"]["w1"].update(title="", text="Ada was born in Vell.")
    r = SearchEngineRetriever(fake.url("wiki"))
    res = r.retrieve(["ada"], k=1, within=[["w1"]], exclude=[["w9"]])
    (body,) = fake.bodies("/_msearch")[0][1::2]
    assert body["query"]["bool"]["filter"] == [{"terms": {"id.keyword": ["w1"]}}]
    assert body["sort"][1] == {"id.keyword": {"order": "asc"}}
    assert res.ids == [["w1"]]
    fake.indices["bad"] = {"body": {"mappings": {"properties": {"id": {"type": "long"}}}}}
    with pytest.raises(ValueError, match="expected a keyword field 'id'"):
        SearchEngineRetriever(fake.url("bad"))
    fake.indices["nocontents"] = {"body": {"mappings": {"properties": {"id": {"type": "keyword"}}}}}
    with pytest.raises(ValueError, match="expected a text field 'contents'"):
        SearchEngineRetriever(fake.url("nocontents"))


def test_failed_bulk_items_are_named(fake):
    fake.reject_ids = {"d4"}
    with pytest.raises(ValueError, match="1 passages were not indexed; the first, 'd4'"):
        SearchEngineRetriever(fake.url(), TINY)


# ---- retrieval ---------------------------------------------------------------------------------
def test_one_msearch_per_batch_with_pool_filters_exclusions_and_tie_break(fake):
    r = SearchEngineRetriever(fake.url(), TINY)
    queries = ["who was born in orra", "ada vell", "orra"]
    res = r.retrieve(
        queries,
        k=2,
        exclude=[["d4"], None, None],
        within=[None, ["d1", "d2", "d6", "d1"], None],
    )
    (lines,) = fake.bodies("/_msearch")  # one request for the batch
    headers, bodies = lines[::2], lines[1::2]
    assert headers == [{}, {}, {}] and len(bodies) == 3
    sort = [{"_score": {"order": "desc"}}, {"id": {"order": "asc"}}]
    match = [{"match": {"contents": {"query": q}}} for q in queries]
    assert bodies[0]["query"] == {
        "bool": {"must": [match[0]], "must_not": [{"terms": {"id": ["d4"]}}]}
    }
    # the pool (deduplicated) filters, and the query only scores: every pool passage matches
    assert bodies[1]["query"] == {
        "bool": {"filter": [{"terms": {"id": ["d1", "d2", "d6"]}}], "should": [match[1]]}
    }
    assert bodies[2]["query"] == {"bool": {"must": [match[2]]}}
    for body in bodies:
        assert body["size"] == 2 and body["sort"] == sort and body["track_scores"] is True
    assert [b["track_total_hits"] for b in bodies] == [False, True, False]
    # the stand-in's term counts: d4 and d5 score 4 (d4 excluded), d1 and d2 tie at 3 (d1 by
    # id); in the pool d2 4, d1 3; for "orra" d3 2, then d2, d4 and d5 tie at 1 (d2 by id)
    assert res.ids == [["d5", "d1"], ["d2", "d1"], ["d3", "d2"]]
    assert res.scores == [[4.0, 3.0], [4.0, 3.0], [2.0, 1.0]]
    # the passages came with the hits, for the env to render
    assert r.corpus["d2"] == TINY["d2"] and len(r.corpus) == 4 and "d6" not in r.corpus
    # a pool passage that shares no word with the query still fills the pool's top k
    assert r.retrieve(["book"], k=2, within=[["d1", "d6"]]).ids == [["d6", "d1"]]


def test_k_and_arguments_are_checked_as_the_protocol_says(fake):
    r = SearchEngineRetriever(fake.url(), TINY)
    with pytest.raises(ValueError, match=r"expected k <= 6 \(the size of the corpus\)"):
        r.retrieve(["ada"], k=7)
    with pytest.raises(ValueError, match="the size of the candidate pool"):
        r.retrieve(["ada"], k=3, within=[["d1", "d2", "d1"]])
    with pytest.raises(TypeError, match="wrap it"):
        r.retrieve("ada", k=1)
    with pytest.raises(ValueError, match="one entry per query"):
        r.retrieve(["a", "b"], k=1, exclude=[["d1"]])
    with pytest.raises(KeyError, match="id 'nope' is not in the index"):
        r.retrieve(["ada"], k=1, within=[["d1", "nope"]])
    n = len(fake.bodies("/_msearch"))
    assert r.retrieve([], k=1).ids == [] and len(fake.bodies("/_msearch")) == n


def test_a_failed_search_names_the_query_and_dfs_is_sent(fake):
    r = SearchEngineRetriever(fake.url(), TINY, config=SearchEngineConfig(dfs=True))
    r.retrieve(["ada"], k=1)
    assert fake.bodies("/_msearch")[0][0] == {"search_type": "dfs_query_then_fetch"}
    fake.fail_search = True
    with pytest.raises(ValueError, match="search 0 \\('ada'\\) failed: broken"):
        r.retrieve(["ada"], k=1)


# ---- errors ------------------------------------------------------------------------------------
def test_unreachable_cluster_names_the_url_and_how_to_start_one(flavor):
    port = free_port()
    url = f"{flavor}+http://127.0.0.1:{port}/wiki18"
    config = SearchEngineConfig(timeout=2, max_retries=0)
    with pytest.raises(
        ConnectionError, match=f"cannot reach {flavor} at {re.escape(url)}.*docker run"
    ):
        SearchEngineRetriever(url, config=config)


def test_missing_client_names_the_extra(monkeypatch):
    for module in ("opensearchpy", "elasticsearch"):
        monkeypatch.setitem(sys.modules, module, None)  # import fails
    for flavor, client in (("opensearch", "opensearch-py"), ("elasticsearch", "elasticsearch")):
        with pytest.raises(
            ImportError, match=rf"needs {client}: pip install 'rag-gym\[search-engine\]'"
        ):
            SearchEngineRetriever(f"{flavor}+http://127.0.0.1:9/x")


def test_refused_credentials_are_a_permission_error(flavor, monkeypatch):
    monkeypatch.delenv("RAG_GYM_SEARCH_AUTH", raising=False)
    engine = FakeEngine(flavor, auth=("ann", "s3cret"))
    try:
        with pytest.raises(PermissionError, match=r"refused the credentials.*RAG_GYM_SEARCH_AUTH"):
            SearchEngineRetriever(engine.url())
        with pytest.raises(PermissionError) as info:
            SearchEngineRetriever(engine.url(auth="ann:wrong@"))
        assert "wrong" not in str(info.value) and "ann:***@" in str(info.value)
        r = SearchEngineRetriever(engine.url(auth="ann:s3cret@"), TINY)
        assert r.retrieve(["ada"], k=1).ids == [["d1"]]
        assert r.url == engine.url(auth="ann:***@")
        r2 = SearchEngineRetriever(engine.url(), auth=("ann", "s3cret"))
        assert r2.corpus_size == 6
        monkeypatch.setenv("RAG_GYM_SEARCH_AUTH", "ann:s3cret")  # no password in the URL
        assert SearchEngineRetriever(engine.url()).corpus_size == 6
    finally:
        engine.close()


def test_the_other_engine_at_the_url_is_named():
    for client in CLIENTS:
        _client_or_skip(client)
    es, os_ = FakeEngine("elasticsearch"), FakeEngine("opensearch")
    try:
        with pytest.raises(ValueError, match="the server is elasticsearch, not opensearch"):
            SearchEngineRetriever(es.url().replace("elasticsearch+", "opensearch+"))
        with pytest.raises(ValueError, match="if it is OpenSearch, use opensearch\\+http://"):
            SearchEngineRetriever(os_.url().replace("opensearch+", "elasticsearch+"))
    finally:
        es.close()
        os_.close()


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("http://127.0.0.1:9200/wiki18", "expected an index URL such as"),
        ("opensearch+http://127.0.0.1:9200", "expected the index name last"),
        ("opensearch+http://127.0.0.1:9200/Wiki", "expected an index name in lower case"),
        ("opensearch+http://127.0.0.1:9200/_wiki", "not starting with"),
    ],
)
def test_bad_urls(url, match):
    with pytest.raises(ValueError, match=match):
        EngineURL.parse(url)


def test_url_parsing_and_config_checks():
    u = EngineURL.parse("opensearch+https://a%40b:p%3Aw@[::1]:9201/proxy/wiki-18")
    assert (u.base, u.index, u.auth) == ("https://[::1]:9201/proxy", "wiki-18", ("a@b", "p:w"))
    assert is_engine_url("elasticsearch+http://h/x") and not is_engine_url("http://h/x")
    assert not is_engine_url(None)
    with pytest.raises(ValueError, match=r"expected k1 >= 0 and 0 <= b <= 1, got k1=1\.5, b=2"):
        SearchEngineConfig(b=2)
    with pytest.raises(ValueError, match="expected shards >= 1, got 0"):
        SearchEngineConfig(shards=0)
    with pytest.raises(ValueError, match="expected timeout > 0 seconds"):
        SearchEngineConfig(timeout=0)
    with pytest.raises(ValueError, match="Snowball language name"):
        SearchEngineConfig(stemmer="English stemmer")
    with pytest.raises(TypeError, match="expected config to be a SearchEngineConfig, got dict"):
        SearchEngineRetriever("opensearch+http://127.0.0.1:9/x", config={"k1": 1})


# ---- the env, the server and the command line ----------------------------------------------------
@pytest.fixture
def synth_index():
    _client_or_skip("opensearch")
    from rag_gym.data.synthhop import world_for

    world = world_for("default", **SMALL_WORLD)
    engine = FakeEngine("opensearch")
    SearchEngineRetriever(engine.url("synth"), world.corpus)
    yield engine, world
    engine.close()


def test_env_searches_a_cluster_index(synth_index):
    import gymnasium as gym

    import rag_gym  # noqa: F401

    engine, world = synth_index
    url = engine.url("synth")
    env = gym.make("rag_gym/SynthHop-v0", split="validation", dataset_kwargs=SMALL_WORLD, index=url)
    assert isinstance(env.unwrapped.retriever, SearchEngineRetriever)
    env.reset(seed=3)
    question = env.unwrapped.current_example.question
    n = len(engine.bodies("/_msearch"))
    obs, _, _, _, info = env.step({"type": 0, "text": question})
    assert len(engine.bodies("/_msearch")) == n + 1
    expected = SearchEngineRetriever(url).retrieve([question], k=3).ids[0]
    assert info["retrieved_ids"] == expected and len(expected) == 3
    for pid in expected:  # the passages are rendered from the hits' _source
        assert world.corpus[pid].text[:40] in obs
    with pytest.raises(ValueError, match="is an index: pass index="):
        gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD, retriever=url)


def test_retrieval_server_serves_a_cluster_index(synth_index):
    pytest.importorskip("fastapi", reason="needs fastapi: pip install 'rag-gym[server]'")
    from fastapi.testclient import TestClient

    from rag_gym.retrieval.server import create_app

    engine, world = synth_index
    retriever = SearchEngineRetriever(engine.url("synth"))
    # one event loop for the whole client (the micro-batcher lives on it)
    with TestClient(create_app(retriever, kind="opensearch")) as client:
        health = client.get("/health").json()
        assert (health["corpus_size"], health["kind"]) == (len(world.corpus), "opensearch")
        pool = world.corpus.ids[:5]
        q = world.corpus.texts[3][:60]
        reply = client.post(
            "/retrieve", json={"queries": [q], "topk": 2, "within": [pool], "return_scores": True}
        )
        assert reply.status_code == 200, reply.text
        (docs,) = reply.json()["result"]
        assert docs[0]["document"]["id"] == world.corpus.ids[3]
        assert {d["document"]["id"] for d in docs} <= set(pool)
        p = world.corpus[world.corpus.ids[3]]
        assert docs[0]["document"]["contents"] == f"{p.title}\n{p.text}"
        (body,) = engine.bodies("/_msearch")[-1][1::2]
        assert body["query"]["bool"]["filter"] == [{"terms": {"id": pool}}]
        bad = client.post("/retrieve", json={"queries": [q], "topk": 1, "within": [["nope"]]})
        assert bad.status_code == 422 and "not in the index" in bad.json()["error"]


def test_serve_command_takes_a_cluster_index(synth_index, monkeypatch):
    pytest.importorskip("fastapi", reason="needs fastapi: pip install 'rag-gym[server]'")
    from typer.testing import CliRunner

    import rag_gym.retrieval.server as server
    from rag_gym.cli import app

    engine, world = synth_index
    served = []
    monkeypatch.setattr(server, "run_server", lambda app_, **kw: served.append((app_, kw)))
    url = engine.url("synth")
    result = CliRunner().invoke(app, ["serve", "--index", url, "--port", "8123"])
    assert result.exit_code == 0, result.output
    assert f"serving opensearch index {url} ({len(world.corpus)} passages)" in result.output
    assert served and served[0][1]["port"] == 8123
    result = CliRunner().invoke(app, ["serve", "--index", url, "--corpus", "c.jsonl"])
    assert result.exit_code != 0 and "--corpus goes with an index directory" in result.output


# ---- a real server -------------------------------------------------------------------------------
REAL = [
    (f, os.environ.get(f"RAG_GYM_{f.upper()}_URL"))
    for f in CLIENTS
    if os.environ.get(f"RAG_GYM_{f.upper()}_URL")
]


@pytest.mark.slow
@pytest.mark.parametrize(("engine", "base"), REAL or [(None, None)])
def test_real_server(engine, base):
    """Index a SynthHop world on a real cluster; pools, exclusions and agreement with rag-gym's
    BM25 (mean top-5 overlap) on the same questions."""
    if engine is None:
        pytest.skip(
            "no OpenSearch/Elasticsearch server on this machine: set "
            "RAG_GYM_OPENSEARCH_URL=http://127.0.0.1:9200 to run"
        )
    _client_or_skip(engine)
    from rag_gym.data.synthhop import world_for
    from rag_gym.retrieval import BM25Retriever

    world = world_for("default", **SMALL_WORLD)
    scheme, _, rest = base.rstrip("/").partition("://")
    url = f"{engine}+{scheme}://{rest}/rag-gym-test-{uuid.uuid4().hex[:8]}"
    r = SearchEngineRetriever(url, world.corpus)
    try:
        questions = [q.question for q in world.questions["validation"]]
        ours = BM25Retriever(world.corpus).retrieve(questions, k=5)
        theirs = r.retrieve(questions, k=5)
        overlap = [len(set(a) & set(b)) / 5 for a, b in zip(ours.ids, theirs.ids, strict=True)]
        assert sum(overlap) / len(overlap) >= 0.8, overlap
        assert all(s == sorted(s, reverse=True) for s in theirs.scores)
        pool = world.corpus.ids[:10]
        res = r.retrieve(questions[:3], k=4, within=[pool] * 3, exclude=[pool[:2]] * 3)
        assert all(set(ids) <= set(pool[2:]) and len(ids) == 4 for ids in res.ids)
        again = SearchEngineRetriever(url)
        assert again.retrieve(questions[:5], k=5).ids == theirs.ids[:5]
    finally:
        r.client.indices.delete(index=r.index_name)  # only the index this test made
