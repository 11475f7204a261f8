"""rag-gym evaluate on a real Ray cluster (a head and two worker nodes on 127.0.0.1): the same
episodes and leaderboard as a local run, a worker node killed mid-run loses no finished episode
and the run completes, and --resume goes on with a Ray run."""

from __future__ import annotations

import json
import threading
import time

import pytest

from rag_gym.baselines import make_agent
from rag_gym.evaluate import EvalConfig, evaluate
from tests.conftest import RAY_NODE, SMALL_WORLD, requires_llama

ray = pytest.importorskip("ray", reason="needs Ray: pip install 'rag-gym[ray]'")

AGENTS = ("random", "search_r1:synthhop")
#: what an episode is, without its timing
KEYS = ("question_id", "prediction", "em", "f1", "recall", "searches", "steps", "actions", "reward")


def config(tmp_path, name, n=8):
    return EvalConfig(
        env_id="rag_gym/SynthHop-v0",
        split="validation",
        n=n,
        seed=3,
        agents=AGENTS,
        env_kwargs={"dataset_kwargs": SMALL_WORLD},
        batch_size=2,
        lm_spec="llama_cpp",
        out_dir=str(tmp_path),
        run_name=name,
    )


def factory():
    from rag_gym.generation.backends import make_lm

    lm = make_lm("llama_cpp", seed=3)
    return lambda name, env: make_agent(name, lm=lm, seed=3, env=env)


def episodes_of(run_dir):
    rows = [json.loads(line) for line in (run_dir / "episodes.jsonl").open()]
    return sorted((tuple(json.dumps(r[k], sort_keys=True) for k in KEYS), r["agent"]) for r in rows)


def table(result):
    """The leaderboard's rows without their timing, as JSON (so that NaN equals NaN)."""
    drop = ("seconds", "s_per_episode", "wall_seconds")
    return [
        json.dumps({k: v for k, v in row.items() if k not in drop}, sort_keys=True, default=str)
        for row in result.rows
    ]


@requires_llama
@pytest.mark.slow
def test_ray_run_equals_local_run_and_survives_a_killed_node(ray_cluster, tmp_path):
    from rag_gym.evaluate.distributed import AgentRecipe, RayEpisodes

    cluster, _ = ray_cluster
    local = evaluate(config(tmp_path, "local"), factory())
    # a third worker node; the node of a worker that is not the head is killed once the run
    # has written its first chunk: search_r1:synthhop plays first (a trained agent), 4 chunks
    # of 2 over 3 workers, so the killed node still holds one
    cluster.add_node(**RAY_NODE)
    cluster.wait_for_nodes()
    runner = RayEpisodes(AgentRecipe("llama_cpp", 3), workers=3, cpus_per_worker=1)
    placed = {node for _, node in ray.get([w.ready.remote() for w in runner.workers])}
    extra = next(n for n in cluster.worker_nodes if n.node_id in placed)
    written = tmp_path / "ray" / "episodes.jsonl"

    def kill_when_started():
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if written.is_file() and written.read_text().count("\n") >= 2:
                break
            time.sleep(0.2)
        cluster.remove_node(extra)

    killer = threading.Thread(target=kill_when_started)
    killer.start()
    try:
        remote = evaluate(config(tmp_path, "ray"), factory(), episodes=runner)
    finally:
        killer.join()
        runner.shutdown()
    assert episodes_of(remote.run_dir) == episodes_of(local.run_dir)
    assert table(remote) == table(local)
    assert len(remote.episodes) == 2 * 8
    assert runner.failures >= 1  # the killed node held a chunk, which ran again elsewhere


@requires_llama
@pytest.mark.slow
def test_resume_goes_on_with_a_ray_run(ray_cluster, tmp_path):
    from rag_gym.evaluate.distributed import AgentRecipe, RayEpisodes

    cfg = config(tmp_path, "half", n=4)
    first = evaluate(EvalConfig(**{**cfg.__dict__, "agents": ("random",)}), factory())
    runner = RayEpisodes(AgentRecipe("llama_cpp", 3), workers=2)
    try:
        both = evaluate(cfg, factory(), episodes=runner, resume=True)
    finally:
        runner.shutdown()
    assert len(both.episodes) == 8
    assert [e for e in both.episodes if e["agent"] == "random"] == first.episodes
