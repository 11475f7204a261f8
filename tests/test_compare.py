import json

import numpy as np
import pytest
from typer.testing import CliRunner

from rag_gym.cli import app
from rag_gym.compare import CompareError, compare, comparison_markdown
from rag_gym.stats import bootstrap_ci, paired_difference


def test_bootstrap_interval_covers_the_mean_at_about_its_level():
    rng = np.random.default_rng(1)
    covered = 0
    for trial in range(200):
        sample = rng.binomial(1, 0.4, size=150)
        low, high = bootstrap_ci(sample, n_resamples=2_000, seed=trial)
        assert low <= sample.mean() <= high
        covered += low <= 0.4 <= high
    assert 0.88 <= covered / 200 <= 0.99


def test_bootstrap_is_seeded_and_narrows_with_more_questions():
    small = np.tile([1, 0, 0, 1, 0], 20)
    large = np.tile([1, 0, 0, 1, 0], 200)
    assert bootstrap_ci(small, seed=3) == bootstrap_ci(small, seed=3)
    lo_s, hi_s = bootstrap_ci(small)
    lo_l, hi_l = bootstrap_ci(large)
    assert hi_l - lo_l < (hi_s - lo_s) / 2


def test_paired_interval_removes_shared_difficulty():
    rng = np.random.default_rng(0)
    difficulty = rng.random(300)
    b = (difficulty > 0.5).astype(float)  # b solves the easy half
    a = b.copy()
    a[np.flatnonzero(b == 0)[:15]] = 1.0  # a also solves 15 more questions
    d = paired_difference(a, b)
    assert d.mean == pytest.approx(15 / 300)
    assert d.wins == 15 and d.losses == 0 and d.n == 300
    assert d.low > 0 and d.p_not_above_zero == 0.0
    # the difference of two independent intervals cannot tell them apart
    a_low, _ = bootstrap_ci(a)
    _, b_high = bootstrap_ci(b)
    assert a_low < b_high


def test_paired_difference_of_equal_agents_straddles_zero():
    rng = np.random.default_rng(2)
    a = rng.binomial(1, 0.5, 200).astype(float)
    b = a.copy()
    flip = rng.choice(200, 20, replace=False)
    b[flip[:10]] = 1 - b[flip[:10]]
    a[flip[10:]] = 1 - a[flip[10:]]
    d = paired_difference(a, b)
    assert d.low < 0 < d.high


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: bootstrap_ci([]), "at least one score"),
        (lambda: bootstrap_ci([1.0, float("nan")]), "finite"),
        (lambda: bootstrap_ci([[1, 0]]), "flat"),
        (lambda: bootstrap_ci([1, 0], confidence=1.0), "confidence"),
        (lambda: bootstrap_ci([1, 0], n_resamples=0), "n_resamples"),
        (lambda: paired_difference([1, 0], [1]), "align them by question id"),
    ],
)
def test_bad_scores_are_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def _episode(agent, qid, em, searches=1, **extra):
    rec = {
        "agent": agent,
        "question_id": qid,
        "em": em,
        "f1": em,
        "recall": 1.0,
        "full_recall": em,
        "searches": searches,
        "error": None,
    }
    rec.update(extra)
    return rec


def _run(path, records, cut_tail=None):
    path.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in records)
    if cut_tail is not None:
        text += cut_tail
    (path / "episodes.jsonl").write_text(text)
    return path


def test_compare_pairs_by_question_across_runs(tmp_path):
    a_run = _run(
        tmp_path / "a",
        [_episode("trained", f"q{i}", float(i % 2 == 0 or i < 10), 2) for i in range(40)],
    )
    b_run = _run(
        tmp_path / "b",
        # b's episodes in another order, one question b never finished, one errored
        [_episode("base", f"q{i}", float(i % 2 == 0), 1) for i in reversed(range(39))]
        + [_episode("base", "q39", 0.0, error="boom")],
    )
    result = compare([a_run, b_run], "trained", "base", metrics=["em", "searches"])
    assert result["questions"] == 39
    em = result["metrics"][0]
    # on q0..q38, a is right on the evens and q1..q9 (5 odd ones), b on the evens
    assert em["a"]["mean"] == pytest.approx((20 + 5) / 39)
    assert em["b"]["mean"] == pytest.approx(20 / 39)
    assert em["difference"]["wins"] == 5 and em["difference"]["losses"] == 0
    assert result["metrics"][1]["difference"]["mean"] == pytest.approx(1.0)
    table = comparison_markdown(result)
    assert "| em | 0.641" in table and "| searches |" in table


