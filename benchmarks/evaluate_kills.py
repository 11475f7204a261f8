"""Kill ``rag-gym evaluate`` mid-run, resume it, and check that nothing was lost.

    python benchmarks/evaluate_kills.py

For each kill point (a share of the run's episodes) and each signal, a real ``rag-gym evaluate``
process is started, sent the signal once its ``episodes.jsonl`` holds that many episodes, then
resumed with the command it printed (after SIGKILL, which prints nothing:
``rag-gym evaluate --resume RUN``). The table compares the resumed run with an uninterrupted
run of the same protocol:

- ``saved``: episodes in the run folder after the kill (every finished one, flushed as it ended);
- ``partial``: episodes counted by the partial leaderboard written on SIGINT/SIGTERM;
- ``kept``: how many of the saved episode records are in the final file unchanged (timings
  included, so none was played again);
- ``episodes``: recorded after the resume, against the uninterrupted run's count;
- ``same leaderboard``: every leaderboard cell but the timing column (s/ep) equals the
  uninterrupted run's, and so does every episode record but its ``seconds``.

A last row kills one run at every point in turn (each signal in turn), resuming in between.
Each random-agent step sleeps ``--delay`` seconds so that the signals land mid-run; the results do
not depend on it. With ``--agents random,naive_rag --lm llama_cpp`` an LLM agent is killed too
(slow on a CPU).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DRIVER = """
import os, sys, time
from rag_gym.baselines.random import RandomAgent
delay, act = float(os.environ.get("DELAY", "0")), RandomAgent.act_batch
def slow(self, *args):
    time.sleep(delay)
    return act(self, *args)
