"""Run files and what reads or writes them: output options (``view --out``, ``compare --json``)
that name a run's own records or an existing file, ``compare`` across runs of different protocols,
hostile run-file content (lines nested 100k deep, 5,000-digit numbers, lone surrogates, odd
folder names), damaged suite runs and column names that collide, ``view --serve`` requests (paths,
Host headers), and ``compare``'s options.

Handled cleanly: exit status 2 with an ``error:`` line naming the file, option or run and no
traceback, nothing written over; a hostile line is skipped with a warning naming the file and
line; ``view --serve`` answers only the report, only to local Host headers.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from bad_input_probes import SMALL

#: agents of the evaluation run the probes read
AGENTS = ("random", "random-b")


def _runner():
    from typer.testing import CliRunner

    return CliRunner()


def _clean_exit(result) -> bool:
    """Exit 2 with an ``error:`` line and no traceback."""
    return (
        result.exit_code == 2
        and "error:" in result.output
        and isinstance(result.exception, (SystemExit, type(None)))
    )


def eval_run(tmp: Path) -> Path:
    """A finished ``rag-gym evaluate`` run folder: random on 6 SynthHop questions, and a
    second agent (random's episodes, EM flipped)."""
    from rag_gym.baselines import make_agent
    from rag_gym.evaluate import EvalConfig, evaluate

    out = tmp / "runfiles-runs"
    config = EvalConfig(
        n=6,
        agents=AGENTS[:1],
        env_kwargs={"dataset_kwargs": SMALL},
        out_dir=str(out),
        run_name="eval",
    )
    evaluate(config, lambda name, env: make_agent(name, env=env))
    run = out / "eval"
    for name in ("episodes.jsonl", "steps.jsonl"):  # a second agent: the first, its EM flipped
        lines = [json.loads(x) for x in (run / name).read_text().splitlines()]
        more = [{**r, "agent": AGENTS[1], "em": 1.0 - float(r.get("em") or 0)} for r in lines]
        with open(run / name, "a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in more))
    return run


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _restore(folder: Path, files: dict[str, bytes]) -> None:
    """Put ``folder`` back as ``files`` (a probe that found a miss leaves the run whole)."""
    if folder.is_dir():
        shutil.rmtree(folder)
    elif folder.exists():
        folder.unlink()
    for rel, data in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_bytes(data)


def probe_output_paths(tmp: Path, run: Path) -> tuple[int, int]:
    """``view --out`` and ``compare --json`` pointed at a run's own files (each file of an
    evaluation run and of a training run, records not written yet, a link to one, the folder
    itself), with and without ``--overwrite``, and at an existing file of the user's without
    ``--overwrite``: handled when the command exits 2 with an ``error:`` line and every file
    is as it was."""
    from rag_gym.cli import app

    runner = _runner()
    tried = clean = 0
    train = tmp / "runfiles-train"
    train.mkdir()
    history = [{"loss": 1.0, "step": 1}, {"loss": 0.5, "step": 2}]
    (train / "results.json").write_text(json.dumps({"log_history": history}))
    for name, data in (("config.json", "{}"), ("model.safetensors", "weights"), ("notes.txt", "x")):
        (train / name).write_text(data)
    (train / "checkpoint-2").mkdir()
    (train / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"log_history": history}))
    mine = tmp / "runfiles-mine.txt"
    mine.write_text("the user's own file")
    for folder in (run, train):
        link = tmp / f"runfiles-link-{folder.name}.html"
        link.symlink_to(folder / next(iter(_snapshot(folder))))
        before = _snapshot(folder)
        targets = [folder / name for name in before]
        targets += [folder / n for n in ("suite.json", "leaderboard.md", "steps.jsonl")]
        targets += [folder / "checkpoint-2" / ".." / "results.json", folder, link]
        targets = list(dict.fromkeys(targets))
        for target in targets:
            for command in ("view", "compare"):
                for extra in ([], ["--overwrite"]):
                    if command == "view":
                        args = ["view", str(folder), "--out", str(target), *extra]
                    else:
                        args = ["compare", str(folder), "--a", AGENTS[0], "--b", AGENTS[1]]
                        args += ["--resamples", "100", "--json", str(target), *extra]
                    tried += 1
                    result = runner.invoke(app, args)
                    ok = _clean_exit(result) and _snapshot(folder) == before
                    ok = ok and mine.read_text() == "the user's own file"
                    clean += ok
                    if not ok:
                        print(f"  output {' '.join(args[:2])} -> {target.name}: exit "
                              f"{result.exit_code}: {result.output[-120:]!r}")  # fmt: skip
                        _restore(folder, before)
    for args in (
        ["view", str(run), "--out", str(mine)],
        ["compare", str(run), "--a", AGENTS[0], "--b", AGENTS[1], "--json", str(mine)],
    ):
        tried += 1
        result = runner.invoke(app, args)
        ok = _clean_exit(result) and mine.read_text() == "the user's own file"
        clean += ok
        if not ok:
            print(f"  output {args[0]} over an existing file: exit {result.exit_code}")
    return tried, clean


