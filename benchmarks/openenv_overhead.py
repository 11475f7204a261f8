"""What serving an env through OpenEnv costs: the WebSocket round trip against an in-process step.

    python benchmarks/openenv_overhead.py --steps 2000 --sessions 1 8 64 --servers 1

Needs ``pip install 'rag-gym[openenv]'``. It starts ``rag-gym openenv serve`` (the default
SynthHop world, Dict form) in ``--servers`` processes on 127.0.0.1, started and stopped here,
then, side by side in this run:

1. Latency: ``--steps`` steps (a SEARCH of the question's text, and every fourth step an ANSWER,
   which ends the episode and is followed by a reset) through ``gym.make`` in this process, and
   the same actions through openenv's own client (``GenericEnvClient(...).sync()``, one session)
   to the server. Prints the p50 and p95 of each and the p50 overhead (served minus in-process;
   target <= 1 ms) and the ratio.
2. Throughput: for each ``--sessions`` count, that many sessions (async clients, one WebSocket
   each, spread round-robin over the servers) each play ``--steps-per-session`` steps; prints
   the aggregate steps/s and its ratio to the one-session figure of the same run.

Another process loading the CPU changes the figures; compare ratios taken in one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import gymnasium as gym

import rag_gym  # noqa: F401
from rag_gym.envs.search import ActionType

HOST = "127.0.0.1"
ENV_ID = "rag_gym/SynthHop-v0"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(env_kwargs: dict, max_sessions: int) -> tuple[subprocess.Popen, str]:
    port = free_port()
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop("RAG_GYM_TOKEN", None)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "rag_gym.cli", "openenv", "serve", "--env", ENV_ID),
            *("--env-kwargs", json.dumps(env_kwargs), "--port", str(port)),
            *("--max-sessions", str(max_sessions)),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            urllib.request.urlopen(f"{url}/health", timeout=5).read()
            return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise SystemExit("server did not start in 300 s")


def actions(question: str, i: int) -> dict:
    if i % 4 == 3:
        return {"type": "answer", "text": "Nowhere"}
    return {"type": "search", "text": f"{question} {i}"}


def in_process(env_kwargs: dict, steps: int) -> list[float]:
    env = gym.make(ENV_ID, **env_kwargs)
    _, info = env.reset(seed=0)
    times = []
    for i in range(steps):
        a = actions(info["question"], i)
        t0 = time.perf_counter()
        _, _, term, trunc, _ = env.step({"type": ActionType[a["type"].upper()], "text": a["text"]})
        times.append(time.perf_counter() - t0)
        if term or trunc:
            _, info = env.reset(seed=i)
    return times


def served(url: str, steps: int) -> list[float]:
    from openenv.core.generic_client import GenericEnvClient

    times = []
    with GenericEnvClient(base_url=url).sync() as client:
        result = client.reset(seed=0)
        question = result.metadata["question"]
        for i in range(steps):
            a = actions(question, i)
            t0 = time.perf_counter()
            result = client.step(a)
            times.append(time.perf_counter() - t0)
            if result.done:
                question = client.reset(seed=i).metadata["question"]
    return times


async def session(url: str, steps: int, seed: int) -> int:
    from openenv.core.generic_client import GenericEnvClient

    async with GenericEnvClient(base_url=url) as client:
        result = await client.reset(seed=seed)
        question = result.metadata["question"]
        for i in range(steps):
            result = await client.step(actions(question, i))
            if result.done:
                question = (await client.reset(seed=seed + i)).metadata["question"]
    return steps


async def throughput(urls: list[str], sessions: int, steps: int) -> float:
    t0 = time.perf_counter()
    done = await asyncio.gather(*(session(urls[s % len(urls)], steps, s) for s in range(sessions)))
    return sum(done) / (time.perf_counter() - t0)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[int(q) - 1] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000, help="latency steps of each side")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--steps-per-session", type=int, default=100)
    parser.add_argument("--servers", type=int, default=1, help="server processes")
    parser.add_argument("--passages", type=int, default=10000, help="SynthHop world size")
    args = parser.parse_args()
    env_kwargs = {"dataset_kwargs": {"n_passages": args.passages}}

    procs, urls = [], []
    try:
        for _ in range(args.servers):
            proc, url = start_server(env_kwargs, max(max(args.sessions), 64))
            procs.append(proc)
            urls.append(url)
        in_process(env_kwargs, 50)  # warm up both sides
        served(urls[0], 50)
        local = in_process(env_kwargs, args.steps)
        remote = served(urls[0], args.steps)
        p50_local, p50_remote = pct(local, 50), pct(remote, 50)
        print(f"latency over {args.steps} steps (SynthHop, {args.passages} passages, Dict form)")
        print(f"  in-process gym.make step: p50 {p50_local:.3f} ms, p95 {pct(local, 95):.3f} ms")
        print(f"  OpenEnv WebSocket step:   p50 {p50_remote:.3f} ms, p95 {pct(remote, 95):.3f} ms")
        print(
            f"  p50 overhead {p50_remote - p50_local:.3f} ms (target <= 1 ms); "
            f"served / in-process p50: {p50_remote / p50_local:.2f}x"
        )
        print(f"throughput ({args.steps_per_session} steps a session, {args.servers} server(s))")
        base = None
        for n in args.sessions:
            rate = asyncio.run(throughput(urls, n, args.steps_per_session))
            base = base or rate
            print(f"  {n:3d} sessions: {rate:8.0f} steps/s  ({rate / base:.2f}x one session)")
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
