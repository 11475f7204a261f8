"""Evaluation spread over a Ray cluster (``rag-gym evaluate --ray ADDRESS``).

An agent's episodes are cut into chunks of ``batch_size`` questions; ``workers`` Ray actors
(spread over the cluster's nodes) each build the env and the agent's backend once
(:class:`AgentRecipe`: the agent's name, backend spec, seed and prompt, rebuilt in the worker)
and play the chunks they are handed with :func:`~rag_gym.evaluate.scheduler.run_agent`. The
driver writes each chunk's episodes to the run folder as the chunk ends, exactly as a local run
writes them, so ``--resume`` works the same.

Each episode keeps its protocol number (``orders``), which fixes its seed, and greedy decoding
on llama.cpp does not depend on which other episodes share a batch, so the leaderboard is the
one a local run gives with the same seed and questions.

A worker that dies (its process or node killed) fails the chunk it held: the chunk goes back
to the queue and runs on another worker, while Ray restarts the dead one. Episodes already
written stay written; a chunk's episodes are written only once it has ended, so none is
written twice.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class AgentRecipe:
    """What a worker needs to build an agent by name: its LLM backend's spec (``None`` for
    agents that need none), the run's seed, the prompt template and the backend's options
    (:func:`~rag_gym.generation.backends.make_lm`'s ``n_ctx``, ``chat_template``…). Picklable,
    unlike a built agent."""

    lm_spec: str | None = None
    seed: int = 0
    prompt: str | None = None
    lm_options: dict[str, Any] | None = None

    def __call__(self, name: str, env: Any):
        from rag_gym.baselines import make_agent, needs_lm
        from rag_gym.generation.backends import make_lm

        options = self.lm_options or {}
        wanted = self.lm_spec and needs_lm(name)
        lm = make_lm(self.lm_spec, seed=self.seed, **options) if wanted else None
        return make_agent(name, lm=lm, seed=self.seed, env=env, prompt=self.prompt)


class _Worker:
    """A Ray actor that plays chunks of an agent's episodes (env and agent built once)."""

    def __init__(self, recipe: AgentRecipe, threads: int) -> None:
        os.environ["RAG_GYM_THREADS"] = str(max(1, threads))
        self.recipe = recipe
        self.agents: dict[str, Any] = {}

    def ready(self) -> tuple[int, str]:
        """Its process id and its Ray node's id."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def play(self, name, env_id, kwargs, base, qids, orders, seed, batch_size) -> list:
        from rag_gym.evaluate.scheduler import make_env, run_agent

        if name not in self.agents:  # built on the run's env, as the runner builds it
            self.agents[name] = self.recipe(name, make_env(*base))
        records: list[dict[str, Any]] = []
        run_agent(
            env_id,
            kwargs,
            self.agents[name],
            qids,
            seed,
            batch_size,
            None,
            orders=orders,
            on_episode=records.append,
            trace=True,
        )
        return records


class RayEpisodes:
    """Plays an agent's episodes on Ray workers (see the module doc); the runner calls it where
    a local run calls :func:`~rag_gym.evaluate.scheduler.run_agent`.

    Args:
        recipe: how each worker builds the agents.
        address: the Ray cluster (:func:`rag_gym.retrieval.ray_shards.connect`).
        workers: actors playing episodes.
        cpus_per_worker: CPUs Ray reserves for each, and the threads its LLM uses.
        timeout: seconds the run may go without any chunk ending (a cluster with no worker).
    """

    def __init__(
        self,
        recipe: AgentRecipe,
        address: str | None = None,
        workers: int = 2,
        cpus_per_worker: float = 1.0,
        timeout: float = 900.0,
    ) -> None:
        from rag_gym.retrieval.ray_shards import connect

        if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"expected workers >= 1, got {workers!r}")
        self.ray = connect(address)
        self.recipe = recipe
        self.timeout = timeout
        actor = self.ray.remote(_Worker).options(
            num_cpus=cpus_per_worker,
            max_restarts=-1,
            max_task_retries=0,
            scheduling_strategy="SPREAD",
        )
        threads = max(1, int(cpus_per_worker))
        self.workers = [actor.remote(recipe, threads) for _ in range(workers)]
        self.failures = 0

    def __call__(
        self,
        name: str,
        env_id: str,
        kwargs: dict[str, Any],
        base: tuple[str, dict[str, Any]],
        qids: list[str],
        orders: list[int],
        seed: int,
        batch_size: int,
        on_episode: Callable[[dict[str, Any]], None],
        tick: Callable[[int], None] | None = None,
    ) -> None:
        from ray.exceptions import RayActorError

        ray = self.ray
        chunks = [
            (qids[i : i + batch_size], orders[i : i + batch_size])
            for i in range(0, len(qids), batch_size)
        ]
        queue = list(range(len(chunks)))
        running: dict[Any, tuple[int, int]] = {}  # ref -> (chunk, worker)
        idle = list(range(len(self.workers)))
        done = 0
        last = time.monotonic()
        while queue or running:
            while queue and idle:
                c, w = queue.pop(0), idle.pop(0)
                q, o = chunks[c]
                ref = self.workers[w].play.remote(
                    name, env_id, kwargs, base, q, o, seed, batch_size
                )
                running[ref] = (c, w)
            ready, _ = ray.wait(list(running), num_returns=1, timeout=5.0)
            if not ready:
                if time.monotonic() - last > self.timeout:
                    raise RuntimeError(
                        f"no chunk of {name}'s episodes ended in {self.timeout}s on the Ray "
                        "cluster: check that it has workers alive"
                    )
                continue
            ref = ready[0]
            c, w = running.pop(ref)
            try:
                records = ray.get(ref)
            except RayActorError:  # the worker died: the chunk runs again, on any worker
                self.failures += 1
                queue.insert(0, c)
                idle.append(w)  # Ray restarts it; a call waits for the restart
                continue
            for rec in records:
                on_episode(rec)
            done += len(records)
            last = time.monotonic()
            if tick is not None:
                tick(done)
            idle.append(w)

    def shutdown(self) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):  # already gone
                self.ray.kill(w, no_restart=True)
