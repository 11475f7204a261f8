"""Suites (``rag-gym evaluate --suite``): the suite files, one corpus for every dataset, the pinned
protocol, the table with its intervals, re-running a saved suite run, and the prompt template."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

import rag_gym  # noqa: F401
from rag_gym.agents.search_r1 import SearchR1Agent
from rag_gym.baselines import make_agent
from rag_gym.cli import app
from rag_gym.evaluate.suite import (
    SuiteConfig,
    SuiteError,
    load_suite,
    parse_suite,
    run_suite,
    suite_names,
)
from rag_gym.stats import macro_average_ci
from tests.conftest import EchoLM

runner = CliRunner()

FACTS = {
    "Where was Ada Vell born?": ("Ada Vell", "Ada Vell is a painter born in Oslo.", "Oslo"),
    "What does Bo Rinn play?": ("Bo Rinn", "Bo Rinn plays the cello in Bergen.", "cello"),
    "Who founded Kelmar Press?": (
        "Kelmar Press",
        "Kelmar Press was founded by Ida Holm.",
        "Ida Holm",
    ),
    "Which river runs through Tavik?": ("Tavik", "The river Lune runs through Tavik.", "Lune"),
    "What colour is the Orrin flag?": ("Orrin", "The Orrin flag is green and white.", "green"),
    "When did Mira Sol retire?": (
        "Mira Sol",
        "Mira Sol retired in 1998 after a long career.",
        "1998",
    ),
}
QUESTIONS = list(FACTS)


def _write_world(root: Path) -> Path:
    """Two FlashRAG-format datasets (three questions each) and the corpus that answers them."""
    (root / "nq").mkdir(parents=True)
    (root / "tq").mkdir()
    for folder, questions in (("nq", QUESTIONS[:3]), ("tq", QUESTIONS[3:])):
        with open(root / folder / "test.jsonl", "w") as f:
            for i, q in enumerate(questions):
                rec = {"id": f"{folder}-{i}", "question": q, "golden_answers": [FACTS[q][2]]}
                f.write(json.dumps(rec) + "\n")
    corpus = root / "corpus.jsonl"
    with open(corpus, "w") as f:
        for i, (title, text, _) in enumerate(FACTS.values()):
            f.write(json.dumps({"id": f"p{i}", "contents": f"{title}\n{text}"}) + "\n")
        for i in range(20):  # distractors
            f.write(
                json.dumps({"id": f"d{i}", "contents": f"Filler {i}\nNothing about {i}."}) + "\n"
            )
    return corpus


SUITE = {
    "name": "tiny",
    "description": "two FlashRAG-format datasets over one corpus",
    "k": 2,
    "metric": "em",
    "datasets": [
        {"name": "NQ", "env": "rag_gym/NQ-v0", "split": "test", "data": "nq/test.jsonl"},
        {"name": "TQ", "env": "rag_gym/TriviaQA-v0", "split": "test", "data": "tq/test.jsonl"},
    ],
}


def _suite_file(root: Path, **changes) -> Path:
    path = root / "tiny.json"
    path.write_text(json.dumps({**SUITE, **changes}))
    return path


class KnowsSome(EchoLM):
    """A scripted search_r1 policy: searches the question, then answers it right when it is in
    ``known``, wrong otherwise; the question is read from the first message of the prompt."""

    def __init__(self, known):
        super().__init__(reply=self._reply)
        self.known = known

    def chat_prompt(self, messages):
        return "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages) + "<a>"

    def _reply(self, prompt):
        question = next(q for q in FACTS if q in prompt)
        if "<information>" not in prompt:
            return f"<search>{question}</search>"
        return f"<answer>{FACTS[question][2] if question in self.known else 'nobody'}</answer>"


def test_shipped_suites_load_and_name_registered_envs():
    import gymnasium as gym

    assert {"search_r1", "multihop"} <= set(suite_names())
    search_r1 = load_suite("search_r1")
    assert [d.name for d in search_r1.datasets] == [
        "NQ", "TriviaQA", "PopQA", "HotpotQA", "2Wiki", "MuSiQue", "Bamboogle"
    ]  # fmt: skip
    assert search_r1.k == 3 and search_r1.metric == "em"
    for suite in map(load_suite, suite_names()):
        for d in suite.datasets:
            assert d.env_id in gym.registry, d.env_id


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({**SUITE, "colour": 1}), "unknown fields ['colour']"),
        (json.dumps({**SUITE, "k": 0}), "expected k to be an integer >= 1"),
        (json.dumps({**SUITE, "metric": "bleu"}), "expected metric to be one of"),
        (json.dumps({**SUITE, "datasets": []}), "expected datasets to be a non-empty list"),
        (
            json.dumps({**SUITE, "datasets": [SUITE["datasets"][0], SUITE["datasets"][0]]}),
            "distinct dataset names",
        ),
        (
            json.dumps({**SUITE, "datasets": [{**SUITE["datasets"][0], "n": 0}]}),
            "datasets[0].n",
        ),
        (
            json.dumps({**SUITE, "datasets": [{**SUITE["datasets"][0], "split": "tset"}]}),
            "datasets[0].split: expected a split in",
        ),
    ],
)
def test_a_bad_suite_file_is_an_error_naming_the_field(text, message):
    with pytest.raises(SuiteError, match=re.escape(message)):
        parse_suite(text, "tiny.json")


def test_run_suite_pins_the_protocol_and_reports_each_column_and_the_average(tmp_path):
    corpus = _write_world(tmp_path)
    suite = load_suite(_suite_file(tmp_path))
    # right on two of NQ's three questions and one of TQ's three
    lm = KnowsSome({QUESTIONS[0], QUESTIONS[1], QUESTIONS[4]})
    config = SuiteConfig(
        suite=suite,
        agents=("search_r1", "random"),
        corpus=str(corpus),
        data_root=str(tmp_path),
        out_dir=str(tmp_path / "runs"),
        run_name="s",
    )
    result = run_suite(config, lambda name, env: make_agent(name, lm=lm, env=env))
    row = result.table["search_r1"]
    assert row["NQ"]["mean"] == pytest.approx(2 / 3) and row["NQ"]["n"] == 3
    assert row["TQ"]["mean"] == pytest.approx(1 / 3)
    assert row["average"]["mean"] == pytest.approx(0.5) and row["average"]["n"] == 6
    assert row["average"]["low"] <= 0.5 <= row["average"]["high"]
    assert result.table["random"]["average"]["mean"] == 0.0
    saved = json.loads((result.run_dir / "suite.json").read_text())
    assert saved["corpus"]["sha256"] == hashlib.sha256(corpus.read_bytes()).hexdigest()
    assert saved["suite"]["sha256"] == hashlib.sha256(suite.text.encode()).hexdigest()
    assert saved["k"] == 2 and saved["answer_normaliser"]["function"].endswith("normalize_answer")
    for column in ("NQ", "TQ"):
        col = saved["columns"][column]
        assert col["k"] == 2 and col["corpus_mode"] == "corpus" and col["corpus_size"] == 26
        assert (result.run_dir / column / "protocol.json").is_file()
        assert col["max_turns"]["search_r1"] == 8
    md = (result.run_dir / "suite.md").read_text()
    assert "| search_r1 | 0.667 (" in md and "NQ (3)" in md and "average (6)" in md


def test_cli_suite_reruns_from_its_protocol_to_the_same_table(tmp_path):
    corpus = _write_world(tmp_path)
    suite = _suite_file(tmp_path)
    args = ["evaluate", "--suite", str(suite), "--corpus", str(corpus), "--data-root"]
    args += [str(tmp_path), "--agents", "random", "--out", str(tmp_path / "runs"), "--no-progress"]
    first = runner.invoke(app, [*args, "--run-name", "a"])
    assert first.exit_code == 0, first.output
    rerun = ["evaluate", "--from-run", str(tmp_path / "runs" / "a"), "--out"]
    again = runner.invoke(app, [*rerun, str(tmp_path / "runs"), "--run-name", "b", "--no-progress"])
    assert again.exit_code == 0, again.output
    a, b = (tmp_path / "runs" / x for x in "ab")
    assert (a / "suite.md").read_text() == (b / "suite.md").read_text()
    assert (a / "suite.csv").read_text() == (b / "suite.csv").read_text()
    for column in ("NQ", "TQ"):
        ids = [
            json.loads((d / column / "protocol.json").read_text())["question_ids"] for d in (a, b)
        ]
        assert ids[0] == ids[1]
    # a corpus that changed since the run is not the run's protocol
    with open(corpus, "a") as f:
        f.write(json.dumps({"id": "new", "contents": "New\nA new passage."}) + "\n")
    changed = runner.invoke(
        app,
        ["evaluate", "--from-run", str(a), "--out", str(tmp_path / "runs"), "--run-name", "c"],
    )
    assert changed.exit_code == 2 and "the corpus is not the run's" in changed.output


def test_cli_suite_names_missing_data_and_wrong_options(tmp_path):
    corpus = _write_world(tmp_path)
    (tmp_path / "tq" / "test.jsonl").unlink()
    base = ["evaluate", "--suite", str(_suite_file(tmp_path)), "--agents", "random"]
    base += ["--data-root", str(tmp_path), "--out", str(tmp_path / "runs"), "--no-progress"]
    missing = runner.invoke(app, [*base, "--corpus", str(corpus)])
    assert missing.exit_code == 2
    assert "TQ: " in missing.output and "--datasets" in missing.output
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    only = runner.invoke(app, [*base, "--corpus", str(corpus), "--datasets", "NQ"])
    assert only.exit_code == 0, only.output
    assert "NQ (3)" in only.output and "TQ" not in only.output
    two = runner.invoke(app, [*base, "--corpus", str(corpus), "--index", str(tmp_path)])
    assert two.exit_code == 2 and "exactly one of --corpus" in two.output
    env = runner.invoke(app, [*base, "--corpus", str(corpus), "--env", "rag_gym/NQ-v0"])
    assert env.exit_code == 2 and "--env has no meaning with --suite" in env.output
    unknown = runner.invoke(app, [*base, "--corpus", str(corpus), "--datasets", "PopQA"])
    assert unknown.exit_code == 2 and "expected datasets of the tiny suite" in unknown.output


def test_prompt_template_is_the_first_message_and_recorded(tmp_path):
    lm = KnowsSome(set(QUESTIONS))
    template = "Answer, searching with <search> and </search>.\nQuestion: {question}\n"
    agent = make_agent("search_r1", lm=lm, prompt=template)
    assert isinstance(agent, SearchR1Agent)
    agent.reset(slot=0)
    agent.act("Question: Where was Ada Vell born?", {"question": QUESTIONS[0]})
    expected = lm.chat_prompt(
        [{"role": "user", "content": template.replace("{question}", QUESTIONS[0])}]
    )
    assert lm.calls[0] == [expected]
    assert agent.describe()["prompt_sha256"] == hashlib.sha256(template.encode()).hexdigest()
    # agents with prompts of their own keep them
    assert not hasattr(make_agent("naive_rag", lm=lm, prompt=template), "prompt")
    with pytest.raises(ValueError, match="holding \\{question\\}"):
        SearchR1Agent(lm, prompt="no placeholder")
    bad = tmp_path / "p.txt"
    bad.write_text("no placeholder here")
    out = runner.invoke(app, ["evaluate", "--prompt", str(bad), "--agents", "random"])
    assert out.exit_code == 2 and "{question}" in out.output


def test_macro_average_interval_keeps_each_group_weight():
    low, high = macro_average_ci([[1.0] * 50, [0.0] * 5])
    assert low == high == 0.5  # each group constant: every resample averages 1 and 0
    with pytest.raises(ValueError, match="at least one group"):
        macro_average_ci([])


def _hotpot(qid: str, title: str) -> dict:
    return {
        "_id": qid,
        "question": f"Where was {title} born?",
        "answer": "Vell",
        "type": "bridge",
        "level": "hard",
        "supporting_facts": [[title, 0]],
        "context": [[title, [f"{title} was born in Vell."]], ["Kest", ["Kest is a town."]]],
    }


def test_index_build_pools_several_datasets_passages(tmp_path):
    from rag_gym.retrieval import load_index

    a = tmp_path / "a.json"
    a.write_text(json.dumps([_hotpot("q1", "Ada"), _hotpot("q2", "Bo")]))
    b = tmp_path / "b.json"
    b.write_text(json.dumps([_hotpot("q3", "Cy")]))
    build = ["index", "build", "--dataset", "hotpotqa,hotpotqa", "--out"]
    out = runner.invoke(app, [*build, str(tmp_path / "idx"), "--data-path", f"{a},{b}"])
    assert out.exit_code == 0, out.output
    retriever, _ = load_index(tmp_path / "idx")
    assert sorted(retriever.corpus.ids) == ["Ada", "Bo", "Cy", "Kest"]  # Kest stored once
    short = runner.invoke(app, [*build, str(tmp_path / "idx2"), "--data-path", str(a)])
    assert short.exit_code == 2 and "one --data-path a --dataset" in short.output


def test_the_shipped_search_r1_suite_runs_on_flashrag_layout_files(tmp_path):
    corpus = _write_world(tmp_path / "world")
    suite = load_suite("search_r1")
    for d in suite.datasets:  # the layout the suite names, FlashRAG's records
        path = tmp_path / "flashrag" / d.data
        path.parent.mkdir(parents=True, exist_ok=True)
        rec = {"id": f"{d.name}-0", "question": QUESTIONS[0], "golden_answers": ["Oslo"]}
        path.write_text(json.dumps(rec) + "\n")
    args = ["evaluate", "--suite", "search_r1", "--corpus", str(corpus), "--agents", "random"]
    args += ["--data-root", str(tmp_path / "flashrag"), "--out", str(tmp_path / "runs")]
    out = runner.invoke(app, [*args, "--run-name", "s", "--no-progress"])
    assert out.exit_code == 0, out.output
    md = (tmp_path / "runs" / "s" / "suite.md").read_text()
    for d in suite.datasets:
        assert f"{d.name} (1)" in md
    assert "average (7)" in md


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["Hot pot", "Hot_pot"], "'Hot pot' and 'Hot_pot', both the folder 'Hot_pot'"),
        (["NQ", "nq"], "'NQ' and 'nq', both the folder 'nq'"),
        (["a/b", "a?b"], "'a/b' and 'a?b', both the folder 'a_b'"),
        (["suite.json"], "'suite.json', whose folder 'suite.json' is the suite run's own"),
        ([".."], "'..', whose folder '..' is the suite run's own"),
    ],
)
def test_two_columns_never_share_a_folder(names, message):
    datasets = [{**SUITE["datasets"][0], "name": n} for n in names]
    with pytest.raises(SuiteError, match=re.escape(message)):
        parse_suite(json.dumps({**SUITE, "datasets": datasets}), "tiny.json")


def test_suite_json_config_types_cover_every_option():
    from dataclasses import fields

    from rag_gym.evaluate.suite import _CONFIG_TYPES

    assert set(_CONFIG_TYPES) == {f.name for f in fields(SuiteConfig)}


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("suite")
    corpus = _write_world(root)
    args = ["evaluate", "--suite", str(_suite_file(root)), "--corpus", str(corpus)]
    args += ["--data-root", str(root), "--agents", "random", "--out", str(root / "runs")]
    out = runner.invoke(app, [*args, "--run-name", "s", "--no-progress"])
    assert out.exit_code == 0, out.output
    return root / "runs" / "s"


def _without(d: dict, key: str) -> dict:
    return {k: v for k, v in d.items() if k != key}


DAMAGED = {
    "suite {}": (lambda s: {**s, "suite": {}}, "expected suite.text to be a string"),
    "suite a list": (lambda s: {**s, "suite": []}, "expected suite to be an object"),
    "no suite": (lambda s: _without(s, "suite"), "expected suite to be an object"),
    "suite text edited": (
        lambda s: {**s, "suite": {**s["suite"], "text": s["suite"]["text"] + " "}},
        "expected suite.sha256 to be the checksum of suite.text",
    ),
    "config []": (lambda s: {**s, "config": []}, "expected config to be an object"),
    "no config": (lambda s: _without(s, "config"), "expected config to be an object"),
    "config without agents": (
        lambda s: {**s, "config": _without(s["config"], "agents")},
        "expected config.agents to be a list",
    ),
    "config.seed a string": (
        lambda s: {**s, "config": {**s["config"], "seed": "0"}},
        "expected config.seed to be an integer or null",
    ),
    "config with an unknown key": (
        lambda s: {**s, "config": {**s["config"], "colour": 1}},
        "expected config.colour to be absent",
    ),
    "config.agents of numbers": (
        lambda s: {**s, "config": {**s["config"], "agents": [1]}},
        "expected config.agents to be a list of names",
    ),
    "corpus a string": (lambda s: {**s, "corpus": "x"}, "expected corpus to be an object"),
    "data []": (lambda s: {**s, "data": []}, "expected data to be an object"),
    "no data": (lambda s: _without(s, "data"), "expected data to be an object"),
    "a pin without sha256": (
        lambda s: {**s, "data": {**s["data"], "NQ": {"path": "x"}}},
        "expected data.NQ.sha256 to be a checksum",
    ),
    "data {}": (lambda s: {**s, "data": {}}, "expected data.NQ (the checksum"),
    "a list": (lambda s: [s], "expected the file to be a JSON object"),
}


@pytest.mark.parametrize("label", list(DAMAGED))
@pytest.mark.parametrize("option", ["--resume", "--from-run"])
def test_a_damaged_suite_run_is_an_error_naming_the_key(suite_run, tmp_path, label, option):
    import shutil

    damage, message = DAMAGED[label]
    run = tmp_path / "s"
    shutil.copytree(suite_run, run)
    saved = json.loads((run / "suite.json").read_text())
    (run / "suite.json").write_text(json.dumps(damage(saved)))
    args = ["evaluate", option, str(run), "--no-progress"]
    if option == "--from-run":
        args += ["--out", str(tmp_path / "again"), "--run-name", "b"]
    out = runner.invoke(app, args)
    assert out.exit_code == 2, out.output
    assert message in out.output and "suite.json" in out.output
    assert isinstance(out.exception, SystemExit)


def test_a_suite_json_that_is_not_json_is_an_error(suite_run, tmp_path):
    import shutil

    run = tmp_path / "s"
    shutil.copytree(suite_run, run)
    for text in ("[" * 100_000, '{"k": ' + "7" * 5_000 + "}", '{"suite": "\\ud800"}'):
        (run / "suite.json").write_text(text)
        out = runner.invoke(app, ["evaluate", "--resume", str(run), "--no-progress"])
        assert out.exit_code == 2 and "cannot read" in out.output, out.output


def test_lm_options_reach_every_column_and_a_rerun(tmp_path, monkeypatch):
    """--n-ctx, --max-new-tokens, --temperature and --chat-template go to the suite's backend,
    into each column's protocol.json and suite.json, and back to a --from-run rerun; a resume
    cannot change them."""
    from tests.test_cli_options import _with_fake_lm

    made = _with_fake_lm(monkeypatch)
    corpus = _write_world(tmp_path)
    args = ["evaluate", "--suite", str(_suite_file(tmp_path)), "--corpus", str(corpus)]
    args += ["--data-root", str(tmp_path), "--agents", "naive_rag", "--no-progress"]
    args += ["--out", str(tmp_path / "runs")]
    flags = ["--n-ctx", "1024", "--max-new-tokens", "7", "--temperature", "0.5"]
    first = runner.invoke(app, [*args, *flags, "--chat-template", "gemma", "--run-name", "a"])
    assert first.exit_code == 0, first.output
    options = {"n_ctx": 1024, "max_new_tokens": 7, "temperature": 0.5, "chat_template": "gemma"}
    assert made == [{"spec": "llama_cpp", **options}]
    saved = json.loads((tmp_path / "runs" / "a" / "suite.json").read_text())["config"]
    assert {k: saved[k] for k in options} == options
    for column in ("NQ", "TQ"):
        protocol = json.loads((tmp_path / "runs" / "a" / column / "protocol.json").read_text())
        assert {k: protocol["config"][k] for k in options} == options
    rerun = ["evaluate", "--from-run", str(tmp_path / "runs" / "a"), "--no-progress"]
    again = runner.invoke(app, [*rerun, "--out", str(tmp_path / "runs"), "--run-name", "b"])
    assert again.exit_code == 0, again.output
    assert made[-1] == {"spec": "llama_cpp", **options}
    resume = ["evaluate", "--resume", str(tmp_path / "runs" / "a"), "--n-ctx", "512"]
    refused = runner.invoke(app, resume)
    assert refused.exit_code == 2 and "--n-ctx has no meaning with --resume" in refused.output
