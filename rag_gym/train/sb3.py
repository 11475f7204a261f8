"""Classic RL with Stable-Baselines3 on the macro-action envs: the env stack, fixed macro
heuristics, evaluation on a held-out split, and SB3 logging under rag-gym's metric names.

:func:`make_sb3_env` builds ``TextToVector(MacroActions(StepCost(gym.make(env_id))))``: a
``Box`` observation and a ``Discrete`` action space, so PPO and DQN train unchanged. The
reward is the env's own (EM at the answer, 1 for refusing an unanswerable question) minus
``step_cost`` per step (none by default: a discount below 1 already favours short
episodes, and with a cost PPO can settle on refusing at once, see ``docs/sb3.md``).

A *fixed macro heuristic* plays one constant macro sequence on every question
(:func:`fixed_sequences` lists every ``SEARCH_QUESTION``, then up to ``max_searches``
``SEARCH_CANDIDATE_j``, then one answer macro); :func:`play_split` scores any policy on every
question of the env's split, once each, in order.

Stable-Baselines3 is imported only by the functions that need it (``pip install
'rag-gym[sb3]'``).

>>> env = make_sb3_env(split="validation", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})
>>> env.observation_space.shape, env.action_space
((890,), Discrete(14))
>>> stats = play_split(env, sequence_policy(env, ["SEARCH_QUESTION", "ANSWER_EARLIEST"]))
>>> stats["n"], 0.0 <= stats["em"] <= 1.0
(10, True)
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from rag_gym.data import QAExample
from rag_gym.wrappers.evo_rag import StepCost, find_wrapper
from rag_gym.wrappers.macro import MacroActions
from rag_gym.wrappers.vectorize import TextToVector

#: ``act(obs, t) -> macro index``: a policy as :func:`play_split` calls it (t: step in episode)
Policy = Callable[[Any, int], int]


@dataclass
class PPOMacroConfig:
    """The settings of ``examples/train_sb3_ppo.py``: PPO on the macro-action env against the fixed
    macro heuristics (:func:`make_sb3_env`, :func:`rank_fixed_sequences`)."""

    exp_name: str = "train_sb3_ppo"
    """the name of this experiment (part of the run name)"""
    env_id: str = "rag_gym/SynthHop-v0"
    """a rag-gym search env id"""
    dataset_kwargs: str = "{}"
    """JSON: dataset options on top of the registration's, e.g. '{"n_passages": 2000}'"""
    seed: int = 1
    """seed of PPO, the envs and torch"""
    total_timesteps: int = 300_000
    """PPO's environment steps"""
    num_envs: int = 8
    """parallel training envs (in one process)"""
    num_steps: int = 128
    """steps per env per rollout"""
    batch_size: int = 256
    """minibatch size"""
    update_epochs: int = 4
    """PPO epochs per rollout"""
    learning_rate: float = 3e-4
    """Adam's learning rate"""
    gamma: float = 0.95
    """discount factor (below 1, it favours short episodes)"""
    gae_lambda: float = 0.95
    """GAE lambda"""
    ent_coef: float = 0.02
    """entropy bonus"""
    hidden: int = 256
    """units in each of the two hidden layers of the policy and value networks"""
    encoder: str = "hashing"
    """TextToVector's encoder: hashing or minilm"""
    n_features: int = 256
    """hashing dimensions per text block"""
    step_cost: float = 0.0
    """reward subtracted per step (too large a cost makes refusing at once the best policy, see
    docs/sb3.md)"""
    max_searches: int = 2
    """fixed heuristics follow up to this many candidates after searching the question"""
    heuristic_questions: int = 0
    """questions per split for the heuristics (0: all)"""
    eval_every: int = 20_000
    """PPO steps between validation evaluations"""
    eval_questions: int = 200
    """validation questions per evaluation (0: all)"""
    torch_threads: int = 1
    """torch CPU threads"""
    track: bool = False
    """log to Weights & Biases (offline unless WANDB_MODE says otherwise)"""
    wandb_project_name: str = "rag-gym"
    """the W&B project"""
    runs_dir: str = "runs"
    """where run folders go"""


def require_sb3() -> Any:
    """``stable_baselines3``, or an ``ImportError`` naming the extra to install."""
    try:
        import stable_baselines3
    except ImportError as exc:
        raise ImportError(
            "classic RL needs Stable-Baselines3: pip install torch==2.13.0 'rag-gym[sb3]'"
        ) from exc
    return stable_baselines3


