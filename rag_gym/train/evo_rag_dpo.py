"""EVO-RAG's preference training (``000-evo-rag.txt`` §3.3–3.5, Algorithm 1): sibling branches,
a multi-head preference model and DPO on LoRA adapters, over two curriculum stages.

One *cycle* (§3.4 "Policy learning alternates three steps", Algorithm 1 lines 3–12):

1. **Roll-out** (§3.4 (i)): the current policy plays ``episodes_per_cycle`` training episodes in
   the ``evo_rag`` text-action env (SEARCH / BACKTRACK / ANSWER / REFUSE, §3.1), whose reward is
   ``R_t = Σ_k w_k(t) r_k`` with the stage's time-dynamic Table 1 weights (§3.5–3.6).
2. **Sibling branches** (§3.3, Algorithm 1 line 10): at each visited state ``s_t`` the policy's own
   action is one branch; every other action type is a sibling. A sibling SEARCH or ANSWER is
   written by the policy after its opening tag (``<search>`` → the policy's query); BACKTRACK
   and REFUSE are the fixed ``<backtrack/>`` / ``<refuse/>`` (BACKTRACK only where the env allows
   it). Each sibling is executed and its branch completed by the current policy until the
   episode ends. A state is restored by resetting the env on the question and replaying the
   action texts before it (the env is deterministic; the replay is checked against the
   rollout's return).
3. **Scoring**: each branch ``x`` gets ``R(x) = Σ_t w_t · r_t(s_t, a_t)``, the cumulative
   time-weighted return of its whole trajectory (the shared prefix plus the branch).
4. **Reward-model pairs** (§3.3): two siblings of one state whose returns differ by
   ``|R(x⁺) − R(x⁻)| ≥ Δ = 0.3`` make a pair, ``x⁺`` the higher. Pairs accumulate over the stage
   (Algorithm 1 line 10 "Store … sibling preferences").
5. **Preference model epoch** (§3.3): :class:`PreferenceModel`, a frozen encoder (the embedded
   all-MiniLM-L6-v2) embedding each trajectory prefix ending in the branch's action, seven
   linear heads ``f_φ^(k)``, one per reward term, trained one epoch on
   ``L_RM = −(1/7) Σ_k log σ(f^(k)(x⁺) − f^(k)(x⁻))``.
6. **Policy pairs** (§3.4 (ii)): at each state, the siblings the preference model scores highest
   and lowest (score: the mean of the seven heads, the scalar whose pairwise loss is ``L_RM``)
   make one pair when their scores differ by at least ``δ = 0.2``.
7. **Policy epoch** (§3.4 (iii)): one epoch of TRL's ``DPOTrainer`` on LoRA adapters, β = 0.1,
   learning rate 5e-6, effective batch 64 (8 × 8-fold accumulation); the pair's prompt is the
   exact token context the policy acted in (prompt, its earlier actions and the retrieved
   passages), chosen / rejected the two action's tokens.
8. **Dev check** (§3.4 "Training stops if … dev EM stalls for two cycles"): greedy EM on
   ``eval_questions`` validation questions; each cycle's adapter is saved; the stage's best is
   the highest dev EM, ties going to the higher dev return (small models often tie at EM 0);
   the stage stops after ``patience`` cycles without a new best.

The *Discovery* stage runs cycles under Table 1's Start → Mid weights; then the best Discovery
checkpoint is reloaded (§3.5 "we reload the best-performing checkpoint from the previous
stage") and the *Refinement* stage runs under Mid → End (Algorithm 1 line 2).

Readings of the paper, where it leaves room:

* §3.4 prints the DPO loss without a reference model, ``−log σ(β[log π_θ(x⁺) − log π_θ(x⁻)])``;
  ``reference_free=True`` (the default) trains exactly that (TRL's loss with reference log-probs
  of 0). ``reference_free=False`` is Rafailov et al.'s DPO against the policy as it was when
  the policy epoch began. Without a reference nothing normalises for length: a pair whose
  chosen action is much shorter (``<refuse/>``) than its rejected one starts with a loss near 0
  and teaches little, while the reverse pair teaches a lot.
* The printed ``L_RM`` gives all seven heads the same pair (``x⁺`` has the higher *total*
  return), so the heads differ only by their random initialisation; it is implemented as
  printed. Policy pairs rank siblings by the preference model, not by the returns: that is what
  the alternation of a reward-model epoch with a policy epoch serves.
* The paper gives no value for N (episodes per cycle), the preference model's optimiser, the
  LoRA rank or the maximum number of cycles; the defaults below say so.

>>> preference_pairs([1.0, 0.7, 0.69, 0.0])  # |ΔR| ≥ 0.3, the higher first
[(0, 1), (0, 2), (0, 3), (1, 3), (2, 3)]
>>> policy_pair([0.1, 0.3, 0.25]), policy_pair([0.1, 0.29])  # the score gap must reach 0.2
((1, 0), None)
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rag_gym.rewards.core import EVO_RAG_TERMS
from rag_gym.train.episodes import TextEnvSpec, evaluate_policy, rollout_engine
from rag_gym.train.rollout import Episode, RolloutEngine, generation_info, make_generator

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


def _require_trl():
    from rag_gym.train.trl_compat import require_trl

    trl = require_trl()
    import peft

    return trl, peft


def _torch():
    try:
        import torch
    except ImportError as exc:
        raise ImportError(
            "the preference model needs torch: pip install torch==2.13.0 'rag-gym[dense]'"
        ) from exc
    return torch


# ==================================== configuration ============================================
@dataclass
class EvoRagDPOConfig:
    """Options of an EVO-RAG preference-training run (the module docstring has the algorithm)."""

    env_id: str = "rag_gym/SynthHop-v0"
    """A registered search-env id (``rag-gym envs`` lists them)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra ``gym.make`` keyword arguments (``dataset_kwargs``, ``k``, ``data_path``…)."""
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
    sibling_actions: tuple[str, ...] = SIBLING_ACTIONS
    """The action types tried as siblings at a state (besides the policy's own action)."""
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
        if not isinstance(self.env_kwargs, dict):
            raise TypeError(
                f"expected env_kwargs to be a dict, got {type(self.env_kwargs).__name__}"
            )
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


# ==================================== pair selection ===========================================
def preference_pairs(returns: Sequence[float], margin: float = RM_MARGIN) -> list[tuple[int, int]]:
    """Reward-model pairs among one state's siblings (§3.3): ``(i⁺, i⁻)`` for every two branches
    whose returns differ by at least ``margin`` (Δ = 0.3), the higher return first."""
    pairs = []
    for i in range(len(returns)):
        for j in range(i + 1, len(returns)):
            gap = float(returns[i]) - float(returns[j])
            if abs(gap) >= margin - _TOL:
                pairs.append((i, j) if gap > 0 else (j, i))
    return pairs


def policy_pair(scores: Sequence[float], margin: float = POLICY_MARGIN) -> tuple[int, int] | None:
    """The policy pair of one state (§3.4 (ii)): ``(best, worst)`` by preference-model score when
    the gap is at least ``margin`` (δ = 0.2), else ``None``. Ties go to the earlier sibling."""
    if len(scores) < 2:
        return None
    best = max(range(len(scores)), key=lambda i: (scores[i], -i))
    worst = min(range(len(scores)), key=lambda i: (scores[i], i))
    if best != worst and float(scores[best]) - float(scores[worst]) >= margin - _TOL:
        return best, worst
    return None


# ==================================== preference model =========================================
class PreferenceModel:
    """f_φ (§3.3): a frozen encoder and seven linear heads, one per EVO-RAG reward term.

    ``score(x) = (1/7) Σ_k f^(k)(x)``, and the loss over pairs ``(x⁺, x⁻)`` is the averaged
    pairwise logistic loss ``L_RM = −(1/7) Σ_k log σ(f^(k)(x⁺) − f^(k)(x⁻))`` (mean over pairs).
    Only the heads train (Adam); embeddings are cached per text.

    Args:
        encoder: ``None`` (the embedded all-MiniLM-L6-v2), a sentence-transformers id or path,
            or a callable ``texts -> array (n, d)``.
        n_heads: one per reward term (seven, :data:`~rag_gym.rewards.core.EVO_RAG_TERMS`).
        learning_rate: Adam's.
        seed: initialises the heads (the heads differ only by it: they see the same pairs).
    """

    def __init__(
        self,
        encoder: str | Path | Callable[[Sequence[str]], Any] | None = None,
        n_heads: int = len(EVO_RAG_TERMS),
        learning_rate: float = 1e-2,
        seed: int = 0,
    ) -> None:
        torch = _torch()
        from rag_gym.retrieval.encoders import SentenceEncoder, default_encoder

        _check_int("n_heads", n_heads)
        if encoder is None:
            encoder = default_encoder()
        elif isinstance(encoder, (str, Path)):
            encoder = SentenceEncoder(encoder)
        elif not callable(encoder):
            raise TypeError(
                "expected encoder to be None, a model id / path or a callable texts -> array, "
                f"got {type(encoder).__name__}"
            )
        self.encoder = encoder
        self._cache: dict[str, np.ndarray] = {}
        dim = self._embed_numpy(["probe"]).shape[1]
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.heads = torch.nn.Linear(dim, n_heads)
        self.optimizer = torch.optim.Adam(self.heads.parameters(), lr=learning_rate)

    @property
    def n_heads(self) -> int:
        return int(self.heads.out_features)

    def _embed_numpy(self, texts: Sequence[str]) -> np.ndarray:
        missing = list(dict.fromkeys(t for t in texts if t not in self._cache))
        if missing:
            vectors = np.asarray(self.encoder(missing), dtype=np.float32)
            if vectors.ndim != 2 or len(vectors) != len(missing):
                raise ValueError(
                    f"expected the encoder to return an array (n, d) for n={len(missing)} texts, "
                    f"got shape {vectors.shape}"
                )
            self._cache.update(zip(missing, vectors, strict=True))
        return np.stack([self._cache[t] for t in texts])

    def embed(self, texts: Sequence[str]) -> Any:
        """The frozen encoder's embeddings as a float32 tensor ``(n, d)``."""
        torch = _torch()
        return torch.from_numpy(self._embed_numpy(list(texts)))

    def head_scores(self, texts: Sequence[str]) -> Any:
        """``f^(k)(x)`` for every text and head: a tensor ``(n, n_heads)``."""
        return self.heads(self.embed(texts))

    def scores(self, texts: Sequence[str]) -> list[float]:
        """The scalar score of each text: the mean of its heads."""
        torch = _torch()
        if not texts:
            return []
        with torch.no_grad():
            return self.head_scores(texts).mean(dim=1).tolist()

    def loss(self, chosen: Sequence[str], rejected: Sequence[str]) -> Any:
        """``L_RM`` over the pairs ``(chosen[i], rejected[i])`` (a scalar tensor)."""
        torch = _torch()
        if len(chosen) != len(rejected) or not chosen:
            raise ValueError(
                f"expected as many chosen as rejected texts (at least one), "
                f"got {len(chosen)} and {len(rejected)}"
            )
        gap = self.head_scores(chosen) - self.head_scores(rejected)
        return -torch.nn.functional.logsigmoid(gap).mean()

    def train_epoch(
        self, pairs: Sequence[tuple[str, str]], batch_size: int = 64, seed: int = 0
    ) -> float:
        """One pass over ``pairs`` (shuffled) in batches of ``batch_size``; returns the mean loss
        of the batches (each measured before its update)."""
        order = list(range(len(pairs)))
        random.Random(seed).shuffle(order)
        losses = []
        for start in range(0, len(order), batch_size):
            batch = [pairs[i] for i in order[start : start + batch_size]]
            loss = self.loss([p for p, _ in batch], [n for _, n in batch])
            self.optimizer.zero_grad()
            loss.backward()
            self.optimizer.step()
            losses.append(float(loss.item()))
        return float(np.mean(losses)) if losses else float("nan")

    def evaluate(self, pairs: Sequence[tuple[str, str]]) -> dict[str, float]:
        """``L_RM`` and the accuracy (``score(x⁺) > score(x⁻)``) on ``pairs``, no update."""
        torch = _torch()
        if not pairs:
            return {"loss": float("nan"), "accuracy": float("nan")}
        with torch.no_grad():
            loss = float(self.loss([p for p, _ in pairs], [n for _, n in pairs]).item())
        chosen = self.scores([p for p, _ in pairs])
        rejected = self.scores([n for _, n in pairs])
        accuracy = float(np.mean([c > r for c, r in zip(chosen, rejected, strict=True)]))
        return {"loss": loss, "accuracy": accuracy}

    def save(self, path: str | Path) -> Path:
        """Write the heads to a safetensors file."""
        from safetensors.torch import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous() for k, v in self.heads.state_dict().items()}, path)
        return path

    def load(self, path: str | Path) -> None:
        """Read heads written by :meth:`save`."""
        from safetensors.torch import load_file

        self.heads.load_state_dict(load_file(str(path)))


