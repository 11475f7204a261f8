"""Time to first render of ``rag-gym view``'s report of a 5,000-episode run in headless Chromium.

    python benchmarks/view_render.py [--episodes 5000] [--run RUN_DIR] [--repeats 3]

1. The run: ``rag-gym evaluate`` on SynthHop-v0's train split (1,000 questions) with five
   agents, ``random`` and four prompted ones (``naive_rag``, ``oracle``, ``direct``,
   ``iter_retgen``) answering through a fake backend that replies with the passage title it
   reads first (fast and deterministic: the run takes minutes, not hours). It has step traces
   and passages like any run. ``--run`` reuses a run folder instead.
2. ``build_report`` writes its ``report.html`` (timed; the plots are drawn there).
3. Headless Chromium (Debian's ``chromium`` and ``chromium-driver``, through Selenium) opens the
   page from disk; time to first render is ``performance.now()`` when the report has rendered
   its first view and painted (navigation start to the frame after rendering).
4. Reference, in the same run and browser: the same episodes as one static HTML table (the
   page a report without lazy rendering would be), time to its first paint.

Each figure is the best of ``--repeats`` loads (every load printed): other work on a shared
machine only ever slows a load down. Target: at most 2 s for the report.
"""

from __future__ import annotations

import argparse
import html
import json
import re
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import rag_gym  # noqa: F401
from rag_gym.baselines import make_agent
from rag_gym.evaluate import EvalConfig, evaluate
from rag_gym.generation.lm import Generation, GenerationConfig, LanguageModel
from rag_gym.view import build_report
from tests.view.browser import chrome, missing

AGENTS = ("random", "naive_rag", "oracle", "direct", "iter_retgen")


class FirstTitleLM(LanguageModel):
    """Replies with the first passage title in the prompt (``unknown`` when there is none)."""

    name = "first-title"

    def generate(self, prompts, config: GenerationConfig | None = None):
        config = config or GenerationConfig()
        out = []
        for p in prompts:
            text = p if isinstance(p, str) else "\n".join(m["content"] for m in p)
            m = re.search(r"\[1\] ([^:\n]+):", text)
            reply = f"Answer: {m.group(1) if m else 'unknown'}"
            out.append([Generation(text=reply, prompt_tokens=len(text) // 4, completion_tokens=6)])
        return out


def make_run(out: Path, episodes: int) -> Path:
    per_agent = -(-episodes // len(AGENTS))
    lm = FirstTitleLM()
    t = time.perf_counter()
    result = evaluate(
        EvalConfig(
            split="train",
            n=per_agent,
            agents=AGENTS,
            out_dir=str(out),
            run_name="run",
            batch_size=16,
        ),
        lambda name, env: make_agent(name, lm=lm, seed=0, env=env),
    )
    print(f"run: {len(result.episodes)} episodes in {time.perf_counter() - t:.0f} s: {out / 'run'}")
    return out / "run"


def static_table(run: Path, target: Path) -> None:
    """Every episode as one row of a plain HTML table: the reference page."""
    rows = []
    for line in (run / "episodes.jsonl").read_text().splitlines():
        e = json.loads(line)
        cells = (e["agent"], e["question"], e["prediction"], e["em"], e["f1"], e["steps"])
        rows.append("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>")
    target.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body><table>"
        + "".join(rows)
        + "</table><script>requestAnimationFrame(() => setTimeout(() => {"
        "document.body.dataset.painted = performance.now();}, 0));</script></body></html>"
    )


def load_ms(driver, page: Path, key: str) -> float:
    driver.get("about:blank")
    driver.get(page.resolve().as_uri())
    for _ in range(600):
        value = driver.execute_script(f"return document.body && document.body.dataset.{key}")
        if value:
            return float(value)
        time.sleep(0.05)
    raise TimeoutError(f"{page} did not render in 30 s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=5000)
    parser.add_argument("--run", type=Path, default=None, help="reuse this run folder")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    why = missing()
    if why:
        sys.exit(f"cannot run: {why}")
    tmp = Path(tempfile.mkdtemp(prefix="view-render-"))
    run = args.run or make_run(tmp, args.episodes)
    n = len((run / "episodes.jsonl").read_text().splitlines())
    t = time.perf_counter()
    report = build_report(run, tmp / "report.html")
    print(
        f"build_report: {time.perf_counter() - t:.2f} s, {report.stat().st_size / 1e6:.1f} MB "
        f"for {n} episodes"
    )
    reference = tmp / "static.html"
    static_table(run, reference)
    driver = chrome()
    try:
        ours, ref = [], []
        for i in range(args.repeats):
            ours.append(load_ms(driver, report, "painted"))
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            ref.append(load_ms(driver, reference, "painted"))
            print(f"load {i + 1}: report {ours[-1]:.0f} ms, static table {ref[-1]:.0f} ms")
            if errors:
                print(f"  console errors: {errors}")
    finally:
        driver.quit()
    best, best_ref = min(ours), min(ref)
    print(
        f"time to first render, {n} episodes: {best / 1000:.2f} s (target <= 2 s: "
        f"{'met' if best <= 2000 else 'NOT met'}); static table of the same episodes: "
        f"{best_ref / 1000:.2f} s; ratio report/static = {best / best_ref:.2f}"
    )


if __name__ == "__main__":
    main()