def make_sb3_env(
    env_id: str = "rag_gym/SynthHop-v0",
    split: str = "train",
    encoder: str = "hashing",
    n_features: int = 256,
    n_candidates: int = 5,
    step_cost: float = 0.0,
    **make_kwargs: Any,
) -> gym.Env:
    """A search env with macro actions and vector observations, ready for SB3.

    Args:
        env_id: a search id (``rag_gym/<Dataset>-v0``).
        split: the question split (``"train"`` to learn, ``"validation"``/``"test"`` held out).
        encoder, n_features: the :class:`TextToVector` encoder.
        n_candidates: candidates per passage in :class:`MacroActions`.
        step_cost: subtracted from the reward at every step (0 for none).
        make_kwargs: more ``gym.make`` arguments (``max_episode_steps``…); ``dataset_kwargs``
            updates the registration's (``{"n_passages": 2000}`` keeps SynthHop-Hard's preset).
    """
    if not isinstance(step_cost, (int, float)) or isinstance(step_cost, bool):
        raise TypeError(f"expected step_cost to be a number, got {step_cost!r}")
    if step_cost < 0:
        raise ValueError(f"expected step_cost >= 0 (a cost), got {step_cost}")
    if "dataset_kwargs" in make_kwargs:  # on top of the registration's (its preset stays)
        base = dict(gym.spec(env_id).kwargs.get("dataset_kwargs") or {})
        make_kwargs["dataset_kwargs"] = {**base, **(make_kwargs["dataset_kwargs"] or {})}
    env = gym.make(env_id, split=split, **make_kwargs)
    if step_cost:
        env = StepCost(env, weight=float(step_cost))
    env = MacroActions(env, n_candidates=n_candidates)
    return TextToVector(env, encoder=encoder, n_features=n_features, n_candidates=n_candidates)


def macros_of(env: gym.Env) -> MacroActions:
    """The :class:`MacroActions` in ``env``'s wrapper chain."""
    macro = find_wrapper(env, MacroActions)
    if macro is None:
        raise ValueError("expected an env with MacroActions in its wrapper chain (make_sb3_env)")
    return macro  # type: ignore[return-value]


def sequence_policy(env: gym.Env, macros: Sequence[str | int]) -> Policy:
    """The fixed heuristic that plays ``macros`` (names or indices) in order, then ``REFUSE``
    (so an episode whose last macro did not apply ends there)."""
    names = macros_of(env).macro_names
    if not macros:
        raise ValueError("expected at least one macro in the sequence, got none")
    indices = []
    for m in macros:
        if isinstance(m, str):
            if m not in names:
                from rag_gym._names import unknown_name

                raise unknown_name("macro", m, names)
            indices.append(names.index(m))
        else:
            indices.append(int(m))
    indices.append(names.index("REFUSE"))
    return lambda obs, t: indices[min(t, len(indices) - 1)]


def model_policy(model: Any, deterministic: bool = True) -> Policy:
    """An SB3 model (``model.predict``) as a :data:`Policy`."""
    return lambda obs, t: int(np.asarray(model.predict(obs, deterministic=deterministic)[0]))


def fixed_sequences(n_candidates: int = 5, max_searches: int = 2) -> list[tuple[str, ...]]:
    """Every constant macro sequence "search the question, follow up to ``max_searches``
    candidates, answer": ``(2K + 2) · Σ_{m ≤ max_searches} K^m`` sequences for ``K =
    n_candidates``, the answer being a candidate, ``ANSWER_EARLIEST`` or ``REFUSE``.

    >>> len(fixed_sequences(5, 2)), fixed_sequences(2, 1)[:2]
    (217, [('SEARCH_QUESTION', 'ANSWER_CANDIDATE_1'), ('SEARCH_QUESTION', 'ANSWER_CANDIDATE_2')])
    """
    searches = [f"SEARCH_CANDIDATE_{j}" for j in range(1, n_candidates + 1)]
    answers = [f"ANSWER_CANDIDATE_{j}" for j in range(1, n_candidates + 1)]
    answers += ["ANSWER_EARLIEST", "REFUSE"]
    out = []
    for m in range(max_searches + 1):
        for hops in itertools.product(searches, repeat=m):
            out += [("SEARCH_QUESTION", *hops, a) for a in answers]
    return out


def play_split(
    env: gym.Env,
    act: Policy,
    n_questions: int | None = None,
    group_by: Callable[[QAExample], str] | None = None,
) -> dict[str, float]:
    """Play each of the first ``n_questions`` (all by default) of ``env``'s split once, in
    order (``reset(options={"question_index": i})``), and average: ``em`` (the env's answer term: EM,
    or 1 for a correct refusal), ``return`` (with the step costs), ``steps``, ``refused``,
    ``invalid`` (inapplicable macros per episode) and ``n``. With ``group_by`` (a question →
    its group's name), also ``em/<group>`` and ``n/<group>`` per group."""
    examples = env.unwrapped.examples
    n = len(examples) if n_questions is None else min(int(n_questions), len(examples))
    totals = {"em": 0.0, "return": 0.0, "steps": 0.0, "refused": 0.0, "invalid": 0.0}
    groups: dict[str, list[float]] = {}
    for i in range(n):
        obs, info = env.reset(options={"question_index": i})
        for t in itertools.count():
            obs, reward, terminated, truncated, info = env.step(act(obs, t))
            totals["return"] += float(reward)
            totals["invalid"] += float(info.get("invalid_action", False))
            if terminated or truncated:
                em = float(info.get("reward_terms", {}).get("answer", 0.0))
                totals["em"] += em
                totals["steps"] += t + 1
                totals["refused"] += float(info.get("action_type") == "REFUSE")
                if group_by is not None:
                    groups.setdefault(group_by(examples[i]), []).append(em)
                break
    out = {k: v / max(n, 1) for k, v in totals.items()}
    out["n"] = n
    for name in sorted(groups, key=lambda g: (-len(groups[g]), g)):
        out[f"em/{name}"] = float(np.mean(groups[name]))
        out[f"n/{name}"] = len(groups[name])
    return out


