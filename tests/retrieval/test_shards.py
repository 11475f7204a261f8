"""Sharded indexes searched in this process: the merged top-k of S shards equals one index over
the whole corpus (ids, scores, tie-breaks), and a bad sharded index is a clear error.

The same equality on a real Ray cluster is tests/retrieval/test_ray_shards.py."""

from __future__ import annotations

import itertools
import json
import shutil

import pytest

from rag_gym.data.types import iter_corpus_jsonl
from rag_gym.retrieval.bm25 import BM25Retriever
from rag_gym.retrieval.bm25_build import build_bm25_index
from rag_gym.retrieval.shards import (
    MANIFEST,
    ShardedRetriever,
    ShardError,
    build_bm25_shards,
    build_dense_shards,
    read_shards,
)
from tests.conftest import requires_dense
from tests.retrieval.shard_tools import hotpot_case, small_corpus, synthhop_case


def single(path, out):
    build_bm25_index((p for _, p in iter_corpus_jsonl(path)), out)
    return BM25Retriever.load(out)


def assert_same(got, want):
    assert got.ids == want.ids
    assert got.scores == want.scores  # the same float32 values, not merely close ones


@pytest.mark.parametrize("case", [synthhop_case, hotpot_case], ids=["synthhop", "hotpotqa"])
@pytest.mark.slow
def test_bm25_shards_equal_one_index(tmp_path, case):
    path, queries, pools = case(tmp_path)
    assert len(queries) >= 2000
    one = single(path, tmp_path / "one")
    want = one.retrieve(queries, 5)
    exclude = [ids[:1] for ids in want.ids]
    want_excl = one.retrieve(queries, 5, exclude=exclude)
    want_pool = [one.retrieve([q], 2, within=[p]) for q, p in zip(queries, pools, strict=False)]
    for s in (1, 2, 3):
        out = build_bm25_shards(path, tmp_path / f"s{s}", s)
        manifest = read_shards(out, s)
        assert [e["size"] for e in manifest["shards"]] and sum(
            e["size"] for e in manifest["shards"]
        ) == len(one.corpus)
        sharded = ShardedRetriever.load(out, shards=s)
        assert_same(sharded.retrieve(queries, 5), want)
        assert_same(sharded.retrieve(queries, 5, exclude=exclude), want_excl)
        for (q, p), w in zip(zip(queries, pools, strict=False), want_pool, strict=False):
            assert_same(sharded.retrieve([q], 2, within=[p]), w)
        # the passages returned are the corpus's own
        pid = want.ids[0][0]
        row = one.corpus._index[pid]
        assert sharded.corpus.texts[sharded.corpus._index[pid]] == one.corpus.texts[row]


def test_the_sharded_corpus_reads_the_shards_and_does_not_grow(tmp_path, monkeypatch):
    """The router's corpus is the whole corpus, row for row, read from the shards' corpus
    files: every passage (returned or not) is the single index's; what it remembers of recent
    results stays bounded; it is read-only."""
    from rag_gym.data.types import Passage
    from rag_gym.retrieval.shards import ShardedCorpus

    path, queries, _ = synthhop_case(tmp_path)
    one = single(path, tmp_path / "one")
    sharded = ShardedRetriever.load(build_bm25_shards(path, tmp_path / "s3", 3))
    corpus = sharded.corpus
    assert len(corpus) == len(one.corpus) == corpus.server_size
    assert list(corpus.ids) == list(one.corpus.ids)
    for pid in itertools.islice(one.corpus.ids, 0, None, 7):  # never returned yet
        assert corpus[pid] == one.corpus[pid] and pid in corpus
    monkeypatch.setattr(ShardedCorpus, "recent_ids", 50)
    for i in range(0, 600, 60):
        got = sharded.retrieve(queries[i : i + 60], 5)
        assert len(corpus._recent) <= 50 + 300
        assert [corpus[p] for p in got.ids[-1]] == [one.corpus[p] for p in got.ids[-1]]
    assert "no such id" not in corpus and 3 not in corpus
    with pytest.raises(KeyError, match="no such id"):
        corpus["no such id"]
    with pytest.raises(TypeError, match="read-only"):
        corpus.add(Passage("new", "", "text"))


