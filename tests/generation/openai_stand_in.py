"""An OpenAI-compatible stand-in server on 127.0.0.1 that answers well or fails in a chosen
way, for the tests of the OpenAI-compatible backend, the judges and the evaluator."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

#: the ways the stand-in fails at the HTTP level or in the reply's shape
FAILURES = {
    "401": "answers 401 with a JSON error",
    "404": "answers 404 with an HTML page",
    "html": "answers 200 with an HTML page",
    "invalid_json": "answers 200 with a body that is not JSON",
    "not_utf8": "answers 200 with a body that is not UTF-8",
    "garbage_status": "answers a status line that is not HTTP's",
    "no_choices": "answers 200 with {}",
    "content_int": "answers 200 with a message content that is a number",
}


class StandIn:
    """Serves ``POST /v1/chat/completions`` and ``/v1/completions`` on 127.0.0.1.

    ``mode`` is ``"ok"`` (the reply ``reply(prompt text)``), one of :data:`FAILURES`, ``"500"``,
    ``"control"`` (a 401 whose body holds terminal control bytes) or ``"redirect"`` (``code``
    to ``location``; a request for ``location``'s own path is answered as ``"ok"``). ``seen``
    keeps each request's method, path and ``Authorization`` header."""

    def __init__(
        self, reply: str | Callable[[str], str] = "Answer: north.", mode: str = "ok"
    ) -> None:
        self.reply, self.mode = reply, mode
        self.location, self.code = "", 307
        self.seen: list[tuple[str, str, str | None]] = []  # (method, path, Authorization)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                self.answer(b"")

            def do_POST(self):
                self.answer(self.rfile.read(int(self.headers.get("Content-Length", 0))))

            def answer(self, raw: bytes) -> None:
                outer.seen.append((self.command, self.path, self.headers.get("Authorization")))
                mode = outer.mode
                if mode == "garbage_status":
                    self.wfile.write(b"HELLO THERE\r\n\r\n")
                    self.close_connection = True
                    return
                here = f"http://127.0.0.1:{outer.port}{self.path}"
                if mode == "redirect" and outer.location != here:
                    self.send_response(outer.code)
                    self.send_header("Location", outer.location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                mode = "ok" if mode == "redirect" else mode
                body = json.loads(raw) if raw else {}
                prompt = " ".join(m["content"] for m in body.get("messages", [])) or body.get(
                    "prompt", ""
                )
                text = outer.reply(prompt) if callable(outer.reply) else outer.reply
                good = {
                    "choices": [
                        {"message": {"content": text}, "text": text, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 5, "completion_tokens": 2},
                }
                status, kind, data = {
                    "ok": (200, "application/json", json.dumps(good).encode()),
                    "401": (401, "application/json", b'{"error": "invalid api key"}'),
                    "404": (404, "text/html", b"<html><body>Not Found</body></html>"),
                    "500": (500, "application/json", b'{"error": "overloaded"}'),
                    "html": (200, "text/html", b"<!doctype html><html>login</html>"),
                    "invalid_json": (200, "application/json", b'{"choices": [tru'),
                    "not_utf8": (200, "application/json", b'{"x": "\xff\xfe"}'),
                    "no_choices": (200, "application/json", b"{}"),
                    "content_int": (
                        200,
                        "application/json",
                        b'{"choices": [{"message": {"content": 5}, "text": 5}]}',
                    ),
                    "control": (401, "text/plain", b"bad key\x1b[2J\x1b]0;owned\x07\r\n"),
                }[mode]
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

    def __enter__(self) -> StandIn:
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
