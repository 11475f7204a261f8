"""GRPO and DAPO over rag_gym envs: TRL's ``GRPOTrainer`` with multi-turn env rollouts.

TRL supplies the loss and the trainer loop; this module supplies what it lacks:

* a rollout function (TRL's ``rollout_func``) that plays whole episodes in a text-action env
  (:class:`~rag_gym.train.rollout.RolloutEngine`): generate until an action tag closes,
  step the env, append the observation, go on until the episode ends. Env-written tokens
  (retrieved passages, messages) get ``env_mask = 0`` and are left out of the loss, the
  Search-R1 / Eval-RAR practice (Eval-RAR, "Evaluation-Driven Retrieval-Augmented Reasoning via Reinforcement Learning", §3.2 "retrieved token masking");
* the trajectory reward: the episode's return under the chosen reward preset, with every
  reward term logged on its own (``rewards/<term>/mean``, weight 0 so only the return trains);
* DAPO's *dynamic sampling* (Yu et al. 2025; R²AG's "std > 0" constraint,
  R²AG, "Learning to Reason, Retrieve, and Self-Evolve through a Multi-Branch Retrieval Tree", §2.4): a group whose returns all agree has zero advantage and teaches
  nothing, so it is dropped and refilled with another question, up to ``max_resample_rounds``
  times (``episode/groups_resampled`` logs how many). ``dynamic_sampling_on="answer"`` is
  DAPO's own constraint (its eq. 11, 0 < #correct < G): a group is flat when its answers are
  all right or all wrong, even if a step cost or another dense term makes its returns differ.
  ``"unsolved"`` is the one-sided form for a dense efficiency term: a group is flat when its
  answers are all wrong (or its returns all agree), and a group of right answers keeps its
  dense differences, which are then the step cost's whole point ("stay right, search less").
  A group of wrong answers differs only in its dense terms (a step cost then teaches "answer
  sooner" where no episode could answer), so under either criterion a group still flat after
  the refill rounds trains with zero advantage (its returns are set to their mean). The
  criteria read :attr:`Episode.solved <rag_gym.train.rollout.Episode.solved>` (exact match),
  so they assume an EM outcome reward;
* ARENA's stabilised KL estimator (``kl_estimator="stabilized"``, :func:`~rag_gym.train.trl_compat.stabilized_kl_trainer_class`);
* log-probabilities at the model's tokens only, the ones the loss reads
  (:func:`~rag_gym.train.trl_compat.env_grpo_trainer_class`);
* curriculum stages (LWTS's stage 1 then stage 2 answer reward) switched at fractions of
  training, and R²AG's iterative forest training (:func:`train_forest`).

DAPO (``algorithm="dapo"``) is TRL's token-level ``loss_type="dapo"`` with asymmetric clipping
(ε_low 0.2, ε_high 0.28), overlong masking (``mask_truncated_completions``: an episode cut by
the token budget gets no end token and is masked) and the dynamic sampling above; GRPO keeps
TRL's sequence-mean loss and a KL to the reference model with coefficient β.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from rag_gym import health
from rag_gym.train.credit import MODES, group_scales, token_advantages, turn_advantages
from rag_gym.train.episodes import (
    TextEnvSpec,
    _mean,
    default_tags,
    env_factory,
    evaluate_policy,
    played_tags,
    rollout_engine,
)
from rag_gym.train.rollout import Episode, RolloutEngine, Sampler, make_generator

__all__ = [
    "EnvGRPOConfig",
    "EnvRollout",
    "TextEnvSpec",
    "balanced_order",
    "build_trainer",
    "default_tags",
    "env_factory",
    "evaluate_policy",
    "kind_order",
    "kind_pools",
    "load_with_adapter",
    "micro_batch",
    "question_keys",
    "refusal_rates",
    "rollout_engine",
    "train",
    "train_forest",
    "train_from",
]

ALGORITHMS = ("grpo", "dapo")
KL_ESTIMATORS = ("k3", "stabilized")
FLAT_CRITERIA = ("return", "answer", "unsolved")


#: The :class:`EnvGRPOConfig` fields that are ``trl.GRPOConfig``'s own, same name and meaning,
#: passed to it as they are (a test checks that TRL still has each, and that no other field
#: shares a name with one of TRL's unless it is set by :func:`build_trainer` on purpose).
TRL_FIELDS = (
    "num_generations",
    "learning_rate",
    "warmup_steps",
    "beta",
    "epsilon",
    "epsilon_high",
    "temperature",
    "top_p",
    "use_vllm",
)


@dataclass
class EnvGRPOConfig:
    """Options of a GRPO/DAPO run over a rag_gym env (see :data:`~rag_gym.train.recipes.RECIPES`
    for the papers' settings)."""

    env_id: str = "rag_gym/SynthHop-v0"
    """A registered id (``rag-gym envs`` lists them)."""
    env_kwargs: dict[str, Any] | str | None = field(default_factory=dict)
    """Extra ``gym.make`` keyword arguments (``dataset_kwargs``, ``k``, ``data_path``…); a JSON
    object on a command line."""
    split: str = "train"
    """The split whose questions are trained on."""
    reward_preset: str = "none"
    """A reward preset of :mod:`rag_gym.wrappers.presets` (``none`` keeps the env's reward: EM;
    :data:`~rag_gym.train.recipes.RECIPES` sets the papers' presets)."""
    reward_kwargs: dict[str, Any] | str | None = field(default_factory=dict)
    """Options of the preset (``stage``, ``encoder``…); a JSON object on a command line."""
    tags: str | None = None
    """The :class:`~rag_gym.wrappers.TextActions` tag preset of a search env; default: the
    reward preset's own (``eval_rar``, ``evo_rag``), else ``search_r1``."""
    max_episode_steps: int | None = None
    """The env's horizon; ``None`` keeps the preset's (20 steps, 5 tree expansions)."""
    step_cost: float = 0.0
    """Weight of EVO-RAG's step-cost term r_step = −1 per env step (EVO-RAG, arXiv:2505.17391, §3.2),
    added on top of the preset's reward; 0 leaves it out."""
    refusal: float = 0.0
    """Weight ρ of EVO-RAG's refusal reward r_ref (§3.2: +1 for REFUSE when the evidence so far
    is insufficient, −1 when it suffices; Table 1 gives ρ = 0.5), added on top of the preset's
    reward; 0 leaves it out. Sufficiency is decided by ``refusal_verifier``."""
    refusal_verifier: str = "answerable"
    """The refusal reward's sufficiency verifier: ``"answerable"`` (the env's ground truth: §3.2's
    cases as written, refusing an answerable question is −1 whatever has been retrieved) or
    ``"evidence"`` (:func:`rag_gym.wrappers.evo_rag.gold_coverage`: every gold passage retrieved so
    far, the paper's verifier made exact), under which a REFUSE before searching is +1 on every
    question, so a policy can earn the reward by refusing at once."""
    retrieval_hit: float = 0.0
    """Weight β of EVO-RAG's retrieval-hit term r_ret (the gold-hit term; arXiv:2505.17391, §3.2:
    +1 for a SEARCH whose passages meet the gold ones, −1 for a SEARCH that misses, landing on
    that SEARCH's turn), added on top of the preset's reward; 0 leaves it out."""
    judge: str | None = None
    """An LLM judge's backend spec (``llama_cpp``, ``openai:model@url``…): its verdict on the
    answers the env scores below 1 becomes a reward term (:class:`~rag_gym.wrappers.
    JudgedAnswerReward`, with a cache); ``None`` leaves it out."""
    judge_weight: float = 1.0
    """The judge term's weight: a "yes" adds ``judge_weight × (1 − answer reward)``."""
    model: str = "embedded"
    """``embedded`` (SmolLM2-135M-Instruct), a ``.gguf`` model file, a hub id or a directory
    (what ``--lm`` takes), or ``tiny`` (a random 2-layer model for smoke tests)."""
    chat_template: str | None = None
    """The chat template the rollouts' prompts are rendered in (``chatml``, ``gemma``,
    ``llama3`` or a Jinja file); ``None`` is the model's own, or, from an SFT run (``init``), the
    one that run recorded. A model without one is refused."""
    algorithm: str = "grpo"
    """``grpo`` or ``dapo``."""
    num_generations: int = 4
    """Group size G: episodes per question."""
    prompts_per_step: int = 2
    """Questions per optimisation step (the batch is ``prompts_per_step * G`` episodes)."""
    balance_answerable: bool = False
    """Give every step as many answerable questions as unanswerable ones: the split's two kinds,
    each shuffled with ``seed``, are interleaved and trained in that order (``prompts_per_step``
    must be even). With the refusal reward, a step then both pays refusals of the questions
    that should be refused and punishes refusals of the ones that should not, so no single
    step's mix of kinds, drawn at random, sets the policy's refusal bias. The smaller kind is
    dealt again (reshuffled) as often as the larger kind needs, and a flat group that dynamic
    sampling refills gets a question of its own kind. The split needs questions of both kinds."""
    unanswerable_per_step: int | None = None
    """Exactly this many of every step's ``prompts_per_step`` questions unanswerable, the rest
    answerable (``balance_answerable`` is half of them): each kind shuffled with ``seed`` and
    dealt again as often as needed, flat groups refilled with their own kind, as
    ``balance_answerable``. A step's net push on the refusal bias is the sum over its groups
    of the refusals' advantages, and a group's depends on how often the policy refuses that
    kind: a start that refuses unanswerable questions far more often than answerable ones is
    pushed towards refusing everything by a step that holds as many of each, and balanced by one
    that holds fewer unanswerable ones."""
    micro_batch_size: int | None = None
    """Episodes per forward/backward pass: the step's ``prompts_per_step * G`` episodes are
    accumulated into one update in passes of this many (the same update up to float rounding;
    it must divide the batch). The activations of a pass, and the logits over the vocabulary of
    each of its tokens, grow with its tokens, so smaller passes hold less memory.
    ``None``: 1 on a CPU, the whole batch on a GPU."""
    beta: float = 0.0
    """KL coefficient (0 disables the reference model, as TRL's and DAPO's default)."""
    kl_estimator: str = "k3"
    """``k3`` (TRL's, GRPO's) or ``stabilized`` (ARENA's; see :func:`~rag_gym.train.trl_compat.stabilized_kl_trainer_class`)."""
    advantage: str = "episode"
    """How each model token's advantage is computed (:mod:`rag_gym.train.credit`):
    ``"episode"`` (GRPO's: the episode's return normalised within its group, the same for
    every token), ``"turn"`` (each turn's tokens: the group-normalised discounted return from
    that turn on) or ``"gigpo"`` (GiGPO: the episode's advantage plus ``gigpo_weight`` times a
    step advantage among the group's turns taken from the same anchor state)."""
    gamma: float = 1.0
    """Discount of the per-turn returns of ``advantage="turn"`` and ``"gigpo"``, in [0, 1]."""
    gigpo_weight: float = 1.0
    """ω, the weight of GiGPO's step advantage (``advantage="gigpo"``; the paper's 1)."""
    epsilon: float = 0.2
    """Lower clipping bound ε (ε_low)."""
    epsilon_high: float | None = None
    """Upper clipping bound; default ε for GRPO, 0.28 for DAPO."""
    dynamic_sampling: bool | None = None
    """Drop and refill flat groups; default on for DAPO, and whenever ``dynamic_sampling_on``
    is not ``"return"``."""
    dynamic_sampling_on: str = "return"
    """What makes a group flat: ``"return"`` (its returns all agree; R²AG's std > 0),
    ``"answer"`` (its answers are all right or all wrong; DAPO's eq. 11) or ``"unsolved"``
    (its answers are all wrong, or its returns all agree: the one to use with a step cost);
    see :attr:`Episode.solved <rag_gym.train.rollout.Episode.solved>`."""
    max_resample_rounds: int = 3
    """Refill rounds per batch at most (the batch goes on with what it has after them)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold of the rollouts (1: off)."""
    learning_rate: float = 2e-5
    """Peak learning rate (of the LoRA adapters with ``lora``, the default: a full-weight run
    wants about 1e-6, as the papers' recipes use)."""
    warmup_steps: int = 0
    """Steps over which the learning rate rises linearly from 0 (then it decays linearly to 0
    at ``max_steps``). Adam's first update moves every weight by about the learning rate
    whatever the gradient's size, and its momentum carries that direction through the next
    flat steps: with one question a step, the first group alone sets it, and a warmup spreads
    that first move over several groups. 0: the full rate from the first step."""
    max_steps: int = 100
    """Optimiser steps (the learning-rate schedule's length)."""
    max_turns: int = 8
    """Model turns per episode at most (the env's horizon usually ends it first)."""
    max_turn_tokens: int = 128
    """New tokens per model turn at most."""
    max_completion_tokens: int = 1024
    """Model + env tokens per episode."""
    lora: bool = True
    """Train LoRA adapters (peft) instead of all weights."""
    lora_r: int = 16
    """LoRA rank (with ``lora``)."""
    lora_alpha: int = 32
    """LoRA scaling alpha (with ``lora``)."""
    stages: tuple[tuple[Any, float], ...] | str | None = ()
    """Curriculum: ``((stage, until_fraction), …)``, e.g. LWTS ``((1, 0.5), (2, 1.0))`` (JSON
    ``[[1, 0.5], [2, 1.0]]`` on a command line);
    each stage is set on every env (:func:`~rag_gym.wrappers.presets.set_stage`) until that
    fraction of ``max_steps``."""
    output_dir: str = "runs"
    """Parent folder of the run folder."""
    exp_name: str = "grpo"
    """The run's name in W&B and in the default run folder name."""
    save_steps: int = 10
    """Checkpoint every this many steps (``resume_from_checkpoint`` picks one up)."""
    max_minutes: float | None = None
    """Wall-clock budget of the training loop: once a step ends past it, training stops there
    and saves as it would at ``max_steps`` (for a machine held for a fixed time).
    ``max_steps`` still sets the learning-rate schedule and ``stages``."""
    rollout_log_steps: int = 10
    """Save a few sampled rollouts to ``steps.jsonl`` every this many steps, and at the end
    (:mod:`rag_gym.train.rollout_log`, shown by ``rag-gym view``); 0: only at the end."""
    resume_from_checkpoint: str | None = None
    """A checkpoint folder of this run to go on from (``rag-gym train grpo --resume`` finds the newest)."""
    track: bool = False
    """Log to W&B (offline unless configured); TensorBoard is always on."""
    use_vllm: bool = False
    """Generate with TRL's colocated vLLM engine (a GPU and ``rag-gym[gpu]``)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (TRL's GRPO default is on): less memory,
    about a third more compute. Off here: ``micro_batch_size`` saves memory without the
    recomputation."""
    seed: int = 0
    """Seed of the questions drawn, the rollouts' sampling and training."""
    run_dir: str | None = None
    """Exact folder to write into; default ``output_dir/<run name>``."""

    @property
    def step_mix(self) -> tuple[int, int] | None:
        """``(questions, unanswerable)`` of the run of steps :func:`kind_order` deals, from
        ``balance_answerable`` (one of each kind, repeated) or ``unanswerable_per_step``;
        ``None`` when the kinds are drawn at random."""
        if self.balance_answerable:
            return (2, 1)
        if self.unanswerable_per_step:
            return (self.prompts_per_step, self.unanswerable_per_step)
        return None

    @property
    def episodes_per_step(self) -> int:
        """The batch of one optimisation step: ``prompts_per_step * num_generations`` episodes."""
        return self.prompts_per_step * self.num_generations

    def __post_init__(self) -> None:
        from rag_gym.train.models import model_option
        from rag_gym.train.options import dict_option, json_option
        from rag_gym.wrappers.presets import check_preset

        self.env_kwargs = dict_option("env_kwargs", self.env_kwargs)
        self.model = model_option(self.model)
        self.reward_kwargs = dict_option("reward_kwargs", self.reward_kwargs)
        stages = json_option("stages", self.stages, "'[[1, 0.5], [2, 1.0]]'") or ()
        try:
            self.stages = tuple((stage, float(until)) for stage, until in stages)
        except (TypeError, ValueError):
            raise TypeError(
                f"expected stages as (stage, until_fraction) pairs, got {self.stages!r}"
            ) from None
        check_preset(self.reward_preset)
        from rag_gym.wrappers.evo_rag import refusal_verifier_name

        refusal_verifier_name(self.refusal_verifier, "refusal_verifier")
        if self.algorithm not in ALGORITHMS:
            from rag_gym._names import unknown_name

            raise unknown_name("algorithm", self.algorithm, ALGORITHMS)
        if self.kl_estimator not in KL_ESTIMATORS:
            from rag_gym._names import unknown_name

            raise unknown_name("KL estimator", self.kl_estimator, KL_ESTIMATORS)
        if self.advantage not in MODES:
            from rag_gym._names import unknown_name

            raise unknown_name("advantage", self.advantage, MODES)
        if isinstance(self.gamma, bool) or not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"expected gamma in [0, 1], got {self.gamma!r}")
        if isinstance(self.gigpo_weight, bool) or not self.gigpo_weight >= 0.0:
            raise ValueError(f"expected gigpo_weight >= 0, got {self.gigpo_weight!r}")
        for name in (
            "num_generations",
            "prompts_per_step",
            "max_steps",
            "max_turns",
            "max_turn_tokens",
            "max_completion_tokens",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"expected {name} to be an int >= 1, got {value!r}")
        w = self.warmup_steps
        if not isinstance(w, int) or isinstance(w, bool) or not 0 <= w < self.max_steps:
            raise ValueError(
                f"expected warmup_steps to be an int in [0, max_steps = {self.max_steps}), "
                f"got {w!r}"
            )
        if self.balance_answerable and self.prompts_per_step % 2:
            raise ValueError(
                f"balance_answerable needs an even prompts_per_step (half answerable, half "
                f"unanswerable questions a step), got {self.prompts_per_step}"
            )
        k = self.unanswerable_per_step
        if k is not None:
            if self.balance_answerable:
                raise ValueError(
                    "balance_answerable and unanswerable_per_step both set each step's mix of "
                    "kinds: give one (balance_answerable is unanswerable_per_step = "
                    "prompts_per_step / 2)"
                )
            if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k < self.prompts_per_step:
                raise ValueError(
                    f"expected unanswerable_per_step to be an int in [1, prompts_per_step = "
                    f"{self.prompts_per_step}), got {k!r}: a step needs questions of both kinds"
                )
        if self.num_generations < 2:
            raise ValueError(
                f"expected num_generations >= 2 (a group needs two episodes to compare), "
                f"got {self.num_generations}"
            )
        batch = self.episodes_per_step
        micro = self.micro_batch_size
        if micro is not None and (
            not isinstance(micro, int) or isinstance(micro, bool) or micro < 1 or batch % micro
        ):
            raise ValueError(
                f"expected micro_batch_size to divide the batch of prompts_per_step * "
                f"num_generations = {batch} episodes, got {micro!r}"
            )
        if not self.beta >= 0:
            raise ValueError(f"expected beta >= 0, got {self.beta!r}")
        if self.max_minutes is not None and not (
            isinstance(self.max_minutes, (int, float)) and self.max_minutes > 0
        ):
            raise ValueError(f"expected max_minutes > 0 (or None), got {self.max_minutes!r}")
        for fraction in (f for _, f in self.stages):
            if not 0 < fraction <= 1:
                raise ValueError(f"expected stage fractions in (0, 1], got {fraction!r}")
        if self.epsilon_high is None:
            self.epsilon_high = 0.28 if self.algorithm == "dapo" else self.epsilon
        if self.dynamic_sampling_on not in FLAT_CRITERIA:
            raise ValueError(
                f"expected dynamic_sampling_on in {FLAT_CRITERIA}, got {self.dynamic_sampling_on!r}"
            )
        if self.dynamic_sampling is None:
            self.dynamic_sampling = self.algorithm == "dapo" or self.dynamic_sampling_on != "return"
        elif not self.dynamic_sampling and self.dynamic_sampling_on != "return":
            raise ValueError(
                f"dynamic_sampling_on={self.dynamic_sampling_on!r} needs dynamic_sampling: "
                "leave dynamic_sampling unset (or True), or drop dynamic_sampling_on"
            )

    def text_env(self) -> TextEnvSpec:
        """The env this run trains in (and evaluates on): this config's :class:`TextEnvSpec`
        fields."""
        return TextEnvSpec(**{f.name: getattr(self, f.name) for f in fields(TextEnvSpec)})