def test_ties_across_shards_are_broken_by_id(tmp_path):
    # every passage scores the same for "shared": the single index ranks them by id, and so
    # must the merge of shards that each hold some of them
    path = small_corpus(tmp_path, "p", "shared words")
    one = single(path, tmp_path / "one")
    want = one.retrieve(["shared"], 12)
    assert len(set(want.scores[0])) == 1
    sharded = ShardedRetriever.load(build_bm25_shards(path, tmp_path / "s3", 3))
    assert_same(sharded.retrieve(["shared"], 12), want)


@requires_dense
@pytest.mark.slow
def test_dense_shards_equal_one_index(tmp_path):
    from rag_gym.data import Corpus
    from rag_gym.retrieval.dense import DenseConfig, DenseRetriever

    path, queries, _ = synthhop_case(tmp_path)
    lines = path.read_text(encoding="utf-8").splitlines()[:700]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = DenseConfig(batch_size=8)  # encoded 128 at a time: 6 calls
    one = DenseRetriever(Corpus.from_jsonl(path), config)
    queries = queries[:2000]
    want = one.retrieve(queries, 5)
    for s in (1, 2, 3):
        sharded = ShardedRetriever.load(build_dense_shards(path, tmp_path / f"d{s}", s, config))
        assert_same(sharded.retrieve(queries, 5), want)


def test_shards_of_other_corpora_or_kinds_or_counts_are_refused(tmp_path):
    a = build_bm25_shards(small_corpus(tmp_path, "a", "alpha words"), tmp_path / "a", 2)
    b = build_bm25_shards(small_corpus(tmp_path, "b", "beta words"), tmp_path / "b", 2)
    with pytest.raises(ShardError, match="has 2 shards, not 3: pass --shards 2"):
        read_shards(a, 3)
    # a shard of another corpus swapped in
    shutil.rmtree(a / "shard-001")
    shutil.copytree(b / "shard-001", a / "shard-001")
    with pytest.raises(ShardError, match=r"other corpus statistics.*different corpora"):
        ShardedRetriever.load(a)
    # a shard of another kind
    c = build_bm25_shards(small_corpus(tmp_path, "c", "gamma words"), tmp_path / "c", 2)
    manifest = json.loads((c / MANIFEST).read_text())
    params = json.loads((c / "shard-000" / "params.json").read_text())
    assert params["kind"] == "bm25"
    manifest["kind"] = "dense"
    from rag_gym.retrieval.shards import _digest

    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    manifest["manifest_sha256"] = _digest(body)
    (c / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="different retriever kinds"):
        read_shards(c)
    # an edited manifest
    (c / MANIFEST).write_text(json.dumps({**manifest, "n_shards": 5}))
    with pytest.raises(ShardError, match="edited or damaged"):
        read_shards(c)


def test_a_killed_build_leaves_nothing_loadable(tmp_path, monkeypatch):
    from rag_gym.retrieval import shards as mod

    path = small_corpus(tmp_path, "p", "some words")
    calls = []

    def dying_map(fn, args):
        if fn is mod.build_bm25_shard:
            fn(*args[0])  # the first shard is written, then the build dies
            calls.append(1)
            raise KeyboardInterrupt
        return [fn(*a) for a in args]

    with pytest.raises(KeyboardInterrupt):
        build_bm25_shards(path, tmp_path / "out", 2, map_fn=dying_map)
    assert calls and not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]
    with pytest.raises(ShardError, match="is not a sharded index"):
        read_shards(tmp_path / "out")


def test_too_many_shards_and_repeated_ids_are_clear_errors(tmp_path):
    path = small_corpus(tmp_path, "p", "some words")
    with pytest.raises(ValueError, match=r"expected a shard count <= 12 \(the corpus's passages"):
        build_bm25_shards(path, tmp_path / "x", 40)
    dup = tmp_path / "dup.jsonl"
    dup.write_text(path.read_text() + path.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match="passage id 'p3' is repeated"):
        build_bm25_shards(dup, tmp_path / "y", 2)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(path.read_text() + "{not json\n")
    with pytest.raises(ValueError, match="the line at byte"):
        build_bm25_shards(bad, tmp_path / "z", 2)