#: protocol.json changes that make a question id name another question or score another way
PROTOCOL_CHANGES = {
    "env_id": {"env_id": "rag_gym/TriviaQA-v0"},
    "split": {"split": "test"},
    "data_path": {"env_kwargs": {"data_path": "triviaqa/test.jsonl"}},
    "dataset": {"env_kwargs": {"dataset": "flashrag"}},
    "dataset_kwargs": {"env_kwargs": {"dataset_kwargs": {"n_passages": 3000}}},
    "k=1": {"k": 1},
    "k=5": {"k": 5},
    "retriever": {"retriever": "DenseRetriever"},
    "corpus_mode": {"corpus_mode": "distractor"},
    "corpus_size": {"corpus_size": 1},
    "answer_metric": {"answer_metric": "f1"},
    "max_episode_steps": {"max_episode_steps": 2},
}


def probe_compare_protocols(tmp: Path, run: Path) -> tuple[int, int]:
    """``compare`` of agent a's run against agent b's run on the same question ids (as FlashRAG
    names every dataset's questions ``test_0``…) whose protocols differ in one field each, or
    where one run has no or a damaged ``protocol.json``: handled when refused (exit 2, an
    ``error:`` line naming both runs and the field). Two controls must pair: the same protocol,
    and two datasets pooled with both agents in each."""
    from rag_gym.cli import app

    runner = _runner()
    base = json.loads((run / "protocol.json").read_text())
    ids = [f"test_{i}" for i in range(8)]

    def make(name: str, agents, protocol) -> Path:
        folder = tmp / "runfiles-cmp" / name
        folder.mkdir(parents=True)
        lines = [
            {"agent": a, "question_id": q, "em": float((i + len(a)) % 2), "f1": 0.5,
             "recall": 1.0, "full_recall": 1.0, "searches": 1, "error": None}
            for a in agents for i, q in enumerate(ids)
        ]  # fmt: skip
        (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        if protocol is not None:
            text = protocol if isinstance(protocol, str) else json.dumps(protocol)
            (folder / "protocol.json").write_text(text)
        return folder

    def changed(change: dict) -> dict:
        out = {**base, **change}
        if "env_kwargs" in change:
            out["env_kwargs"] = {**base["env_kwargs"], **change["env_kwargs"]}
        return out

    tried = clean = 0
    a_run = make("a", ["x"], base)
    cases = {label: (changed(c), label.split("=")[0]) for label, c in PROTOCOL_CHANGES.items()}
    cases["no protocol.json"] = (None, "protocol.json")
    cases["protocol.json nested 100,000 deep"] = ("[" * 100_000, "protocol.json")
    cases["protocol.json a list"] = ("[1]", "protocol.json")
    for label, (protocol, field) in cases.items():
        b_run = make(f"b-{len(os.listdir(tmp / 'runfiles-cmp'))}", ["y"], protocol)
        tried += 1
        result = runner.invoke(app, ["compare", str(a_run), str(b_run), "--a", "x", "--b", "y"])
        ok = _clean_exit(result) and field in result.output
        if protocol is not None and not isinstance(protocol, str):
            ok = ok and a_run.name in result.output and b_run.name in result.output
        clean += ok
        if not ok:
            print(f"  compare across {label}: exit {result.exit_code}: {result.output[-160:]!r}")
    controls = [
        ([a_run, make("same", ["y"], base)], 8),
        ([make("nq", ["x", "y"], base), make("tq", ["x", "y"], changed(PROTOCOL_CHANGES["env_id"]))], 16),
    ]  # fmt: skip
    for runs, questions in controls:
        tried += 1
        args = ["compare", *map(str, runs), "--a", "x", "--b", "y", "--resamples", "200"]
        result = runner.invoke(app, args)
        ok = result.exit_code == 0 and f"on {questions} shared questions" in result.output
        clean += ok
        if not ok:
            print(f"  compare control: exit {result.exit_code}: {result.output[-160:]!r}")
    return tried, clean


#: lines no run file can hold: (label, bytes)
HOSTILE_LINES = [
    ("nested 100,000 deep", b"[" * 100_000 + b"]" * 100_000),
    ("an object nested 5,000 deep",
     b'{"agent": "random", "question_id": "q", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("a 5,000-digit integer", b'{"agent": "random", "question_id": "q", "em": ' + b"7" * 5000 + b"}"),
    ("a 400-digit negative integer",
     b'{"agent": "random", "question_id": "q", "steps": -' + b"7" * 400 + b"}"),
    ("a lone surrogate value", b'{"agent": "random", "question_id": "\\ud800", "id": "\\udfff"}'),
    ("a lone surrogate key", b'{"agent": "random", "question_id": "q", "\\udc00": 1, "id": "p"}'),
    ("not UTF-8", b'{"agent": "random", "question_id": "\xff\xfe", "id": "\xc3"}'),
]  # fmt: skip
#: odd but valid lines a reader must take or skip: (label, bytes)
ODD_LINES = [
    ("a NUL and controls", b'{"agent": "random", "question_id": "q\\u0000\\u001b[31m", "id": "p"}'),
    ("1e999 and NaN", b'{"agent": "random", "question_id": "q", "em": 1e999, "f1": NaN, "id": 1e999}'),
    ("odd field types", b'{"agent": ["a"], "question_id": {"b": 1}, "gold_ids": 5, "answers": "x", '
     b'"prompt_tokens": "many", "steps": {}, "retrieved_ids": 3, "health": [], "id": [1]}'),
    ("a JSON array", b"[1, 2]"),
    ("a JSON string", b'"episode"'),
    ("null", b"null"),
]  # fmt: skip
#: whole-file contents no JSON file of a run can hold
HOSTILE_FILES = [
    ("nested 100,000 deep", b"[" * 100_000),
    ("a 5,000-digit integer", b'{"random": ' + b"7" * 5000 + b"}"),
    ("a lone surrogate", b'{"\\ud800": "\\udfff", "log_history": [{"step": 1, "\\ud800": 1}]}'),
    ("not UTF-8", b'{"a": "\xff"}'),
    ("a list", b"[1, 2]"),
    ("cut", b'{"log_history": [{"step": '),
    ("odd types", b'{"log_history": [{"step": "x"}, 5, {"step": 1e999, "loss": 1e999}], '
     b'"agents": [], "env_id": 5, "random": "fast"}'),
]  # fmt: skip


def probe_run_file_content(tmp: Path, run: Path) -> tuple[int, int]:
    """Hostile content in a run folder, read by ``rag-gym view`` (the report is written; a
    line-level problem names the file and line in the report), by ``rag-gym compare`` (a result
    or an ``error:`` line naming the file) and by ``--resume``'s reader (a ``ValueError`` naming
    the file and line): each hostile line in each JSONL file, in the middle and as a cut last
    line; each hostile content in each JSON file; odd checkpoint folders; a damaged
    ``leaderboard.csv``; a run folder whose name is not UTF-8."""
    from rag_gym.cli import app
    from rag_gym.evaluate import load_episodes
    from rag_gym.view import build_report

    runner = _runner()
    tried = clean = 0
    work = tmp / "runfiles-content"
    n = 0

    def copy() -> Path:
        nonlocal n
        n += 1
        folder = work / f"r{n}"
        shutil.copytree(run, folder)
        return folder

    def view_ok(folder: Path, needle: str | None) -> bool:
        try:
            out = build_report(folder, work / f"report{len(os.listdir(work))}.html")
            html = out.read_text(encoding="utf-8")
        except Exception as exc:
            print(f"  view {needle}: {type(exc).__name__}: {str(exc)[:120]}")
            return False
        ok = needle is None or needle in html
        if not ok:
            print(f"  view: no warning naming {needle}")
        return ok

    for name in ("episodes.jsonl", "steps.jsonl", "passages.jsonl"):
        for label, line in HOSTILE_LINES + ODD_LINES:
            for cut in (False, True):
                if cut and (label, line) in ODD_LINES:
                    continue
                folder = copy()
                path = folder / name
                count = len(path.read_bytes().splitlines())
                with open(path, "ab") as f:
                    f.write(line + (b"" if cut else b"\n"))
                hostile = (label, line) in HOSTILE_LINES
                needle = f"{name}:{count + 1}" if hostile else None
                tried += 1
                clean += view_ok(folder, needle)
                if name == "episodes.jsonl":
                    tried += 1
                    args = ["compare", str(folder), "--a", AGENTS[0], "--b", AGENTS[1]]
                    result = runner.invoke(app, [*args, "--resamples", "100"])
                    named = _clean_exit(result) and f"{name}:{count + 1}" in result.output
                    ok = named if hostile and not cut else result.exit_code == 0 or named
                    ok = ok and isinstance(result.exception, (SystemExit, type(None)))
                    clean += ok
                    if not ok:
                        print(f"  compare {label} (cut {cut}): exit {result.exit_code}: "
                              f"{result.output[-160:]!r}")  # fmt: skip
                    tried += 1
                    try:
                        load_episodes(path)
                        ok = cut or not hostile
                    except ValueError as exc:
                        ok = f"{name}:{count + 1}" in str(exc)
                    except Exception as exc:
                        ok = False
                        print(f"  resume reader {label}: {type(exc).__name__}: {str(exc)[:100]}")
                    clean += ok
    files = ["protocol.json", "timing.json", "results.json", "history.json", "trainer_state.json",
             "checkpoint-3/trainer_state.json"]  # fmt: skip
    for name in files:
        for label, data in HOSTILE_FILES:
            folder = copy()
            (folder / name).parent.mkdir(exist_ok=True)
            (folder / name).write_bytes(data)
            tried += 1
            clean += view_ok(folder, None)
            if name == "protocol.json":
                tried += 1
                args = ["compare", str(folder), "--a", AGENTS[0], "--b", AGENTS[1]]
                result = runner.invoke(app, [*args, "--resamples", "100"])
                ok = result.exit_code in (0, 2) and isinstance(
                    result.exception, (SystemExit, type(None))
                )
                clean += ok
                if not ok:
                    print(f"  compare protocol.json {label}: exit {result.exit_code}")
    for folder_name in ("checkpoint-abc", "checkpoint-", "checkpoint-1e3", "checkpoint--1",
                        "checkpoint-" + "9" * 40, "checkpoint-x-2"):  # fmt: skip
        folder = copy()
        (folder / folder_name).mkdir()
        (folder / folder_name / "trainer_state.json").write_text('{"log_history": []}')
        tried += 1
        clean += view_ok(folder, None)
    for _label, data in (("binary", b"\xff\xfe\x00garbage"), ("a NUL", b"agent,em\nx\x00,1\n"),
                        ("a 200 KB field", b"agent,em\nx," + b"9" * 200_000 + b"\n"),
                        ("no agent column", b"em\n1\n"), ("ragged rows", b"agent,em\nx,1,2,3\ny\n"),
                        ("text numbers", b"agent,em,f1\nx,abc,1e999\n")):  # fmt: skip
        folder = copy()
        (folder / "episodes.jsonl").unlink()
        (folder / "leaderboard.csv").write_bytes(data)
        tried += 1
        clean += view_ok(folder, None)
    odd = work / os.fsdecode(b"run-\xff-name")
    shutil.copytree(run, odd)
    tried += 1
    clean += view_ok(odd, None)
    return tried, clean


SUITE = {
    "name": "tiny",
    "k": 2,
    "metric": "em",
    "datasets": [
        {"name": "NQ", "env": "rag_gym/NQ-v0", "split": "test", "data": "nq/test.jsonl"},
        {"name": "TQ", "env": "rag_gym/TriviaQA-v0", "split": "test", "data": "tq/test.jsonl"},
    ],
}


def probe_suite_runs(tmp: Path) -> tuple[int, int]:
    """A finished suite run whose ``suite.json`` is damaged one way each (a key missing, of
    another type, a pin without its checksum, ``data`` empty, the suite text edited, not JSON),
    resumed and re-run (``--resume``, ``--from-run``): handled when the command exits 2 with an
    ``error:`` line naming ``suite.json``. And suite files whose dataset names give one column
    folder (``Hot pot``/``Hot_pot``, ``NQ``/``nq``) or a folder of the run's own: handled when
    ``parse_suite`` raises ``SuiteError``."""
    from rag_gym.cli import app
    from rag_gym.evaluate.suite import SuiteError, parse_suite

    runner = _runner()
    root = tmp / "runfiles-suite"
    for folder, n in (("nq", 3), ("tq", 3)):
        (root / folder).mkdir(parents=True)
        with open(root / folder / "test.jsonl", "w") as f:
            for i in range(n):
                rec = {"id": f"test_{i}", "question": f"q {folder} {i}?", "golden_answers": ["x"]}
                f.write(json.dumps(rec) + "\n")
    corpus = root / "corpus.jsonl"
    with open(corpus, "w") as f:
        for i in range(20):
            f.write(json.dumps({"id": f"p{i}", "contents": f"T{i}\nText {i}."}) + "\n")
    (root / "tiny.json").write_text(json.dumps(SUITE))
    args = ["evaluate", "--suite", str(root / "tiny.json"), "--corpus", str(corpus)]
    args += ["--data-root", str(root), "--agents", "random", "--out", str(root / "runs")]
    result = runner.invoke(app, [*args, "--run-name", "s", "--no-progress"])
    assert result.exit_code == 0, result.output
    good = json.loads((root / "runs" / "s" / "suite.json").read_text())

    def without(d, key):
        return {k: v for k, v in d.items() if k != key}

    damaged = {
        "suite {}": {**good, "suite": {}},
        "suite a string": {**good, "suite": "tiny"},
        "no suite": without(good, "suite"),
        "suite without sha256": {**good, "suite": without(good["suite"], "sha256")},
        "suite text edited": {**good, "suite": {**good["suite"], "text": "{}"}},
        "config []": {**good, "config": []},
        "config {}": {**good, "config": {}},
        "no config": without(good, "config"),
        "config.agents a string": {**good, "config": {**good["config"], "agents": "random"}},
        "config.seed a string": {**good, "config": {**good["config"], "seed": "0"}},
        "config.n a list": {**good, "config": {**good["config"], "n": [1]}},
        "config.datasets [1]": {**good, "config": {**good["config"], "datasets": [1]}},
        "config with an unknown key": {**good, "config": {**good["config"], "x": 1}},
        "no corpus": without(good, "corpus"),
        "data []": {**good, "data": []},
        "data {}": {**good, "data": {}},
        "no data": without(good, "data"),
        "a pin without sha256": {**good, "data": {**good["data"], "NQ": {"path": "x"}}},
        "a pin a string": {**good, "data": {**good["data"], "NQ": "abc"}},
        "a pin's sha256 a number": {**good, "data": {**good["data"], "NQ": {"sha256": 5}}},
        "a list": [good],
        "null": None,
    }
    raw = {
        "nested 100,000 deep": "[" * 100_000,
        "a 5,000-digit integer": '{"suite": ' + "7" * 5000 + "}",
        "a lone surrogate": '{"suite": "\\ud800"}',
        "not JSON": "{",
    }
    tried = clean = 0
    for label, content in [*((k, json.dumps(v)) for k, v in damaged.items()), *raw.items()]:
        for option in ("--resume", "--from-run"):
            run = root / "runs" / f"d{tried}"
            shutil.copytree(root / "runs" / "s", run)
            (run / "suite.json").write_text(content)
            args = ["evaluate", option, str(run), "--no-progress"]
            if option == "--from-run":
                args += ["--out", str(root / "again"), "--run-name", f"b{tried}"]
            tried += 1
            result = runner.invoke(app, args)
            ok = _clean_exit(result) and "suite.json" in result.output
            clean += ok
            if not ok:
                print(f"  suite {option} {label}: exit {result.exit_code}: "
                      f"{result.output[-160:]!r}")  # fmt: skip
    for names in (["Hot pot", "Hot_pot"], ["NQ", "nq"], ["a/b", "a b"], ["x:y", "x?y"],
                  ["suite.json"], ["suite.md"], ["prompt.txt"], [".."], ["."], ["é", "_"]):  # fmt: skip
        datasets = [{**SUITE["datasets"][0], "name": n} for n in names]
        tried += 1
        try:
            parse_suite(json.dumps({**SUITE, "datasets": datasets}), "tiny.json")
            print(f"  suite names {names}: accepted")
        except SuiteError as exc:
            clean += "tiny.json" in str(exc)
        except Exception as exc:
            print(f"  suite names {names}: {type(exc).__name__}: {exc}")
    return tried, clean


def probe_serve(tmp: Path, run: Path) -> tuple[int, int]:
    """Requests to ``rag-gym view --serve``'s server (a real one on 127.0.0.1, through
    ``http.client``) beside a file of the user's: handled when the report's paths with a local
    ``Host`` get the report, any other path 404 without a folder listing or another file, and
    any other ``Host`` (a DNS-rebinding page's name, none, another port) 403."""
    import http.client
    import threading

    from rag_gym.view import build_report, make_server

    folder = tmp / "runfiles-serve"
    folder.mkdir()
    report = build_report(run, folder / "report.html")
    (folder / "secret.txt").write_text("SECRET")
    page = report.read_bytes()
    tried = clean = 0
    with make_server(report, 0) as server:
        host, port = server.server_address[:2]
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            tried += 1
            clean += host == "127.0.0.1"
            good_hosts = [f"127.0.0.1:{port}", f"localhost:{port}", f"LocalHost:{port}"]
            bad_hosts = ["evil.example", f"evil.example:{port}", f"127.0.0.1.nip.io:{port}",
                         f"127.0.0.1:{port + 1}", "", None, f"localhost:{port}@evil.example",
                         "0.0.0.0", f"[::1]:{port}"]  # fmt: skip
            paths = ["/secret.txt", "/./secret.txt", "/%2e%2e/", "/../", "//secret.txt",
                     "/report.html/", "/x", "/report.html%00", "/REPORT.HTML", "/.", "/?C=M;O=D"]  # fmt: skip
            for method in ("GET", "HEAD"):
                for h in good_hosts + bad_hosts:
                    for path in ["/", "/report.html", *paths]:
                        tried += 1
                        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                        try:
                            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
                            if h is not None:
                                conn.putheader("Host", h)
                            conn.endheaders()
                            reply = conn.getresponse()
                            body = reply.read()
                        except (OSError, http.client.HTTPException) as exc:
                            print(f"  serve {method} {path} Host {h!r}: {type(exc).__name__}")
                            continue
                        finally:
                            conn.close()
                        if h not in good_hosts:
                            ok = reply.status == 403 and b"SECRET" not in body
                            ok = ok and b"rag-gym report" not in body
                        elif path in ("/", "/report.html") or path.startswith("/?"):
                            ok = reply.status == 200 and body == (page if method == "GET" else b"")
                        else:
                            ok = reply.status == 404 and b"SECRET" not in body
                            ok = ok and b"Directory listing" not in body
                        clean += ok
                        if not ok:
                            print(f"  serve {method} {path} Host {h!r}: {reply.status}")
        finally:
            server.shutdown()
    return tried, clean


def probe_compare_options(tmp: Path, run: Path) -> tuple[int, int]:
    """``compare`` options a careless user gives: no metric, resamples out of 1..1,000,000
    (10**13 once raised MemoryError), a confidence outside (0, 1): handled when the command
    exits 2 with an ``error:`` line naming the option, without a traceback."""
    from rag_gym.cli import app

    runner = _runner()
    tried = clean = 0
    base = ["compare", str(run), "--a", AGENTS[0], "--b", AGENTS[1]]
    cases = [(["--metrics", m], "--metrics") for m in ("", " ", ",", " , ,")]
    cases += [(["--resamples", str(r)], "--resamples")
              for r in (10**13, 2**63, 10**30, 0, -1, 1_000_001)]  # fmt: skip
    cases += [(["--confidence", c], "confidence") for c in ("nan", "inf", "0", "1", "-0.5", "1.5")]
    for args, name in cases:
        tried += 1
        result = runner.invoke(app, [*base, *args])
        ok = _clean_exit(result) and name in result.output
        clean += ok
        if not ok:
            print(f"  compare {args}: exit {result.exit_code}: {result.output[-160:]!r}")
    return tried, clean


def probes(tmp: Path) -> dict[str, tuple[int, int]]:
    """(tried, handled cleanly) per category, over one finished evaluation run."""
    runs = eval_run(tmp)
    return {
        "output options beside a run's own files (view --out, compare --json)": (
            probe_output_paths(tmp, runs)
        ),
        "compare across runs of different protocols": probe_compare_protocols(tmp, runs),
        "hostile run-file content (view, compare, --resume)": probe_run_file_content(tmp, runs),
        "damaged suite runs (--resume, --from-run) and column names": probe_suite_runs(tmp),
        "view --serve requests (paths, Host headers)": probe_serve(tmp, runs),
        "compare options (--metrics, --resamples, --confidence)": probe_compare_options(tmp, runs),
    }