# ==================================== branching ================================================
@dataclass
class ReplayStep:
    """One replayed env step of an episode."""

    action_text: str
    """The text the env received."""
    action_type: str
    """The action executed (``SEARCH`` … ``REFUSE``), or ``INVALID`` when no action tag parsed."""
    reward: float
    reward_terms: dict[str, float]
    observation: str
    """What the model read next."""
    mask_before: list[int]
    """The env's ``action_mask`` at the state before the step."""


@dataclass
class Replay:
    """An episode's action texts replayed from a reset on its question."""

    question: str
    steps: list[ReplayStep]
    info: dict[str, Any]
    """The last step's ``info`` (the reset's when no step was replayed)."""

    @property
    def episode_return(self) -> float:
        return float(sum(s.reward for s in self.steps))


def replay(env: Any, index: int, actions: Sequence[str]) -> Replay:
    """Restore a state: reset ``env`` on question ``index`` and step ``actions`` (the action texts
    played before it). EVO-RAG's envs are deterministic given the question and the texts."""
    from rag_gym.envs.search import ActionType

    _, info = env.reset(options={"index": int(index)})
    question = info["question"]
    steps = []
    for n, text in enumerate(actions):
        mask = [int(v) for v in info.get("action_mask", [1] * len(ActionType))]
        obs, reward, terminated, truncated, info = env.step(text)
        if (terminated or truncated) and n < len(actions) - 1:
            raise ValueError(
                f"replaying question {index}: action {n} of {len(actions)} ends the episode"
            )
        executed = info.get("actions") or ["INVALID"]
        steps.append(
            ReplayStep(
                action_text=text,
                action_type=executed[0],
                reward=float(reward),
                reward_terms={k: float(v) for k, v in info.get("reward_terms", {}).items()},
                observation=obs,
                mask_before=mask,
            )
        )
    return Replay(question=question, steps=steps, info=info)