def test_compare_says_when_an_agent_was_trained_on_the_questions(tmp_path):
    episodes = [_episode("trained", f"q{i}", 1.0) for i in range(4)]
    episodes += [_episode("base", f"q{i}", 0.0) for i in range(4)]
    run = _run(tmp_path / "r", episodes)
    result = compare([run], "trained", "base", metrics=["em"])
    assert result["a"]["seen_in_training"] is None  # no protocol.json says
    assert "Not held out" not in comparison_markdown(result)
    seen = {"seen": 3, "n": 4, "training_sets": []}
    protocol = {"agents": {"trained": {"seen_questions": seen}, "base": {}}}
    (run / "protocol.json").write_text(json.dumps(protocol))
    result = compare([run], "trained", "base", metrics=["em"])
    assert (result["a"]["seen_in_training"], result["b"]["seen_in_training"]) == (3, None)
    table = comparison_markdown(result)
    assert "Not held out: 3 of trained's evaluated questions" in table
    assert "base's" not in table


def test_compare_reads_a_cut_run_without_changing_it(tmp_path):
    run = _run(
        tmp_path / "r",
        [_episode("x", "q1", 1.0), _episode("y", "q1", 0.0)],
        cut_tail='{"agent": "x", "questi',
    )
    before = (run / "episodes.jsonl").read_bytes()
    with pytest.warns(RuntimeWarning, match="cut off"):
        result = compare([run], "x", "y", metrics=["em"])
    assert result["questions"] == 1
    assert (run / "episodes.jsonl").read_bytes() == before


def test_compare_errors_name_the_fix(tmp_path):
    run = _run(tmp_path / "r", [_episode("x", "q1", 1.0), _episode("y", "q2", 0.0)])
    with pytest.raises(CompareError, match="share no question"):
        compare([run], "x", "y")
    with pytest.raises(CompareError, match="the runs hold x, y"):
        compare([run], "x", "z")
    with pytest.raises(CompareError, match="two different agents"):
        compare([run], "x", "x")
    with pytest.raises(CompareError, match=r"episodes\.jsonl"):
        compare([tmp_path], "x", "y")
    twice = _run(tmp_path / "r2", [_episode("x", "q1", 1.0)])
    with pytest.raises(CompareError, match="more than one run"):
        compare([run, twice], "x", "y")
    ok = _run(tmp_path / "r3", [_episode("x", "q1", 1.0), _episode("y", "q1", 0.0)])
    with pytest.raises(CompareError, match="metric 'nope'"):
        compare([ok], "x", "y", metrics=["nope"])


def test_runs_on_disjoint_questions_pool_into_one_comparison(tmp_path):
    # two held-out sets (say the test split of two worlds), each with both agents in its own runs
    first = [_episode("x", f"w0-q{i}", float(i < 6)) for i in range(10)]
    first += [_episode("y", f"w0-q{i}", float(i < 5)) for i in range(10)]
    second_x = [_episode("x", f"w2-q{i}", float(i < 4)) for i in range(10)]
    second_y = [_episode("y", f"w2-q{i}", float(i < 2)) for i in range(10)]
    runs = [
        _run(tmp_path / "w0", first),
        _run(tmp_path / "w2x", second_x),
        _run(tmp_path / "w2y", second_y),
    ]
    res = compare(runs, "x", "y", metrics=["em"])
    assert res["questions"] == 20
    assert res["a"]["runs"] == [str(runs[0]), str(runs[1])]
    assert res["b"]["runs"] == [str(runs[0]), str(runs[2])]
    em = res["metrics"][0]
    assert em["a"]["mean"] == pytest.approx(10 / 20)
    assert em["b"]["mean"] == pytest.approx(7 / 20)
    assert em["difference"]["wins"] == 3 and em["difference"]["losses"] == 0
    # one set alone pairs only its own questions
    assert compare(runs[:1], "x", "y", metrics=["em"])["questions"] == 10


