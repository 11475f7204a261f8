"""The report's plots, drawn by matplotlib and inlined as base64 PNG ``data:`` URIs."""

from __future__ import annotations

import base64
import io
import math
from typing import Any


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _uri(fig) -> str:
    plt = _pyplot()
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def _z(value: Any) -> float:
    """``value`` as a plotted number: 0 for what is not a finite number."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        x = float(value)
        return x if math.isfinite(x) else 0.0
    return 0.0


def leaderboard_plots(rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """EM and F1 per agent; EM against the mean number of searches (as LWTS Figure 1)."""
    if not rows:
        return []
    plt = _pyplot()
    names = [str(r["agent"]) for r in rows]
    em = [_z(r.get("em")) for r in rows]
    f1 = [_z(r.get("f1")) for r in rows]
    fig, ax = plt.subplots(figsize=(min(40.0, max(4.0, 0.9 * len(rows) + 2)), 3.2))
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], em, 0.4, label="EM")
    ax.bar([i + 0.2 for i in x], f1, 0.4, label="F1")
    ax.set_xticks(list(x), names, rotation=30, ha="right")
    ax.set_ylim(0, max(1.0, *em, *f1))
    ax.set_ylabel("score")
    ax.legend()
    plots = [{"title": "EM and F1 per agent", "src": _uri(fig)}]
    fig, ax = plt.subplots(figsize=(4.6, 3.2))
    for r, e in zip(rows, em, strict=True):
        s = _z(r.get("searches"))
        ax.scatter(s, e, s=36)
        ax.annotate(str(r["agent"]), (s, e), fontsize=8, xytext=(3, 3), textcoords="offset points")
    ax.set_xlabel("mean searches per question")
    ax.set_ylabel("EM")
    plots.append({"title": "EM against retrievals", "src": _uri(fig)})
    return plots


#: learning-curve metrics drawn, in this order, when the log has them
CURVE_KEYS = (
    "loss",
    "reward",
    "episode/em",
    "eval/em",
    "charts/em",
    "episode/num_searches",
    "kl",
    "mean_token_accuracy",
    "losses/dpo",
    "eval/return",
    "entropy",
    "learning_rate",
)
#: logged values that say little about learning (timings, clipping counters, token counts)
_SKIP = ("runtime", "per_second", "clip_ratio", "num_tokens", "total_flos", "grad_norm")


def curve_plots(curves: dict[str, list[list[float]]], limit: int = 8) -> list[dict[str, str]]:
    """One small plot per logged training metric: the known ones first, then any other that
    changes, ``limit`` at most."""
    if not curves:
        return []
    plt = _pyplot()
    keys = [k for k in CURVE_KEYS if k in curves]
    keys += [
        k
        for k in curves
        if k not in keys and not any(s in k for s in _SKIP) and len({v for _, v in curves[k]}) > 1
    ]
    plots = []
    for key in keys[:limit]:
        pts = curves[key]
        fig, ax = plt.subplots(figsize=(3.6, 2.3))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="." if len(pts) < 40 else None)
        ax.set_xlabel("training step")
        ax.set_title(key, fontsize=10)
        plots.append({"title": key, "src": _uri(fig)})
    return plots