def model_turns(env_mask: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each model-written run of a completion: one per turn (the env writes
    at least one token between two turns).

    >>> model_turns([1, 1, 0, 0, 1, 0])
    [(0, 2), (4, 5)]
    """
    spans, start = [], None
    for i, m in enumerate(env_mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(env_mask)))
    return spans


def branch_text(
    question: str, history: Sequence[ReplayStep], t: int, t_max: int, action: str
) -> str:
    """What the preference model embeds for a branch: the trajectory prefix ending in its action
    (§3.3). The action, the step and the question come first and the earlier steps follow, most
    recent first, each observation clipped to 300 characters, so the encoder's input limit
    (256 word pieces for MiniLM) cuts the oldest evidence, never the action."""
    lines = [f"Step {t + 1}/{t_max} action: {action.strip()}", f"Question: {question}"]
    for j in range(len(history) - 1, -1, -1):
        step = history[j]
        obs = " ".join(step.observation.split())[:300]
        lines.append(f"Step {j + 1}: {step.action_text.strip()} -> {obs}")
    return "\n".join(lines)


@dataclass
class Sibling:
    """One branch at a visited state: its first action and its completed trajectory."""

    action_type: str
    """``SEARCH``, ``BACKTRACK``, ``ANSWER``, ``REFUSE``, or ``INVALID`` (a policy action that
    parsed to none)."""
    action_ids: list[int]
    """The action's tokens (a policy pair's chosen or rejected completion)."""
    action_text: str
    episode_return: float
    """R(x): the time-weighted return of the whole trajectory (shared prefix + branch)."""
    reward_terms: dict[str, float]
    """Each term's weighted sum over the trajectory."""
    taken: bool = False
    """The rollout's own action (its branch is the rollout's continuation)."""
    finished: bool = False
    em: float = 0.0
    text: str = ""
    """What the preference model embeds (:func:`branch_text`)."""