def test_refusal_rates_pair_over_their_own_kind_of_question(tmp_path):
    """``refuse_unans`` pairs the unanswerable questions only, ``refuse_ans`` the answerable
    ones: a refusal reward should raise the first and leave the second alone."""
    records = []
    for i in range(30):
        unans = i < 10
        # x refuses 8 of the 10 unanswerable questions and 1 answerable one; y refuses 2 and 1
        x_ref = (unans and i < 8) or i == 20
        y_ref = (unans and i < 2) or i == 21
        for agent, refused in (("x", x_ref), ("y", y_ref)):
            records.append(
                _episode(agent, f"q{i}", 0.0, answerable=not unans, refused=bool(refused))
            )
    run = _run(tmp_path / "r", records)
    res = compare([run], "x", "y", metrics=["refuse_unans", "refuse_ans", "em"])
    unans, ans, em = res["metrics"]
    assert unans["questions"] == 10 and ans["questions"] == 20 and em["questions"] == 30
    assert unans["a"]["mean"] == pytest.approx(0.8) and unans["b"]["mean"] == pytest.approx(0.2)
    assert unans["difference"]["wins"] == 6 and unans["difference"]["losses"] == 0
    assert ans["a"]["mean"] == ans["b"]["mean"] == pytest.approx(1 / 20)
    assert ans["difference"]["wins"] == 1 and ans["difference"]["losses"] == 1
    table = comparison_markdown(res)
    assert "| refuse_unans (10 questions) | 0.800" in table and "| em | 0.000" in table
    only_answerable = _run(
        tmp_path / "a",
        [_episode(a, "q1", 1.0, answerable=True, refused=False) for a in ("x", "y")],
    )
    with pytest.raises(CompareError, match="needs unanswerable questions"):
        compare([only_answerable], "x", "y", metrics=["refuse_unans"])
    unknown = _run(tmp_path / "u", [_episode(a, "q1", 1.0, refused=False) for a in ("x", "y")])
    with pytest.raises(CompareError, match="'answerable' field"):
        compare([unknown], "x", "y", metrics=["refuse_ans"])