def test_index_build_shards_from_the_command_line(tmp_path):
    from typer.testing import CliRunner

    from rag_gym.cli import app

    path = small_corpus(tmp_path, "p", "some words")
    runner = CliRunner()
    out = tmp_path / "idx"
    result = runner.invoke(
        app, ["index", "build", "--corpus", str(path), "--shards", "2", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "in 2 shards" in result.output
    assert read_shards(out, 2)["corpus_size"] == 12
    bad = runner.invoke(
        app, ["index", "build", "--corpus", str(path), "--ray", "local", "--out", str(out)]
    )
    assert bad.exit_code != 0 and "give --shards S too" in bad.output
    bad = runner.invoke(app, ["serve", "--index", str(out), "--shards", "2"])
    assert bad.exit_code != 0 and "--shards and --replicas go with --ray" in bad.output


def test_the_shard_count_is_checked_before_any_work_that_grows_with_it(tmp_path):
    """A count over the passages is refused at once (it used to take a pass per shard, and
    2**63 never ended); a count equal to the passages gives one passage a shard, even when the
    passages differ in length so much that byte ranges would leave some shards empty."""
    import time

    from rag_gym.data import Corpus, Passage

    path = tmp_path / "uneven.jsonl"
    Corpus(
        [Passage(f"p{i}", "", ("long " * 400 if i % 7 == 0 else "w") + f" {i}") for i in range(30)]
    ).to_jsonl(path)
    t0 = time.perf_counter()
    for bad in (31, 1_000_000, 2**63):
        with pytest.raises(ValueError, match=r"expected a shard count <= 30 .*pass fewer --shards"):
            build_bm25_shards(path, tmp_path / "x", bad)
    for bad in (0, -5):
        with pytest.raises(ValueError, match="expected a shard count >= 1"):
            build_bm25_shards(path, tmp_path / "x", bad)
    for bad in (True, 2.0, "3"):
        with pytest.raises(TypeError, match="expected the shard count to be an int"):
            build_bm25_shards(path, tmp_path / "x", bad)
    assert time.perf_counter() - t0 < 5 and not (tmp_path / "x").exists()
    one = single(path, tmp_path / "one")
    for s in (30, 29, 7):
        out = build_bm25_shards(path, tmp_path / f"s{s}", s)
        sizes = [e["size"] for e in read_shards(out, s)["shards"]]
        assert len(sizes) == s and min(sizes) >= 1 and sum(sizes) == 30
        assert_same(ShardedRetriever.load(out).retrieve(["long 14", "w 3"], 5),
                    one.retrieve(["long 14", "w 3"], 5))  # fmt: skip


def test_a_sharded_rebuild_never_deletes_what_it_did_not_create(tmp_path):
    """Rebuilding over a sharded index replaces it only while it holds nothing but its own
    files, as the plain build does; a user's file anywhere in it is named and kept."""
    path = small_corpus(tmp_path, "p", "some words")
    out = build_bm25_shards(path, tmp_path / "idx", 2)
    build_bm25_shards(path, out, 3)  # a sharded index of its own files: replaced
    assert read_shards(out, 3)
    for where in ("notes.txt", "shard-001/mine.txt", "shard-000/bm25s/extra.npy", "shard-9x"):
        kept = out / where
        kept.parent.mkdir(parents=True, exist_ok=True)
        kept.write_text("the user's")
        with pytest.raises(FileExistsError, match=rf"not its own \({where}\).*--force"):
            build_bm25_shards(path, out, 2)
        assert kept.read_text() == "the user's" and read_shards(out, 3)
        kept.unlink()
    (out / "shard-005").mkdir()  # an empty folder that is no index
    with pytest.raises(FileExistsError, match=r"not its own \(shard-005\)"):
        build_bm25_shards(path, out, 2)
    (out / "shard-005").rmdir()
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "thesis.tex").write_text("years of work")
    with pytest.raises(FileExistsError, match=r"not a sharded rag-gym index.*thesis\.tex"):
        build_bm25_shards(path, plain, 2)
    assert (plain / "thesis.tex").read_text() == "years of work"
    build_bm25_shards(path, out, 2)  # clean again: replaced
    assert read_shards(out, 2)
    build_bm25_shards(path, plain, 2, force=True)  # --force replaces anything
    assert not (plain / "thesis.tex").exists()
