"""Learning-curve plotting: the moving mean drawn over noisy per-step series."""

from __future__ import annotations

import pytest

from rag_gym.train.tracking import learning_curve, rolling_mean


def test_rolling_mean_matches_a_direct_window_mean():
    values = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    for window in (1, 3, 8, 20):
        want = [
            sum(values[max(0, i - window + 1) : i + 1]) / min(i + 1, window)
            for i in range(len(values))
        ]
        assert rolling_mean(values, window) == pytest.approx(want)
    with pytest.raises(ValueError, match="window >= 1"):
        rolling_mean(values, 0)


def test_learning_curve_draws_the_moving_mean_for_long_series(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="needs matplotlib")
    import matplotlib.axes

    drawn: list[str | None] = []
    plot = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        drawn.append(kwargs.get("label"))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    log = [{"step": s, "reward": s % 2, "loss": 1.0 / s} for s in range(1, 41)]
    path = learning_curve(log, tmp_path / "curve.png", ["reward", "missing"])
    assert path is not None and path.stat().st_size > 1000
    assert drawn == ["per step", "mean of 4 steps"]  # 40 steps: a window of 4, one panel
    drawn.clear()
    learning_curve(log[:5], tmp_path / "short.png", ["reward"])
    assert drawn == [None]  # 5 points: drawn as they are
