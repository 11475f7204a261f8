"""The scoring core on hand-computed cases."""

from __future__ import annotations

import pytest

from rag_gym import metrics as m


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        (
            "  a  cat_and   AN  apple ",
            "catand apple",
        ),  # "_" is deleted, as every official scorer does
        ("Eiffel_Tower", "eiffeltower"),
        ("“Hamlet”", "“hamlet”"),  # curly quotes are not ASCII punctuation: kept
        ("U.S.A.", "usa"),
        ("the", ""),
        ("Theatre", "theatre"),
    ],
)
def test_normalize(text, expected):
    assert m.normalize_answer(text) == expected


def test_exact_match_uses_aliases_articles_punctuation():
    assert m.exact_match("the Hateful Eight.", ["The Hateful Eight", "Hateful Eight"]) == 1.0
    assert m.exact_match("Hateful 8", ["The Hateful Eight"]) == 0.0
    assert m.exact_match("", ["x"]) == 0.0


def test_partial_f1_hand_computed():
    # pred tokens: [john, smith, jr] ; gold: [john, smith] -> P = 2/3, R = 1, F1 = 0.8
    assert m.f1_score("John Smith Jr.", "John Smith") == pytest.approx(0.8)
    # best alias wins: vs "Jonathan Smith": overlap 1 -> P=1/3 R=1/2 F1=0.4 ; vs "John Smith": 0.8
    assert m.f1_score("John Smith Jr.", ["Jonathan Smith", "John Smith"]) == pytest.approx(0.8)
    # repeated tokens count by multiplicity: pred [a1, a1, b] gold [a1, b, c]: overlap 2 -> P=2/3 R=2/3
    assert m.f1_score("a1 a1 b", "a1 b c") == pytest.approx(2 / 3)
    # HotpotQA's official rule: a yes/no gold scores 0 unless the prediction is exactly it
    assert m.f1_score("yes it is", "yes") == 0.0
    assert m.f1_score("Yes.", "yes") == 1.0
    assert m.f1_score("no", "yes") == 0.0
    assert m.f1_score("x", []) == 0.0


def test_cover_em_is_token_aligned():
    assert m.cover_exact_match("I think it is the Eiffel Tower, in Paris", ["Eiffel Tower"]) == 1.0
    assert m.cover_exact_match("Parisian", ["Paris"]) == 0.0


METRICS = (m.exact_match, m.f1_score, m.cover_exact_match, m.sub_exact_match, m.answer_scores)


@pytest.mark.parametrize("metric", METRICS)
@pytest.mark.parametrize("gold", ["", "  ", "The", "a.", "An!", ["Paris", "the"]])
@pytest.mark.parametrize("prediction", ["an", "the", ".", "", "Paris"])
def test_a_gold_that_normalises_to_nothing_is_refused_by_every_answer_metric(
    metric, gold, prediction
):
    # against such a gold the official scorers give EM 1 to "an" and sub-EM 1 to anything
    with pytest.raises(
        ValueError, match=r"expected gold answers that keep a word.*normalises to ''"
    ):
        metric(prediction, gold)


