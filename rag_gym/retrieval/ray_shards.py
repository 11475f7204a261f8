"""Sharded, replicated retrieval on a Ray cluster.

Each shard of a sharded index (:mod:`rag_gym.retrieval.shards`) is served by ``replicas`` Ray
actors, spread over the cluster's nodes (``SPREAD``); :class:`RayShardedRetriever` is the
router: it sends each batch to one replica of every shard (round robin), and merges their top-k
exactly (:func:`~rag_gym.retrieval.shards.merge_top_k`), so it answers as one index over the
whole corpus would. ``rag-gym serve --ray ADDRESS --index DIR`` puts it behind the usual
``/retrieve`` API.

**Failover.** A replica that dies (its process or node killed) fails the calls it held; the
router sends them again to another replica of the same shard, and Ray restarts the dead one
(``max_restarts=-1``). A search has no side effects, so a retried call gives the same answer
and no request is lost or answered twice. Only when every replica of a shard has failed for
``timeout`` seconds (600) does a batch fail (``RuntimeError`` naming the shard); a slow replica
is waited for, not asked again.

**Text.** A replica returns ids, scores and rows only; the router's corpus
(:class:`~rag_gym.retrieval.shards.ShardedCorpus`) reads passages from the shards' corpus files
when they are asked for (mapped, read on access), so a batch carries no text between processes,
only the passages a reply holds are read, and the router's memory does not grow with what it
serves.

**Files.** A replica loads its shard from the index folder's path, so every node must see the
folder at the same path (one machine, or a shared filesystem), and so must the router.

:func:`ray_map` runs a build's passes as Ray tasks (``rag-gym index build --shards S --ray``).

Needs ``pip install 'rag-gym[ray]'``.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rag_gym.retrieval.shards import ShardedRetriever, layout, read_shards, shard_search

logger = logging.getLogger("rag_gym.retrieval.ray_shards")


class ClusterError(ConnectionError):
    """No Ray cluster at the address given, or Ray is not installed; the message says how to
    start one."""


def _ray():
    try:
        import ray
    except ImportError as exc:
        raise ImportError("Ray is not installed: pip install 'rag-gym[ray]'") from exc
    return ray


def connect(address: str | None = None, timeout: float = 30.0) -> Any:
    """Join the Ray cluster at ``address`` (``"auto"``: the one this machine runs, as Ray finds
    it; ``HOST:PORT`` of its head; ``ray://HOST:PORT`` through Ray Client), or start a Ray
    instance in this process for ``None`` or ``"local"``. Returns the ``ray`` module.

    An address where no cluster answers within ``timeout`` seconds is a :class:`ClusterError`
    naming it, not a hang.
    """
    ray = _ray()
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address in (None, "", "local"):
        try:
            ray.init(**kwargs)
        except Exception as exc:
            raise ClusterError(f"could not start a local Ray instance: {exc}") from None
        return ray
    if not address.startswith("ray://") and address != "auto":
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise ClusterError(
                f"expected a Ray address such as 127.0.0.1:6379, ray://HOST:10001, 'auto' or "
                f"'local', got {address!r}"
            )
        _check_reachable(host, int(port), address, timeout)
    try:
        ray.init(address=address, **kwargs)
    except Exception as exc:
        raise ClusterError(
            f"no Ray cluster at {address!r} ({type(exc).__name__}: {str(exc)[:200]}); start one "
            "with `ray start --head` (its address is printed), or pass --ray local to start one "
            "in this process"
        ) from None
    return ray


def _check_reachable(host: str, port: int, address: str, timeout: float) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=min(2.0, timeout)):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise ClusterError(
                    f"no Ray cluster at {address!r}: nothing answers on {host}:{port} "
                    f"({exc.strerror or exc}); start one with `ray start --head --port {port}`, "
                    "or pass --ray local to start one in this process"
                ) from None
            time.sleep(0.5)


def _check_cpus(ray, n_shards: int, replicas: int, cpus: float) -> None:
    """Refuse at once when the cluster has fewer CPUs in all than the replicas reserve (Ray
    would otherwise wait for nodes that never come); log when the CPUs exist but others hold
    them (the replicas then start as they free up)."""
    need = n_shards * replicas * cpus
    total = float(ray.cluster_resources().get("CPU", 0))
    if need > total:
        raise ValueError(
            f"{n_shards} shards x {replicas} replicas x {cpus:g} CPUs need {need:g} CPUs, the "
            f"Ray cluster has {total:g}: pass fewer --replicas, a smaller --cpus-per-replica "
            f"(e.g. {total / (n_shards * replicas):.2g}), or add nodes to the cluster"
        )
    free = float(ray.available_resources().get("CPU", 0))
    if need > free:
        logger.warning(
            "the replicas need %g CPUs and %g of the cluster's %g are free now: they start as "
            "other work frees them",
            need,
            free,
            total,
        )


def _wait_ready(ray, refs: list, timeout: float, every: float = 15.0) -> None:
    """Wait for every replica's ``ready`` call, logging progress every ``every`` seconds;
    ``TimeoutError`` after ``timeout``, ``ray.get``'s error if a replica failed to load."""
    deadline = time.monotonic() + timeout
    pending = list(refs)
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(pending)} of {len(refs)} replicas not ready")
        done, pending = ray.wait(pending, num_returns=len(pending), timeout=min(every, left))
        ray.get(done)  # a replica that failed to load raises here
        if pending:
            logger.warning(
                "%d of %d replicas ready after %.0fs; waiting (up to %.0fs) for the others: "
                "check that the cluster has the CPUs free and every node sees the index",
                len(refs) - len(pending),
                len(refs),
                timeout - max(0.0, deadline - time.monotonic()),
                timeout,
            )