RandomAgent.act_batch = slow
from rag_gym.cli import main
sys.argv = ["rag-gym", *sys.argv[1:]]
main()
"""


def run_cli(work: Path, args: list[str], delay: float, kill_at: int | None = None, sig=None):
    """``rag-gym ARGS`` in a process of its own; ``sig`` once ``kill_at`` episodes are saved.
    Returns (exit code, output, episodes saved when the signal was sent)."""
    env = {**os.environ, "DELAY": str(delay), "OMP_NUM_THREADS": "1", "COLUMNS": "250"}
    proc = subprocess.Popen(
        [sys.executable, str(work / "driver.py"), *args],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    at = None
    if sig is not None:
        run = Path(args[args.index("--resume") + 1]) if "--resume" in args else None
        run = work / (run or Path("runs") / args[args.index("--run-name") + 1])
        episodes = run / "episodes.jsonl"
        while proc.poll() is None:
            if episodes.is_file():
                at = episodes.read_bytes().count(b"\n")
                if at >= kill_at:
                    proc.send_signal(sig)
                    break
            time.sleep(0.002)
    out, _ = proc.communicate()
    return proc.returncode, out, at


def records(run: Path) -> list[dict]:
    path = run / "episodes.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line cut by SIGKILL
            out.append(json.loads(line))
    return out


def leaderboard(run: Path) -> list[dict]:
    lines = (run / "leaderboard.csv").read_text().splitlines()
    keys = lines[0].split(",")
    rows = [dict(zip(keys, line.split(","), strict=True)) for line in lines[1:]]
    return [{k: v for k, v in r.items() if k != "seconds"} for r in rows]


def without_seconds(recs: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "seconds"} for r in recs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=60, help="questions per agent")
    parser.add_argument("--agents", default="random")
    parser.add_argument("--lm", default=None, help="backend for LLM agents (e.g. llama_cpp)")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--delay", type=float, default=0.01, help="seconds per random step")
    parser.add_argument("--points", default="0.02,0.2,0.4,0.6,0.8,0.97")
    parser.add_argument("--signals", default="SIGINT,SIGTERM,SIGKILL")
    args = parser.parse_args()

    env_kwargs = json.dumps({"dataset_kwargs": {"n_passages": 2000, "n_questions": [60, 60, 60]}})
    base = ["evaluate", "--agents", args.agents, "--n", str(args.n), "--env-kwargs", env_kwargs]
    base += ["--batch-size", str(args.batch_size), "--out", "runs", "--no-progress"]
    base += ["--lm", args.lm] if args.lm else []
    signals = [getattr(signal, s) for s in args.signals.split(",")]
    work = Path(tempfile.mkdtemp(prefix="evaluate_kills_"))
    (work / "driver.py").write_text(DRIVER)

    rc, out, _ = run_cli(work, [*base, "--run-name", "full"], 0.0)
    if rc != 0:
        sys.exit(f"the uninterrupted run failed:\n{out}")
    full = work / "runs" / "full"
    expected = len(records(full))
    points = [max(1, round(float(p) * expected)) for p in args.points.split(",")]

    header = (
        "| kill at | signal | exit | saved | partial | resume command | kept | episodes | "
        "same leaderboard |"
    )
    print(f"{expected} episodes per run ({args.agents}, n={args.n}); work folder {work}\n")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    survived = total = 0

    def check(run: Path, saved: list[dict]) -> tuple[int, bool, bool]:
        final = records(run)
        kept = sum(1 for r in saved if r in final)
        same = without_seconds(final) == without_seconds(records(full)) and leaderboard(
            run
        ) == leaderboard(full)
        return kept, len(final) == expected, same

    for point in points:
        for sig in signals:
            name = f"k{point}-{sig.name}"
            rc, out, _ = run_cli(work, [*base, "--run-name", name], args.delay, point, sig)
            run = work / "runs" / name
            saved = records(run)
            partial = "-"
            if (run / "leaderboard.csv").is_file():
                partial = str(sum(int(r["episodes"]) for r in leaderboard(run)))
            printed = "resume with: " in out
            command = (
                out.split("resume with: ")[1].splitlines()[0]
                if printed
                else f"rag-gym evaluate --resume runs/{name}"
            )
            rc2, out2, _ = run_cli(work, [*shlex.split(command)[1:], "--no-progress"], 0.0)
            if rc2 != 0:
                print(f"resume of {name} failed:\n{out2}", file=sys.stderr)
            kept, complete, same = check(run, saved)
            ok = rc2 == 0 and kept == len(saved) and complete and same and len(saved) < expected
            if sig != signal.SIGKILL:  # a partial leaderboard and the resume command
                ok = ok and printed and partial == str(len(saved))
            survived += ok
            total += 1
            print(
                f"| {point} | {sig.name} | {rc} | {len(saved)} | {partial} | "
                f"{'printed' if printed else '(none: SIGKILL)'} | {kept}/{len(saved)} | "
                f"{len(records(run))}/{expected} | {'yes' if same else 'no'} |"
            )

    # one run killed at every point in turn, resumed in between
    name, saved_all, kills = "chain", [], 0
    args_now = [*base, "--run-name", name]
    for i, point in enumerate(points):
        sig = signals[i % len(signals)]
        rc, _, _ = run_cli(work, args_now, args.delay, point, sig)
        kills += rc != 0
        saved_all = records(work / "runs" / name)
        args_now = ["evaluate", "--resume", f"runs/{name}", "--no-progress"]
    rc2, _, _ = run_cli(work, args_now, 0.0)
    kept, complete, same = check(work / "runs" / name, saved_all)
    ok = rc2 == 0 and complete and same and kept == len(saved_all)
    survived += ok
    total += 1
    print(
        f"| {','.join(str(p) for p in points)} (one run) | each in turn | {kills} killed | "
        f"{len(saved_all)} | - | - | {kept}/{len(saved_all)} | "
        f"{len(records(work / 'runs' / name))}/{expected} | {'yes' if same else 'no'} |"
    )
    print(
        f"\nruns with nothing lost: {survived} of {total} "
        f"({total - 1} runs killed once, one run killed {kills} times)"
    )


if __name__ == "__main__":
    main()
