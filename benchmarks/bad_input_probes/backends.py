"""Bad replies and failures of the LLM backend and the judge: HTTP error statuses, HTML, invalid
JSON, text that is not UTF-8, broken status lines, replies of the wrong shape, a judge that gives no
verdict; redirects to another origin (the API key stays with its origin); control bytes in the
messages ``rag-gym evaluate`` prints; a signal in the report step.

Handled cleanly: a backend failure is a ``BackendError`` naming the URL (never the agent's own
error), ``--resume`` replays those episodes and then gives an uninterrupted run's leaderboard, a
judge without a verdict is recorded as missing (never "no") and reported at the end of the run,
and a signal in the report step says that the run is saved and how to write the report.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from bad_input_probes import SMALL


class _StandIn:
    """An OpenAI-compatible stand-in on 127.0.0.1. ``answer`` is ``(status, content type,
    body bytes)``, ``("raw", bytes)`` (written as the whole reply, then the socket closed),
    ``("close",)`` (closed without a reply) or ``("redirect", code, location)``; the default
    is a good chat completion of ``reply(prompt)``. ``seen``: (method, path, Authorization)."""

    def __init__(self, reply=lambda prompt: "Answer: north.") -> None:
        self.reply, self.answer, self.seen = reply, None, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.respond(b"")

            def do_POST(self):
                self.respond(self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def respond(self, raw):
                outer.seen.append((self.command, self.path, self.headers.get("Authorization")))
                answer = outer.answer
                here = f"http://127.0.0.1:{outer.port}{self.path}"
                target = None
                if answer is not None and answer[0] == "redirect":  # LOOP: ever further
                    target = here + "x" if answer[2] == "LOOP" else answer[2]
                if target is not None and target.split(str(outer.port), 1)[-1] != self.path:
                    self.send_response(answer[1])
                    self.send_header("Location", target)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if answer is not None and answer[0] == "raw":
                    self.wfile.write(answer[1])
                    self.close_connection = True
                    return
                if answer is not None and answer[0] == "close":
                    self.close_connection = True
                    return
                if answer is None or answer[0] == "redirect":
                    body = json.loads(raw) if raw else {}
                    prompt = " ".join(m["content"] for m in body.get("messages", []))
                    text = outer.reply(prompt or body.get("prompt", ""))
                    good = {
                        "choices": [{"message": {"content": text}, "text": text}],
                        "usage": {"prompt_tokens": 5, "completion_tokens": 2},
                    }
                    answer = (200, "application/json", json.dumps(good).encode())
                status, kind, data = answer
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _json(obj) -> tuple[int, str, bytes]:
    return 200, "application/json", json.dumps(obj).encode()


def _choice(**fields) -> tuple[int, str, bytes]:
    return _json({"choices": [{"message": {"content": "hi"}, "text": "hi", **fields}]})


#: replies an OpenAI-compatible backend must refuse, by label; the 8 modes of the issue first
BAD_REPLIES = {
    "401": (401, "application/json", b'{"error": "invalid api key"}'),
    "404 HTML page": (404, "text/html", b"<html><body>Not Found</body></html>"),
    "200 HTML page": (200, "text/html", b"<!doctype html><html>login</html>"),
    "invalid JSON": (200, "application/json", b'{"choices": [tru'),
    "not UTF-8": (200, "application/json", b'{"x": "\xff\xfe"}'),
    "garbage status line": ("raw", b"HELLO THERE\r\n\r\n"),
    "{}": _json({}),
    "content a number": _json({"choices": [{"message": {"content": 5}, "text": 5}]}),
    # more of the same kinds
    "400": (400, "application/json", b'{"error": "bad request"}'),
    "403": (403, "text/plain", b"forbidden"),
    "405": (405, "text/plain", b""),
    "413": (413, "text/plain", b"too large"),
    "422": (422, "application/json", b'{"detail": []}'),
    "501": (501, "text/plain", b"not implemented"),
    "418 with control bytes": (418, "text/plain", b"\x1b[2J\x1b]0;owned\x07"),
    "empty 200": (200, "application/json", b""),
    "JSON null": _json(None),
    "JSON list": _json([1, 2]),
    "JSON string": _json("hello"),
    "choices []": _json({"choices": []}),
    "choices a string": _json({"choices": "x"}),
    "choices [null]": _json({"choices": [None]}),
    "no message": _json({"choices": [{"text": "hi"}]}),
    "message a string": _json({"choices": [{"message": "hi", "text": "hi"}]}),
    "content a list": _json({"choices": [{"message": {"content": ["a"]}, "text": ["a"]}]}),
    "content an object": _json({"choices": [{"message": {"content": {}}, "text": {}}]}),
    "content true": _json({"choices": [{"message": {"content": True}, "text": True}]}),
    "usage a string": _json(
        {"choices": [{"message": {"content": "hi"}, "text": "hi"}], "usage": "lots"}
    ),
    "usage negative": _json(
        {
            "choices": [{"message": {"content": "hi"}, "text": "hi"}],
            "usage": {"prompt_tokens": -5},
        }
    ),
    "usage a float": _json(
        {
            "choices": [{"message": {"content": "hi"}, "text": "hi"}],
            "usage": {"completion_tokens": 1.5},
        }
    ),
    "usage text": _json(
        {
            "choices": [{"message": {"content": "hi"}, "text": "hi"}],
            "usage": {"prompt_tokens": "many"},
        }
    ),
    "finish_reason a number": _choice(finish_reason=7),
    "nested 100,000 deep": (200, "application/json", b"[" * 100_000 + b"]" * 100_000),
    "a 5,000-digit number": (200, "application/json", b'{"choices": ' + b"7" * 5000 + b"}"),
    "lone surrogate escape in content": (
        200,
        "application/json",
        b'{"choices": [{"message": {"content": "\\ud800"}, "text": "\\ud800"}]}',
    ),
    "status line HTTP/9": ("raw", b"HTTP/9.9 200 OK\r\n\r\n{}"),
    "status code not a number": ("raw", b"HTTP/1.1 abc OK\r\n\r\n"),
    "header line 100 KB": ("raw", b"HTTP/1.1 200 OK\r\nX: " + b"a" * 100_000 + b"\r\n\r\n"),
    "body shorter than Content-Length": (
        "raw",
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{}",
    ),
    "binary garbage": ("raw", bytes(range(256)) * 4),
    "redirect loop": ("redirect", 307, "LOOP"),
    "redirect to ftp": ("redirect", 302, "ftp://127.0.0.1:1/x"),
}


def _clean(message: str) -> bool:
    return not any(ord(c) < 32 or ord(c) == 127 for c in message)


def probe_backend_replies() -> tuple[int, int]:
    """``OpenAICompatibleLM`` against replies no OpenAI-compatible server may give: each is a
    ``BackendError`` naming the URL (``ConnectionError`` for a connection closed without a
    reply, which a run treats as unreachable), with no control character in its message."""
    from rag_gym.generation.lm import BackendError
    from rag_gym.generation.openai_compat import OpenAICompatibleLM

    server = _StandIn()
    tried = clean = 0
    chat = [[{"role": "user", "content": "hi"}]]
    cases = {**BAD_REPLIES, "connection closed without a reply": ("close",)}
    try:
        lm = OpenAICompatibleLM("m", base_url=server.url, max_retries=0, timeout=5)
        for label, answer in cases.items():
            server.answer = answer
            chat_only = label in ("no message", "message a string")  # a good completion
            for prompt in (chat,) if chat_only else (chat, ["plain"]):
                tried += 1
                expected = ConnectionError if answer[0] == "close" else BackendError
                try:
                    out = lm.generate(prompt)
                except expected as exc:
                    ok = server.url in str(exc) and _clean(str(exc))
                    clean += ok
                    if not ok:
                        print(f"  backend reply {label}: unnamed or raw: {str(exc)[:120]!r}")
                    continue
                except Exception as exc:
                    print(f"  backend reply {label}: {type(exc).__name__}: {str(exc)[:120]!r}")
                    continue
                if label == "lone surrogate escape in content":  # text, left to the env
                    ok = isinstance(out[0][0].text, str)
                    clean += ok
                    continue
                print(f"  backend reply {label}: accepted: {out[0][0]!r:.120}")
    finally:
        server.close()
    return tried, clean


def probe_redirects() -> tuple[int, int]:
    """A server that redirects (301, 302, 303, 307, 308) to another port, another host name,
    another scheme, or its own origin: the key goes to the same scheme, host and port only."""
    from rag_gym.generation.openai_compat import OpenAICompatibleLM

    first, other = _StandIn(), _StandIn()
    os.environ["RAG_GYM_PROBE_KEY"] = "sekret"
    tried = clean = 0
    try:
        lm = OpenAICompatibleLM(
            "m", base_url=first.url, api_key_env="RAG_GYM_PROBE_KEY", max_retries=0
        )
        targets = {
            "another port": (other, f"{other.url}/chat/completions", None),
            "another host name": (first, f"http://localhost:{first.port}/v1/x", None),
            "the same origin": (first, f"{first.url}/moved", "Bearer sekret"),
            "the same origin, port written": (
                first,
                f"http://127.0.0.1:{first.port}/v1/again",
                "Bearer sekret",
            ),
        }
        for code in (301, 302, 303, 307, 308):
            for label, (where, location, expected) in targets.items():
                tried += 1
                first.answer = ("redirect", code, location)
                where.seen.clear() if where is other else None
                first.seen.clear()
                try:
                    lm.generate([[{"role": "user", "content": "hi"}]])
                except Exception as exc:
                    print(f"  redirect {code} to {label}: {type(exc).__name__}: {exc}")
                    continue
                path = location.split(str(where.port), 1)[1]
                seen = [a for _, p, a in where.seen if p == path]
                ok = seen == [expected]
                clean += ok
                if not ok:
                    print(f"  redirect {code} to {label}: the target saw {seen}")
        # https to http on the same host: another scheme (the request is never sent there)
        for code in (302, 307):
            tried += 1
            first.answer = ("redirect", code, f"https://127.0.0.1:{first.port}/v1/tls")
            try:
                lm.generate([[{"role": "user", "content": "hi"}]])
                print(f"  redirect {code} to https: accepted")
            except Exception as exc:  # no TLS here: the handshake fails
                clean += "sekret" not in str(exc)
    finally:
        first.close()
        other.close()
        del os.environ["RAG_GYM_PROBE_KEY"]
    return tried, clean


def _config(tmp: Path, name: str, **kw):
    from rag_gym.evaluate import EvalConfig

    base = dict(
        n=4,
        seed=1,
        agents=("naive_rag",),
        env_kwargs={"dataset_kwargs": SMALL},
        out_dir=str(tmp / "runs"),
        run_name=name,
    )
    return EvalConfig(**{**base, **kw})


def _no_times(result):
    episodes = [{k: v for k, v in e.items() if k != "seconds"} for e in result.episodes]
    rows = [{k: None if v != v else v for k, v in r.items() if k != "seconds"} for r in result.rows]
    return episodes, rows


def probe_backend_resume(tmp: Path) -> tuple[int, int]:
    """A run whose LLM backend fails in each way of :data:`BAD_REPLIES` (and times out): every
    episode is recorded failed; once the backend works, ``--resume`` plays them again and the
    episodes and leaderboard equal an uninterrupted run's."""
    import warnings

    from rag_gym.baselines import make_agent
    from rag_gym.evaluate import evaluate
    from rag_gym.generation.openai_compat import OpenAICompatibleLM

    server = _StandIn()
    tried = clean = 0
    lm = OpenAICompatibleLM("m", base_url=server.url, max_retries=0, timeout=5)

    def factory(name, env):
        return make_agent(name, lm=lm)

    try:
        reference = _no_times(evaluate(_config(tmp, "backend-ref"), factory))
        for i, (label, answer) in enumerate(BAD_REPLIES.items()):
            if label == "lone surrogate escape in content":
                continue  # a reply, not a failure
            tried += 1
            name = f"backend-{i}"
            server.answer = answer
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    failed = evaluate(_config(tmp, name), factory)
                server.answer = None
                resumed = evaluate(_config(tmp, name), factory, resume=True)
            except Exception as exc:
                server.answer = None
                print(f"  backend {label}, resume: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            ok = failed.rows[0]["errors"] == 4 and _no_times(resumed) == reference
            clean += ok
            if not ok:
                print(f"  backend {label}: not replayed ({failed.episodes[0]['error']!r:.100})")
    finally:
        server.close()
    return tried, clean


def _judge_reply(prompt: str) -> str:
    golds = prompt.split("Gold answers: ")[1].split("\n")[0].lower()
    prediction = prompt.split("Predicted answer: ")[1].split("\n")[0].lower()
    return "Yes." if prediction and prediction in golds else "No."


def _golden(name, env):
    """naive_rag answering the gold answer of questions of odd length, "x" to the others."""
    from rag_gym.baselines import make_agent
    from rag_gym.generation.lm import Generation, LanguageModel

    gold = {ex.question: ex.answers[0] for ex in env.unwrapped.examples}

    class Golden(LanguageModel):
        name = "golden"

        def generate(self, prompts, config=None):
            out = []
            for p in prompts:
                text = json.dumps(p)
                q = next((q for q in gold if json.dumps(q)[1:-1] in text), None)
                reply = f"Answer: {gold[q]}." if q and len(q) % 2 else "Answer: x."
                out.append([Generation(text=reply, prompt_tokens=10, completion_tokens=2)])
            return out

    return make_agent(name, lm=Golden())


def probe_judges(tmp: Path) -> tuple[int, int]:
    """``evaluate(judge=...)`` with a judge that gives no verdict: an OpenAI-compatible judge
    failing in each way of :data:`BAD_REPLIES` or replying neither yes nor no, and plain
    callables returning what is not a verdict or raising. Handled cleanly: every judged
    episode's ``judge`` is ``None`` with a ``judge_error``, the leaderboard's ``judge_missing``
    counts them, and a resume with a working judge equals an uninterrupted run. An unreachable
    judge (or one answering 500 after the retries) stops the run with nothing recorded, and a
    resume then equals an uninterrupted run too."""
    import warnings

    from rag_gym.evaluate import evaluate, load_episodes
    from rag_gym.generation.judges import LLMAnswerJudge
    from rag_gym.generation.openai_compat import OpenAICompatibleLM

    server = _StandIn(reply=_judge_reply)

    def fresh() -> LLMAnswerJudge:  # a judge of its own: no verdict cached by another run
        return LLMAnswerJudge(OpenAICompatibleLM("m", base_url=server.url, max_retries=0))

    tried = clean = 0

    def missing_then_resumed(name, judge_fn, reference) -> str | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = evaluate(_config(tmp, name), _golden, judge=judge_fn)
        judged = [e for e in result.episodes if e["prediction"] and e["answerable"]]
        if not judged or not all(e["judge"] is None and e["judge_error"] for e in judged):
            return f"judge values {[e['judge'] for e in judged]}"
        if result.rows[0]["judge_missing"] != len(judged):
            return f"judge_missing {result.rows[0]['judge_missing']}"
        server.answer, server.reply = None, _judge_reply
        resumed = evaluate(_config(tmp, name), _golden, judge=fresh(), resume=True)
        return None if _no_times(resumed) == reference else "resume differs"

    try:
        reference = _no_times(evaluate(_config(tmp, "judge-ref"), _golden, judge=fresh()))
        cases = {
            f"judge {k}": v
            for k, v in BAD_REPLIES.items()
            if k != "lone surrogate escape in content"
        }
        for reply in ("Maybe.", "", "  ", "Perhaps yes", "N/A", "Unclear!", "\x1b[31mYES"):
            cases[f"judge replies {reply!r}"] = ("reply", reply)
        for i, (label, answer) in enumerate(cases.items()):
            tried += 1
            if answer[0] == "reply":
                server.answer, server.reply = None, lambda prompt, r=answer[1]: r
            else:
                server.answer = answer
            try:
                problem = missing_then_resumed(f"judge-{i}", fresh(), reference)
            except Exception as exc:
                problem = f"{type(exc).__name__}: {str(exc)[:120]}"
            server.answer, server.reply = None, _judge_reply
            clean += problem is None
            if problem is not None:
                print(f"  {label}: {problem}")
        plain = {
            "returns 'maybe'": lambda q, p, g: "maybe",
            "returns None": lambda q, p, g: None,
            "returns 2": lambda q, p, g: 2,
            "returns NaN": lambda q, p, g: float("nan"),
            "returns a list": lambda q, p, g: [True],
            "raises ValueError": lambda q, p, g: (_ for _ in ()).throw(ValueError("no")),
            "raises TimeoutError": lambda q, p, g: (_ for _ in ()).throw(TimeoutError("slow")),
            "raises KeyError": lambda q, p, g: {}["x"],
        }
        for i, (label, fn) in enumerate(plain.items()):
            tried += 1
            try:
                problem = missing_then_resumed(f"plain-{i}", fn, reference)
            except Exception as exc:
                problem = f"{type(exc).__name__}: {str(exc)[:120]}"
            clean += problem is None
            if problem is not None:
                print(f"  judge callable {label}: {problem}")
        # unreachable: stops the run, nothing recorded; then resumed to the reference
        for label, make in (
            ("unreachable", lambda: (_free_url(), None)),
            ("answering 500", lambda: (server.url, (500, "text/plain", b"down"))),
        ):
            tried += 1
            url, answer = make()
            server.answer = answer
            down = LLMAnswerJudge(OpenAICompatibleLM("m", base_url=url, max_retries=0))
            name = f"judge-{label}"
            try:
                evaluate(_config(tmp, name), _golden, judge=down)
                print(f"  judge {label}: the run went on")
                continue
            except ConnectionError as exc:
                ok = load_episodes(tmp / "runs" / name / "episodes.jsonl") == []
                ok = ok and "the judge cannot be reached" in str(exc)
            server.answer = None
            resumed = evaluate(_config(tmp, name), _golden, judge=fresh(), resume=True)
            ok = ok and _no_times(resumed) == reference
            clean += ok
            if not ok:
                print(f"  judge {label}: not stopped cleanly or resumed")
    finally:
        server.close()
    return tried, clean


def _free_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/v1"


def probe_control_bytes(tmp: Path) -> tuple[int, int]:
    """``rag-gym evaluate`` against a backend whose error bodies, non-JSON bodies, status lines
    and replies hold terminal control sequences: nothing it prints holds a control character
    but newlines (exit 1 with the resume command, or 2 when the run stops)."""
    from typer.testing import CliRunner

    from rag_gym.cli import app

    runner = CliRunner()
    payloads = [
        b"\x1b[2J\x1b[H",
        b"\x1b]0;owned\x07",
        b"\x1b]8;;http://evil\x1b\\link\x1b]8;;\x1b\\",
        b"\r\x1b[Kfake: all good",
        b"\x00\x08\x7f",
        "\u202etxt.exe".encode(),
        "\x9b31m".encode(),
    ]
    server = _StandIn()
    world = json.dumps({"dataset_kwargs": SMALL})
    tried = clean = 0
    try:
        for i, payload in enumerate(payloads):
            for label, answer in (
                ("401 body", (401, "text/plain", payload)),
                ("HTML body", (200, "text/html", payload)),
                ("status line", ("raw", b"HTTP/1.1 " + payload + b"\r\n\r\n")),
                (
                    "reply",
                    _json(
                        {
                            "choices": [{"message": {"content": 5}}],
                            "x": payload.decode(errors="replace"),
                        }
                    ),
                ),
                ("500 body", (500, "text/plain", payload)),
            ):
                tried += 1
                server.answer = answer
                result = runner.invoke(
                    app,
                    [
                        *("evaluate", "--agents", "naive_rag", "--lm", f"openai:m@{server.url}"),
                        *("--n", "2", "--env-kwargs", world, "--out", str(tmp / "cb")),
                        *("--run-name", f"cb-{i}-{tried}", "--no-progress"),
                    ],
                )
                text = result.output.replace("\n", "")
                ok = result.exit_code in (1, 2) and _clean(text) and "Traceback" not in text
                ok = ok and "\u202e" not in text and "\x9b" not in text
                clean += ok
                if not ok:
                    print(f"  control bytes in a {label}: exit {result.exit_code}: {text[-160:]!r}")
    finally:
        server.close()
    return tried, clean


_DRIVER = """
import sys, time
from pathlib import Path
import rag_gym.view

def slow_report(run_dir, *args, **kwargs):
    Path(run_dir, "reporting").write_text("")
    time.sleep(60)

rag_gym.view.build_report = slow_report
from rag_gym.cli import app
sys.argv[0] = "rag-gym"
app()
"""


def probe_report_signal(tmp: Path) -> tuple[int, int]:
    """SIGTERM and SIGINT while ``rag-gym evaluate`` writes its report (the run finished):
    exit 143 or 130, a message that the run is saved, the command that writes the report, no
    traceback, and the run folder complete."""
    driver = tmp / "report_driver.py"
    driver.write_text(_DRIVER)
    world = json.dumps({"dataset_kwargs": SMALL})
    tried = clean = 0
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)) * 2:
        tried += 1
        run = tmp / "sig" / f"r{tried}"
        args = ["evaluate", "--agents", "random", "--n", "3", "--env-kwargs", world]
        args += ["--out", str(run.parent), "--run-name", run.name, "--no-progress"]
        proc = subprocess.Popen(
            [sys.executable, str(driver), *args],
            env={**os.environ, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        while not (run / "reporting").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        ok = proc.returncode == code and "while writing the report: the run is complete" in err
        ok = ok and f"rag-gym view {run}" in err and "Traceback" not in err
        ok = ok and len((run / "episodes.jsonl").read_text().splitlines()) == 3
        clean += ok
        if not ok:
            print(
                f"  {signal.Signals(sig).name} in the report step: exit {proc.returncode}: {err[-200:]!r}"
            )
    return tried, clean


def probes(tmp: Path) -> dict[str, tuple[int, int]]:
    """(tried, handled cleanly) per category."""
    return {
        "LLM backend replies (OpenAICompatibleLM)": probe_backend_replies(),
        "API key on redirects": probe_redirects(),
        "backend failures replayed by --resume": probe_backend_resume(tmp),
        "judges without a verdict": probe_judges(tmp),
        "control bytes in evaluate's messages": probe_control_bytes(tmp),
        "signals in the report step": probe_report_signal(tmp),
    }