def test_cli_compare_prints_and_writes_json(tmp_path):
    run = _run(
        tmp_path / "r",
        [_episode("x", f"q{i}", 1.0) for i in range(10)]
        + [_episode("y", f"q{i}", float(i < 3)) for i in range(10)],
    )
    out = tmp_path / "cmp.json"
    res = CliRunner().invoke(
        app, ["compare", str(run), "--a", "x", "--b", "y", "--metrics", "em", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    saved = json.loads(out.read_text())
    assert saved["metrics"][0]["difference"]["mean"] == pytest.approx(0.7)
    assert "| em | 1.000" in res.output
    bad = CliRunner().invoke(app, ["compare", str(run), "--a", "x", "--b", "nobody"])
    assert bad.exit_code == 2 and "unknown agent 'nobody'" in bad.output


def test_leaderboard_row_carries_the_em_interval():
    from rag_gym.evaluate import COLUMNS, leaderboard_markdown, summarise

    def episode(em):
        return {
            "prediction": "x", "answers": ["x"], "answerable": True, "em": em, "f1": em,
            "cover_em": em, "judge": None, "recall": None, "full_recall": None, "ap": None,
            "searches": 1, "steps": 2, "refused": False, "prompt_tokens": 0,
            "completion_tokens": 0, "error": None,
        }  # fmt: skip

    row = summarise("a", [episode(float(i < 12)) for i in range(40)], 1.0)
    low, high = (float(v) for v in row["em_ci"].split("–"))
    assert low < row["em"] == 0.3 < high
    assert (low, high) == tuple(
        round(v, 2) for v in bootstrap_ci([float(i < 12) for i in range(40)])
    )
    assert "EM 95% CI" in [h for _, h, _ in COLUMNS]
    assert row["em_ci"] in leaderboard_markdown([row])
    assert summarise("b", [episode(float("nan"))], 1.0)["em_ci"] is None


def _protocol(run, **changes):
    protocol = {
        "env_id": "rag_gym/NQ-v0",
        "split": "test",
        "env_kwargs": {"data_path": "nq/test.jsonl", "dataset": "flashrag"},
        "k": 3,
        "retriever": "BM25Retriever",
        "corpus_mode": "corpus",
        "corpus_size": 100,
        "answer_metric": "em",
        "max_episode_steps": 8,
        "agents": {},
    }
    protocol.update(changes)
    (run / "protocol.json").write_text(json.dumps(protocol))
    return run


def test_compare_pairs_questions_only_under_one_protocol(tmp_path):
    """FlashRAG names every dataset's questions test_0, test_1...: an id pairs only within one
    dataset and protocol."""
    ids = [f"test_{i}" for i in range(10)]
    nq_x = _protocol(_run(tmp_path / "nq-x", [_episode("x", q, 1.0) for q in ids]))
    tq = {"env_id": "rag_gym/TriviaQA-v0", "env_kwargs": {"data_path": "tq/test.jsonl"}}
    tq_y = _protocol(_run(tmp_path / "tq-y", [_episode("y", q, 0.0) for q in ids]), **tq)
    with pytest.raises(CompareError, match=r"'x' in .*nq-x and 'y' in .*tq-y .*env_id") as err:
        compare([nq_x, tq_y], "x", "y", metrics=["em"])
    assert "and 9 more questions" in str(err.value) and "--allow-mismatch" in str(err.value)
    k5 = _protocol(_run(tmp_path / "k5-y", [_episode("y", q, 0.0) for q in ids]), k=5)
    with pytest.raises(CompareError, match=r"\(k 3 vs 5\)"):
        compare([nq_x, k5], "x", "y", metrics=["em"])
    bare = _run(tmp_path / "bare-y", [_episode("y", q, 0.0) for q in ids])
    with (
        pytest.warns(RuntimeWarning, match=r"no protocol\.json"),
        pytest.raises(CompareError, match=r"protocol\.json \(one run has none\)"),
    ):
        compare([nq_x, bare], "x", "y", metrics=["em"])
    # asked for: pairs by id alone, and says what differed
    res = compare([nq_x, k5], "x", "y", metrics=["em"], allow_mismatch=True)
    assert res["questions"] == 10 and res["protocol_differences"] == ["k 3 vs 5"]
    assert "across different protocols (--allow-mismatch): k 3 vs 5" in comparison_markdown(res)
    # two datasets, both agents in each: every question pairs with its own dataset's
    nq = _protocol(
        _run(tmp_path / "nq", [_episode(a, q, float(a == "x")) for a in "xy" for q in ids])
    )
    tqa = _protocol(
        _run(tmp_path / "tq", [_episode(a, q, float(a == "y")) for a in "xy" for q in ids]), **tq
    )
    res = compare([nq, tqa], "x", "y", metrics=["em"])
    assert res["questions"] == 20 and res["metrics"][0]["difference"]["mean"] == 0.0
    assert res["metrics"][0]["difference"]["wins"] == 10 and res["protocol_differences"] == []
    damaged = _run(tmp_path / "damaged", [_episode("y", q, 0.0) for q in ids])
    (damaged / "protocol.json").write_text("[" * 100_000)
    with pytest.raises(CompareError, match="nested deeper"):
        compare([nq_x, damaged], "x", "y")


def test_cli_compare_never_writes_over_a_run_file(tmp_path):
    run = _run(
        tmp_path / "r",
        [_episode("x", f"q{i}", 1.0) for i in range(10)]
        + [_episode("y", f"q{i}", float(i < 3)) for i in range(10)],
    )
    _protocol(run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    base = ["compare", str(run), "--a", "x", "--b", "y", "--metrics", "em", "--resamples", "200"]
    for name in ("episodes.jsonl", "protocol.json", "leaderboard.csv", "steps.jsonl"):
        res = CliRunner().invoke(app, [*base, "--json", str(run / name), "--overwrite"])
        assert res.exit_code == 2 and f"would replace the run's own {name}" in res.output
        assert "Traceback" not in res.output
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    mine = tmp_path / "mine.json"
    mine.write_text("my notes")
    res = CliRunner().invoke(app, [*base, "--json", str(mine)])
    assert res.exit_code == 2 and "already exists: pass --overwrite" in res.output
    assert mine.read_text() == "my notes"
    res = CliRunner().invoke(app, [*base, "--json", str(mine), "--overwrite"])
    assert res.exit_code == 0 and json.loads(mine.read_text())["questions"] == 10
    # a new file in the run folder is not the run's; a comparison there is replaced on request
    inside = run / "cmp.json"
    assert CliRunner().invoke(app, [*base, "--json", str(inside)]).exit_code == 0
    assert CliRunner().invoke(app, [*base, "--json", str(inside), "--overwrite"]).exit_code == 0
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metrics", ""], "expected --metrics to name at least one metric"),
        (["--metrics", " , "], "expected --metrics to name at least one metric"),
        (["--resamples", str(10**13)], "expected --resamples in 1..1,000,000"),
        (["--resamples", "0"], "expected --resamples in 1..1,000,000"),
        (["--confidence", "nan"], "expected 0 < confidence < 1"),
    ],
)
def test_cli_compare_bounds_its_options(tmp_path, args, message):
    run = _run(tmp_path / "r", [_episode(a, f"q{i}", 1.0) for a in "xy" for i in range(5)])
    res = CliRunner().invoke(app, ["compare", str(run), "--a", "x", "--b", "y", *args])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output


def test_compare_and_the_bootstrap_refuse_empty_metrics_and_huge_resamples(tmp_path):
    run = _run(tmp_path / "r", [_episode(a, f"q{i}", 1.0) for a in "xy" for i in range(5)])
    with pytest.raises(CompareError, match="expected at least one metric"):
        compare([run], "x", "y", metrics=[])
    with pytest.raises(ValueError, match=r"n_resamples to be an int in 1\.\.1,000,000"):
        bootstrap_ci([1.0, 0.0], n_resamples=10**13)
    with pytest.raises(ValueError, match=r"n_resamples to be an int in 1\.\.1,000,000"):
        paired_difference([1.0, 0.0], [0.0, 1.0], n_resamples=1_000_001)