@dataclass
class VisitedState:
    """A state ``s_t`` of a rolled-out episode and its sibling branches."""

    index: int
    """The question's index in the split."""
    t: int
    """Steps before the state."""
    prompt_ids: list[int]
    """Every token the policy read before acting at ``s_t``: the prompt, its earlier actions and
    the env's replies, exactly as in the rollout."""
    siblings: list[Sibling]


@dataclass
class BranchJob:
    """A branch to play: at state ``t`` of ``episode``, write ``prefix_ids`` and, when ``close``
    is set, let the policy finish the action up to that closing tag; then complete the episode."""

    episode: Episode
    t: int
    action_type: str
    prefix_ids: list[int]
    close: str | None = None


def env_copies(engine: RolloutEngine, n: int, stage: str | None = None) -> list[Any]:
    """The first ``n`` env copies of ``engine`` (made as needed), each scoring with the
    curriculum ``stage`` (§3.5) when given."""
    from rag_gym.rewards.core import evo_rag_weights
    from rag_gym.wrappers import presets

    if stage is not None:
        evo_rag_weights(0.0, stage, "dynamic")  # validates the name
    engine.grow(n)
    if stage is not None:
        for env in engine.envs:
            presets.set_stage(env, stage)
    return engine.envs[:n]


class SiblingBrancher:
    """Rolls out episodes and branches sibling actions at their visited states (§3.3).

    Args:
        engine: a :class:`~rag_gym.train.rollout.RolloutEngine` over the ``evo_rag`` env
            (its env copies are reused for branches).
        sibling_actions: the action types tried at each state besides the policy's own.
        max_branch_states: states branched per episode (random), ``None`` for all.
        batch_size: episodes played at once.
        seed: draws the branched states.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        sibling_actions: Sequence[str] = SIBLING_ACTIONS,
        max_branch_states: int | None = None,
        batch_size: int = 32,
        seed: int = 0,
    ) -> None:
        from rag_gym.wrappers.evo_rag import TimeDynamicWeights, find_wrapper
        from rag_gym.wrappers.text_actions import TextActions

        self.engine = engine
        self.tokenizer = engine.tokenizer
        env = engine.envs[0]
        text = find_wrapper(env, TextActions)
        weights = find_wrapper(env, TimeDynamicWeights)
        if text is None or weights is None:
            raise ValueError(
                "EVO-RAG branching needs a TextActions env with the evo_rag reward preset; build "
                "it with env_factory(env_id, reward_preset='evo_rag', tags='evo_rag')"
            )
        self.t_max = weights.t_max
        tags = text.tags
        self._actions: dict[str, tuple[str, str | None]] = {}
        for name, tag, closing in (
            ("SEARCH", tags.search, True),
            ("ANSWER", tags.answer, True),
            ("BACKTRACK", tags.backtrack, False),
            ("REFUSE", tags.refuse, False),
        ):
            if tag:
                self._actions[name] = (f"<{tag}>", f"</{tag}>") if closing else (f"<{tag}/>", None)
        missing = [a for a in sibling_actions if a not in self._actions]
        if missing:
            raise ValueError(
                f"the env's tag set {tags.name!r} has no tag for the sibling actions {missing}; "
                "use tags='evo_rag'"
            )
        self.sibling_actions = tuple(sibling_actions)
        self.max_branch_states = max_branch_states
        self.batch_size = batch_size
        self.rng = random.Random(seed)
        self.stage: str | None = None

    # ---- envs ---------------------------------------------------------------------------------
    def set_stage(self, stage: str) -> None:
        """The curriculum stage every env copy scores with (§3.5)."""
        self.stage = stage
        env_copies(self.engine, len(self.engine.envs), stage)

    def _envs(self, n: int) -> list[Any]:
        return env_copies(self.engine, n, self.stage)

    # ---- roll-outs ----------------------------------------------------------------------------
    def rollout(self, generate: Callable, indices: Sequence[int]) -> list[Episode]:
        """One episode per question index with the policy (§3.4 (i))."""
        episodes: list[Episode] = []
        for start in range(0, len(indices), self.batch_size):
            chunk = list(indices[start : start + self.batch_size])
            self._envs(len(chunk))
            episodes += self.engine.play(generate, chunk)
        return episodes

    def replay_episode(self, episode: Episode, t: int | None = None) -> Replay:
        """Replay ``episode``'s first ``t`` actions (all by default) in env copy 0; the full
        replay must give the episode's return."""
        spans = model_turns(episode.env_mask)
        if len(spans) != episode.turns:
            raise ValueError(
                f"expected one model-written run per turn, got {len(spans)} runs for "
                f"{episode.turns} turns (a turn that wrote no tokens?)"
            )
        texts = [self._decode(episode.completion_ids[a:b]) for a, b in spans]
        env = self._envs(1)[0]
        result = replay(env, episode.index, texts if t is None else texts[:t])
        if t is None and abs(result.episode_return - episode.episode_return) > 1e-6:
            raise RuntimeError(
                f"replaying question {episode.index} gave return {result.episode_return:.6f}, "
                f"the rollout {episode.episode_return:.6f}: the env is not deterministic given "
                "the question and the action texts, so its states cannot be restored"
            )
        return result

    def _decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ---- branches -----------------------------------------------------------------------------
    def branch(self, generate: Callable, episodes: Sequence[Episode]) -> list[VisitedState]:
        """Every (or ``max_branch_states``) visited state of each episode with its siblings:
        the rollout's own action and one branch per other action type, each completed by
        ``generate`` (Algorithm 1 line 10)."""
        states: list[VisitedState] = []
        jobs: list[BranchJob] = []
        owners: list[tuple[int, str, list[ReplayStep]]] = []
        for ep in episodes:
            full = self.replay_episode(ep)
            spans = model_turns(ep.env_mask)
            chosen = list(range(len(spans)))
            if self.max_branch_states is not None and len(chosen) > self.max_branch_states:
                chosen = sorted(self.rng.sample(chosen, self.max_branch_states))
            for t in chosen:
                step = full.steps[t]
                start, end = spans[t]
                taken = Sibling(
                    action_type=step.action_type,
                    action_ids=list(ep.completion_ids[start:end]),
                    action_text=step.action_text,
                    episode_return=ep.episode_return,
                    reward_terms=dict(ep.reward_terms),
                    taken=True,
                    finished=ep.finished,
                    em=ep.em,
                    text=branch_text(
                        full.question, full.steps[:t], t, self.t_max, step.action_text
                    ),
                )
                state = VisitedState(
                    index=ep.index,
                    t=t,
                    prompt_ids=list(ep.prompt_ids) + list(ep.completion_ids[:start]),
                    siblings=[taken],
                )
                states.append(state)
                for action in self.sibling_actions:
                    if action == step.action_type:
                        continue
                    if action == "BACKTRACK" and not step.mask_before[2]:
                        continue  # nothing to drop yet: the env would call it invalid
                    opening, close = self._actions[action]
                    jobs.append(
                        BranchJob(
                            ep,
                            t,
                            action,
                            self.tokenizer.encode(opening, add_special_tokens=False),
                            close,
                        )
                    )
                    owners.append((len(states) - 1, full.question, full.steps[:t]))
        siblings = self.play_branches(generate, jobs)
        for (owner, question, history), job, sibling in zip(owners, jobs, siblings, strict=True):
            sibling.text = branch_text(question, history, job.t, self.t_max, sibling.action_text)
            states[owner].siblings.append(sibling)
        return states

    def play_branches(self, generate: Callable, jobs: Sequence[BranchJob]) -> list[Sibling]:
        """Play each job: restore its state, write its action, complete the episode with
        ``generate``; in batches of ``batch_size``."""
        out: list[Sibling] = []
        for start in range(0, len(jobs), self.batch_size):
            out += self._play_chunk(generate, list(jobs[start : start + self.batch_size]))
        return out

    def _play_chunk(self, generate: Callable, jobs: list[BranchJob]) -> list[Sibling]:
        engine = self.engine
        envs = self._envs(len(jobs))
        branches: list[Episode] = []
        for job, env in zip(jobs, envs, strict=True):
            spans = model_turns(job.episode.env_mask)
            start = spans[job.t][0]
            prefix = [self._decode(job.episode.completion_ids[a:b]) for a, b in spans[: job.t]]
            restored = replay(env, job.episode.index, prefix)
            terms = dict.fromkeys(job.episode.reward_terms, 0.0)
            for step in restored.steps:
                for key, value in step.reward_terms.items():
                    terms[key] = terms.get(key, 0.0) + value
            branches.append(
                Episode(
                    prompt_ids=list(job.episode.prompt_ids),
                    completion_ids=list(job.episode.completion_ids[:start]),
                    env_mask=list(job.episode.env_mask[:start]),
                    episode_return=restored.episode_return,
                    reward_terms=terms,
                    turns=job.t,
                    index=job.episode.index,
                )
            )
        actions = self._write_actions(generate, jobs, branches)
        active = []
        for i, (branch, env, action) in enumerate(zip(branches, envs, actions, strict=True)):
            # RolloutEngine's own turn step, so a branch has exactly the rollout's token layout
            if engine.advance(branch, env, action):
                active.append(i)
        while active:
            budgets = [
                engine.max_completion_tokens - len(branches[i].completion_ids) for i in active
            ]
            new = generate(
                [branches[i].prompt_ids + branches[i].completion_ids for i in active],
                max(1, min(engine.max_turn_tokens, min(budgets))),
                engine.stop,
            )
            active = [
                i
                for i, tokens in zip(active, new, strict=True)
                if engine.advance(branches[i], envs[i], list(tokens))
            ]
        return [
            Sibling(
                action_type=job.action_type,
                action_ids=action,
                action_text=self._decode(action),
                episode_return=branch.episode_return,
                reward_terms=dict(branch.reward_terms),
                finished=branch.finished,
                em=branch.em,
            )
            for job, branch, action in zip(jobs, branches, actions, strict=True)
        ]

    def _write_actions(
        self, generate: Callable, jobs: list[BranchJob], branches: list[Episode]
    ) -> list[list[int]]:
        """Each job's action tokens: the prefix, plus the policy's text up to the closing tag
        (appended when the policy did not write it) for SEARCH and ANSWER siblings."""
        actions = [list(job.prefix_ids) for job in jobs]
        eos = self.tokenizer.eos_token_id
        for close in sorted({job.close for job in jobs if job.close}):
            rows = [i for i, job in enumerate(jobs) if job.close == close]
            new = generate(
                [branches[i].prompt_ids + branches[i].completion_ids + actions[i] for i in rows],
                max(1, self.engine.max_turn_tokens - 2),
                [close],
            )
            for i, tokens in zip(rows, new, strict=True):
                tokens = list(tokens)
                while tokens and tokens[-1] == eos:
                    tokens.pop()
                actions[i] += tokens
                if close not in self._decode(actions[i]):
                    actions[i] += self.tokenizer.encode(close, add_special_tokens=False)
        return actions


