"""BM25 at Wikipedia scale: out-of-core build, memory-mapped serving, pruned top-k, beside tantivy.

    python benchmarks/bm25_scale.py --sizes 1000000                      # SynthHop, 1M passages
    python benchmarks/bm25_scale.py --sizes 1000000 21000000 --memory 8GB  # the 21M targets
    python benchmarks/bm25_scale.py --corpus wiki-18.jsonl --queries-file questions.jsonl
    python benchmarks/bm25_scale.py --sizes 1000000 --against HEAD~1 --no-tantivy  # a change's cost

For each corpus (a SynthHop "hard" world of each ``--sizes``, written as ``{id, contents}``
JSONL, or the ``--corpus`` file), each step in a fresh process so that memory figures do not mix:

* **build**: ``rag-gym index build``'s out-of-core path under ``--memory``: wall time, the
  process's peak RSS, the index's size on disk;
* **serve**: a fresh process loads the index (arrays memory-mapped): load time, RSS after the
  load (and how much of it is file-backed, i.e. mapped index pages), then batched throughput (one
  ``retrieve`` call over ``--queries`` queries, k = ``--k``, best of ``--repeats`` after a first
  timed pass that also builds the kernel's lazy per-list tables) and
  single-query throughput (``--single`` calls);
* **exhaustive** (up to ``--exhaustive-max`` passages): the same queries scored whole by the
  numpy backend (bm25s's full score array and a top-k over it), once, timed; the serve step's
  top-k (ids and float32 scores) must be identical;
* **tantivy** (``pip install tantivy``; skipped with the reason when absent): the same corpus,
  queries and k through tantivy's Python bindings (``en_stem`` tokenizer, BM25, OR of the query
  words; one query per call, as its API searches), with the same figures, and the overlap of its
  top-k with rag-gym's (different stemmers, so not 100%). Its queries drop the stop words
  rag-gym's tokenizer drops (bm25s's English list), so both engines score the same words; and it
  searches with ``count=False``: tantivy-py counts every match by default, which puts a counting
  collector beside the top-k one and turns off tantivy's block-max WAND pruning.

With ``--against REV``, the serve step also runs on the same index with the ``rag_gym`` package
of git revision ``REV`` (extracted to a temporary folder and put first on ``PYTHONPATH``),
alternating with this tree's (``--against-rounds`` times each, the best of each kept): every
figure is printed for both with this tree's ratio to ``REV``'s, and both must return the same
top-k. The index is built once, by this tree.

The targets print MET or MISSED at the end. Other processes slow everything down; the load
average is printed at the start and the end, and every ratio is measured within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

from revisions import extract_revision, run_step

GB = 1024**3


def rss() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key = line.split(":")[0]
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = int(line.split()[1]) * 1024
    return out


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def best_of(repeats: int, *fns) -> list[float]:
    best = [float("inf")] * len(fns)
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


# ---- cells, each in its own process -------------------------------------------------------------
def cell_generate(args, out: dict) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from retrieval_sweep import world_and_queries

    t0 = time.perf_counter()
    world, queries = world_and_queries(args.size)
    world.corpus.to_jsonl(args.corpus, fmt="contents")
    Path(args.queries_file).write_text(json.dumps(queries))
    out["seconds"] = time.perf_counter() - t0
    out["peak"] = peak_rss()


def cell_build(args, out: dict) -> None:
    from rag_gym.data.types import iter_corpus_jsonl
    from rag_gym.retrieval.bm25_build import build_bm25_index

    t0 = time.perf_counter()
    build_bm25_index(
        (p for _, p in iter_corpus_jsonl(args.corpus)),
        args.index,
        memory=args.memory,
        corpus_name=Path(args.corpus).stem,
        force=True,
    )
    out["seconds"] = time.perf_counter() - t0
    out["peak"] = peak_rss()
    out["bytes"] = folder_bytes(Path(args.index))


def load_queries(path: str, n: int) -> list[str]:
    text = Path(path).read_text()
    try:
        queries = json.loads(text)
    except json.JSONDecodeError:  # JSONL with a "question" field (FlashRAG's format)
        queries = [json.loads(line)["question"] for line in text.splitlines() if line.strip()]
    return [q for q in queries if isinstance(q, str)][:n]


def cell_serve(args, out: dict) -> None:
    import rag_gym
    from rag_gym.retrieval import BM25Retriever

    out["package"] = str(Path(rag_gym.__file__).parent)

    before = rss()["VmRSS"]
    t0 = time.perf_counter()
    bm25 = BM25Retriever.load(args.index)
    out["load_s"] = time.perf_counter() - t0
    out["rss_load"] = rss()
    out["rss_before"] = before
    batch = load_queries(args.queries_file, args.queries)
    single = batch[: args.single]
    k = args.k
    bm25.retrieve(batch[:8], k)
    # the first pass also builds the kernel's lazy tables (length tables, pair bounds,
    # superblocks) for the lists the queries read: reported apart from the steady state
    t0 = time.perf_counter()
    bm25.retrieve(batch, k)
    out["first_pass_qps"] = len(batch) / (time.perf_counter() - t0)
    (t,) = best_of(args.repeats, lambda: bm25.retrieve(batch, k))
    out["batched_qps"] = len(batch) / t
    t0 = time.perf_counter()
    for q in single:
        bm25.retrieve([q], k)
    out["single_qps"] = len(single) / (time.perf_counter() - t0)
    out["rss_served"] = rss()
    out["passages"] = len(bm25.corpus)
    got = bm25.retrieve(batch, k)
    Path(args.topk_file).write_text(json.dumps({"ids": got.ids, "scores": got.scores}))


def cell_exhaustive(args, out: dict) -> None:
    from rag_gym.retrieval import BM25Retriever

    bm25 = BM25Retriever.load(args.index, backend="numpy")
    batch = load_queries(args.queries_file, args.queries)
    t0 = time.perf_counter()
    got = bm25.retrieve(batch, args.k)
    out["qps"] = len(batch) / (time.perf_counter() - t0)
    out["same"] = json.loads(Path(args.topk_file).read_text()) == {
        "ids": got.ids,
        "scores": got.scores,
    }


def _words(text: str, stopwords: frozenset[str] = frozenset()) -> str:
    """The query's words for tantivy's query parser, less ``stopwords`` (lowercased match)."""
    return " ".join(w for w in re.findall(r"\w+", text) if w.lower() not in stopwords)


def _rag_gym_stopwords() -> frozenset[str]:
    """The stop words rag-gym's BM25 tokenizer drops (bm25s's English list)."""
    from rag_gym.retrieval.bm25_format import bm25s_stopwords

    return frozenset(bm25s_stopwords("en"))


def cell_tantivy_build(args, out: dict) -> None:
    import tantivy

    from rag_gym.data.types import iter_corpus_jsonl

    t0 = time.perf_counter()
    schema = tantivy.SchemaBuilder()
    schema.add_text_field("id", stored=True, tokenizer_name="raw")
    schema.add_text_field("body", stored=False, tokenizer_name="en_stem")
    path = Path(args.index)
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    index = tantivy.Index(schema.build(), path=str(path))
    writer = index.writer(heap_size=args.tantivy_heap, num_threads=1)
    for _, p in iter_corpus_jsonl(args.corpus):
        writer.add_document(tantivy.Document(id=p.id, body=f"{p.title}\n{p.text}"))
    writer.commit()
    writer.wait_merging_threads()
    out["seconds"] = time.perf_counter() - t0
    out["peak"] = peak_rss()
    out["bytes"] = folder_bytes(path)


def cell_tantivy_serve(args, out: dict) -> None:
    import tantivy

    before = rss()["VmRSS"]
    t0 = time.perf_counter()
    index = tantivy.Index.open(args.index)
    searcher = index.searcher()
    out["load_s"] = time.perf_counter() - t0
    out["rss_load"] = rss()
    out["rss_before"] = before
    out["segments"] = searcher.num_segments
    batch = load_queries(args.queries_file, args.queries)
    single = batch[: args.single]
    k = args.k
    stop = _rag_gym_stopwords()
    parsed = [index.parse_query(_words(q, stop) or "nothing", ["body"]) for q in batch]

    def search_all():
        return [
            [searcher.doc(addr)["id"][0] for _, addr in searcher.search(q, k, count=False).hits]
            for q in parsed
        ]

    search_all()
    (t,) = best_of(args.repeats, search_all)
    out["batched_qps"] = len(batch) / t
    t0 = time.perf_counter()
    for q in single:
        query = index.parse_query(_words(q, stop) or "nothing", ["body"])
        [searcher.doc(addr)["id"][0] for _, addr in searcher.search(query, k, count=False).hits]
    out["single_qps"] = len(single) / (time.perf_counter() - t0)
    out["rss_served"] = rss()
    ours = json.loads(Path(args.topk_file).read_text())["ids"]
    theirs = search_all()
    shared = sum(len(set(a) & set(b)) for a, b in zip(ours, theirs, strict=True))
    out["overlap"] = shared / max(1, sum(len(a) for a in ours))


CELLS = {
    "generate": cell_generate,
    "build": cell_build,
    "serve": cell_serve,
    "exhaustive": cell_exhaustive,
    "tantivy_build": cell_tantivy_build,
    "tantivy_serve": cell_tantivy_serve,
}


def run_cell(cell: str, args, package: Path | None = None, **paths) -> dict:
    """Run one cell in a fresh process; with ``package``, a folder holding another ``rag_gym``,
    that one is imported instead of this tree's."""
    argv = ["--cell", cell]
    for name in ("k", "queries", "single", "repeats", "memory", "exhaustive_max", "tantivy_heap"):
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    for name, value in paths.items():
        argv += [f"--{name.replace('_', '-')}", str(value)]
    return run_step(__file__, argv, package, name=cell)


