"""``rag-gym view``: one self-contained HTML report of an evaluation or training run.

:func:`build_report` reads a run folder (:mod:`rag_gym.view.load`) and writes
``report.html`` beside it: the data as embedded JSON, CSS, JavaScript and plots (base64 PNG)
inline, nothing fetched from a network, no front-end build step. The page renders lazily
(episodes a page at a time), so a run of 10,000 episodes stays usable. It shows

* the leaderboard (sortable by any column) and its plots;
* an episode browser, filtered by agent, correct or wrong, refused, unanswerable, number of
  hops and text search;
* one episode step by step: actions, queries, retrieved passages with the gold ones marked,
  the reward terms of each step, the model's raw output and the tokens spent;
* one question across all agents, side by side;
* for a training run, the learning curve and the rollouts sampled during training, by step.

:func:`serve` shows a report on ``127.0.0.1`` only. Needs Jinja2 (``pip install
'rag-gym[view]'``).
"""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

from rag_gym.view.load import NotARunFolder, check_run_folder, load_run

__all__ = ["NotARunFolder", "build_report", "load_run", "make_server", "render_html", "serve"]

REPORT_FILE = "report.html"


def _jinja_env():
    try:
        import jinja2
    except ImportError as exc:
        raise ImportError("rag-gym view needs Jinja2: pip install 'rag-gym[view]'") from exc
    return jinja2.Environment(
        loader=jinja2.PackageLoader("rag_gym.view", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
    )


def _script_json(data: Any) -> str:
    """JSON safe inside ``<script type="application/json">`` (no ``</`` or ``<!--``)."""
    try:  # the loader reads NaN as None: this is the fast path
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(data), ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as ``None`` (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    if value is None or isinstance(value, (str, int)):
        return value
    return str(value)


def render_html(data: dict[str, Any]) -> str:
    """The report page of :func:`~rag_gym.view.load.load_run`'s ``data``."""
    from rag_gym.view.plots import curve_plots, leaderboard_plots

    env = _jinja_env()
    plots = leaderboard_plots(data["leaderboard"]["rows"])
    curves = curve_plots(data["train"]["curves"]) if data.get("train") else []
    template = env.get_template("report.html.j2")
    return template.render(
        title=data["title"],
        warnings=data["warnings"],
        plots=plots,
        curve_plots=curves,
        data_json=_script_json(data),
        style=(Path(__file__).parent / "templates" / "report.css").read_text(encoding="utf-8"),
        script=(Path(__file__).parent / "templates" / "report.js").read_text(encoding="utf-8"),
    )


def is_report(path: Path) -> bool:
    """Whether the file ``path`` is a report :func:`build_report` wrote."""
    try:
        with open(path, "rb") as f:
            head = f.read(2048)
    except OSError:
        return False
    return head.startswith(b"<!DOCTYPE html>") and b"<title>rag-gym report" in head


def build_report(
    run_dir: str | Path, out: str | Path | None = None, overwrite: bool = False
) -> Path:
    """Write the report of ``run_dir`` (to ``run_dir/report.html`` unless ``out`` is given)
    and return its path.

    Raises :class:`NotARunFolder` (a ``FileNotFoundError``) when ``run_dir`` holds no run;
    damaged files in a run render with warnings in the page (see :mod:`rag_gym.view.load`).
    ``run_dir/report.html`` is replaced each time; an ``out`` file that is one of the run's
    files is refused, and one that exists needs ``overwrite``
    (:class:`~rag_gym.evaluate.run_folder.OutputRefused`, a ``FileExistsError``). The file is
    written whole or not at all.
    """
    from rag_gym.evaluate.run_folder import check_output, write_atomically

    path = check_run_folder(run_dir)
    target = path / REPORT_FILE
    if out is not None and Path(out).resolve() != target.resolve():
        target = check_output(out, [path], "--out", overwrite, ours=is_report)
    html = render_html(load_run(path))
    try:  # a name that is not UTF-8 (a folder's) is written with replacement characters
        write_atomically(target, html, errors="replace")
    except OSError as exc:
        raise OSError(
            f"cannot write the report to {target} ({exc.strerror or exc}): "
            "pass another file (rag-gym view RUN --out FILE)"
        ) from exc
    return target


def make_server(report: str | Path, port: int = 8000):
    """An HTTP server of the one file ``report``, bound to 127.0.0.1 only (``port`` 0: any free
    port); :func:`serve` runs it.

    It answers ``GET``/``HEAD`` of ``/`` and ``/<report name>`` with the report, any other path
    with 404 (no other file, no folder listing), and a request whose ``Host`` header is not
    ``127.0.0.1`` or ``localhost`` at its port with 403: a web page that rebinds its own domain
    name to 127.0.0.1 cannot read the report."""
    import http.server
    from urllib.parse import unquote, urlsplit

    report = Path(report).resolve()
    if not report.is_file():
        raise FileNotFoundError(f"expected a report file to serve, got {report}: build it first")

    class ReportHandler(http.server.BaseHTTPRequestHandler):
        server_version = "rag-gym-view"
        timeout = 30  # a client that sends nothing is dropped

        def do_GET(self) -> None:
            self._reply(body=True)

        def do_HEAD(self) -> None:
            self._reply(body=False)

        def _reply(self, body: bool) -> None:
            bound = self.server.server_address[1]
            allowed = {f"127.0.0.1:{bound}", f"localhost:{bound}"}
            if bound == 80:
                allowed |= {"127.0.0.1", "localhost"}
            host = (self.headers.get("Host") or "").strip().lower()
            if host not in allowed:
                self.send_error(403, "expected Host 127.0.0.1 or localhost")
                return
            if unquote(urlsplit(self.path).path) not in ("/", f"/{report.name}"):
                self.send_error(404, f"this server serves /{report.name} only")
                return
            try:
                data = report.read_bytes()
            except OSError:
                self.send_error(404, "the report file is gone")
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if body:
                self.wfile.write(data)

    return http.server.ThreadingHTTPServer(("127.0.0.1", port), ReportHandler)


def serve(report: str | Path, port: int = 8000) -> None:  # pragma: no cover (blocks)
    """Serve ``report`` on http://127.0.0.1:``port`` until Ctrl-C."""
    with make_server(report, port) as httpd:
        host, bound = httpd.server_address[:2]
        print(f"serving http://{host}:{bound}/{Path(report).name} (Ctrl-C stops)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            httpd.serve_forever()