class _Replica:
    """One replica of one shard (a Ray actor): the shard's retriever, loaded once."""

    def __init__(self, path: str, shard: int, verify: bool = False) -> None:
        from rag_gym.retrieval.shards import load_shard

        self.shard = shard
        self.retriever = load_shard(path, shard, verify=verify)

    def ready(self) -> tuple[int, int, int]:
        return self.shard, len(self.retriever.corpus), os.getpid()

    def search(self, queries, k, exclude, within) -> dict[str, list]:
        return shard_search(self.retriever, queries, k, exclude, within)


class RayShardedRetriever(ShardedRetriever):
    """A sharded index served by Ray actors: ``replicas`` per shard, the router in this process.

    Args:
        path: a sharded index folder (``rag-gym index build --shards S``), at this path on
            every node.
        shards: the shard count expected (``--shards``); another count than the index's is a
            :class:`~rag_gym.retrieval.shards.ShardError`.
        replicas: actors per shard (throughput, and failover when one dies).
        address: the Ray cluster (see :func:`connect`).
        cpus_per_replica: CPUs Ray reserves for each actor.
        timeout: seconds a batch may wait for a shard's answer, failovers included.
        start_timeout: seconds the replicas may take to start and load their shards.
    """

    def __init__(
        self,
        path: str | Path,
        shards: int | None = None,
        replicas: int = 1,
        address: str | None = None,
        cpus_per_replica: float = 1.0,
        timeout: float = 600.0,
        verify: bool = False,
        start_timeout: float = 600.0,
    ) -> None:
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ValueError(f"expected replicas >= 1, got {replicas!r}")
        if not (isinstance(cpus_per_replica, (int, float)) and cpus_per_replica > 0):
            raise ValueError(f"expected cpus_per_replica > 0, got {cpus_per_replica!r}")
        path = Path(path).resolve()
        manifest = read_shards(path, shards)
        ray = connect(address)
        _check_cpus(ray, manifest["n_shards"], replicas, cpus_per_replica)
        self._ray = ray
        self.path = path
        self.manifest = manifest
        self.timeout = timeout
        actor = ray.remote(_Replica).options(
            num_cpus=cpus_per_replica,
            max_restarts=-1,
            max_task_retries=0,
            scheduling_strategy="SPREAD",
        )
        self.replicas = [
            [actor.remote(str(path), s, verify) for _ in range(replicas)]
            for s in range(manifest["n_shards"])
        ]
        try:
            _wait_ready(
                ray, [a.ready.remote() for row in self.replicas for a in row], start_timeout
            )
        except Exception as exc:
            self.shutdown()
            raise RuntimeError(
                f"the replicas of {path} did not start within {start_timeout}s "
                f"({type(exc).__name__}: {str(exc)[:300]}); check that every node sees the "
                "index at this path and has the CPUs asked for (--cpus-per-replica)"
            ) from None
        self._turn = [itertools.count() for _ in self.replicas]
        # when each replica may be tried again after it failed (Ray restarts it meanwhile)
        self._down = [[0.0] * len(row) for row in self.replicas]
        self._lock = threading.Lock()
        self.failovers = 0
        self._corpora: dict[int, Any] = {}
        super().__init__(self.replicas, **layout(manifest))

    def shard_corpus(self, shard: int):
        """Shard ``shard``'s corpus file, opened here (mapped, read on access) on first use."""
        corpus = self._corpora.get(shard)
        if corpus is None:
            from rag_gym.retrieval.persist import read_index

            entry = self.manifest["shards"][shard]
            _, corpus = read_index(self.path / entry["dir"], self.manifest["kind"])
            corpus = self._corpora.setdefault(shard, corpus)
        return corpus

    def _next(self, shard: int, after: int | None = None) -> int:
        """The replica of ``shard`` to call: round robin (or the one after ``after``), passing
        over replicas that failed in the last :attr:`backoff` seconds unless all did."""
        n = len(self.replicas[shard])
        now = time.monotonic()
        with self._lock:
            start = next(self._turn[shard]) if after is None else after + 1
            for j in range(n):
                r = (start + j) % n
                if self._down[shard][r] <= now:
                    return r
            return start % n

    #: seconds a replica that failed is passed over
    backoff = 2.0

    def _failed(self, shard: int, replica: int) -> None:
        with self._lock:
            self.failovers += 1
            self._down[shard][replica] = time.monotonic() + self.backoff

    def search(self, shard: int, queries, k, exclude, within) -> dict[str, list]:
        return self.search_all(queries, k, exclude, within, only=[shard])[0]

    def search_all(self, queries, k, exclude, within, only=None) -> list[dict[str, list]]:
        """Every shard's part of a batch, from one replica each, in parallel; a replica that
        fails is replaced by the next of its shard until one answers or ``timeout`` passes."""
        ray = self._ray
        from ray.exceptions import GetTimeoutError, RayActorError

        args = (list(queries), k, exclude, within)
        shards = list(range(len(self.replicas))) if only is None else list(only)
        pending = {}
        for s in shards:
            r = self._next(s)
            pending[s] = (r, self.replicas[s][r].search.remote(*args))
        out: dict[int, dict] = {}
        deadline = time.monotonic() + self.timeout
        while pending:
            s, (r, ref) = next(iter(pending.items()))
            try:
                out[s] = ray.get(ref, timeout=max(0.0, deadline - time.monotonic()))
                del pending[s]
            except (RayActorError, GetTimeoutError) as exc:
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"shard {s} of {self.path} did not answer within {self.timeout}s: every "
                        f"replica failed (last: {type(exc).__name__}); check the cluster"
                    ) from None
                self._failed(s, r)
                r = self._next(s, after=r)
                if all(t > time.monotonic() for t in self._down[s]):
                    time.sleep(0.2)  # every replica failed: give Ray time to restart one
                pending[s] = (r, self.replicas[s][r].search.remote(*args))
        return [out[s] for s in shards]

    def replica_pids(self) -> list[list[int]]:
        """The process id of every replica, by shard (after restarts, the new ones)."""
        return [
            [pid for _, _, pid in self._ray.get([a.ready.remote() for a in row])]
            for row in self.replicas
        ]

    def shutdown(self) -> None:
        """Stop every replica."""
        for row in getattr(self, "replicas", []):
            for a in row:
                with contextlib.suppress(Exception):  # already gone
                    self._ray.kill(a, no_restart=True)

    def __repr__(self) -> str:
        per = len(self.replicas[0]) if self.replicas else 0
        return f"RayShardedRetriever({self.path}, {len(self.replicas)} shards x {per} replicas)"


def ray_map(address: str | None = None, cpus: float = 1.0) -> Callable:
    """A ``map_fn`` for :func:`~rag_gym.retrieval.shards.build_bm25_shards` that runs each call
    as a Ray task on the cluster at ``address``, all at once, results in call order."""
    ray = connect(address)

    def run(fn: Callable[..., Any], calls: list[tuple]) -> list[Any]:
        task = ray.remote(fn).options(num_cpus=cpus, max_retries=2)
        return ray.get([task.remote(*args) for args in calls])

    return run