# Each official behaviour, hand-computed against the SQuAD / HotpotQA normalisation (which the
# 2Wiki, MuSiQue, Search-R1 and FlashRAG scorers copy). Columns: EM, F1, cover-EM, sub-EM.
@pytest.mark.parametrize(
    ("prediction", "golds", "em", "f1", "cover", "sub"),
    [
        # underscore: deleted, never a space ("new_york" -> "newyork")
        ("Eiffel_Tower", ["Eiffel Tower"], 0.0, 0.0, 0.0, 0.0),
        ("eiffel_tower", ["Eiffel_Tower"], 1.0, 1.0, 1.0, 1.0),
        ("New_York City", ["New York"], 0.0, 0.0, 0.0, 0.0),
        # glued suffix: "obamas" holds "obama" as a substring, not as a token
        ("Obama's", ["Obama"], 0.0, 0.0, 0.0, 1.0),
        ("It was in the 1990s", ["1990"], 0.0, 0.0, 0.0, 1.0),
        # curly quotes stay (not in string.punctuation): "obama’s", "“hamlet”"
        ("Obama’s", ["Obama"], 0.0, 0.0, 0.0, 1.0),
        ("“Hamlet”", ["Hamlet"], 0.0, 0.0, 0.0, 1.0),
        ('"Hamlet"', ["Hamlet"], 1.0, 1.0, 1.0, 1.0),
        # yes/no: F1 is 0 unless the prediction is exactly it (HotpotQA); cover/sub still see it
        ("yes it is", ["yes"], 0.0, 0.0, 1.0, 1.0),
        ("Yes.", ["yes"], 1.0, 1.0, 1.0, 1.0),
        ("no", ["yes"], 0.0, 0.0, 0.0, 0.0),
        # no gold alias (an unlabelled question); a gold that normalises to "" is refused (above)
        ("anything", [], 0.0, 0.0, 0.0, 0.0),
        # best alias wins in every column
        ("Paris, France", ["Lyon", "Paris"], 0.0, pytest.approx(2 / 3), 1.0, 1.0),
    ],
)
def test_official_behaviours(prediction, golds, em, f1, cover, sub):
    assert m.exact_match(prediction, golds) == em
    assert m.f1_score(prediction, golds) == f1
    assert m.cover_exact_match(prediction, golds) == cover
    assert m.sub_exact_match(prediction, golds) == sub


def test_sub_em_is_a_raw_substring_where_cover_em_is_token_aligned():
    assert m.sub_exact_match("Parisian", "Paris") == 1.0
    assert m.cover_exact_match("Parisian", "Paris") == 0.0
    # a single string is one alias, not a list of characters
    assert m.sub_exact_match("xyz", "ab") == 0.0


def test_recall_full_recall():
    retrieved = ["d3", "d1", "d3", "d7", "d2"]
    gold = ["d1", "d2"]
    assert m.recall_at_k(retrieved, gold, k=2) == 0.5
    assert m.recall_at_k(retrieved, gold) == 1.0
    assert m.full_recall(retrieved, gold, k=3) == 0.0  # distinct top-3: d3, d1, d7
    assert m.full_recall(retrieved, gold, k=4) == 1.0
    assert m.recall_at_k(retrieved, []) == 0.0


def test_average_precision_r2ag():
    # ranks of gold: 2 and 4 of ["x", "a", "y", "b"]: (1/2 + 2/4) / |g|=2 = 0.5
    assert m.average_precision(["x", "a", "y", "b"], ["a", "b"]) == pytest.approx(0.5)
    # only one of three gold found, at rank 1: (1/1) / 3
    assert m.average_precision(["a", "x"], ["a", "b", "c"]) == pytest.approx(1 / 3)
    # top-t cut: t=2 keeps ["x", "a"]: (1/2) / 2
    assert m.average_precision(["x", "a", "b"], ["a", "b"], k=2) == pytest.approx(0.25)
    assert m.mean_average_precision([(["a"], ["a"]), (["x", "a"], ["a"])]) == pytest.approx(0.75)


def test_retrieval_count():
    assert m.retrieval_count(["SEARCH", "EVALUATE", "search", "ANSWER"]) == 2


def test_leaderboard_has_sub_em_beside_cover_em():
    from rag_gym.evaluate import COLUMNS, summarise

    keys = [c[0] for c in COLUMNS]
    assert keys[keys.index("cover_em") + 1] == "sub_em"

    def episode(prediction, answers, cover):
        return {
            "prediction": prediction, "answers": answers, "answerable": True, "em": 0.0,
            "f1": 0.0, "cover_em": cover, "judge": None, "recall": None, "full_recall": None,
            "ap": None, "searches": 1, "steps": 2, "refused": False, "prompt_tokens": 0,
            "completion_tokens": 0, "error": None,
        }  # fmt: skip

    row = summarise(
        "a",
        [
            episode("Parisian", ["Paris"], 0.0),  # sub-EM 1, cover-EM 0
            episode("Lyon", ["Paris"], 0.0),
            episode(None, ["Paris"], 0.0),  # no answer: 0
            episode("Paris", ["Paris"], float("nan")),  # unscored episode: left out of both
        ],
        1.0,
    )
    assert row["cover_em"] == 0.0 and row["sub_em"] == pytest.approx(1 / 3)