class EnvRollout:
    """TRL's ``rollout_func``: each prompt is a question key; one episode per prompt.

    Prompts arrive in groups of ``num_generations`` copies (TRL's ``RepeatSampler``). With
    ``dynamic_sampling``, groups whose episode returns all agree are replayed on other
    questions drawn from ``pool`` (at most ``max_resample_rounds`` times).
    """

    def __init__(
        self,
        engine: RolloutEngine,
        keys: dict[str, tuple[int, tuple[str, ...]]],
        num_generations: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        dynamic_sampling: bool = False,
        max_resample_rounds: int = 3,
        seed: int = 0,
        flat_on: str = "return",
    ) -> None:
        if flat_on not in FLAT_CRITERIA:
            raise ValueError(f"expected flat_on in {FLAT_CRITERIA}, got {flat_on!r}")
        self.flat_on = flat_on
        self.engine = engine
        self.keys = keys
        self.pool = list(keys)
        self.kinds: dict[str, list[str]] | None = None
        """With ``balance_answerable`` or ``unanswerable_per_step``: each key's pool of its own
        kind (a flat group is refilled with a question of the same kind, so the step keeps its
        mix)."""
        self.num_generations = num_generations
        self.temperature = temperature
        self.top_p = top_p
        self.dynamic_sampling = dynamic_sampling
        self.max_resample_rounds = max_resample_rounds
        self.rng = random.Random(seed)
        self.generator: Sampler | None = None
        self.last_stats: dict[str, float] = {}
        self.episodes: list[Episode] = []

    def generator_for(self, trainer: Any, episodes: int = 16) -> Callable:
        """A :class:`~rag_gym.train.rollout.Sampler` on TRL's colocated vLLM engine when the
        trainer uses vLLM, else :func:`make_generator` on the policy with a slot (a kept cache)
        for each of the ``episodes`` played at once."""
        if getattr(trainer, "use_vllm", False):
            from rag_gym.generation.vllm_lm import VLLMLM
            from rag_gym.train.trl_compat import colocated_vllm

            args = trainer.args
            return Sampler(VLLMLM.from_llm(colocated_vllm(trainer)), args.temperature, args.top_p)
        g = self.generator
        if (
            g is None
            or g.model is not trainer.model
            or (g.concurrent_clients and g.lm.batch_size < episodes)
        ):
            self.generator = make_generator(
                trainer.model,
                self.engine.tokenizer,
                temperature=self.temperature,
                top_p=self.top_p,
                batch_size=max(16, episodes),
            )
        return self.generator

    @property
    def zeroes_flat_groups(self) -> bool:
        """A group still flat after the refills trains with zero advantage (every criterion
        but ``"return"``, whose flat groups have equal returns already)."""
        return self.dynamic_sampling and self.flat_on != "return"

    def is_flat(self, group: Sequence[Episode]) -> bool:
        """The group teaches nothing under ``flat_on``: its returns all agree (``"return"``);
        its answers are all right or all wrong (``"answer"``); its answers are all wrong or
        its returns all agree (``"unsolved"``)."""
        if self.flat_on == "answer":
            return len({e.solved for e in group}) == 1
        agree = len({round(e.episode_return, 9) for e in group}) == 1
        if self.flat_on == "unsolved":
            return agree or not any(e.solved for e in group)
        return agree

    def play_keys(self, generate: Callable, keys: Sequence[str]) -> list[Episode]:
        indices = [self.keys[k][0] for k in keys]
        prefixes = [self.keys[k][1] for k in keys]
        return self.engine.play(generate, indices, prefixes=prefixes if any(prefixes) else None)

    def __call__(self, prompts: list[str], trainer: Any) -> dict[str, Any]:
        started = time.perf_counter()
        generate = self.generator_for(trainer, len(prompts))
        keys = [p if isinstance(p, str) else str(p) for p in prompts]
        unknown = [k for k in keys if k not in self.keys]
        if unknown:
            raise ValueError(f"rollout got prompts that are not question keys: {unknown[:3]}")
        episodes = self.play_keys(generate, keys)
        g = self.num_generations
        resampled = 0
        if self.dynamic_sampling and len(keys) % g == 0:
            for _ in range(self.max_resample_rounds):
                flat = [i for i in range(0, len(keys), g) if self.is_flat(episodes[i : i + g])]
                if not flat:
                    break
                new_keys: list[str] = []
                for start in flat:
                    pool = self.pool if self.kinds is None else self.kinds[keys[start]]
                    new_keys += [self.rng.choice(pool)] * g
                replay = self.play_keys(generate, new_keys)
                for n, start in enumerate(flat):
                    episodes[start : start + g] = replay[n * g : (n + 1) * g]
                resampled += len(flat)
        flat_groups = (
            [i for i in range(0, len(keys), g) if self.is_flat(episodes[i : i + g])]
            if len(keys) % g == 0
            else []
        )
        returns = [e.episode_return for e in episodes]
        if self.zeroes_flat_groups:
            for i in flat_groups:  # zero advantage: only the dense terms tell these apart
                mean = sum(returns[i : i + g]) / g
                returns[i : i + g] = [mean] * g
        self.episodes = episodes
        self.last_stats = {
            "episode/em": _mean(e.em for e in episodes),
            "episode/num_searches": _mean(e.num_searches for e in episodes),
            "episode/turns": _mean(e.turns for e in episodes),
            "episode/finished": _mean(e.finished for e in episodes),
            "episode/model_tokens": _mean(e.model_tokens for e in episodes),
            "episode/completion_tokens": _mean(len(e.completion_ids) for e in episodes),
            "episode/prompt_tokens": _mean(len(e.prompt_ids) for e in episodes),
            "episode/groups_resampled": float(resampled),
            "episode/groups_flat": float(len(flat_groups)),
            "episode/rollout_seconds": time.perf_counter() - started,
            **refusal_rates(episodes),
            **{
                f"health/{flag}": rate
                for flag, rate in health.rates(
                    _health_flags(e, self.engine.max_turn_tokens) for e in episodes
                ).items()
                if rate == rate  # nan: not known for this batch
            },
        }
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": None,
            "env_mask": [e.env_mask for e in episodes],
            "episode_return": returns,
            "reward_terms": [dict(e.reward_terms) for e in episodes],
            "num_searches": [e.num_searches for e in episodes],
            "turn_rewards": [e.turn_rewards for e in episodes],
            "turn_spans": [e.turn_spans for e in episodes],
            "anchors": [e.anchors for e in episodes],
        }


