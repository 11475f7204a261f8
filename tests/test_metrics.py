"""The scoring core on hand-computed cases."""

from __future__ import annotations

import pytest

from rag_gym import metrics as m


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The Eiffel Tower!", "eiffel tower"),
        ("  a  cat_and   AN  apple ", "cat and apple"),
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
    assert m.cover_exact_match("anything", [""]) == 0.0


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