# ==================================== pairs for the two learners ===============================
def reward_model_pairs(
    states: Sequence[VisitedState], margin: float = RM_MARGIN
) -> list[tuple[str, str]]:
    """``(text⁺, text⁻)`` of every sibling pair whose returns differ by at least Δ (§3.3)."""
    pairs = []
    for state in states:
        sib = state.siblings
        for i, j in preference_pairs([s.episode_return for s in sib], margin):
            pairs.append((sib[i].text, sib[j].text))
    return pairs


def policy_pairs(
    states: Sequence[VisitedState], model: PreferenceModel, margin: float = POLICY_MARGIN
) -> list[dict[str, list[int]]]:
    """One DPO example per state whose best and worst siblings (by ``model``'s score) differ by
    at least δ (§3.4 (ii)): ``{"prompt_ids", "chosen_ids", "rejected_ids"}``."""
    rows = []
    for state in states:
        pick = policy_pair(model.scores([s.text for s in state.siblings]), margin)
        if pick is None:
            continue
        chosen, rejected = state.siblings[pick[0]], state.siblings[pick[1]]
        if chosen.action_ids == rejected.action_ids:
            continue
        rows.append(
            {
                "prompt_ids": list(state.prompt_ids),
                "chosen_ids": list(chosen.action_ids),
                "rejected_ids": list(rejected.action_ids),
            }
        )
    return rows