def credit_hook(cfg: EnvGRPOConfig) -> Callable[..., Any] | None:
    """The trainer's per-token ``credit`` for ``cfg.advantage`` (:mod:`rag_gym.train.credit`):
    None for ``"episode"`` (TRL's advantage, one per episode); for ``"turn"`` and ``"gigpo"``, a
    function of TRL's episode advantages, the completion width, the rollout's fields (the
    returns TRL scored, each turn's reward, span and anchor) and TRL's ``scale_rewards``."""
    if cfg.advantage == "episode":
        return None

    def credit(advantages: Any, width: int, fields: dict[str, Any], scale_rewards: str) -> Any:
        import torch

        g = cfg.num_generations
        scales = group_scales([float(r) for r in fields["episode_return"]], g, scale_rewards)
        values = turn_advantages(
            cfg.advantage,
            advantages.tolist(),
            scales,
            fields["turn_rewards"],
            fields["anchors"],
            g,
            gamma=cfg.gamma,
            omega=cfg.gigpo_weight,
        )
        rows = token_advantages(values, fields["turn_spans"], width)
        return torch.tensor(rows, dtype=advantages.dtype, device=advantages.device)

    return credit


def _health_flags(episode: Episode, max_turn_tokens: int | None) -> dict[str, bool | None]:
    """:func:`rag_gym.health.episode_flags` of a rollout: an episode that did not end with an
    answer or a refusal was cut (by the env's step limit, the token budget or the turns)."""
    ended = episode.info.get("action_type")
    return health.episode_flags(
        episode.trace.get("steps", []),
        ended,
        ended not in ("ANSWER", "REFUSE"),
        episode.trace.get("gold_ids", []),
        max_turn_tokens,
    )


