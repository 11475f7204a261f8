"""The scripted SynthHop expert: every demonstration is right and backed by retrieved gold."""

from __future__ import annotations

import gymnasium as gym
import pytest

import rag_gym  # noqa: F401
from rag_gym.agents.expert import SynthHopExpert
from rag_gym.envs import ActionType
from rag_gym.wrappers import TextActions
from tests.conftest import SMALL_WORLD


def _env(env_id="rag_gym/SynthHop-v0", tags="search_r1", **world):
    kwargs = {**SMALL_WORLD, **world}
    return TextActions(gym.make(env_id, split="train", dataset_kwargs=kwargs), tags=tags)


def _right(demo, ex) -> bool:
    """Assert a Hard demonstration is right (EM 1, or a refusal exactly when unanswerable);
    return whether it refused."""
    refused = demo.info["action_type"] == ActionType.REFUSE.name
    assert refused == (not ex.answerable), ex.question
    if ex.answerable:
        assert demo.info["scores"]["em"] == 1.0
    return refused


def test_every_demonstration_answers_right_and_retrieves_its_gold():
    env = _env()
    expert = SynthHopExpert(env.tags, seed=0)
    examples = env.unwrapped.examples
    for i, ex in enumerate(examples):
        demo = expert.play(env, i)
        assert demo.info["scores"]["em"] == 1.0, (ex.question, demo.turns[-1].action)
        assert demo.gold_found
        assert set(demo.info["gold_found"]) == set(ex.supporting_ids)
        # one search per hop when the first query finds it; each search turn ends with the tag
        assert all(t.action.endswith("</search>") for t in demo.turns[:-1])
        assert demo.turns[-1].action.endswith(f"<answer>{ex.answers[0]}</answer>")
        # every fact the expert states comes from a passage it retrieved in the transcript
        for hop, turn in zip(ex.meta["decomposition"], demo.turns[1:], strict=False):
            assert hop["answer"] in turn.action


def test_hard_world_refuses_only_unanswerable_questions():
    env = _env("rag_gym/SynthHop-Hard-v0", tags="evo_rag", unanswerable_rate=0.3)
    expert = SynthHopExpert(env.tags, seed=1)
    seen = {True: 0, False: 0}
    for i, ex in enumerate(env.unwrapped.examples):
        demo = expert.play(env, i)
        if _right(demo, ex):
            assert demo.turns[-1].action.endswith("<refuse/>")
        seen[ex.answerable] += 1
    assert seen[False] > 0 and seen[True] > 0


def test_phrasing_varies_and_a_seed_repeats_it():
    env = _env()
    first = [SynthHopExpert(env.tags, seed=0).play(env, i).turns[0].action for i in range(20)]
    again = [SynthHopExpert(env.tags, seed=0).play(env, i).turns[0].action for i in range(20)]
    assert first != [
        SynthHopExpert(env.tags, seed=5).play(env, i).turns[0].action for i in range(20)
    ]
    expert = SynthHopExpert(env.tags, seed=0)
    assert first[0] == again[0]
    openings = {expert.play(env, i).turns[0].action.split(" ")[0] for i in range(30)}
    assert len(openings) >= 3  # several planning sentences, not one template


def test_the_default_expert_draws_only_its_phrasings():
    """Without ``confirm_rate`` the expert makes no draw but its phrasing choices, so a seed
    gives the same demonstrations whichever rates other experts use."""
    env = _env()
    comparisons = [i for i, ex in enumerate(env.unwrapped.examples) if ex.type == "comparison"]
    assert comparisons
    zero = SynthHopExpert(env.tags, seed=0)
    calls = []
    rng = zero.rng

    class Recording:
        def __getattr__(self, name):
            calls.append(name)
            return getattr(rng, name)

    zero.rng = Recording()
    for i in comparisons:
        zero.play(env, i)
    assert calls and set(calls) == {"integers"}
    with pytest.raises(ValueError, match="confirm_rate"):
        SynthHopExpert(env.tags, confirm_rate=1.5)


def test_expert_errors():
    env = _env()
    with pytest.raises(ValueError, match="max_attempts"):
        SynthHopExpert(env.tags, max_attempts=0)
    with pytest.raises(TypeError, match="TextActions"):
        SynthHopExpert(env.tags).play(
            gym.make("rag_gym/SynthHop-v0", dataset_kwargs=SMALL_WORLD), 0
        )


def test_a_seed_gives_the_demonstrations_it_always_gave():
    """The Hard world's demonstrations (misses and refusals included) hash to what they always
    were, so the documented SFT runs train on the same transcripts."""
    import hashlib

    env = _env("rag_gym/SynthHop-Hard-v0", tags="evo_rag", unanswerable_rate=0.3)
    expert = SynthHopExpert(env.tags, seed=1)
    digest = hashlib.sha256()
    for i in range(len(env.unwrapped.examples)):
        for turn in expert.play(env, i).turns:
            digest.update(turn.action.encode())
    assert digest.hexdigest() == "7d8bf2f12e2e0c9ca1cb6a67c3df7aad7e99299af465e9681900c445de9b7361"


def test_confirm_rate_adds_one_search_of_the_last_fact_and_stays_right():
    """``confirm_rate=1``: every answered demonstration searches once more than the
    question needs, for the last hop's fact, and still answers right; 0 makes no extra
    draw, so a seed's demonstrations are those it always gave."""
    env = _env()
    examples = env.unwrapped.examples
    confirm = SynthHopExpert(env.tags, seed=0, confirm_rate=1.0)
    plain = SynthHopExpert(env.tags, seed=0)
    for i, ex in enumerate(examples[:30]):
        demo, base = confirm.play(env, i), plain.play(env, i)
        assert demo.info["scores"]["em"] == 1.0, (ex.question, demo.turns[-1].action)
        assert demo.turns[-1].action.endswith(f"<answer>{ex.answers[0]}</answer>")
        assert len(demo.turns) == len(base.turns) + 1
        # the extra search asks for the last hop again, after it was read
        last = ex.meta["decomposition"][-1]
        assert last["answer"] in demo.turns[-2].action  # its plan states the fact read
        assert demo.turns[-2].action.endswith("</search>")
        # and its reading (or the earlier reading it stands on) names the value again
        assert last["answer"] in demo.turns[-1].action
    half = SynthHopExpert(env.tags, seed=0, confirm_rate=0.5)
    lengths = [len(half.play(env, i).turns) - len(plain.play(env, i).turns) for i in range(30)]
    assert set(lengths) == {0, 1}
    with pytest.raises(ValueError, match="confirm_rate"):
        SynthHopExpert(env.tags, confirm_rate=-0.1)