# ==================================== the policy epoch =========================================
def policy_epoch(
    model: Any,
    tokenizer: Any,
    rows: Sequence[dict[str, list[int]]],
    cfg: EvoRagDPOConfig,
    output_dir: str | Path,
    seed: int = 0,
    on_log: Callable[[dict[str, float], int, int], None] | None = None,
) -> list[dict[str, Any]]:
    """One DPO epoch (§3.4 (iii)) of the PEFT ``model`` on ``rows``; returns the trainer's log
    history. ``on_log(logs, step, max_steps)`` sees every logged row."""
    trl, peft = _require_trl()
    import torch
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback

    if not isinstance(model, peft.PeftModel):
        raise TypeError(f"expected a peft.PeftModel (LoRA adapters), got {type(model).__name__}")
    if not rows:
        raise ValueError("expected at least one policy pair, got none")
    columns: dict[str, list[Any]] = {k: [r[k] for r in rows] for k in rows[0]}
    if cfg.reference_free:
        columns["ref_chosen_logps"] = [0.0] * len(rows)
        columns["ref_rejected_logps"] = [0.0] * len(rows)
    cuda = torch.cuda.is_available()
    args = trl.DPOConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=cfg.per_device_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        learning_rate=cfg.learning_rate,
        beta=cfg.beta,
        num_train_epochs=1,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        max_length=None,
        precompute_ref_log_probs=cfg.reference_free,
        activation_checkpointing=cfg.gradient_checkpointing,
        use_cpu=not cuda,
        bf16=cuda,
        seed=seed,
        disable_tqdm=True,
    )

    class Forward(TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if on_log is not None and logs:
                on_log(dict(logs), int(state.global_step), int(state.max_steps))

    from rag_gym.train.trl_compat import drop_dpo_state, token_dpo_trainer_class

    trainer = token_dpo_trainer_class()(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict(columns),
        processing_class=tokenizer,
        callbacks=[Forward()],
    )
    trainer.remove_callback(PrinterCallback)  # the rows go to on_log, not to stdout
    try:
        trainer.train()
    finally:
        drop_dpo_state(model)  # so the next epoch starts from the same model
    return list(trainer.state.log_history)


# ==================================== the training loop ========================================
class _Tracker:
    """TensorBoard (always) and W&B (with ``track``), CleanRL's way: ``wandb.init`` with
    ``sync_tensorboard`` and one ``SummaryWriter``; plus the rows for the learning curve."""

    def __init__(self, run_dir: Path, track: bool, name: str, config: dict[str, Any]) -> None:
        from rag_gym.train.tracking import report_to

        targets = report_to(run_dir, track)
        self.wandb = None
        if "wandb" in targets:
            import os

            import wandb

            self.wandb = wandb.init(
                project=os.environ.get("WANDB_PROJECT", "rag-gym"),
                name=name,
                config=config,
                dir=str(run_dir),
                sync_tensorboard=True,
            )
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))
        self.rows: list[dict[str, Any]] = []

    def log(self, values: dict[str, float], step: int, **row: Any) -> None:
        for key, value in values.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self.writer.add_scalar(key, value, step)
        self.rows.append({**row, **values})

    def close(self) -> None:
        self.writer.close()
        if self.wandb is not None:
            self.wandb.finish()