def refusal_rates(episodes: Sequence[Episode]) -> dict[str, float]:
    """The share of a batch's episodes that refused, for each kind of question the batch holds:
    ``episode/refused_unanswerable`` (refusals the refusal reward pays) and
    ``episode/refused_answerable`` (refusals it punishes). Logged only for a batch with an
    unanswerable question or a refusal (a SynthHop-Hard world), where the two rates, not the
    refusal term's mean, show whether a run learns when to refuse or only how often."""
    refused = {True: [], False: []}
    for e in episodes:
        refused[bool(e.info.get("answerable", True))].append(e.refused)
    if not refused[False] and not any(refused[True]):
        return {}
    names = {False: "episode/refused_unanswerable", True: "episode/refused_answerable"}
    return {names[kind]: _mean(flags) for kind, flags in refused.items() if flags}


def reward_functions(term_names: Sequence[str], rollout: EnvRollout) -> tuple[list, list[float]]:
    """The episode return (weight 1) and one logged-only function per reward term (weight 0)."""

    def episode_return(prompts, completions, episode_return, log_metric=None, **_):
        if log_metric is not None:
            for key, value in rollout.last_stats.items():
                log_metric(key, value)
        return [float(r) for r in episode_return]

    funcs: list[Callable] = [episode_return]
    for name in term_names:

        def term(prompts, completions, reward_terms, _name=name, **_):
            return [float(t.get(_name, 0.0)) for t in reward_terms]

        term.__name__ = name
        funcs.append(term)
    return funcs, [1.0] + [0.0] * len(term_names)


