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


def _titles_of(observation: str) -> list[str]:
    import re

    return re.findall(r"Doc \d+\(Title: ([^)]*)\)", observation)


def test_the_plain_style_gives_the_demonstrations_a_seed_always_gave():
    """The default style makes no change: the Hard world's demonstrations (misses and refusals
    included) hash to what they always were, so the documented SFT runs train on the same
    transcripts."""
    import hashlib

    env = _env("rag_gym/SynthHop-Hard-v0", tags="evo_rag", unanswerable_rate=0.3)
    expert = SynthHopExpert(env.tags, seed=1)
    digest = hashlib.sha256()
    for i in range(len(env.unwrapped.examples)):
        for turn in expert.play(env, i).turns:
            digest.update(turn.action.encode())
    assert digest.hexdigest() == "7d8bf2f12e2e0c9ca1cb6a67c3df7aad7e99299af465e9681900c445de9b7361"


def test_title_list_lists_the_titles_then_reads_the_one_named_or_says_none_is():
    """``title_list``: every turn after a search starts with ``Looking for X:`` and the titles
    the observation shows, in rank order; it reads Doc r only where r's title is X, and says
    "None is about X" exactly where X is not among them. The demonstrations stay right."""
    import re

    env = _env("rag_gym/SynthHop-Hard-v0", tags="evo_rag", unanswerable_rate=0.3)
    expert = SynthHopExpert(env.tags, seed=1, style="title_list")
    reads = misses = 0
    for i, ex in enumerate(env.unwrapped.examples):
        demo = expert.play(env, i)
        _right(demo, ex)
        for before, turn in zip(demo.turns, demo.turns[1:], strict=False):
            titles = _titles_of(before.observation)
            listed = re.match(r"<think>Looking for (.+?): (.+?)\. ", turn.action)
            assert listed, turn.action
            entity = listed.group(1)
            assert re.findall(r"Doc \d+ is about (.+?)(?=, Doc|$)", listed.group(2)) == titles
            read = re.search(
                r"(?:Doc (\d+) says|According to Doc (\d+),|From Doc (\d+):|"
                r"Doc (\d+) tells me)",
                turn.action,
            )
            if entity in titles:
                assert read and titles[int(next(g for g in read.groups() if g)) - 1] == entity
                reads += 1
            else:
                assert f"None is about {entity}" in turn.action and not read, turn.action
                misses += 1
    assert reads > 50 and misses > 5


def test_title_verdicts_mark_each_title_and_the_read_is_the_one_marked_yes():
    """``title_verdicts``: each listed title is followed by (yes) exactly when it is the entity
    searched; the turn reads the Doc marked (yes), and says "None is about X" exactly where no
    title is. The demonstrations stay right, and the phrasing draws are those of title_list."""
    import re

    env = _env("rag_gym/SynthHop-Hard-v0", tags="evo_rag", unanswerable_rate=0.3)
    expert = SynthHopExpert(env.tags, seed=1, style="title_verdicts")
    plain = SynthHopExpert(env.tags, seed=1, style="title_list")
    verdicts = {"yes": 0, "no": 0}
    for i, ex in enumerate(env.unwrapped.examples):
        demo = expert.play(env, i)
        _right(demo, ex)
        same = plain.play(env, i)
        assert [re.sub(r" \((?:yes|no)\)", "", t.action) for t in demo.turns] == [
            t.action for t in same.turns
        ]
        for before, turn in zip(demo.turns, demo.turns[1:], strict=False):
            titles = _titles_of(before.observation)
            listed = re.match(r"<think>Looking for (.+?): (.+?)\. ", turn.action)
            assert listed, turn.action
            entity = listed.group(1)
            marked = re.findall(r"Doc \d+ is about (.+?) \((yes|no)\)", listed.group(2))
            assert [t for t, _ in marked] == titles
            assert [v for _, v in marked] == ["yes" if t == entity else "no" for t in titles]
            for _, v in marked:
                verdicts[v] += 1
            read = re.search(
                r"(?:Doc (\d+) says|According to Doc (\d+),|From Doc (\d+):|"
                r"Doc (\d+) tells me)",
                turn.action,
            )
            if "yes" in (v for _, v in marked):
                assert read and marked[int(next(g for g in read.groups() if g)) - 1][1] == "yes"
            else:
                assert f"None is about {entity}" in turn.action and not read, turn.action
    assert verdicts["yes"] > 50 and verdicts["no"] > 2 * verdicts["yes"]
    with pytest.raises(
        ValueError, match=r"style in \['plain', .*got 'title_verdict'; did you mean"
    ):
        SynthHopExpert(env.tags, style="title_verdict")


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
