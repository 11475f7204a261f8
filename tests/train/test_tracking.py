"""Learning-curve plotting: the moving mean drawn over noisy per-step series, several runs on
one plot, and `rag-gym train curves`."""

from __future__ import annotations

import json

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


def test_learning_curve_draws_several_runs_on_the_same_panels(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib", reason="needs matplotlib")
    import matplotlib.axes

    drawn: list[tuple[str | None, str | None]] = []
    plot = matplotlib.axes.Axes.plot

    def spy(self, *args, **kwargs):
        drawn.append((kwargs.get("label"), kwargs.get("color")))
        return plot(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", spy)
    runs = {
        "episode": [{"step": s, "episode/em": s % 2} for s in range(1, 41)],
        "turn": [{"step": s, "episode/em": 1.0, "loss": 0.5} for s in range(1, 11)],
    }
    path = learning_curve(runs, tmp_path / "runs.png", ["episode/em", "loss"])
    assert path is not None and path.stat().st_size > 1000
    assert drawn == [
        (None, "C0"),  # episode's 40 steps: faint, then its moving mean
        ("episode (mean of 4 steps)", "C0"),
        ("turn", "C1"),  # turn's 10 steps: as they are
        ("turn", "C1"),  # loss: only turn logged it
    ]


def test_run_log_history_reads_results_or_the_newest_checkpoint(tmp_path):
    from rag_gym.train.tracking import run_log_history

    done = tmp_path / "done"
    done.mkdir()
    (done / "results.json").write_text(json.dumps({"log_history": [{"step": 1, "loss": 2.0}]}))
    assert run_log_history(done) == [{"step": 1, "loss": 2.0}]
    stopped = tmp_path / "stopped"
    for step in (2, 10, 9):  # the newest by number, not by name
        (stopped / f"checkpoint-{step}").mkdir(parents=True)
        state = {"log_history": [{"step": s} for s in range(1, step + 1)]}
        (stopped / f"checkpoint-{step}" / "trainer_state.json").write_text(json.dumps(state))
    assert len(run_log_history(stopped)) == 10
    with pytest.raises(FileNotFoundError, match=r"no results\.json"):
        run_log_history(tmp_path / "nothing")


def test_train_curves_command_plots_runs_and_names_bad_input(tmp_path):
    pytest.importorskip("matplotlib", reason="needs matplotlib")
    from typer.testing import CliRunner

    from rag_gym import cli

    for name, em in (("credit-episode", 0.25), ("credit-turn", 0.5)):
        (tmp_path / name).mkdir()
        log = [{"step": s, "episode/em": em, "reward": 1.0} for s in range(1, 31)]
        (tmp_path / name / "results.json").write_text(json.dumps({"log_history": log}))
    runs = [str(tmp_path / "credit-episode"), str(tmp_path / "credit-turn")]
    out = tmp_path / "curves.png"
    result = CliRunner().invoke(cli.app, ["train", "curves", *runs, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.stat().st_size > 1000
    result = CliRunner().invoke(
        cli.app, ["train", "curves", *runs, "--keys", "kl", "--out", str(out)]
    )
    assert result.exit_code != 0 and "none of ['kl']" in result.output
    result = CliRunner().invoke(cli.app, ["train", "curves", str(tmp_path / "missing")])
    assert result.exit_code != 0 and "no results.json" in result.output