def question_keys(engine: RolloutEngine) -> dict[str, tuple[int, tuple[str, ...]]]:
    """One key per question of the env's split: its id (unique within a split)."""
    return {ex.id: (i, ()) for i, ex in enumerate(engine.envs[0].unwrapped.examples)}


def balanced_order(
    keys: dict[str, tuple[int, tuple[str, ...]]], examples: Sequence[Any], seed: int
) -> list[str]:
    """``keys`` ordered answerable, unanswerable, answerable, … (each kind shuffled by ``seed``):
    every question of the larger kind once, the smaller kind's questions again (reshuffled) each
    time they run out: :attr:`EnvGRPOConfig.balance_answerable`."""
    return kind_order(keys, examples, seed, per_step=2, unanswerable=1)


def kind_order(
    keys: dict[str, tuple[int, tuple[str, ...]]],
    examples: Sequence[Any],
    seed: int,
    per_step: int,
    unanswerable: int,
) -> list[str]:
    """``keys`` in steps of ``per_step``: ``per_step - unanswerable`` answerable questions, then
    ``unanswerable`` unanswerable ones (each kind shuffled by ``seed``); as many steps as either
    kind needs to be dealt once, the other kind dealt again (reshuffled) each time it runs out:
    :attr:`EnvGRPOConfig.unanswerable_per_step`."""
    rng = random.Random(seed)
    kinds = _keys_by_kind(keys, examples)
    if not kinds[True] or not kinds[False]:
        missing = "unanswerable" if not kinds[False] else "answerable"
        raise ValueError(
            f"a step of both kinds needs answerable and unanswerable questions, but the training "
            f"split has no {missing} one: train on a world with both (e.g. SynthHop-Hard-v0 with "
            f'--env-kwargs \'{{"dataset_kwargs": {{"unanswerable_rate": 0.5}}}}\'), '
            f"or leave balance_answerable and unanswerable_per_step off"
        )
    share = {True: per_step - unanswerable, False: unanswerable}
    steps = max(-(-len(kinds[kind]) // share[kind]) for kind in kinds)
    dealt: dict[bool, list[str]] = {}
    for answerable, kind in kinds.items():
        dealt[answerable] = []
        while len(dealt[answerable]) < steps * share[answerable]:
            dealt[answerable] += rng.sample(kind, len(kind))
    order: list[str] = []
    for step in range(steps):
        for answerable in (True, False):
            n = share[answerable]
            order += dealt[answerable][step * n : (step + 1) * n]
    return order


def _keys_by_kind(
    keys: dict[str, tuple[int, tuple[str, ...]]], examples: Sequence[Any]
) -> dict[bool, list[str]]:
    """``keys`` split by their question's kind: ``{True: answerable, False: unanswerable}``."""
    kinds: dict[bool, list[str]] = {True: [], False: []}
    for key, (index, _) in keys.items():
        kinds[bool(examples[index].answerable)].append(key)
    return kinds


def kind_pools(
    keys: dict[str, tuple[int, tuple[str, ...]]], examples: Sequence[Any]
) -> dict[str, list[str]]:
    """Each key → the keys of its kind (answerable or not): where a balanced step refills."""
    kinds = _keys_by_kind(keys, examples)
    return {key: kind for kind in kinds.values() for key in kind}


def build_trainer(
    cfg: EnvGRPOConfig,
    model: Any = None,
    tokenizer: Any = None,
    keys: dict[str, tuple[int, tuple[str, ...]]] | None = None,
    max_steps: int | None = None,
    run_dir: str | Path | None = None,
    extra_rewards: Sequence[tuple[Callable, float]] = (),
) -> tuple[Any, EnvRollout]:
    """TRL's ``GRPOTrainer`` for ``cfg`` (with ``rollout_func`` and ``env_mask``, through
    :func:`~rag_gym.train.trl_compat.env_grpo_trainer_class`; the
    :func:`~rag_gym.train.trl_compat.stabilized_kl_trainer_class` for ``kl_estimator="stabilized"``)
    and its rollout function.

    ``model``/``tokenizer`` default to :func:`~rag_gym.train.models.load_policy` of
    ``cfg.model``; ``keys`` (question key → (index, replayed action prefix)) default to every
    question of the split. ``extra_rewards`` adds TRL-style reward functions
    ``fn(completions, **columns) -> list[float]`` (e.g. :mod:`rag_gym.rewards.trl`) with their
    weights to the episode return; they see the whole completion text (passages included).
    They are not flattened with a flat group's returns, so they cannot be combined with
    ``dynamic_sampling_on`` other than ``"return"``.
    """
    from rag_gym.train.trl_compat import (
        checkpointing_option,
        env_grpo_trainer_class,
        require_trl,
        stabilized_kl_trainer_class,
    )

    trl = require_trl()
    from datasets import Dataset
    from transformers import TrainerCallback

    from rag_gym.train.models import load_policy, lora_config
    from rag_gym.train.rollout_log import RolloutLog, rollout_callback
    from rag_gym.train.tracking import learning_curve, run_dir_for, trainer_arguments
    from rag_gym.wrappers import presets

    if model is None:
        model, tokenizer = load_policy(cfg.model, chat_template=cfg.chat_template)
    run_dir = run_dir_for(cfg, run_dir)
    engine = rollout_engine(cfg, tokenizer, cfg.split)
    keys = keys if keys is not None else question_keys(engine)
    probe = engine.envs[0]
    _, info = probe.reset(seed=cfg.seed, options={"question_index": 0})
    term_names = sorted(info.get("reward_terms", {}))
    rollout = EnvRollout(
        engine,
        keys,
        cfg.num_generations,
        temperature=cfg.temperature,
        top_p=cfg.top_p,
        dynamic_sampling=bool(cfg.dynamic_sampling),
        max_resample_rounds=cfg.max_resample_rounds,
        seed=cfg.seed,
        flat_on=cfg.dynamic_sampling_on,
    )
    funcs, weights = reward_functions(term_names, rollout)
    if rollout.zeroes_flat_groups and any(w for _, w in extra_rewards):
        raise ValueError(
            f"dynamic_sampling_on={rollout.flat_on!r} gives a flat group zero advantage through "
            "its episode returns, which extra reward functions would undo: train them into the "
            "env's reward (a preset or wrapper), or use dynamic_sampling_on='return'"
        )
    if cfg.advantage != "episode" and any(w for _, w in extra_rewards):
        raise ValueError(
            f"advantage={cfg.advantage!r} credits each turn with the env's reward for its step, "
            "and an extra reward function scores whole episodes: train it into the env's reward "
            "(a preset or wrapper), or use advantage='episode'"
        )
    for fn, weight in extra_rewards:
        funcs.append(fn)
        weights.append(float(weight))
    steps = max_steps or cfg.max_steps
    import torch

    micro = micro_batch(cfg, torch.cuda.is_available())

    args = trl.GRPOConfig(
        **trainer_arguments(cfg, run_dir),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=cfg.episodes_per_step // micro,
        **{name: getattr(cfg, name) for name in TRL_FIELDS},
        max_completion_length=cfg.max_completion_tokens,
        loss_type="dapo" if cfg.algorithm == "dapo" else "grpo",
        mask_truncated_completions=cfg.algorithm == "dapo",
        reward_weights=weights,
        max_steps=steps,
        vllm_mode="colocate",
        remove_unused_columns=False,
        shuffle_dataset=cfg.step_mix is None,
        disable_dropout=True,
        log_completions=False,
        **checkpointing_option(trl.GRPOConfig, cfg.gradient_checkpointing),
    )
    peft_config = lora_config(cfg.lora_r, cfg.lora_alpha) if cfg.lora else None
    if cfg.step_mix is not None:
        examples = engine.envs[0].unwrapped.examples
        order = kind_order(keys, examples, cfg.seed, *cfg.step_mix)
        rollout.kinds = kind_pools(keys, examples)
    else:
        order = list(keys)
    dataset = Dataset.from_dict({"prompt": order})

    class Stages(TrainerCallback):
        def __init__(self) -> None:
            self.current: Any = None

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if not cfg.stages:
                return
            fraction = state.global_step / max(1, state.max_steps)
            stage = next((s for s, until in cfg.stages if fraction < until), cfg.stages[-1][0])
            if stage != self.current:
                for env in engine.envs:
                    presets.set_stage(env, stage)
                self.current = stage

    rollout_log = RolloutLog(run_dir, every=cfg.rollout_log_steps, seed=cfg.seed)

    class Curve(TrainerCallback):
        def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step not in rollout_log.saved_steps:
                rollout_log(int(state.global_step), rollout.episodes, force=True)
            learning_curve(
                state.log_history,
                run_dir / "learning_curve.png",
                [
                    "reward",
                    "episode/em",
                    "episode/num_searches",
                    "episode/refused_unanswerable",  # a world with unanswerable questions
                    "episode/refused_answerable",
                    "loss",
                    "kl",
                ],
                title=run_dir.name,
            )

    # TRL's trainer, scoring the model's tokens only; ARENA's KL estimator has no public hook
    trainer_class = (
        env_grpo_trainer_class() if cfg.kl_estimator == "k3" else stabilized_kl_trainer_class()
    )
    trainer = trainer_class(
        model=model,
        reward_funcs=funcs,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
        rollout_func=rollout,
        callbacks=[
            Stages(),
            Curve(),
            rollout_callback(rollout_log, rollout),
            *([time_limit_callback(cfg.max_minutes)] if cfg.max_minutes else []),
        ],
    )
    if cfg.advantage != "episode" and trainer.accelerator.num_processes > 1:
        raise ValueError(
            f"advantage={cfg.advantage!r} reads whole groups of episodes in one process, and "
            f"this run has {trainer.accelerator.num_processes}: run it in one process, or use "
            "advantage='episode'"
        )
    trainer.credit = credit_hook(cfg)
    # The rollout plays episodes with the trainer's (possibly PEFT-wrapped) model.
    rollout.generator = None
    run_dir.mkdir(parents=True, exist_ok=True)
    # the tag set the policy learns to write, as played (a text-in preset picks its own): what
    # ``search_r1:RUN`` plays the checkpoint with
    record = {**asdict(cfg), "tags": played_tags(engine.envs[0]) or cfg.tags}
    (run_dir / "config.json").write_text(_json(record))
    return trainer, rollout


def time_limit_callback(minutes: float) -> Any:
    """A ``TrainerCallback`` that stops training (with a save) at the end of the first step that
    ends ``minutes`` after training began (:attr:`EnvGRPOConfig.max_minutes`)."""
    import time

    from transformers import TrainerCallback

    class TimeLimit(TrainerCallback):
        def __init__(self) -> None:
            self.started: float | None = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.started = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if self.started is not None and time.monotonic() - self.started >= 60 * minutes:
                print(
                    f"max_minutes={minutes:g} reached at step {state.global_step}: stopping",
                    flush=True,
                )
                control.should_training_stop = True
                control.should_save = True

    return TimeLimit()


def micro_batch(cfg: EnvGRPOConfig, cuda: bool) -> int:
    """Episodes per forward/backward pass of ``cfg`` (its ``micro_batch_size``, else 1 on a
    CPU and the whole step's batch on a GPU)."""
    if cfg.micro_batch_size is not None:
        return cfg.micro_batch_size
    return cfg.episodes_per_step if cuda else 1


def resume_config(run_dir: str | Path) -> tuple[EnvGRPOConfig, str | None, int | None]:
    """The config, SFT ``init`` and ``eval_n`` of the stopped run in ``run_dir``, set to go on
    from its newest ``checkpoint-N`` (what ``rag-gym train grpo --resume RUN`` runs)."""
    import json

    run_dir = Path(run_dir)
    config, started = run_dir / "config.json", run_dir / "init.json"
    if not config.is_file() or not started.is_file():
        raise FileNotFoundError(
            f"expected a GRPO run folder (config.json and init.json) to resume, got {run_dir}: "
            "pass the folder `rag-gym train grpo` printed or wrote"
        )
    from transformers.trainer_utils import get_last_checkpoint

    checkpoint = get_last_checkpoint(run_dir)
    if checkpoint is None:
        raise FileNotFoundError(
            f"expected a checkpoint-N folder in {run_dir} to resume from, found none (the run "
            "stopped before its first save_steps): start it again"
        )
    record = json.loads(config.read_text())
    # runs from before the option judged refusals on the evidence so far
    record.setdefault("refusal_verifier", "evidence")
    known = {f.name for f in fields(EnvGRPOConfig)}
    gone = sorted(set(record) - known)
    if gone:
        import warnings

        warnings.warn(
            f"{config} sets options this version no longer has, resumed without them: {gone}",
            stacklevel=2,
        )
        record = {k: v for k, v in record.items() if k in known}
    record.update(run_dir=str(run_dir), resume_from_checkpoint=checkpoint)
    start = json.loads(started.read_text())
    return EnvGRPOConfig(**record), start.get("init"), start.get("eval_n")


def _json(obj: Any) -> str:
    import json

    return json.dumps(obj, indent=2, default=str)


def train(cfg: EnvGRPOConfig) -> dict[str, Any]:
    """Run ``cfg`` to the end (or resume it) and return the trainer's log history and folder."""
    trainer, _ = build_trainer(cfg)
    trainer.train(resume_from_checkpoint=cfg.resume_from_checkpoint)
    trainer.save_model(str(Path(trainer.args.output_dir) / "final"))
    return {"run_dir": trainer.args.output_dir, "log_history": trainer.state.log_history}


def train_forest(
    cfg: EnvGRPOConfig, iterations: int = 5, steps_per_iteration: int | None = None
) -> dict[str, Any]:
    """R²AG's iterative forest training (R²AG, appendix B.1–B.2) on a tree env.

    Round 1 trains on the roots (each question with no evidence). After each round the policy
    expands every context once; expansions that hit a gold document and neither stop nor end
    the episode become the next round's contexts (the tree env with ``prune="gold"`` keeps only
    the gold-hitting branches as evidence), each replayed from its question by its action
    prefix. At most ``iterations`` rounds (R²AG: 5), fewer when no context survives. Every
    rollout is one expansion (``max_turns=1``): its reward is that step's R²AG reward.
    """
    if not isinstance(iterations, int) or not 1 <= iterations <= 50:
        raise ValueError(f"expected iterations in [1, 50], got {iterations!r}")
    if cfg.step_mix is not None:
        raise ValueError(
            "balance_answerable and unanswerable_per_step do not apply to train_forest: its "
            "later rounds train on gold-hitting contexts, not on the split's questions; leave "
            "them off"
        )
    from rag_gym.train.models import load_policy
    from rag_gym.train.tracking import run_dir_for

    cfg.max_turns = 1
    model, tokenizer = load_policy(cfg.model, chat_template=cfg.chat_template)
    root = run_dir_for(cfg)
    steps = steps_per_iteration or max(1, math.ceil(cfg.max_steps / iterations))
    keys: dict[str, tuple[int, tuple[str, ...]]] | None = None
    history: list[dict[str, Any]] = []
    for round_ in range(1, iterations + 1):
        trainer, rollout = build_trainer(
            cfg, model, tokenizer, keys=keys, max_steps=steps, run_dir=root / f"round{round_}"
        )
        trainer.train()
        model = trainer.model
        history.append(
            {"round": round_, "contexts": len(rollout.keys), "log": trainer.state.log_history}
        )
        keys = _next_contexts(
            rollout, make_generator(model, tokenizer, temperature=cfg.temperature)
        )
        if not keys:
            break
    return {"run_dir": str(root), "rounds": history}


def _next_contexts(
    rollout: EnvRollout, generate: Callable
) -> dict[str, tuple[int, tuple[str, ...]]]:
    keys = list(rollout.keys)
    nxt: dict[str, tuple[int, tuple[str, ...]]] = {}
    for start in range(0, len(keys), 16):
        chunk = keys[start : start + 16]
        for key, ep in zip(chunk, rollout.play_keys(generate, chunk), strict=True):
            index, prefix = rollout.keys[key]
            if ep.finished or not any(b.get("gold_hits") for b in ep.info.get("branches", [])):
                continue
            action = rollout.engine.tokenizer.decode(
                [t for t, m in zip(ep.completion_ids, ep.env_mask, strict=True) if m],
                skip_special_tokens=True,
            )
            nxt[f"{key}>{len(prefix) + 1}"] = (index, (*prefix, action))
    return nxt


def load_with_adapter(
    base: str, init: str | Path, trainable: bool = True, chat_template: str | None = None
) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the policy ``base`` with the LoRA adapter of ``init`` (an adapter
    folder, or a run folder with ``final/``) applied, its weights trainable. ``chat_template``
    ``None`` is the one ``init``'s run recorded (:func:`~rag_gym.agents.provenance.
    recorded_chat_template`), else the base's own."""
    from peft import PeftModel

    from rag_gym.agents.provenance import recorded_chat_template
    from rag_gym.generation.adapters import AdapterError, resolve_adapter
    from rag_gym.train.models import load_policy

    folder = resolve_adapter(init)
    if chat_template is None:
        chat_template = recorded_chat_template(folder)
    model, tokenizer = load_policy(base, chat_template=chat_template)
    try:
        model = PeftModel.from_pretrained(model, str(folder), is_trainable=trainable)
    except (RuntimeError, ValueError, KeyError) as exc:
        raise AdapterError(
            f"the adapter in {folder} does not fit the base model {base!r} ({exc}); pass "
            "--model with the base it was trained on"
        ) from exc
    return model, tokenizer


def _held_out_em(
    when: str, model: Any, tokenizer: Any, engine: RolloutEngine | None, n: int | None
) -> dict[str, Any] | None:
    """:func:`evaluate_policy` on the held-out questions, said on stdout as it starts and ends
    (it runs for minutes on a CPU, with no other output)."""
    if engine is None:
        return None
    total = engine.n_questions if n is None else min(n, engine.n_questions)
    print(f"held-out EM {when}: {total} greedy validation episodes...", flush=True)
    t0 = time.perf_counter()
    scores = evaluate_policy(model, tokenizer, engine, n=n)
    print(f"held-out EM {when}: {scores['em']:.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return scores


def train_from(
    cfg: EnvGRPOConfig, init: str | Path | None = None, eval_n: int | None = 100
) -> dict[str, Any]:
    """GRPO/DAPO from the SFT checkpoint ``init`` (its LoRA adapter goes on training; with
    ``beta > 0`` the KL's reference is TRL's frozen ``"ref"`` copy of that adapter), with held-out
    EM before and after on ``eval_n`` validation questions. Writes ``results.json`` beside the
    trainer's files and returns its content."""

    if cfg.resume_from_checkpoint is not None and not Path(cfg.resume_from_checkpoint).is_dir():
        raise FileNotFoundError(
            f"expected resume_from_checkpoint to be a checkpoint folder, got "
            f"{cfg.resume_from_checkpoint!r} (no such folder)"
        )
    if init is not None:
        model, tokenizer = load_with_adapter(cfg.model, init, chat_template=cfg.chat_template)
        cfg.lora = False  # the adapter is already there
    else:
        from rag_gym.train.models import load_policy

        model, tokenizer = load_policy(cfg.model, chat_template=cfg.chat_template)
    t0 = time.perf_counter()
    held_out = rollout_engine(cfg, tokenizer, "validation") if eval_n else None
    before = _held_out_em("before training", model, tokenizer, held_out, eval_n)
    trainer, rollout = build_trainer(cfg, model, tokenizer)
    # the run's own record of where it started, read back by resume_config
    from rag_gym.train.models import policy_template

    start = {"init": None if init is None else str(Path(init).resolve()), "eval_n": eval_n}
    start["chat_template"] = policy_template(tokenizer)  # the rollouts' prompts
    (Path(trainer.args.output_dir) / "init.json").write_text(_json(start))
    t1 = time.perf_counter()
    trainer.train(resume_from_checkpoint=cfg.resume_from_checkpoint)
    t2 = time.perf_counter()
    final = Path(trainer.args.output_dir) / "final"
    trainer.save_model(str(final))
    after = _held_out_em("after training", trainer.model, tokenizer, held_out, eval_n)
    results = {
        "stage": cfg.algorithm,
        "init": None if init is None else str(init),
        "run_dir": trainer.args.output_dir,
        "checkpoint": str(final),
        "eval_split": "validation",
        "before": before,
        "after": after,
        "generation": rollout.generator.lm.describe() if rollout.generator else None,
        "seconds": {
            "eval_before": t1 - t0,
            "train": t2 - t1,
            "eval_after": time.perf_counter() - t2,
        },
        "log_history": trainer.state.log_history,
    }
    Path(trainer.args.output_dir, "results.json").write_text(_json(results))
    return results