def _dpo_logger(
    tracker: _Tracker, offset: int, stage: str, cycle: int, losses: list[float]
) -> Callable[[dict[str, float], int, int], None]:
    """Forward a policy epoch's logged rows: ``losses/dpo`` and ``dpo/<TRL metric>`` at the run's
    policy step; on the learning curve's x axis the epoch spreads over its cycle."""

    def log(logs: dict[str, float], step: int, steps: int) -> None:
        if "loss" not in logs:
            return
        values = {"losses/dpo": float(logs["loss"])}
        for key, value in logs.items():
            if key not in ("loss", "epoch") and isinstance(value, (int, float)):
                values[f"dpo/{key}"] = float(value)
        losses.append(values["losses/dpo"])
        tracker.log(values, offset + step, stage=stage, cycle=cycle - 1 + step / max(1, steps))

    return log


def _mean(values: Any) -> float:
    values = [float(v) for v in values]
    return float(np.mean(values)) if values else 0.0


def _load_adapter(model: Any, folder: Path) -> None:
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model, load_file(str(folder / "adapter_model.safetensors")))


def train(
    cfg: EvoRagDPOConfig,
    model: Any = None,
    tokenizer: Any = None,
    on_cycle: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run EVO-RAG's two stages (Algorithm 1) and return the run's record.

    ``model``/``tokenizer`` default to :func:`~rag_gym.train.models.load_policy` of
    ``cfg.model``; the model gets LoRA adapters (a PEFT model is used as is). ``on_cycle``
    sees each cycle's summary row. Writes to the run folder: ``config.json``, each cycle's
    adapter and preference heads (``<stage>/cycle<n>/``), ``final/`` (the best Refinement
    adapter and the tokenizer), TensorBoard logs (W&B with ``track``), ``learning_curve.png``
    and ``history.json``.

    Returns ``{"run_dir", "history", "stages": {stage: {best_cycle, best, cycles, checkpoint}},
    "final", "generation", "model"}`` (``generation``:
    :func:`~rag_gym.train.rollout.generation_info` of the roll-outs' generator; ``model``: the
    PEFT policy, holding the final adapter).
    """
    _, peft = _require_trl()
    import torch

    from rag_gym.train.models import load_policy
    from rag_gym.train.tracking import learning_curve, run_name

    torch.manual_seed(cfg.seed)
    if model is None:
        model, tokenizer = load_policy(cfg.model)
    if tokenizer is None:
        raise TypeError("a model was given without its tokenizer")
    if not isinstance(model, peft.PeftModel):
        model = peft.get_peft_model(
            model,
            peft.LoraConfig(
                r=cfg.lora_r,
                lora_alpha=cfg.lora_alpha,
                target_modules="all-linear",
                task_type="CAUSAL_LM",
            ),
        )
    name = run_name(cfg.env_id, cfg.exp_name, cfg.seed)
    run_dir = Path(cfg.run_dir or Path(cfg.output_dir) / name)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(asdict(cfg), indent=2, default=str))

    brancher = SiblingBrancher(
        rollout_engine(cfg, tokenizer, cfg.split),
        cfg.sibling_actions,
        cfg.max_branch_states,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
    )
    dev = rollout_engine(cfg, tokenizer, cfg.eval_split)
    reward_model = PreferenceModel(cfg.encoder, learning_rate=cfg.rm_learning_rate, seed=cfg.seed)
    tracker = _Tracker(run_dir, cfg.track, name, asdict(cfg))
    order = random.Random(cfg.seed)
    queue: list[int] = []
    n_train = brancher.engine.n_questions
    generation: dict[str, Any] | None = None
    policy_step = 0
    cycle_no = 0
    stages: dict[str, Any] = {}
    try:
        for stage_no, stage in enumerate(STAGES):
            brancher.set_stage(stage)
            env_copies(dev, len(dev.envs), stage)
            buffer: list[tuple[str, str]] = []
            best: tuple[float, float] | None = None
            best_cycle, stall, cycles = 0, 0, 0
            for cycle in range(1, cfg.cycles_per_stage + 1):
                cycles, cycle_no = cycle, cycle_no + 1
                generate = make_generator(
                    model,
                    tokenizer,
                    temperature=cfg.temperature,
                    top_p=cfg.top_p,
                    batch_size=cfg.batch_size,
                )
                generation = generation_info(generate)
                indices = []
                for _ in range(cfg.episodes_per_cycle):
                    if not queue:
                        queue = list(range(n_train))
                        order.shuffle(queue)
                    indices.append(queue.pop())
                episodes = brancher.rollout(generate, indices)
                states = brancher.branch(generate, episodes)
                new_pairs = reward_model_pairs(states, cfg.rm_margin)
                unseen = reward_model.evaluate(new_pairs)  # before it trains on them
                buffer += new_pairs
                rm_loss = (
                    reward_model.train_epoch(buffer, cfg.rm_batch_size, seed=cfg.seed + cycle_no)
                    if buffer
                    else float("nan")
                )
                rows = policy_pairs(states, reward_model, cfg.policy_margin)
                dpo_losses: list[float] = []
                if rows:
                    log = policy_epoch(
                        model,
                        tokenizer,
                        rows,
                        cfg,
                        run_dir / "dpo",
                        seed=cfg.seed + cycle_no,
                        on_log=_dpo_logger(tracker, policy_step, stage, cycle_no, dpo_losses),
                    )
                    policy_step += max((r.get("step", 0) for r in log), default=0)
                dev_scores = evaluate_policy(
                    model, tokenizer, dev, cfg.eval_questions, cfg.batch_size, stage
                )
                folder = run_dir / stage / f"cycle{cycle}"
                model.save_pretrained(str(folder))
                reward_model.save(folder / "preference_model.safetensors")
                score = (dev_scores["em"], dev_scores["return"])
                if best is None or score > best:
                    best, best_cycle, stall = score, cycle, 0
                else:
                    stall += 1
                summary = {
                    "charts/stage": float(stage_no),
                    "charts/episode_return": _mean(e.episode_return for e in episodes),
                    "charts/em": _mean(e.em for e in episodes),
                    "charts/num_searches": _mean(e.num_searches for e in episodes),
                    "charts/turns": _mean(e.turns for e in episodes),
                    "charts/states": float(len(states)),
                    "charts/branches": float(sum(len(s.siblings) for s in states)),
                    "charts/rm_pairs": float(len(new_pairs)),
                    "charts/rm_buffer": float(len(buffer)),
                    "charts/policy_pairs": float(len(rows)),
                    "charts/policy_steps": float(policy_step),
                    "losses/reward_model": rm_loss,
                    "eval/rm_accuracy_new_pairs": unseen["accuracy"],
                    "eval/em": dev_scores["em"],
                    "eval/return": dev_scores["return"],
                    "eval/num_searches": dev_scores["num_searches"],
                }
                if dpo_losses:
                    summary["losses/dpo_epoch"] = _mean(dpo_losses)
                for term in EVO_RAG_TERMS:
                    summary[f"rewards/{term}"] = _mean(
                        e.reward_terms.get(term, 0.0) for e in episodes
                    )
                tracker.log(summary, cycle_no, stage=stage, cycle=cycle_no, stage_cycle=cycle)
                if on_cycle is not None:
                    on_cycle({"stage": stage, "cycle": cycle, **summary})
                if stall >= cfg.patience:
                    break
            best_folder = run_dir / stage / f"cycle{best_cycle}"
            _load_adapter(model, best_folder)  # §3.5: reload the stage's best checkpoint
            stages[stage] = {
                "best_cycle": best_cycle,
                "best": {"em": best[0], "return": best[1]} if best else None,
                "cycles": cycles,
                "checkpoint": str(best_folder),
            }
    finally:
        tracker.close()
    final = run_dir / "final"
    model.save_pretrained(str(final))
    tokenizer.save_pretrained(str(final))
    learning_curve(
        tracker.rows,
        run_dir / "learning_curve.png",
        ["losses/dpo", "losses/reward_model", "charts/episode_return", "eval/em"],
        title=run_dir.name,
        x_key="cycle",
    )
    (run_dir / "history.json").write_text(json.dumps(tracker.rows, indent=1, default=str))
    return {
        "run_dir": str(run_dir),
        "history": tracker.rows,
        "stages": stages,
        "final": str(final),
        "generation": generation,
        "model": model,
    }