def question_kind(example: QAExample) -> str:
    """A SynthHop question's kind: ``comparison``, or its relations joined by ``>``
    (``"birthplace>country"``); the example's ``type`` for other datasets."""
    relations = example.meta.get("relations")
    if example.type == "comparison" or not relations:
        return example.type or "question"
    return ">".join(relations)


def rank_fixed_sequences(
    env: gym.Env,
    sequences: Sequence[Sequence[str]],
    n_questions: int | None = None,
) -> list[tuple[tuple[str, ...], dict[str, float]]]:
    """``(sequence, play_split stats)`` for each sequence, best EM first (ties: higher return)."""
    macro_env = macros_of(env)  # a sequence reads no observation: skip the vectoriser
    rows = [
        (tuple(s), play_split(macro_env, sequence_policy(env, s), n_questions)) for s in sequences
    ]
    return sorted(rows, key=lambda r: (-r[1]["em"], -r[1]["return"]))


# ---- SB3 logging and evaluation -------------------------------------------------------------------
def metric_name(key: str) -> str:
    """SB3's logger keys under rag-gym's groups: ``train/x`` → ``losses/x`` (the learning rate
    → ``charts/learning_rate``), ``rollout/x`` and ``time/x`` → ``charts/x``.

    >>> metric_name("train/loss"), metric_name("rollout/ep_rew_mean"), metric_name("eval/em")
    ('losses/loss', 'charts/ep_rew_mean', 'eval/em')
    """
    group, _, name = key.partition("/")
    if group == "train":
        return "charts/learning_rate" if name == "learning_rate" else f"losses/{name}"
    if group in ("rollout", "time"):
        return f"charts/{name}"
    return key


def make_logger(folder: str | None, formats: Sequence[str] = ("stdout", "tensorboard")) -> Any:
    """An SB3 ``Logger`` writing ``formats`` under ``folder`` with keys renamed by
    :func:`metric_name`; pass it to ``model.set_logger``. Extra writers (``KVWriter``) may be
    appended to its ``output_formats``."""
    require_sb3()
    from stable_baselines3.common import logger as sb3_logger

    class _Renaming(sb3_logger.Logger):
        def record(self, key: str, value: Any, exclude: Any = None) -> None:
            super().record(metric_name(key), value, exclude)

        def record_mean(self, key: str, value: Any, exclude: Any = None) -> None:
            super().record_mean(metric_name(key), value, exclude)

    writers = [sb3_logger.make_output_format(f, folder or ".") for f in formats]
    return _Renaming(folder, writers)


def eval_callback(
    eval_env: gym.Env, every: int, n_questions: int | None = None, deterministic: bool = True
) -> Any:
    """An SB3 callback that plays ``eval_env``'s questions (:func:`play_split`) every ``every``
    timesteps and at the end of training, logs ``eval/<stat>``, and keeps ``history``: a list
    of ``(timesteps, stats)``."""
    require_sb3()
    from stable_baselines3.common.callbacks import BaseCallback

    class EvalOnSplit(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.history: list[tuple[int, dict[str, float]]] = []
            self._next = 0

        def _evaluate(self) -> None:
            stats = play_split(eval_env, model_policy(self.model, deterministic), n_questions)
            self.history.append((self.num_timesteps, stats))
            for key, value in stats.items():
                self.logger.record(f"eval/{key}", value)
            self.logger.dump(self.num_timesteps)

        def _on_step(self) -> bool:
            if self.num_timesteps >= self._next:
                self._evaluate()
                self._next = self.num_timesteps + every
            return True

        def _on_training_end(self) -> None:
            if not self.history or self.history[-1][0] != self.num_timesteps:
                self._evaluate()

    return EvalOnSplit()


def episode_stats_callback() -> Any:
    """An SB3 callback that logs each finished training episode's answer term (EM) and
    length, averaged per rollout, as ``charts/em`` and ``charts/episode_steps``."""
    require_sb3()
    from stable_baselines3.common.callbacks import BaseCallback

    class EpisodeStats(BaseCallback):
        def _on_step(self) -> bool:
            for info, done in zip(self.locals["infos"], self.locals["dones"], strict=True):
                if done:
                    self.logger.record_mean(
                        "charts/em", float(info.get("reward_terms", {}).get("answer", 0.0))
                    )
                    self.logger.record_mean("charts/episode_steps", float(info.get("step", 0)))
            return True

    return EpisodeStats()
