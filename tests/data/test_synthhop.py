"""SynthHop: determinism, the one-retrieval-cannot-answer property, unanswerables, splits."""

from __future__ import annotations

import re

import pytest

from rag_gym.data.synthhop import PRESETS, SynthHopConfig, generate, world_for

SMALL = SynthHopConfig(
    n_passages=3000,
    n_questions=(150, 50, 50),
    hops=(2, 3, 4),
    unanswerable_rate=0.2,
    comparison_rate=0.2,
    seed=7,
)


@pytest.fixture(scope="module")
def world():
    return generate(SMALL)


def passages_naming(corpus, names):
    """Passages whose text names all of ``names`` (word-boundary match)."""
    patterns = [re.compile(rf"(?<!\w){re.escape(n)}(?!\w)") for n in names]
    return [p for p in corpus if all(pat.search(p.text) for pat in patterns)]


def _all_questions(world):
    return [q for qs in world.questions.values() for q in qs]


def test_same_seed_same_world():
    a = generate.__wrapped__(SMALL)  # bypass the cache: really generate twice
    b = generate.__wrapped__(SMALL)
    assert a.corpus.checksum() == b.corpus.checksum()
    assert a.questions == b.questions
    assert [q.meta for q in _all_questions(a)] == [q.meta for q in _all_questions(b)]


def test_different_seed_different_world():
    other = SynthHopConfig(**{**SMALL.__dict__, "seed": 8})
    assert generate(other).corpus.checksum() != generate(SMALL).corpus.checksum()


@pytest.mark.slow
def test_no_single_passage_names_start_and_answer(world):
    checked = 0
    for q in _all_questions(world):
        if q.type == "compositional":
            names = [q.meta["start_entity"], q.answer]
        else:  # comparison: no passage names both compared entities
            names = [q.meta["start_entity"], q.meta["other_entity"]]
        assert passages_naming(world.corpus, names) == [], q.question
        checked += 1
    assert checked == 250


def test_hops_and_gold_passages_follow_the_chain(world):
    for q in _all_questions(world):
        decomposition = q.meta["decomposition"]
        assert q.hops == len(decomposition)
        chain_ids = [step["passage_id"] for step in decomposition]
        assert list(q.supporting_ids) == [pid for pid in chain_ids if pid in world.corpus]
        if q.type == "compositional":
            assert decomposition[-1]["answer"] == q.answer
            # each hop's passage states the next hop's entity or the answer
            for step in decomposition:
                if step["passage_id"] in world.corpus:
                    text = world.corpus[step["passage_id"]].text
                    assert re.search(rf"(?<!\w){re.escape(step['answer'])}(?!\w)", text)
    assert {q.hops for q in _all_questions(world)} == {2, 3, 4}


def test_unanswerable_questions_miss_exactly_one_needed_passage(world):
    unanswerable = [q for q in _all_questions(world) if not q.answerable]
    assert [sum(not q.answerable for q in qs) for qs in world.questions.values()] == [30, 10, 10]
    for q in unanswerable:
        needed = [step["passage_id"] for step in q.meta["decomposition"]]
        missing = [pid for pid in needed if pid not in world.corpus]
        assert missing == [q.meta["missing_id"]]
        assert needed.index(missing[0]) >= 1  # hop 2 or later
    for q in _all_questions(world):
        if q.answerable:
            assert all(step["passage_id"] in world.corpus for step in q.meta["decomposition"])
    assert len(world.removed_ids) == len(unanswerable)


def test_splits_disjoint(world):
    texts = {s: {q.question for q in qs} for s, qs in world.questions.items()}
    ids = {s: {q.id for q in qs} for s, qs in world.questions.items()}
    assert [len(v) for v in texts.values()] == [150, 50, 50]
    assert not texts["train"] & texts["validation"] and not texts["train"] & texts["test"]
    assert not texts["validation"] & texts["test"]
    assert sum(len(v) for v in ids.values()) == 250


def test_pools_hold_gold_and_hard_negatives(world):
    for q in _all_questions(world):
        pool = [p.id for p in q.passages]
        assert len(pool) == len(set(pool)) == SMALL.pool_size
        assert set(q.supporting_ids) <= set(pool)
        assert all(pid in world.corpus for pid in pool)
        gold_types = {step["passage_id"][0] for step in q.meta["decomposition"]}
        negatives = [pid for pid in pool if pid not in q.supporting_ids]
        # hard negatives are entities of the gold entities' types
        assert sum(pid[0] in gold_types for pid in negatives) >= len(negatives) // 2


def test_names_are_generated_and_unique(world):
    titles = world.corpus.titles
    assert len(set(titles)) == len(titles)
    assert all(
        re.fullmatch(r"[A-Z][a-z' ]+(?: [A-Z][a-z]+)*", t.replace("The ", "", 1))
        for t in titles[:50]
    )


def test_presets():
    assert PRESETS["default"].hops == (2,) and PRESETS["default"].unanswerable_rate == 0
    assert PRESETS["hard"].hops == (2, 3, 4) and PRESETS["hard"].unanswerable_rate == 0.1
    world = world_for("default", n_passages=2000, n_questions=(40, 10, 10))
    assert all(q.hops == 2 and q.answerable for qs in world.questions.values() for q in qs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"n_passages": 10}, ValueError, "expected n_passages >= 500"),
        ({"hops": (5,)}, ValueError, r"expected hops from \(2, 3, 4\)"),
        ({"unanswerable_rate": 1.5}, ValueError, r"expected unanswerable_rate in \[0, 1\]"),
        (
            {"n_questions": (9000, 1, 1), "n_passages": 1000},
            ValueError,
            "raise n_passages or lower n_questions",
        ),
        ({"seed": "x"}, TypeError, "expected an int seed"),
        ({"seed": -1}, ValueError, r"expected seed >= 0 \(numpy takes no negative seeds\), got -1"),
        ({"hops": 0}, TypeError, r"expected hops as a tuple, e\.g\. \(2,\) or \(2, 3, 4\), got 0"),
        ({"hops": ()}, ValueError, r"expected hops from \(2, 3, 4\), got \(\)"),
        ({"n_questions": 5}, TypeError, r"expected n_questions as a tuple"),
    ],
)
def test_config_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        SynthHopConfig(**kwargs)


def test_preset_errors():
    with pytest.raises(TypeError, match=r"expected hops as a tuple"):
        world_for("default", hops=0)
    with pytest.raises(ValueError, match=r"expected seed >= 0"):
        world_for("default", seed=-1)
    with pytest.raises(ValueError, match="did you mean 'hard'"):
        world_for("hrd")
    with pytest.raises(TypeError, match=r"unknown SynthHop config fields \['size'\]"):
        world_for("default", size=3)


def test_currency_words_of_a_wikipedia_scale_world_fit_their_name_space():
    """A 21M-passage world has 210,000 countries, more distinct currency words than two
    syllables give: they take three there, and two in every smaller world (unchanged)."""
    import numpy as np

    from rag_gym.data.synthhop import _currency_syllables, _unique_words

    assert _currency_syllables(2_000) == 2 and _currency_syllables(100_000) == 2
    assert _currency_syllables(210_000) == 3
    with pytest.raises(ValueError, match="cannot draw 210000 distinct 2-syllable names"):
        _unique_words(np.random.default_rng(0), 210_000, 2)
    words = _unique_words(np.random.default_rng(0), 210_000, _currency_syllables(210_000))
    assert len(set(words)) == 210_000
