"""TreeSearchEnv: scripted expansions reproduce what R²AG describes (§2, appendix B)."""

from __future__ import annotations

import pytest

from rag_gym.data import Corpus, Passage, QAExample
from rag_gym.envs import TreeSearchEnv
from rag_gym.metrics import average_precision
from rag_gym.retrieval import BM25Retriever

PASSAGES = [
    Passage("ada", "Ada Vell", "Ada Vell is a painter born in Orrin."),
    Passage("orrin", "Orrin", "Orrin is a city in Tamaria."),
    Passage("tamaria", "Tamaria", "Tamaria is a country whose capital is Lusk."),
    Passage("guild", "Kestrel Guild", "Kestrel Guild is a guild founded by Bo Rann."),
    Passage("bo", "Bo Rann", "Bo Rann is a weaver born in Lusk."),
]
Q = QAExample(
    "q1", "In which country is the birthplace of Ada Vell?", ("Tamaria",), ("ada", "orrin"), hops=2
)


def make_env(**kwargs) -> TreeSearchEnv:
    return TreeSearchEnv(examples=[Q], retriever=BM25Retriever(Corpus(PASSAGES)), **kwargs)


def fmt(**kw) -> str:
    return TreeSearchEnv.format_action("reasoning", **kw)


def test_three_base_queries_make_three_branches_of_one_document():
    env = make_env()
    obs, info = env.reset()
    assert "Evidence:\n(none yet)" in obs and info["step"] == 0
    obs, reward, term, trunc, info = env.step(
        fmt(base=["Ada Vell painter", "Kestrel Guild", "Bo Rann weaver"])
    )
    assert [b["ids"] for b in info["branches"]] == [["ada"], ["guild"], ["bo"]]
    assert [b["kind"] for b in info["branches"]] == ["base"] * 3 and all(
        b["depth"] == 1 for b in info["branches"]
    )
    assert info["new_gold_base"] == 1 and info["newly_found_gold"] == ["ada"]
    # top-t AP over base branches [ada, guild, bo] with g = {ada, orrin}: (1/1) / 2
    assert info["ap_base"] == pytest.approx(0.5)
    # prune="gold": only the branch that hit gold is kept as context
    assert (
        info["context_ids"] == ["ada"]
        and "[1] Ada Vell: Ada Vell is a painter" in obs
        and "Kestrel" not in obs
    )
    assert (
        (reward, term, trunc) == (0.0, False, False)
        and info["think_ok"]
        and info["blocks_after_think"] == 3
    )


def test_prune_none_keeps_every_branch():
    env = make_env(prune="none")
    env.reset()
    _, _, _, _, info = env.step(fmt(base=["Ada Vell painter", "Kestrel Guild"]))
    assert info["context_ids"] == ["ada", "guild"]


def test_predicted_queries_and_multi_hit():
    env = make_env()
    env.reset()
    _, _, _, _, info = env.step(
        fmt(base=["Ada Vell painter"], predicted=["Orrin city country", "none"])
    )
    assert [(b["kind"], b["ids"]) for b in info["branches"]] == [
        ("base", ["ada"]),
        ("predicted", ["orrin"]),
    ]
    assert info["new_gold_base"] == 1 and info["new_gold_predicted"] == 1
    assert info["ap_predicted"] == pytest.approx(0.5) and info["all_gold_found"]
    # a gold document found again later is not new
    _, _, _, _, info = env.step(fmt(base=["Orrin Tamaria"]))
    assert info["branches"][0]["gold_hits"] == ["orrin"] and info["branches"][0]["new_gold"] == []
    assert info["new_gold_base"] == 0


def test_stop_after_all_gold_is_a_joint_hit():
    env = make_env()
    env.reset()
    env.step(fmt(base=["Ada Vell painter", "Orrin city"]))
    obs, reward, term, trunc, info = env.step(fmt(stop=True))
    assert (reward, term, trunc) == (1.0, True, False)
    assert info["stop"] and not info["premature_stop"] and info["branches"] == [] and obs == ""


def test_premature_stop_ends_without_joint_hit():
    env = make_env()
    env.reset()
    env.step(fmt(base=["Ada Vell painter"]))
    _, reward, term, _, info = env.step(fmt(stop=True))
    assert reward == 0.0 and term and info["premature_stop"]


def test_missing_think_and_invalid_output():
    env = make_env()
    env.reset()
    _, _, _, _, info = env.step("<base-Q>Ada Vell painter</base-Q>")
    assert not info["think_ok"] and info["blocks_after_think"] == 0 and info["format_ok"]
    obs, reward, term, _, info = env.step("<think>hmm</think> I will not say.")
    assert (
        not info["format_ok"]
        and not term
        and reward == 0.0
        and "Invalid output" in obs
        and info["step"] == 2
    )


def test_context_from_a_previous_round_and_limits():
    env = make_env(max_base=2)
    obs, info = env.reset(options={"context_ids": ["ada"]})
    assert info["context_ids"] == ["ada"] and "[1] Ada Vell" in obs
    _, _, _, _, info = env.step(fmt(base=["Ada", "Orrin city", "Bo Rann"]))
    # the starting context counts as already retrieved: Ada is not new gold
    assert [b["new_gold"] for b in info["branches"]] == [[], ["orrin"]]
    assert info["dropped_queries"] == ["Bo Rann"]
    with pytest.raises(
        ValueError, match=r"options\['context_ids'\] names ids not in the corpus: \['nope'\]"
    ):
        env.reset(options={"context_ids": ["nope"]})


def test_r2ag_ap_is_literal():
    # duplicates are not removed: the formula sums over branches
    assert average_precision(["g", "g"], {"g"}, 4, distinct=False) == pytest.approx(2.0)
    assert average_precision(["x", "g1", "g2"], {"g1", "g2"}, 2, distinct=False) == pytest.approx(
        0.25
    )
    assert average_precision([], set(), 4, distinct=False) == 0.0


def test_errors():
    with pytest.raises(ValueError, match="expected prune 'gold' or 'none', got 'all'"):
        make_env(prune="all")
    with pytest.raises(ValueError, match="expected max_base >= 1"):
        make_env(max_base=0)
    env = make_env()
    with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
        env.step("x")
    env.reset()
    with pytest.raises(
        TypeError, match=r"expected the action to be the model's text \(str\), got dict"
    ):
        env.step({"base": ["x"]})
    env.step(fmt(stop=True))
    with pytest.raises(RuntimeError, match="the episode has ended"):
        env.step(fmt(stop=True))


def test_render_ansi_shows_the_tree(capsys):
    env = TreeSearchEnv(examples=[Q], retriever=BM25Retriever(Corpus(PASSAGES)), render_mode="ansi")
    env.reset()
    env.step(fmt(base=["Ada Vell painter"]))
    text = env.render()
    assert (
        "depth 1 base      'Ada Vell painter' -> ada  gold: ada" in text and "Context: ada" in text
    )
    human = TreeSearchEnv(
        examples=[Q], retriever=BM25Retriever(Corpus(PASSAGES)), render_mode="human"
    )
    human.reset()
    human.step(fmt(base=["Orrin"]))
    assert "'Orrin' -> orrin" in capsys.readouterr().out
