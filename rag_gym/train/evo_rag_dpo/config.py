"""EVO-RAG DPO's options (:class:`EvoRagDPOConfig`) and the paper's constants."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass, field
from typing import Any

from rag_gym.train.episodes import TextEnvSpec
from rag_gym.train.options import dict_option

#: The action types a sibling can take (§3.1); the rollout's own action is one branch, these the
#: others.
SIBLING_ACTIONS = ("SEARCH", "BACKTRACK", "ANSWER", "REFUSE")
#: The two curriculum stages (§3.5), in order.
STAGES = ("discovery", "refinement")
#: Δ (§3.3): the return gap a reward-model pair needs.
RM_MARGIN = 0.3
#: δ (§3.4 (ii)): the preference-model score gap a policy pair needs.
POLICY_MARGIN = 0.2
_TOL = 1e-9  # returns are sums of floats: 0.5 − 0.2 must count as a gap of 0.3


@dataclass
class EvoRagDPOConfig:
    """Options of an EVO-RAG preference-training run (the module docstring has the algorithm)."""

    env_id: str = "rag_gym/SynthHop-v0"
    """A registered search-env id (``rag-gym envs`` lists them)."""
    env_kwargs: dict[str, Any] | str | None = field(default_factory=dict)
    """Extra ``gym.make`` keyword arguments (``dataset_kwargs``, ``k``, ``data_path``…); a JSON
    object on a command line."""
    split: str = "train"
    """The split whose questions are rolled out."""
    eval_split: str = "validation"
    """The split of the dev check that picks each stage's best checkpoint."""
    max_episode_steps: int | None = None
    """T_max, the horizon of the time-dynamic weights ``p(t) = t / T_max``; ``None`` keeps the
    paper's 20 (§3.6)."""
    model: str = "embedded"
    """``embedded`` (SmolLM2-135M-Instruct), ``tiny`` (a random 2-layer model for smoke tests),
    a hub id or a directory."""
    encoder: str | None = None
    """The preference model's frozen encoder: ``None`` is the embedded all-MiniLM-L6-v2, else a
    sentence-transformers id or path (the paper uses an LLM encoder, e.g. LLaMA-3.1-8B, §3.3)."""
    episodes_per_cycle: int = 64
    """N (§3.4 (i)): episodes rolled out per cycle (the paper gives no value)."""
    max_branch_states: int | None = None
    """Visited states branched per episode, drawn at random; ``None`` branches every state
    (Algorithm 1). A cap bounds the cost: each branch is a further episode."""
    sibling_actions: tuple[str, ...] | str | None = SIBLING_ACTIONS
    """The action types tried as siblings at a state (besides the policy's own action); a JSON
    list such as ``["SEARCH", "ANSWER"]`` on a command line."""
    rm_margin: float = RM_MARGIN
    """Δ (§3.3): reward-model pairs need ``|R(x⁺) − R(x⁻)| ≥ Δ``."""
    policy_margin: float = POLICY_MARGIN
    """δ (§3.4 (ii)): a policy pair needs a preference-model score gap ``≥ δ``."""
    rm_learning_rate: float = 1e-2
    """Adam's learning rate for the seven heads (the paper gives no optimiser; linear heads on
    unit-norm embeddings learn in a few steps at this rate)."""
    rm_batch_size: int = 16
    """Pairs per preference-model update (small, so one epoch is several updates even on the
    few pairs of a small run)."""
    beta: float = 0.1
    """β of the DPO loss (§3.4)."""
    learning_rate: float = 5e-6
    """The policy's (LoRA) learning rate (§3.4)."""
    per_device_batch_size: int = 8
    """Policy pairs per forward pass; the effective batch is this × ``gradient_accumulation_steps``
    (§3.4: 64 = 8 × 8)."""
    gradient_accumulation_steps: int = 8
    """§3.4: 8-fold accumulation."""
    reference_free: bool = True
    """``True``: §3.4's printed loss ``−log σ(β[log π(x⁺) − log π(x⁻)])``; ``False``: DPO against
    the policy as it was when the policy epoch began."""
    lora_r: int = 16
    """LoRA rank (the paper uses LoRA adapters, §3.4, without a rank)."""
    lora_alpha: int = 32
    """LoRA scaling α."""
    cycles_per_stage: int = 10
    """Cycles per stage at most (the paper stops on the dev check only)."""
    patience: int = 2
    """A stage stops after this many cycles without a new best dev score (§3.4: two)."""
    eval_questions: int = 64
    """Questions of ``eval_split`` in the dev check (greedy); fewer when the split is smaller."""
    temperature: float = 1.0
    """Sampling temperature of roll-outs and branches."""
    top_p: float = 1.0
    """Nucleus sampling of roll-outs and branches."""
    max_turns: int | None = None
    """Model turns per episode at most; ``None``: T_max (one env step per turn)."""
    max_turn_tokens: int = 128
    """New tokens per turn at most."""
    max_completion_tokens: int = 2048
    """Model + env tokens per episode at most."""
    batch_size: int = 32
    """Episodes (and branches) played at once: env copies and generation batch."""
    gradient_checkpointing: bool = False
    """Gradient checkpointing in the policy epoch (saves memory on large models)."""
    output_dir: str = "runs"
    """Parent folder of the run folder."""
    exp_name: str = "evo_rag_dpo"
    """Part of the run name."""
    seed: int = 0
    """Seeds sampling, question order, the preference model and the trainers."""
    track: bool = False
    """Log to W&B (offline unless configured); TensorBoard is always on."""
    run_dir: str | None = None
    """Exact folder to write into; default ``output_dir/<run name>``."""

    def __post_init__(self) -> None:
        from rag_gym._names import unknown_name

        for name in ("env_id", "split", "eval_split", "model", "output_dir", "exp_name"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(
                    f"expected {name} to be a str, got {type(getattr(self, name)).__name__}"
                )
        self.env_kwargs = dict_option("env_kwargs", self.env_kwargs)
        if isinstance(self.sibling_actions, str):  # a JSON list on a command line
            with contextlib.suppress(json.JSONDecodeError):  # else refused below
                self.sibling_actions = json.loads(self.sibling_actions)
        for name in (
            "episodes_per_cycle",
            "rm_batch_size",
            "per_device_batch_size",
            "gradient_accumulation_steps",
            "lora_r",
            "lora_alpha",
            "cycles_per_stage",
            "patience",
            "eval_questions",
            "max_turn_tokens",
            "max_completion_tokens",
            "batch_size",
        ):
            _check_int(name, getattr(self, name))
        for name in ("max_episode_steps", "max_branch_states", "max_turns"):
            if getattr(self, name) is not None:
                _check_int(name, getattr(self, name))
        if isinstance(self.sibling_actions, str) or not isinstance(
            self.sibling_actions, (tuple, list)
        ):
            raise TypeError(
                "expected sibling_actions to be a tuple of action names such as "
                f"('SEARCH', 'ANSWER'), got {self.sibling_actions!r}"
            )
        if not self.sibling_actions:
            raise ValueError("expected at least one sibling action, got ()")
        for action in self.sibling_actions:
            if action not in SIBLING_ACTIONS:
                raise unknown_name("sibling action", action, SIBLING_ACTIONS)
        self.sibling_actions = tuple(self.sibling_actions)
        for name in ("rm_margin", "policy_margin"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ValueError(f"expected {name} >= 0, got {value!r}")
        for name in ("rm_learning_rate", "beta", "learning_rate"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"expected {name} > 0, got {value!r}")
        if not isinstance(self.temperature, (int, float)) or not self.temperature >= 0:
            raise ValueError(f"expected temperature >= 0, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            raise ValueError(f"expected top_p in (0, 1], got {self.top_p!r}")
        if self.encoder is not None and not isinstance(self.encoder, str):
            raise TypeError(
                f"expected encoder to be None or a model id / path, got {type(self.encoder).__name__}"
            )

    def text_env(self) -> TextEnvSpec:
        """The ``evo_rag`` text-action env (reward preset and tags) with this run's horizon and
        token budgets; a turn per env step, T_max turns at most."""
        return TextEnvSpec(
            env_id=self.env_id,
            env_kwargs=self.env_kwargs,
            reward_preset="evo_rag",
            tags="evo_rag",
            max_episode_steps=self.max_episode_steps,
            max_turns=self.max_turns or self.max_episode_steps or 20,
            max_turn_tokens=self.max_turn_tokens,
            max_completion_tokens=self.max_completion_tokens,
        )


def _check_int(name: str, value: Any, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected {name} to be an int, got {type(value).__name__}: {value!r}")
    if value < minimum:
        raise ValueError(f"expected {name} >= {minimum}, got {value}")
