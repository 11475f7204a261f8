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


def build_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the report of ``run_dir`` (to ``run_dir/report.html`` unless ``out`` is given)
    and return its path.

    Raises :class:`NotARunFolder` (a ``FileNotFoundError``) when ``run_dir`` holds no run;
    damaged files in a run render with warnings in the page (see :mod:`rag_gym.view.load`).
    """
    path = check_run_folder(run_dir)
    html = render_html(load_run(path))
    target = Path(out) if out is not None else path / REPORT_FILE
    tmp = target.with_name(f".{target.name}.tmp")
    try:
        tmp.write_text(html, encoding="utf-8")
        tmp.replace(target)
    except OSError as exc:
        raise OSError(
            f"cannot write the report to {target} ({exc.strerror or exc}): "
            "pass another file (rag-gym view RUN --out FILE)"
        ) from exc
    return target


def make_server(report: str | Path, port: int = 8000):
    """An HTTP server for ``report``'s folder, bound to 127.0.0.1 only (``port`` 0: any free
    port); :func:`serve` runs it."""
    import functools
    import http.server

    report = Path(report)
    if not report.is_file():
        raise FileNotFoundError(f"expected a report file to serve, got {report}: build it first")
    handler = functools.partial(
        http.server.SimpleHTTPRequestHandler, directory=str(report.parent.resolve())
    )
    return http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)


def serve(report: str | Path, port: int = 8000) -> None:  # pragma: no cover (blocks)
    """Serve ``report`` on http://127.0.0.1:``port`` until Ctrl-C."""
    with make_server(report, port) as httpd:
        host, bound = httpd.server_address[:2]
        print(f"serving http://{host}:{bound}/{Path(report).name} (Ctrl-C stops)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            httpd.serve_forever()