def best_serve(runs: list[dict]) -> dict:
    """The serve figures of several runs of one tree: the first run's, with each throughput the
    best of the runs."""
    runs = [r for r in runs if r]
    if not runs:
        return {}
    out = dict(runs[0])
    for key in ("batched_qps", "single_qps", "first_pass_qps"):
        out[key] = max(r[key] for r in runs)
    return out


def show_against(rev: str, now: dict, then: dict) -> None:
    """Each throughput of this tree beside ``rev``'s, with the ratio."""
    if not now or not then:
        print(f"  against {rev}: incomplete (see above)")
        return
    rows = [
        (key.removesuffix("_qps").replace("_", " "), now[key], then[key])
        for key in ("batched_qps", "single_qps", "first_pass_qps")
    ]
    print(f"  this tree against {rev} ({then['package']}), same index and queries, q/s:")
    for name, a, b in rows:
        print(f"    {name}: {a:,.0f} now, {b:,.0f} at {rev}: {a / b:.3f}x")


def show(name: str, build: dict, serve: dict) -> None:
    if not build or not serve:
        print(f"  {name}: incomplete (see above)")
        return
    load = serve["rss_load"]
    print(
        f"  {name}: build {build['seconds']:.1f}s, build peak RSS {build['peak'] / GB:.2f} GB, "
        f"index {build['bytes'] / GB:.2f} GB on disk; load {serve['load_s']:.2f}s, RSS after load "
        f"{load['VmRSS'] / GB:.2f} GB ({load.get('RssFile', 0) / GB:.2f} GB of it mapped files; "
        f"{serve['rss_before'] / GB:.2f} GB before loading), after the queries "
        f"{serve['rss_served']['VmRSS'] / GB:.2f} GB; batched {serve['batched_qps']:,.0f} q/s, "
        f"single {serve['single_qps']:,.0f} q/s"
        + (
            f" (first batched pass {serve['first_pass_qps']:,.0f} q/s)"
            if "first_pass_qps" in serve
            else ""
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--corpus", help="an {id, contents} JSONL instead of SynthHop worlds")
    parser.add_argument("--queries-file", help="with --corpus: a JSON list or JSONL 'question's")
    parser.add_argument("--memory", default="8GB", help="the build's memory budget")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--queries", type=int, default=4000)
    parser.add_argument("--single", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--exhaustive-max", type=int, default=3_000_000)
    parser.add_argument("--tantivy-heap", type=int, default=1 << 30)
    parser.add_argument("--no-tantivy", action="store_true")
    parser.add_argument("--work-dir", default=tempfile.gettempdir())
    parser.add_argument("--keep", action="store_true", help="keep corpora and indexes")
    parser.add_argument(
        "--against", metavar="REV", help="also serve with git revision REV's rag_gym"
    )
    parser.add_argument("--against-rounds", type=int, default=2, help="serve runs of each tree")
    parser.add_argument("--cell", choices=sorted(CELLS), help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--index", help=argparse.SUPPRESS)
    parser.add_argument("--topk-file", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.cell:
        out: dict = {}
        try:
            CELLS[args.cell](args, out)
        finally:
            Path(args.result).write_text(json.dumps(out))
        return

    work_dir = Path(args.work_dir)
    if work_dir.exists() and not work_dir.is_dir():
        parser.error(f"--work-dir {work_dir} is a file: give a folder")
    work_dir.mkdir(parents=True, exist_ok=True)  # created when missing, as --keep expects
    has_tantivy = not args.no_tantivy and _importable("tantivy")
    print(
        f"BM25 at scale on {len(os.sched_getaffinity(0))} CPU cores; load average at the start "
        f"{os.getloadavg()[0]:.1f}; build memory budget {args.memory}"
    )
    runs = [(None, args.corpus)] if args.corpus else [(n, None) for n in sorted(args.sizes)]
    results = {}
    for size, corpus in runs:
        work = Path(tempfile.mkdtemp(prefix="rag-gym-scale-", dir=args.work_dir))
        try:
            queries_file = args.queries_file
            if corpus is None:
                corpus = work / "corpus.jsonl"
                queries_file = work / "queries.json"
                print(f"\n== SynthHop, {size:,} passages ==")
                gen = run_cell(
                    "generate", args, size=size, corpus=corpus, queries_file=queries_file
                )
                if gen:
                    print(
                        f"  world generated and written in {gen['seconds']:.1f}s "
                        f"(peak {gen['peak'] / GB:.2f} GB, not part of the build)"
                    )
            else:
                print(f"\n== {corpus} ==")
            common = {
                "corpus": corpus,
                "queries_file": queries_file,
                "topk_file": work / "top.json",
            }
            build = run_cell("build", args, index=work / "rag-gym", **common)
            serve = run_cell("serve", args, index=work / "rag-gym", **common) if build else {}
            if args.against and serve:
                package = extract_revision(args.against, work / "against")
                then_top = work / "top-against.json"
                nows, thens = [serve], []
                for i in range(args.against_rounds):
                    thens.append(
                        run_cell(
                            "serve",
                            args,
                            package,
                            index=work / "rag-gym",
                            **{**common, "topk_file": then_top},
                        )
                    )
                    if i + 1 < args.against_rounds:
                        nows.append(run_cell("serve", args, index=work / "rag-gym", **common))
                serve, then = best_serve(nows), best_serve(thens)
                same = then and then_top.read_text() == common["topk_file"].read_text()
                show_against(args.against, serve, then)
                print(f"  top-k identical to {args.against}'s: {'yes' if same else 'NO'}")
            show("rag-gym", build, serve)
            if serve and serve["passages"] <= args.exhaustive_max:
                full = run_cell("exhaustive", args, index=work / "rag-gym", **common)
                if full:
                    print(
                        f"  exhaustive scoring (numpy backend): {full['qps']:,.0f} q/s, one pass; "
                        f"block-max / exhaustive {serve['batched_qps'] / full['qps']:.1f}x; "
                        f"top-k identical: {'yes' if full['same'] else 'NO'}"
                    )
            theirs = {}
            if has_tantivy and serve:
                tb = run_cell("tantivy_build", args, index=work / "tantivy", **common)
                ts = run_cell("tantivy_serve", args, index=work / "tantivy", **common) if tb else {}
                show("tantivy", tb, ts)
                if ts:
                    print(
                        f"  tantivy: {ts['segments']} segments; top-{args.k} overlap with "
                        f"rag-gym: {ts['overlap']:.0%}"
                    )
                theirs = {"build": tb, "serve": ts}
            elif not has_tantivy:
                print("  tantivy: skipped: not installed (pip install tantivy) or --no-tantivy")
            results[size or 0] = {"build": build, "serve": serve, "tantivy": theirs}
        finally:
            if args.keep:
                print(f"  kept {work}")
            else:
                shutil.rmtree(work, ignore_errors=True)

    print(f"\n== targets (load average at the end {os.getloadavg()[0]:.1f}) ==")

    def verdict(ok: bool) -> str:
        return "MET" if ok else "MISSED"

    for size, res in sorted(results.items()):
        build, serve = res["build"], res["serve"]
        if not build or not serve:
            continue
        label = f"{size:,} passages" if size else str(args.corpus)
        print(
            f"{label}: build peak {build['peak'] / GB:.2f} GB (<= 16 GB): "
            f"{verdict(build['peak'] <= 16 * GB)}; mmap load {serve['load_s']:.1f}s (<= 10 s): "
            f"{verdict(serve['load_s'] <= 10)}; RSS after load "
            f"{serve['rss_load']['VmRSS'] / GB:.2f} GB (<= 4 GB): "
            f"{verdict(serve['rss_load']['VmRSS'] <= 4 * GB)}; batched "
            f"{serve['batched_qps']:,.0f} q/s at k={args.k} (>= 1,000): "
            f"{verdict(serve['batched_qps'] >= 1000)}"
        )
    small, large = results.get(1_000_000, {}), results.get(max(results, default=0), {})
    if small.get("serve"):
        rate = small["serve"]["batched_qps"]
        print(f"1M batched >= 2,900 q/s: {rate:,.0f} q/s: {verdict(rate >= 2900)}")
    if small.get("serve") and large.get("serve") and large is not small:
        fall = small["serve"]["batched_qps"] / large["serve"]["batched_qps"]
        print(
            f"batched q/s from 1M to {max(results):,}: falls {fall:.1f}x (<= 5x): "
            f"{verdict(fall <= 5)}"
        )
        theirs_small, theirs_large = small["tantivy"].get("serve"), large["tantivy"].get("serve")
        if theirs_small and theirs_large:
            fall = theirs_small["batched_qps"] / theirs_large["batched_qps"]
            print(f"tantivy, the same corpora and queries: batched q/s falls {fall:.1f}x")


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


if __name__ == "__main__":
    main()
