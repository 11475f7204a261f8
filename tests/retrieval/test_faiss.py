"""Prebuilt FAISS indexes (FlashRAG's builder, Search-R1's e5_Flat.index): DenseRetriever.from_faiss.

An index built the FlashRAG way (the embedded MiniLM encodes each ``contents``, the vectors go
into an inner-product ``Flat`` index written by ``faiss.write_index``, beside an ``{id,
contents}`` JSONL) gives the same top-k as rag-gym's own dense index over the same vectors;
a mismatched corpus, dimension, metric or file is a clear error.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag_gym.data import Corpus
from rag_gym.data.synthhop import world_for
from rag_gym.retrieval.dense import DenseRetriever, default_query_prefix
from tests.conftest import requires_dense

faiss = pytest.importorskip("faiss", reason="needs faiss: pip install 'rag-gym[dense]'")


def keyword_encoder(texts):
    """A stub encoder (8 dimensions) for the error cases: no model needed."""
    return np.array([[t.count(c) + 1.0 for c in "aeiourst"] for t in texts], dtype=np.float32)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """200 passages of a SynthHop world as wiki-18-style JSONL, and a FAISS file of their
    stub-encoded vectors."""
    world = world_for("default", n_passages=500, n_questions=(10, 5, 5))
    folder = tmp_path_factory.mktemp("faiss")
    jsonl = folder / "corpus.jsonl"
    with open(jsonl, "w", encoding="utf-8") as f:
        for p in list(world.corpus)[:200]:
            f.write(json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}) + "\n")
    corpus = Corpus.from_jsonl(jsonl)
    vectors = keyword_encoder(corpus.contents())
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = faiss.index_factory(vectors.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(vectors)
    faiss.write_index(index, str(folder / "stub_Flat.index"))
    return {"world": world, "jsonl": jsonl, "corpus": corpus, "index": folder / "stub_Flat.index"}


@requires_dense
@pytest.mark.slow
def test_flashrag_built_index_matches_rag_gym_index(files, tmp_path):
    from sentence_transformers import SentenceTransformer

    from rag_gym.retrieval.encoders import embedded_minilm_path

    corpus = files["corpus"]
    # the FlashRAG way: encode contents, normalise, an inner-product Flat index, write_index
    model = SentenceTransformer(str(embedded_minilm_path()), device="cpu")
    vectors = model.encode(corpus.contents(), normalize_embeddings=True, batch_size=64)
    index = faiss.index_factory(vectors.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(np.asarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(tmp_path / "minilm_Flat.index"))

    ours = DenseRetriever(corpus)  # rag-gym's own index, the same embedded MiniLM
    loaded = DenseRetriever.from_faiss(tmp_path / "minilm_Flat.index", files["jsonl"], None)
    assert loaded.config.index == "flat" and loaded.embeddings is None
    queries = [q.question for q in files["world"].questions["train"]]
    a, b = ours.retrieve(queries, 5), loaded.retrieve(queries, 5)
    assert a.ids == b.ids
    np.testing.assert_allclose(a.scores, b.scores, atol=1e-4)
    # pools read the index's own vectors
    pool = a.ids[0][::-1] + corpus.ids[:5]
    assert (
        loaded.retrieve(queries[:1], 3, within=[pool]).ids
        == ours.retrieve(queries[:1], 3, within=[pool]).ids
    )


@pytest.mark.parametrize("kind", ["Flat", "HNSW16", "IVF4,Flat"])
def test_index_types_load_mapped_and_search(files, tmp_path, kind):
    corpus = files["corpus"]
    vectors = keyword_encoder(corpus.contents())
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    index = faiss.index_factory(vectors.shape[1], kind, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add(vectors)
    faiss.write_index(index, str(tmp_path / "x.index"))
    for mmap in (True, False):
        r = DenseRetriever.from_faiss(
            tmp_path / "x.index", files["jsonl"], keyword_encoder, mmap=mmap, nprobe=4
        )
        got = r.retrieve(["stone river tower"], 3)
        assert len(got.ids[0]) == 3 and got.scores[0] == sorted(got.scores[0], reverse=True)
    if kind.startswith("IVF"):
        with pytest.raises(ValueError, match="within= needs the passage vectors"):
            r.retrieve(["x"], 2, within=[corpus.ids[:4]])


def test_a_corpus_of_another_size_is_refused(files, tmp_path):
    short = tmp_path / "short.jsonl"
    short.write_text("".join(files["jsonl"].read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(ValueError, match=r"holds 200 vectors but .*short.jsonl has 199 passages"):
        DenseRetriever.from_faiss(files["index"], short, keyword_encoder)


def test_an_encoder_of_another_dimension_is_refused(files):
    def wide(texts):
        return np.ones((len(texts), 16), dtype=np.float32)

    with pytest.raises(ValueError, match=r"gives 16-dimensional vectors.* 8-dimensional ones"):
        DenseRetriever.from_faiss(files["index"], files["jsonl"], wide)


def test_an_l2_index_and_a_file_that_is_no_index_are_refused(files, tmp_path):
    l2 = faiss.IndexFlatL2(8)
    l2.add(np.ones((200, 8), dtype=np.float32))
    faiss.write_index(l2, str(tmp_path / "l2.index"))
    with pytest.raises(ValueError, match="expected an inner-product index"):
        DenseRetriever.from_faiss(tmp_path / "l2.index", files["jsonl"], keyword_encoder)
    (tmp_path / "junk.index").write_bytes(b"not a faiss index at all")
    with pytest.raises(ValueError, match="cannot read a FAISS index"):
        DenseRetriever.from_faiss(tmp_path / "junk.index", files["jsonl"], keyword_encoder)
    with pytest.raises(FileNotFoundError, match="no such FAISS index file"):
        DenseRetriever.from_faiss(tmp_path / "absent.index", files["jsonl"], keyword_encoder)
    r = DenseRetriever.from_faiss(files["index"], files["jsonl"], keyword_encoder)
    with pytest.raises(ValueError, match="from_faiss serves its index file as it is"):
        r.save(tmp_path / "out")


def test_query_prefixes_by_model_name():
    assert default_query_prefix("intfloat/e5-base-v2") == "query: "
    assert default_query_prefix("/models/multilingual-e5-large") == "query: "
    assert default_query_prefix("BAAI/bge-large-en-v1.5").startswith("Represent this sentence")
    assert default_query_prefix("BAAI/bge-m3") == ""
    assert default_query_prefix("sentence-transformers/all-MiniLM-L6-v2") == ""
    assert default_query_prefix(None) == ""


@requires_dense
@pytest.mark.slow
def test_serve_a_faiss_index_with_verbatim_contents(files, tmp_path):
    """``rag-gym serve --faiss-index --corpus --encoder minilm``: the served top-k is
    from_faiss's, and contents come back as the corpus rows have them (quoted titles)."""
    pytest.importorskip("fastapi", reason="needs the server extra")
    from sentence_transformers import SentenceTransformer

    from rag_gym.retrieval.encoders import embedded_minilm_path
    from tests.retrieval.test_server_compat import post, start_server, stop

    corpus = files["corpus"]
    model = SentenceTransformer(str(embedded_minilm_path()), device="cpu")
    vectors = model.encode(corpus.contents(), normalize_embeddings=True)
    index = faiss.index_factory(vectors.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(np.asarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(tmp_path / "m.index"))
    rows = [json.loads(line) for line in files["jsonl"].read_text().splitlines()]
    contents = {r["id"]: r["contents"] for r in rows}
    queries = [q.question for q in files["world"].questions["validation"]]
    want = DenseRetriever.from_faiss(tmp_path / "m.index", files["jsonl"], None).retrieve(
        queries, 3
    )
    proc, url = start_server(
        [
            *("--faiss-index", str(tmp_path / "m.index")),
            *("--corpus", str(files["jsonl"]), "--encoder", "minilm"),
        ]
    )
    try:
        status, reply = post(url + "/retrieve", {"queries": queries, "topk": 3})
        assert status == 200
        assert [[d["id"] for d in docs] for docs in reply["result"]] == want.ids
        assert all(d["contents"] == contents[d["id"]] for docs in reply["result"] for d in docs)
        assert reply["result"][0][0]["contents"].startswith('"')
    finally:
        stop(proc)


def test_serve_refuses_a_faiss_index_without_corpus_or_encoder(files):
    from typer.testing import CliRunner

    from rag_gym.cli import app

    result = CliRunner().invoke(app, ["serve", "--faiss-index", str(files["index"])])
    assert result.exit_code != 0 and "--faiss-index needs --corpus" in result.output
    result = CliRunner().invoke(app, ["serve"])
    assert result.exit_code != 0 and "give --index DIR" in result.output
