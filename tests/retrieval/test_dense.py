"""Dense retrieval: exact search by hand, pools, exclusion, ties, IVF/HNSW, save/load, damaged folders."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rag_gym.data import Corpus, Passage
from rag_gym.retrieval.dense import DenseConfig, DenseRetriever
from tests.conftest import requires_dense
from tests.retrieval.index_tools import reseal

faiss = pytest.importorskip("faiss", reason="needs faiss: pip install 'rag-gym[dense]'")

# a stub encoder: one dimension per keyword, so scores are easy to compute by hand
WORDS = ["apple", "pear", "red", "green", "wine"]


def encoder(texts):
    return np.array(
        [[t.lower().count(w) + 0.01 * j for j, w in enumerate(WORDS)] for t in texts],
        dtype=np.float32,
    )


CORPUS = Corpus(
    [
        Passage("d3", "", "red apple"),
        Passage("d1", "", "green apple"),
        Passage("d2", "", "red wine"),
        Passage("d4", "", "pear"),
        Passage("d0", "", "red apple"),
    ]
)


def by_hand(query: str, ids=None) -> list[str]:
    def unit(v):
        return v / np.linalg.norm(v)

    q = unit(encoder([query])[0])
    rows = [
        (float(unit(encoder([p.text])[0]) @ q), p.id) for p in CORPUS if ids is None or p.id in ids
    ]
    return [pid for _, pid in sorted(rows, key=lambda t: (-t[0], t[1]))]


@pytest.mark.parametrize("index", ["flat", "hnsw", "ivf"])
def test_ranking_matches_cosine_by_hand(index):
    dense = DenseRetriever(CORPUS, DenseConfig(index=index, nlist=2, nprobe=2), encoder=encoder)
    for query in ("red apple", "pear", "wine"):
        assert dense.retrieve([query], k=3).ids[0] == by_hand(query)[:3]


def test_ties_by_id_pools_and_exclusion():
    dense = DenseRetriever(CORPUS, encoder=encoder)
    assert dense.retrieve(["red apple"], k=2).ids == [["d0", "d3"]]  # identical texts: id order
    assert dense.retrieve(["red apple"], k=2, exclude=[["d0"]]).ids == [
        [p for p in by_hand("red apple") if p != "d0"][:2]
    ]
    assert dense.retrieve(["red apple"], k=2, within=[["d2", "d4", "d3"]]).ids == [
        by_hand("red apple", {"d2", "d4", "d3"})[:2]
    ]
    with pytest.raises(ValueError, match=r"expected k <= 5 \(the size of the corpus\)"):
        dense.retrieve(["x"], k=6)


def test_save_load_roundtrip_and_fp16(tmp_path):
    dense = DenseRetriever(CORPUS, DenseConfig(fp16=True), encoder=encoder)
    out = dense.save(tmp_path / "dense")
    loaded = DenseRetriever.load(out, encoder=encoder)
    queries = ["red apple", "pear", "green"]
    assert loaded.retrieve(queries, k=4).ids == dense.retrieve(queries, k=4).ids
    assert loaded.embeddings.dtype == np.float16
    assert json.loads((out / "params.json").read_text())["kind"] == "dense"


def test_damaged_index_folders(tmp_path):
    out = DenseRetriever(CORPUS, encoder=encoder).save(tmp_path / "dense")
    (out / "faiss.index").write_bytes(b"not an index")
    with pytest.raises(ValueError, match=r"faiss\.index has 12 bytes, the index was built with"):
        DenseRetriever.load(out, encoder=encoder)
    reseal(out)  # behind the checksums, FAISS's own reading names the file
    with pytest.raises(ValueError, match=r"faiss\.index: cannot read the FAISS index"):
        DenseRetriever.load(out, encoder=encoder)
    out = DenseRetriever(CORPUS, encoder=encoder).save(tmp_path / "dense")
    np.save(out / "embeddings.npy", np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match=r"embeddings\.npy has \d+ bytes, the index was built"):
        DenseRetriever.load(out, encoder=encoder)
    reseal(out)
    with pytest.raises(ValueError, match=r"embeddings\.npy has shape \(2, 5\), expected \(5, 5\)"):
        DenseRetriever.load(out, encoder=encoder)
    with pytest.raises(ValueError, match=r"is not a rag-gym index: params\.json is missing"):
        DenseRetriever.load(tmp_path / "nothing", encoder=encoder)
    with pytest.raises(ValueError, match="expected index 'flat', 'ivf' or 'hnsw'"):
        DenseConfig(index="annoy")


@requires_dense
def test_embedded_minilm_offline():
    corpus = Corpus(
        [
            Passage("a", "Ada Vell", "Ada Vell is a painter born in Orrin."),
            Passage("b", "Kestrel Guild", "Kestrel Guild is a craft guild."),
            Passage("c", "Tamaria", "Tamaria is a country."),
        ]
    )
    dense = DenseRetriever(corpus)
    assert dense.retrieve(["Which artist was born in Orrin?"], k=1).ids == [["a"]]
    assert dense.retrieve(["a guild of craftsmen"], k=1).ids == [["b"]]
