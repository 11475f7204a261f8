"""Bad inputs tried and handled cleanly, per area: data loaders, text that is not Unicode and
integers Python cannot read in data files, env arguments, env actions, index build targets,
command-line options and run folders, replies of a misbehaving retrieval server, and abandoned
requests to ``rag-gym serve``; then the areas of ``bad_input_probes/`` (``data``: split folders,
empty gold answers, question ids, reset options; ``backends``: LLM backend and judge failures,
redirects, control bytes, signals in the report step; ``runfiles``: output options, compare
across protocols, hostile run files, damaged suite runs, ``view --serve``; ``retrieval``: sharded
rebuilds, shard counts, an index changed while served, request heads, redirects, ``/health``,
unread replies, ``serve --ray``), each module's docstring saying what "handled cleanly" means
there.

    python benchmarks/bad_inputs.py              # every area
    python benchmarks/bad_inputs.py data backends  # only these probe modules

Handled cleanly means:

* loaders: the file loads, or raises ``DataFormatError`` (or ``ValueError`` /
  ``FileNotFoundError``) whose message names the file. Anything else is a crash.
* env arguments: the env is made (and steps), or a ``TypeError`` / ``ValueError`` saying
  ``expected``.
* env actions (text, tree and reader envs): the step returns, its observation lies in the
  observation space, and it takes under a second.
* index build targets: the build succeeds without deleting anything of the user's, or refuses
  with ``FileExistsError`` and leaves the folder as it was (and no hidden folder beside it).
* undecodable records (a lone surrogate escape such as ``\\ud800`` in a question, an answer, a
  passage or a key; an integer of 5,000 digits): ``DataFormatError`` naming the file and the
  record (a line of a JSONL file, a record or line of a JSON file).
* command-line options and run folders (``--env-kwargs`` too deep or with too long an integer
  or naming another split, ``--token`` with whitespace, ``synth --out`` a file, ``compare
  --json`` in a missing folder, ``--resume`` on a damaged ``protocol.json``): exit status 2 with
  an ``error:`` line, no traceback; a token with whitespace around is taken stripped, with a
  warning.
* retrieval server replies (``HttpRetriever`` against a stand-in that answers duplicate ids,
  scores that are not finite numbers, fewer passages than asked, or malformed lists): a
  ``ValueError`` naming the server.
* abandoned requests: requests of 500 queries at topk 100 whose clients close the socket at
  once, beside good one-query requests to a live server on 127.0.0.1: each good reply is the
  in-process ranking, and good requests keep at least half of their clean throughput.

Index corruptions have their own script: ``benchmarks/index_corruption.py``.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
from bad_input_probes import GOOD, SMALL, write

import rag_gym  # noqa: F401
from rag_gym.data import Corpus, DataFormatError, Passage, load
from rag_gym.retrieval import BM25Retriever
from rag_gym.wrappers import TextActions

#: a lone surrogate, written into a JSON file as its escape
LONE = "<LONE>"

VALUES = [
    None,
    0,
    -1,
    10**400,
    1.5,
    float("nan"),
    True,
    "",
    " ",
    "x" * 100_000,
    [],
    [[]],
    {},
    {"a": 1},
]


def loader_inputs(tmp: Path):
    """(dataset, path) for every bad file: each field removed or set to each odd value, nested
    fields too, repeated ids, and damaged files."""
    n = 0
    for dataset, (name, rec) in GOOD.items():
        variants = []
        for key in rec:
            variants.append({k: v for k, v in rec.items() if k != key})
            variants += [{**rec, key: v} for v in VALUES]
            if isinstance(rec[key], list) and rec[key] and isinstance(rec[key][0], (dict, list)):
                inner = rec[key][0]
                keys = inner if isinstance(inner, dict) else range(len(inner))
                for ik, v in itertools.product(keys, VALUES):
                    copy = dict(inner) if isinstance(inner, dict) else list(inner)
                    copy[ik] = v
                    variants.append({**rec, key: [copy]})
        for records in [[v] for v in variants] + [[rec, rec], [rec, {**rec, "question": "b"}]]:
            n += 1
            path = tmp / f"{n}-{name}"
            write(path, records)
            yield dataset, path
        for raw in (
            b"",
            b"[]",
            b"{}",
            b"\xff\xfe",
            b"[" * 100_000,
            b"[" * 100_000 + b"]" * 100_000,
            b"{",
            b"null",
            b"1",
        ):
            n += 1
            path = tmp / f"{n}-{name}"
            path.write_bytes(raw if name.endswith(".json") else raw + b"\n")
            yield dataset, path


def probe_loaders(tmp: Path) -> tuple[int, int]:
    tried = clean = 0
    for dataset, path in loader_inputs(tmp):
        tried += 1
        try:
            load(dataset, path=path)
        except (DataFormatError, ValueError, FileNotFoundError) as exc:
            if path.name in str(exc):
                clean += 1
            else:
                print(f"  loader {dataset} {path.name}: unnamed: {str(exc)[:120]}")
            continue
        except Exception as exc:
            print(f"  loader {dataset} {path.name}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        clean += 1
    return tried, clean


def probe_env_args() -> tuple[int, int]:
    cases = [
        ("rag_gym/SynthHop-v0", {"invalid_action_penalty": v})
        for v in (float("nan"), float("inf"), "0", True)
    ]
    cases += [("rag_gym/SynthHop-v0", {"k": v}) for v in (0, -1, 10**6, 1.5, "3", None, True)]
    cases += [("rag_gym/SynthHop-v0", {"max_obs_chars": v}) for v in (0, 10**9, -5, "x")]
    cases += [("rag_gym/SynthHop-Tree-v0", {"k": v}) for v in (0, 10**6)]
    cases += [("rag_gym/SynthHop-Reader-v0", {"max_action_chars": v}) for v in (0, -1, "x")]
    extra = {
        "hops": [0, (), (0,), (5,), "2", None],
        "seed": [-1, 1.5, "x"],
        "n_questions": [5, (1, 2)],
    }
    extra["n_passages"] = [0, -5, "x"]
    for key, values in extra.items():
        cases += [("rag_gym/SynthHop-v0", {"dataset_kwargs": {**SMALL, key: v}}) for v in values]
    cases += [("rag_gym/SynthHop-v0", {"exclude_seen": v}) for v in ("false", "true", 1, None)]
    cases += [("rag_gym/SynthHop-v0", {"retriever": v}) for v in (5, [], 1.5, b"http://x")]
    cases += [("rag_gym/SynthHop-v0", {"examples": v}) for v in ("abc", [1], {"a": 1}, 3)]
    reset_seeds = [-1, 1.5, "x", 2**70]
    tried = clean = 0
    for env_id, kwargs in cases:
        tried += 1
        kwargs = {"dataset_kwargs": SMALL, **kwargs}
        try:
            env = gym.make(env_id, **kwargs)
            env.reset(seed=0)
            clean += 1
        except (TypeError, ValueError) as exc:
            ok = "expected" in str(exc)
            clean += ok
            if not ok:
                print(f"  env args {env_id} {kwargs}: {type(exc).__name__}: {str(exc)[:120]}")
        except Exception as exc:
            print(f"  env args {env_id} {kwargs}: {type(exc).__name__}: {str(exc)[:120]}")
    env = gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL)
    for seed in reset_seeds:
        tried += 1
        try:
            env.reset(seed=seed)
            clean += 1
        except (TypeError, ValueError) as exc:
            clean += "expected" in str(exc)
        except Exception as exc:
            print(f"  reset(seed={seed!r}): {type(exc).__name__}: {str(exc)[:120]}")
    return tried, clean


def probe_env_actions() -> tuple[int, int]:
    texts = [
        "<" + " " * 16_383,
        "<" + "\t" * 16_383 + "search>q</search>",
        "<search" + " " * 16_383,
        "<search" + " " * 16_383 + "/" + " " * 16_383,
        "< /" + " " * 16_383,
        "<" * 16_000,
        "<a" * 8_000,
        "</" * 8_000,
        "<relevance>[" + "9" * 5000 + "]</relevance><analysis>a</analysis><answer>x</answer>",
        "<relevance>" + "1," * 8000 + "</relevance>",
        "<relevance>[" + "0" * 5000 + "1]</relevance>",
        "<search>" * 4000,
        "<base-Q>" + "x " * 8000,
        "\x00\ud800\U0010ffff" * 100,
        "",
        "<answer></answer>",
        "<refuse" + " " * 10_000 + "/>",
    ]
    kw = {"dataset_kwargs": SMALL}
    envs = {
        "text": TextActions(gym.make("rag_gym/SynthHop-Hard-v0", **kw)),
        "tree": gym.make("rag_gym/SynthHop-Hard-Tree-v0", **kw),
        "reader": gym.make("rag_gym/SynthHop-Hard-Reader-v0", **kw),
    }
    tried = clean = 0
    for name, env in envs.items():
        for text in texts:
            tried += 1
            env.reset(seed=0)
            t0 = time.perf_counter()
            try:
                obs, *_ = env.step(text)
            except Exception as exc:
                print(f"  action {name} {text[:20]!r}: {type(exc).__name__}: {str(exc)[:100]}")
                continue
            took = time.perf_counter() - t0
            ok = env.observation_space.contains(obs) and took < 1.0
            clean += ok
            if not ok:
                print(f"  action {name} {text[:20]!r}: {took:.2f} s or obs outside the space")
    return tried, clean


def probe_build_targets(tmp: Path) -> tuple[int, int]:
    retriever = BM25Retriever(Corpus([Passage("a", "", "some words"), Passage("b", "", "more")]))
    tried = clean = 0

    def snapshot(root: Path):
        return sorted((p.relative_to(root).as_posix(), p.is_dir()) for p in root.rglob("*"))

    setups = {
        "folder with files": lambda d: (d.mkdir(), (d / "notes.txt").write_text("x")),
        "folder with a subfolder": lambda d: (d / "sub").mkdir(parents=True),
        "a file": lambda d: d.write_text("keep"),
        "a symlink to a folder": lambda d: (
            (d.parent / "real").mkdir() or d.symlink_to(d.parent / "real")
        ),
        "an index holding a user file": lambda d: (
            retriever.save(d),
            (d / "mine.txt").write_text("x"),
        ),
        "an index with a user subfolder": lambda d: (
            retriever.save(d),
            (d / "bm25s" / "x").mkdir(),
        ),
        "a folder whose params.json is not an index's": lambda d: (
            d.mkdir(),
            (d / "params.json").write_text('{"lr": 0.1}'),
        ),
        "a folder with a garbled params.json": lambda d: (
            d.mkdir(),
            (d / "params.json").write_bytes(b"\xff{"),
        ),
        "an empty folder": lambda d: d.mkdir(),
        "an index": lambda d: retriever.save(d),
        "a missing parent": lambda d: None,
    }
    for i, (label, setup) in enumerate(setups.items()):
        root = tmp / f"target{i}"
        root.mkdir()
        d = root / "idx" if label != "a missing parent" else root / "a" / "b" / "idx"
        setup(d)
        before = snapshot(root)
        tried += 1
        try:
            retriever.save(d)
            user_files = [p for p, is_dir in before if not p.startswith("idx/") and p != "idx"]
            after = {p for p, _ in snapshot(root)}
            ok = all(p in after for p in user_files) and not any(p.startswith(".") for p in after)
            ok = ok and label in ("an empty folder", "an index", "a missing parent")
        except FileExistsError:
            ok = snapshot(root) == before
        except Exception as exc:
            print(f"  build into {label}: {type(exc).__name__}: {str(exc)[:120]}")
            ok = False
        clean += ok
        if not ok:
            print(f"  build into {label}: not clean")
    return tried, clean


def undecodable_inputs(tmp: Path):
    """(dataset, path, where) for every file holding a lone surrogate escape or an integer of
    5,000 digits, in each field a record has (nested ones too), as the second record."""
    n = 0
    for dataset, (name, rec) in GOOD.items():
        variants = []

        def spots(value, put):
            """Every string of ``value`` and every key, each replaced in turn through ``put``."""
            if isinstance(value, str):
                yield lambda bad: put(bad + value)
            elif isinstance(value, dict):
                for key, item in value.items():
                    yield from spots(item, lambda v, key=key: put({**value, key: v}))
                    yield lambda bad, key=key: put(
                        {(bad + k if k == key else k): v for k, v in value.items()}
                    )
            elif isinstance(value, list):
                for i, item in enumerate(value):
                    yield from spots(item, lambda v, i=i: put([*value[:i], v, *value[i + 1 :]]))

        second = {**rec, "_id": "b"} if "_id" in rec else {**rec, "id": "b"}
        for swap in spots(second, lambda v: v):
            variants.append(swap(LONE))
        variants += [{**second, key: "<BIG>"} for key in second]
        for variant in variants:
            n += 1
            path = tmp / f"u{n}-{name}"
            write(path, [rec, variant])
            text = path.read_text().replace(LONE, "\\ud800").replace('"<BIG>"', "7" * 5000)
            path.write_text(text, encoding="utf-8")
            yield dataset, path, ("line 2" if name.endswith(".jsonl") else ("record 1", "line 1"))


def probe_undecodable(tmp: Path) -> tuple[int, int]:
    tried = clean = 0
    for dataset, path, where in undecodable_inputs(tmp):
        tried += 1
        places = (where,) if isinstance(where, str) else where
        try:
            load(dataset, path=path)
        except DataFormatError as exc:
            ok = path.name in str(exc) and any(f", {w}," in str(exc) for w in places)
            clean += ok
            if not ok:
                print(f"  undecodable {dataset} {path.name}: not located: {str(exc)[:120]}")
            continue
        except Exception as exc:
            print(f"  undecodable {dataset} {path.name}: {type(exc).__name__}: {str(exc)[:120]}")
            continue
        print(f"  undecodable {dataset} {path.name}: loaded")
    return tried, clean


def probe_options(tmp: Path) -> tuple[int, int]:
    """Command-line options and run folders a careless user gives."""
    import warnings

    from typer.testing import CliRunner

    from rag_gym.cli import app
    from rag_gym.evaluate import EvalConfig, evaluate
    from rag_gym.retrieval.http import clean_token

    runner = CliRunner()
    tried = clean = 0

    def refused(args: list[str], label: str) -> None:
        nonlocal tried, clean
        tried += 1
        result = runner.invoke(app, args)
        ok = result.exit_code == 2 and "error:" in result.output
        ok = ok and isinstance(result.exception, (SystemExit, type(None)))
        clean += ok
        if not ok:
            print(f"  option {label}: exit {result.exit_code}: {result.output[-160:]!r}")

    out = str(tmp / "runs")
    for label, text in [
        ("--env-kwargs 5,000 digits", '{"k": ' + "7" * 5000 + "}"),
        ("--env-kwargs nested 50,000 deep", "[" * 50_000 + "]" * 50_000),
        ("--env-kwargs object nested 50,000 deep", '{"a": ' + "[" * 50_000 + "]" * 50_000 + "}"),
        ("--env-kwargs another split", '{"split": "train"}'),
        ("--env-kwargs a list", "[1, 2]"),
        ("--env-kwargs not JSON", "{k: 3}"),
        ("--env-kwargs a lone surrogate key", '{"\\ud800": 1}'),
    ]:
        refused(["evaluate", "--env-kwargs", text, "--out", out, "--no-progress"], label)
    existing = tmp / "a-file.txt"
    existing.write_text("mine")
    refused(["synth", "--out", str(existing), "--passages", "2000"], "synth --out FILE")
    refused(["synth", "--out", str(existing / "sub"), "--passages", "2000"], "synth --out FILE/x")
    refused(
        ["compare", str(tmp), "--a", "x", "--b", "y", "--json", str(tmp / "missing" / "x.json")],
        "compare --json in a missing folder",
    )
    # --resume on a damaged protocol.json
    config = EvalConfig(
        n=2, agents=("random",), env_kwargs={"dataset_kwargs": SMALL}, out_dir=out, run_name="r"
    )
    evaluate(config, lambda name, env: __import__("rag_gym.baselines").baselines.make_agent(name))
    protocol_path = tmp / "runs" / "r" / "protocol.json"
    good = json.loads(protocol_path.read_text())
    damaged = {
        "no config": {k: v for k, v in good.items() if k != "config"},
        "agents a list": {**good, "agents": list(good["agents"])},
        "config.agents a string": {**good, "config": {**good["config"], "agents": "random"}},
        "config a list": {**good, "config": []},
        "a list": [good],
        "config.n a string": {**good, "config": {**good["config"], "n": "2"}},
    }
    for label, protocol in damaged.items():
        protocol_path.write_text(json.dumps(protocol))
        refused(["evaluate", "--resume", str(tmp / "runs" / "r")], f"--resume, protocol {label}")
    for label, raw in (("not JSON", "{"), ("not UTF-8", "\udcff")):
        protocol_path.write_bytes(raw.encode("utf-8", "surrogateescape"))
        refused(["evaluate", "--resume", str(tmp / "runs" / "r")], f"--resume, protocol {label}")
    for token in (" abc", "abc\n", "\tabc ", " ", "\n", "a b", "abç", "a\x00b"):
        tried += 1
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                taken = clean_token(token, "--token")
                ok = taken == token.strip() and (taken == token or bool(caught))
            except ValueError as exc:
                ok = "expected --token" in str(exc)
        clean += ok
        if not ok:
            print(f"  --token {token!r}: not handled")
    return tried, clean


def probe_http_replies() -> tuple[int, int]:
    """``HttpRetriever`` against a stand-in answering replies that cannot be right."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from rag_gym.retrieval.http import HttpRetriever

    def doc(pid, score=1.0):
        return {"document": {"id": pid, "contents": f"T\n{pid}"}, "score": score}

    good = [doc("a", 3.0), doc("b", 2.0), doc("c", 1.0)]
    replies = [
        [doc("a"), doc("a"), doc("b")],
        [doc("a", 2.0), doc("b", 1.0)],
        [],
        [doc("a"), doc("b"), doc("c", "NaN")],
        [doc("a"), doc("b"), doc("c", "inf")],
        [doc("a"), doc("b"), doc("c", "-Infinity")],
        [doc("a"), doc("b"), doc("c", True)],
        [doc("a"), doc("b"), doc("c", "high")],
        [doc("a"), doc("b"), doc("c", [1])],
        [doc("a"), doc("b"), 5],
        [doc("a"), doc("b"), {"document": {"id": "c"}, "score": 1.0}],
        "not a list",
        None,
    ]
    shapes = [{"result": [r]} for r in replies]
    shapes += [{"result": [good, good]}, {"result": []}, {"result": "x"}, {"oops": 1}, [good]]
    state = {"reply": None}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            data = json.dumps(state["reply"]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self.send_error(404)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    tried = clean = 0
    try:
        client = HttpRetriever(url, corpus_size=100, retries=0)
        for reply in shapes:
            tried += 1
            state["reply"] = reply
            try:
                client.retrieve(["q"], 3)
            except ValueError as exc:
                ok = url in str(exc)
                clean += ok
                if not ok:
                    print(f"  reply {str(reply)[:60]}: unnamed: {str(exc)[:120]}")
                continue
            except Exception as exc:
                print(f"  reply {str(reply)[:60]}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            print(f"  reply {str(reply)[:60]}: accepted")
    finally:
        httpd.shutdown()
        httpd.server_close()
    return tried, clean


def probe_abandoned(tmp: Path, n_abandoned: int = 200, n_good: int = 300):
    """Good one-query requests alone, then beside ``n_abandoned`` requests of 500 queries at
    topk 100 whose sockets close at once, then alone again, against ``rag-gym serve`` in a
    subprocess: (good requests, correct replies beside the flood, throughput with the flood /
    without)."""
    import multiprocessing
    import socket
    import subprocess
    import urllib.request

    from rag_gym.data.synthhop import world_for

    world = world_for("default", **SMALL)
    retriever = BM25Retriever(world.corpus)
    retriever.save(tmp / "abandoned-index")
    queries = [q.question for q in world.questions["train"]]
    expected = dict(zip(queries, retriever.retrieve(queries, 3).ids, strict=True))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve = ["serve", "--index", str(tmp / "abandoned-index"), "--port", str(port)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag_gym.cli", *serve],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=Path(__file__).resolve().parent.parent,
    )
    url = f"http://127.0.0.1:{port}"
    flood_body = json.dumps(
        {"queries": [f"{queries[i % len(queries)]} {i}" for i in range(500)], "topk": 100}
    ).encode()
    head = (
        "POST /retrieve HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(flood_body)}\r\n\r\n"
    ).encode()

    def good_requests(count: int) -> tuple[int, float]:
        correct, t0 = 0, time.perf_counter()
        for i in range(count):
            q = queries[i % len(queries)]
            body = json.dumps({"queries": [q], "topk": 3}).encode()
            req = urllib.request.Request(
                url + "/retrieve",
                data=body,
                headers={"Content-Type": "application/json"},
                method="POST",
            )
            with urllib.request.urlopen(req, timeout=60) as resp:
                ids = [d["id"] for d in json.loads(resp.read())["result"][0]]
            correct += ids == expected[q]
        return correct, time.perf_counter() - t0

    def flood(stop) -> None:
        for _ in range(n_abandoned):
            if stop.is_set():
                return
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(head + flood_body)
            time.sleep(0.005)

    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.1)
        good_requests(50)  # warm up
        _, before_seconds = good_requests(n_good)
        # the flood from a process of its own: its sends do not take this one's GIL
        context = multiprocessing.get_context("fork")
        stop = context.Event()
        flooding = context.Process(target=flood, args=(stop,))
        flooding.start()
        correct, flood_seconds = good_requests(n_good)
        stop.set()
        flooding.join(60)
        _, after_seconds = good_requests(n_good)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    # against the mean of a clean phase before and one after: a drift of the machine's load
    # is not read as an effect of the flood
    return n_good, correct, (before_seconds + after_seconds) / 2 / flood_seconds


#: the probe modules of ``bad_input_probes/``, in the order they run
PROBE_MODULES = ("data", "backends", "runfiles", "retrieval")


def main() -> None:
    import importlib

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    only = sys.argv[1:]
    unknown = sorted(set(only) - set(PROBE_MODULES))
    if unknown:
        sys.exit(f"error: unknown probe modules {unknown}; expected some of {list(PROBE_MODULES)}")
    results: dict[str, tuple[int, int]] = {}
    kept = None
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        if not only:
            results = {
                "data loaders": probe_loaders(tmp),
                "undecodable records (lone surrogates, 5,000-digit integers)": probe_undecodable(
                    tmp
                ),
                "env arguments": probe_env_args(),
                "env actions (text, tree, reader)": probe_env_actions(),
                "index build targets": probe_build_targets(tmp),
                "command-line options and run folders": probe_options(tmp),
                "retrieval server replies (HttpRetriever)": probe_http_replies(),
            }
            good, correct, kept = probe_abandoned(tmp)
            results["good requests beside 200 abandoned 500-query requests"] = (
                good,
                correct if kept >= 0.5 else 0,
            )
        for name in only or PROBE_MODULES:
            module = importlib.import_module(f"bad_input_probes.{name}")
            sub = tmp / name
            sub.mkdir()
            results.update(module.probes(sub))
    print()
    print("| area | tried | handled cleanly |")
    print("|---|---:|---:|")
    for area, (tried, clean) in results.items():
        print(f"| {area} | {tried} | {clean} ({100 * clean / tried:.1f} %) |")
    tried = sum(t for t, _ in results.values())
    clean = sum(c for _, c in results.values())
    print(f"| all | {tried} | {clean} ({100 * clean / tried:.1f} %) |")
    if kept is not None:
        print(
            f"\ngood requests beside abandoned ones: {kept:.0%} of their clean throughput "
            "(target >= 50%; below it, none counts as handled)"
        )
    sys.exit(0 if all(t == c for t, c in results.values()) else 1)


if __name__ == "__main__":
    main()
