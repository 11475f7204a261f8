"""TextActions: the papers' tag conventions, invalid text, format info, chat rendering."""

from __future__ import annotations

import pytest

from rag_gym.data import Corpus, Passage, QAExample
from rag_gym.envs import SearchEnv
from rag_gym.envs.tags import TAG_PRESETS, parse, tag_set
from rag_gym.retrieval import BM25Retriever
from rag_gym.wrappers import TextActions

PASSAGES = [
    Passage("ada", "Ada Vell", "Ada Vell is a painter born in Orrin."),
    Passage("orrin", "Orrin", "Orrin is a city in Tamaria."),
    Passage("guild", "Kestrel Guild", "Kestrel Guild is a guild founded by Bo Rann."),
]
QUESTIONS = [
    QAExample(
        "q1", "In which country is the birthplace of Ada Vell?", ("Tamaria",), ("ada", "orrin")
    ),
    QAExample("q2", "Who founded Zorn Academy?", ("Ebbin",), (), answerable=False),
]


def make(tags="all", **kwargs) -> TextActions:
    env = SearchEnv(examples=QUESTIONS, retriever=BM25Retriever(Corpus(PASSAGES)), k=2, **kwargs)
    return TextActions(env, tags=tags)


def test_search_returns_information_block():
    env = make()
    obs, info = env.reset(options={"question_id": "q1"})
    assert obs.endswith("Question: In which country is the birthplace of Ada Vell?")
    assert "<search>query</search>" in obs and info["format_ok"]
    obs, reward, term, trunc, info = env.step(
        "<think>first hop</think>\n<search>Ada Vell born in Orrin</search>"
    )
    assert obs == (
        "<information>Doc 1(Title: Ada Vell) Ada Vell is a painter born in Orrin.\n"
        "Doc 2(Title: Orrin) Orrin is a city in Tamaria.</information>"
    )
    assert (
        info["actions"] == ["SEARCH"] and info["format_ok"] and info["tags"] == ["think", "search"]
    )
    assert info["tag_counts"] == {"think": 1, "search": 1} and info["retrieved_ids"] == [
        "ada",
        "orrin",
    ]
    assert (reward, term, trunc) == (0.0, False, False)


def test_answer_ends_and_scores():
    env = make()
    env.reset(options={"question_id": "q1"})
    obs, reward, term, _, info = env.step("<think>known</think><answer> Tamaria </answer>")
    assert (obs, reward, term) == ("", 1.0, True) and info["prediction"] == "Tamaria"


def test_eval_rar_turn_is_evaluate_then_search():
    env = make("eval_rar")
    env.reset(options={"question_id": "q1"})
    _, _, _, _, info = env.step(
        "<evaluate>Ada was born in Orrin; the country is missing.</evaluate><think>next</think>"
        "<search>Orrin country</search><answer>too early</answer>"
    )
    assert info["actions"] == ["EVALUATE", "SEARCH"] and info["ignored_tags"] == ["answer"]
    assert info["step"] == 2 and info["context_ids"] == [["orrin", "ada"]]


def test_evo_rag_backtrack_and_refuse():
    env = make("evo_rag")
    env.reset(options={"question_id": "q2"})
    env.step("<search>Kestrel Guild</search>")
    obs, _, _, _, info = env.step("<think>dead end</think><backtrack/>")
    assert info["actions"] == ["BACKTRACK"] and "Backtracked" in obs and info["context_ids"] == []
    obs, reward, term, _, info = env.step("<refuse></refuse>")
    assert (reward, term) == (1.0, True) and info["actions"] == ["REFUSE"]


@pytest.mark.parametrize(
    "text",
    [
        "I think the answer is Tamaria.",
        "<search>unclosed",
        "<answr>Tamaria</answr>",
        "",
        "<refuse/>",
    ],
)
def test_text_without_an_action_is_invalid_but_counted(text):
    env = make("search_r1")  # no refuse tag in this preset
    env.reset(options={"question_id": "q1"})
    obs, _, term, trunc, info = env.step(text)
    assert not info["format_ok"] and info["actions"] == [] and not term and not trunc
    assert obs.startswith("The previous action was invalid") and "<search> and </search>" in obs
    assert info["step"] == 1 and info["invalid_action"]
    # reported as an unparsable reply, never as the empty EVALUATE the env counted it with
    assert info["action_type"] == "UNPARSABLE" and "EVALUATE" not in info["message"]
    assert info["message"].startswith("Unparsable reply: no complete action tag")
    assert info["message"].endswith(
        "the 'search_r1' tags are <search>…</search>, <answer>…</answer>."
    )
    assert ("<search> is never closed" in info["message"]) == (text == "<search>unclosed")


