"""One retrieval-source type: every way of naming where passages are searched is parsed by
rag_gym/retrieval/source.py, with the URL predicates of rag_gym/_http.py, and nowhere else."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rag_gym._http import is_engine_url, is_server_url, is_url
from rag_gym.retrieval.source import Source

PACKAGE = Path(__file__).resolve().parents[2] / "rag_gym"


@pytest.mark.parametrize(
    ("value", "role", "kind"),
    [
        ("http://127.0.0.1:8000", "retriever", "server"),
        ("https://search.example/api", "retriever", "server"),
        ("opensearch+http://127.0.0.1:9200/wiki18", "index", "engine"),
        ("elasticsearch+https://es.local:9200/wiki18", "index", "engine"),
        ("indexes/bm25", "index", "index"),
        (Path("indexes/bm25"), "index", "index"),
        ("corpus.jsonl", "corpus", "corpus"),
    ],
)
def test_each_way_of_naming_a_source_parses_to_its_kind(value, role, kind):
    source = Source.parse(value, role)
    assert (source.kind, source.location) == (kind, str(value))
    assert source.is_remote == (kind in ("server", "engine"))
    assert Source.parse(source, "corpus") is source  # a parsed source is taken as it is


@pytest.mark.parametrize(
    ("value", "role", "error", "match"),
    [
        ("indexes/bm25", "retriever", ValueError, "a retriever object or a server URL"),
        ("opensearch+http://h:9200/w", "retriever", ValueError, "is an index: pass index="),
        ("http://127.0.0.1:8000", "index", ValueError, "a retrieval server's URL is retriever="),
        ("s3://bucket/corpus.jsonl", "corpus", ValueError, "expected corpus to be a file here"),
        (3, "index", TypeError, "expected index to be a str or a path, got int"),
        ("x", "server", ValueError, "expected a role in"),
    ],
)
def test_a_source_given_as_the_wrong_argument_is_refused_by_name(value, role, error, match):
    with pytest.raises(error, match=match):
        Source.parse(value, role)


def test_the_predicates():
    assert is_server_url("http://a") and not is_server_url("opensearch+http://a/b")
    assert is_engine_url("opensearch+https://a:1/b") and not is_engine_url("http://a")
    assert is_url("hf://x") and not is_url("runs/x") and not is_url(None)


def test_a_saved_index_opens_as_load_index_opens_it(tmp_path):
    from rag_gym.data.synthhop import world_for
    from rag_gym.retrieval import BM25Retriever, load_index

    world = world_for(n_passages=2000, n_questions=(10, 5, 5))
    BM25Retriever(world.corpus).save(tmp_path / "index")
    opened = Source.parse(tmp_path / "index", "index").open()
    loaded, _ = load_index(tmp_path / "index")
    queries = [world.questions["train"][i].question for i in range(5)]
    assert opened.retrieve(queries, 3).ids == loaded.retrieve(queries, 3).ids


def test_url_and_folder_sniffing_lives_in_one_module():
    """No module but rag_gym/_http.py tells a URL from a path by its text."""
    pattern = re.compile(r"""startswith\(\(?["']https?://|["']://["'] in """)
    found = [
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if pattern.search(path.read_text(encoding="utf-8"))
    ]
    assert found == ["_http.py"]
