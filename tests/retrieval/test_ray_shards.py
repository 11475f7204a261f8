"""Sharded retrieval on a real Ray cluster: a head and two worker nodes, each its own raylet,
started by Ray on 127.0.0.1. The router's merged answers equal one index over the whole corpus,
a replica killed in the middle of 1,000 requests loses none of them, and the build runs as Ray
tasks."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

import pytest

from rag_gym.retrieval.shards import build_bm25_shards, build_dense_shards
from tests.conftest import dense_available
from tests.retrieval.shard_tools import hotpot_case, synthhop_case
from tests.retrieval.test_shards import assert_same, single

ray = pytest.importorskip("ray", reason="needs Ray: pip install 'rag-gym[ray]'")


def ray_retriever(path, **kwargs):
    from rag_gym.retrieval.ray_shards import RayShardedRetriever

    return RayShardedRetriever(path, cpus_per_replica=0.25, **kwargs)


@pytest.mark.slow
def test_the_cluster_has_three_nodes_on_loopback(ray_cluster):
    nodes = [n for n in ray.nodes() if n["Alive"]]
    assert len(nodes) == 3
    assert {n["NodeManagerAddress"] for n in nodes} == {"127.0.0.1"}


@pytest.mark.parametrize("case", [synthhop_case, hotpot_case], ids=["synthhop", "hotpotqa"])
@pytest.mark.slow
def test_bm25_shards_on_ray_equal_one_index(ray_cluster, tmp_path, case):
    from rag_gym.retrieval.ray_shards import ray_map

    path, queries, _ = case(tmp_path)
    want = single(path, tmp_path / "one").retrieve(queries, 5)
    for s in (1, 2, 3):
        # built as Ray tasks: the same shards as a build here
        out = build_bm25_shards(path, tmp_path / f"s{s}", s, map_fn=ray_map(cpus=0.25))
        local = build_bm25_shards(path, tmp_path / f"l{s}", s)
        assert (out / "shards.json").read_text().split('"rag_gym_version"')[1] == (
            local / "shards.json"
        ).read_text().split('"rag_gym_version"')[1]
        router = ray_retriever(out, shards=s)
        try:
            nodes = {ray.get(a.ready.remote())[2] for row in router.replicas for a in row}
            assert len(nodes) == s  # one process a replica
            assert_same(router.retrieve(queries, 5), want)
        finally:
            router.shutdown()


@pytest.mark.skipif(not dense_available(), reason="needs the dense extra")
@pytest.mark.slow
def test_dense_shards_on_ray_equal_one_index(ray_cluster, tmp_path):
    from rag_gym.data import Corpus
    from rag_gym.retrieval.dense import DenseConfig, DenseRetriever
    from rag_gym.retrieval.ray_shards import ray_map

    path, queries, _ = synthhop_case(tmp_path)
    lines = path.read_text(encoding="utf-8").splitlines()[:600]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    config = DenseConfig(batch_size=8)
    queries = queries[:2000]
    want = DenseRetriever(Corpus.from_jsonl(path), config).retrieve(queries, 5)
    for s in (1, 2, 3):
        out = build_dense_shards(path, tmp_path / f"d{s}", s, config, map_fn=ray_map(cpus=0.25))
        router = ray_retriever(out, shards=s)
        try:
            assert_same(router.retrieve(queries, 5), want)
        finally:
            router.shutdown()


@pytest.mark.slow
def test_a_replica_killed_under_load_loses_no_request(ray_cluster, tmp_path):
    path, queries, _ = synthhop_case(tmp_path)
    queries = queries[:1000]
    one = single(path, tmp_path / "one")
    want = one.retrieve(queries, 3)
    router = ray_retriever(build_bm25_shards(path, tmp_path / "s2", 2), replicas=2)
    try:
        before = router.replica_pids()
        answers: dict[int, tuple] = {}
        errors: list[BaseException] = []
        started = threading.Event()

        def client(rows):
            try:
                for i in rows:
                    got = router.retrieve([queries[i]], 3)
                    answers[i] = (got.ids[0], got.scores[0])
                    started.set()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(range(t, 1000, 4),)) for t in range(4)]
        for t in threads:
            t.start()
        started.wait(60)
        time.sleep(0.5)
        victim = router.replicas[0][0]
        ray.kill(victim, no_restart=False)  # Ray restarts it; its calls in flight fail
        for t in threads:
            t.join()
        assert not errors
        assert len(answers) == 1000  # every request answered once
        wrong = [i for i in range(1000) if answers[i] != (want.ids[i], want.scores[i])]
        assert wrong == []
        assert router.failovers >= 1
        assert router.replica_pids()[0][0] != before[0][0]  # restarted: a new process
    finally:
        router.shutdown()


@pytest.mark.slow
def test_sharded_index_served_over_http_on_ray(ray_cluster, tmp_path):
    from fastapi.testclient import TestClient

    from rag_gym.retrieval.server import create_app

    path, queries, _ = synthhop_case(tmp_path)
    one = single(path, tmp_path / "one")
    router = ray_retriever(build_bm25_shards(path, tmp_path / "s3", 3), shards=3)
    try:
        with TestClient(create_app(router, kind="bm25")) as client:
            health = client.get("/health").json()
            assert health["corpus_size"] == len(one.corpus)
            reply = client.post(
                "/retrieve", json={"queries": queries[:50], "topk": 3, "return_scores": True}
            ).json()
        want = one.retrieve(queries[:50], 3)
        assert [[d["document"]["id"] for d in row] for row in reply["result"]] == want.ids
        assert [[d["score"] for d in row] for row in reply["result"]] == want.scores
        contents = reply["result"][0][0]["document"]["contents"]
        pid = want.ids[0][0]
        assert contents.endswith(one.corpus.texts[one.corpus._index[pid]])
    finally:
        router.shutdown()


@pytest.mark.slow
def test_an_unreachable_cluster_is_a_clear_error(tmp_path):
    # in a process of its own: this one is connected to the test cluster
    path, _, _ = synthhop_case(tmp_path)
    out = build_bm25_shards(path, tmp_path / "s2", 2)
    code = (
        "from rag_gym.retrieval.ray_shards import RayShardedRetriever\n"
        f"RayShardedRetriever({str(out)!r}, address='127.0.0.1:9')\n"
    )
    env = {**os.environ, "RAY_ADDRESS": ""}
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert proc.returncode != 0
    assert "ClusterError: no Ray cluster at '127.0.0.1:9'" in proc.stderr
    assert "ray start --head" in proc.stderr
    assert time.monotonic() - t0 < 90
    # and through the CLI: a one-line error, no traceback
    cli = subprocess.run(
        [sys.executable, "-m", "rag_gym.cli", "serve", "--index", str(out), "--ray", "127.0.0.1:9"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert cli.returncode != 0 and "no Ray cluster at '127.0.0.1:9'" in cli.stderr
    assert "Traceback" not in cli.stderr


class _FakeRay:
    """What ``_check_cpus`` and ``_wait_ready`` ask of Ray: the cluster's CPUs, and replicas
    that become ready after ``ready_after`` waits."""

    def __init__(self, total: float, free: float, ready_after: int = 0) -> None:
        self.total, self.free, self.ready_after, self.waits = total, free, ready_after, 0

    def cluster_resources(self):
        return {"CPU": self.total}

    def available_resources(self):
        return {"CPU": self.free}

    def wait(self, refs, num_returns, timeout):
        self.waits += 1
        return (list(refs), []) if self.waits > self.ready_after else ([], list(refs))

    def get(self, refs):
        return refs


def test_replicas_that_need_more_cpus_than_the_cluster_has_are_refused_at_once(caplog):
    from rag_gym.retrieval.ray_shards import _check_cpus, _wait_ready

    with pytest.raises(ValueError, match=r"need 8 CPUs, the Ray cluster has 4: pass fewer"):
        _check_cpus(_FakeRay(4, 4), 4, 2, 1.0)
    with caplog.at_level("WARNING", logger="rag_gym.retrieval.ray_shards"):
        _check_cpus(_FakeRay(8, 2), 4, 2, 1.0)  # they exist, others hold them: a log line
        assert "need 8 CPUs and 2 of the cluster's 8 are free now" in caplog.text
        _wait_ready(_FakeRay(8, 8, ready_after=2), ["a", "b"], timeout=60, every=0.01)
        assert "0 of 2 replicas ready after" in caplog.text
    with pytest.raises(TimeoutError, match="2 of 2 replicas not ready"):
        _wait_ready(_FakeRay(8, 8, ready_after=10**9), ["a", "b"], timeout=0.05, every=0.01)