def test_an_unparsable_reply_is_traced_and_flagged_as_unparsable():
    from rag_gym.health import episode_flags
    from rag_gym.traces import step_record

    for tags in ("all", "search_r1", "eval_rar"):
        env = make(tags)
        env.reset(options={"question_id": "q1"})
        _, reward, _, _, info = env.step("The answer is probably Tamaria.")
        step = step_record(1, "The answer is probably Tamaria.", info, reward, ["ada"])
        assert step["action"] == "UNPARSABLE" and step["invalid"], tags
        assert step["message"].startswith("Unparsable reply") and "note" not in step["message"]
        assert episode_flags([step], None, False)["unparsable"], tags
        # the same env still reads a well-formed reply after it
        _, _, term, _, info = env.step("<answer>Tamaria</answer>")
        assert term and info["action_type"] == "ANSWER" and info["format_ok"]
    env = make("all")
    env.reset(options={"question_id": "q1"})
    message = env.step("x")[4]["message"]
    assert "<evaluate>…</evaluate>" in message and "<refuse/>" in message  # the preset's own tags


def test_empty_query_reports_the_env_message():
    env = make()
    env.reset(options={"question_index": 0})
    obs, _, _, _, info = env.step("<search>   </search>")
    assert (
        info["format_ok"]
        and obs == "<information>Invalid action: SEARCH needs a non-empty query.</information>"
    )


def test_unclosed_and_counts_and_clipping():
    env = TextActions(
        SearchEnv(examples=QUESTIONS, retriever=BM25Retriever(Corpus(PASSAGES))),
        max_action_chars=70,
    )
    env.reset(options={"question_index": 0})
    _, _, _, _, info = env.step(
        "<think>a</think><think>b</think><search>Orrin</search><reflect>" + "x" * 100
    )
    assert info["tag_counts"] == {"think": 2, "search": 1} and info["unclosed_tags"] == ["reflect"]
    assert info["action_clipped"]


def test_llm_output_never_crashes():
    env = make()
    env.reset(options={"question_index": 0})
    obs, _, _, _, info = env.step("<search>emoji \U0001f600 and \x00 nul</search>")
    assert env.observation_space.contains(obs) and info["query"] == "emoji \ufffd and \ufffd nul"
    with pytest.raises(
        TypeError, match=r"expected the action to be the model's text \(str\), got int"
    ):
        env.step(3)


def test_chat_messages():
    env = make()
    env.reset(options={"question_index": 0})
    env.step("<search>Ada Vell</search>")
    msgs = env.messages()
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    assert msgs[1]["content"].startswith("Question:") and msgs[3]["content"].startswith(
        "<information>"
    )
    folded = env.messages(system=False)
    assert [m["role"] for m in folded] == ["user", "assistant", "user"]
    assert folded[0]["content"].startswith(msgs[0]["content"])


def test_tag_parser_edge_cases():
    parsed = parse("<search>a</search><search>b</search><Answer>c</Answer>")
    assert [(t.name, t.content) for t in parsed.tags] == [
        ("search", "a"),
        ("search", "b"),
        ("answer", "c"),
    ]
    nested = parse("<answer><search>x</search></answer>")
    assert [(t.name, t.content) for t in nested.tags] == [
        ("answer", "<search>x</search>"),
        ("search", "x"),
    ]
    assert parse("<think>open").unclosed == ("think",)
    assert [t.name for t in parse("<refuse/>", self_closing=frozenset({"refuse"})).tags] == [
        "refuse"
    ]


def test_presets_and_errors():
    assert tag_set("eval_rar").evaluate == "evaluate" and tag_set("eval_rar").refuse is None
    assert set(TAG_PRESETS) == {"all", "search_r1", "eval_rar", "evo_rag", "when_to_search"}
    with pytest.raises(ValueError, match="did you mean 'eval_rar'"):
        tag_set("evalrar")
