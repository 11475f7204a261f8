"""The papers' reward formulas as pure functions: one definition, used by the env wrappers
(:mod:`rag_gym.wrappers`) and by the TRL-style reward functions (:mod:`rag_gym.rewards.trl`).

Each function cites the paper and section it implements; the tests compute every value by
hand. Notation follows the papers: ``D_t`` the passages of the SEARCH at step t, ``D*`` the
gold passages, ``p(t) = t / T_max`` with t counted from 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from rag_gym import metrics

# ============================ EVO-RAG (arXiv:2505.17391) ======================================
#: The seven EVO-RAG terms in the order of the weight vector w(t) = (β, λ, γ, δ, ρ, η, κ), §3.5.
EVO_RAG_TERMS = (
    "retrieval_hit",
    "retrieval_action",
    "query_overlap",
    "backtrack",
    "refusal",
    "step_cost",
    "answer",
)


def retrieval_hit(is_search: bool, retrieved: Iterable[str], gold: Iterable[str]) -> float:
    """r_ret (§3.2): +1 for a SEARCH whose D_t meets D*, −1 for a SEARCH that misses, else 0.

    >>> retrieval_hit(True, ["a", "x"], ["a"]), retrieval_hit(True, ["x"], ["a"]), retrieval_hit(False, [], ["a"])
    (1.0, -1.0, 0.0)
    """
    if not is_search:
        return 0.0
    return 1.0 if set(retrieved) & set(gold) else -1.0


def query_overlap(query: np.ndarray, previous: Sequence[np.ndarray]) -> float:
    """r_dup (§3.2): −max_{j<t} cos(e(q_t), e(q_j)); 0 for the first query.

    >>> query_overlap(np.array([1.0, 0.0]), [np.array([1.0, 1.0]), np.array([0.0, 1.0])])  # -cos 45°
    -0.7071067811865475
    """
    if len(previous) == 0:
        return 0.0
    q = np.asarray(query, dtype=np.float64)
    prev = np.asarray(previous, dtype=np.float64)
    sims = prev @ q / np.maximum(np.linalg.norm(prev, axis=1) * np.linalg.norm(q), 1e-12)
    return -float(np.max(sims))


def backtrack_penalty(is_backtrack: bool) -> float:
    """r_bt (§3.2): −1 per BACKTRACK."""
    return -1.0 if is_backtrack else 0.0


def refusal_reward(is_refuse: bool, sufficient: bool) -> float:
    """r_ref (§3.2): +1 for REFUSE when the evidence is insufficient, −1 when it is sufficient.

    EVO-RAG decides sufficiency with an external verifier over the evidence so far; see
    :class:`rag_gym.wrappers.RefusalReward` for the pluggable verifier.
    """
    if not is_refuse:
        return 0.0
    return -1.0 if sufficient else 1.0


def step_cost() -> float:
    """r_step (§3.2): −1 per step (the weight η(t) scales it)."""
    return -1.0


def answer_correctness(prediction: str | None, golds: Iterable[str]) -> float:
    """r_ans (§3.2): ½ [EM + F1] of the final answer, 0 without one."""
    if not prediction:
        return 0.0
    golds = list(golds)
    return 0.5 * (metrics.exact_match(prediction, golds) + metrics.f1_score(prediction, golds))


def retrieval_action_penalty(is_search: bool, p: float, r_dup: float) -> float:
    """r_act (§3.2): for a SEARCH, 0 while p(t) < 0.3, then −1[r_dup < 0]; 0 otherwise.

    >>> retrieval_action_penalty(True, 0.25, -0.9), retrieval_action_penalty(True, 0.3, -0.9)
    (0.0, -1.0)
    >>> retrieval_action_penalty(True, 0.5, 0.0), retrieval_action_penalty(False, 0.9, -1.0)
    (0.0, 0.0)
    """
    if not is_search or p < 0.3:
        return 0.0
    return -1.0 if r_dup < 0 else 0.0


#: Table 1 (§3.6): weight → (Start, Mid, End). Discovery interpolates Start → Mid, Refinement
#: Mid → End, within each episode by p(t) = t / T_max.
EVO_RAG_TABLE1: dict[str, tuple[float, float, float]] = {
    "retrieval_hit": (2.0, 1.0, 0.5),  # β
    "retrieval_action": (1.5, 0.8, 0.4),  # λ
    "query_overlap": (0.1, 0.5, 1.2),  # γ
    "backtrack": (0.3, 0.5, 1.0),  # δ
    "refusal": (0.5, 0.5, 0.5),  # ρ
    "step_cost": (0.02, 0.05, 0.10),  # η
    "answer": (0.05, 0.10, 1.00),  # κ
}
STAGES = ("discovery", "refinement")
SCHEDULES = ("dynamic", "fixed", "none")


def evo_rag_weights(
    p: float, stage: str = "discovery", schedule: str = "dynamic"
) -> dict[str, float]:
    """w_k(t) for the seven terms (§3.6): ``w_k(t) = (1 − p) w_k^early + p w_k^late``.

    * ``schedule="dynamic"``: Discovery interpolates Table 1's Start → Mid, Refinement Mid → End.
    * ``schedule="fixed"``: the "Two-stage (fixed)" arm of Table 4 / §5.1 — constant weights
      inside a stage. The paper does not print the constants; rag-gym uses the mean of the
      stage's interpolation range, so the two arms differ only in timing.
    * ``schedule="none"``: the "No Reward" baseline of Table 4 / §5.1, which optimises only the
      answer-correctness reward: κ = 1, every other weight 0.

    >>> evo_rag_weights(0.5)["retrieval_hit"], evo_rag_weights(0.5, "refinement")["answer"]
    (1.5, 0.55)
    """
    if stage not in STAGES:
        raise ValueError(f"expected stage in {STAGES}, got {stage!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"expected schedule in {SCHEDULES}, got {schedule!r}")
    if schedule == "none":
        return {k: (1.0 if k == "answer" else 0.0) for k in EVO_RAG_TERMS}
    lo, hi = (0, 1) if stage == "discovery" else (1, 2)
    if schedule == "fixed":
        p = 0.5
    return {k: (1 - p) * cols[lo] + p * cols[hi] for k, cols in EVO_RAG_TABLE1.items()}


# ============================ ARENA (arXiv:2505.13258, §3.3) ===================================
READER_ORDER = ("relevance", "analysis", "answer")


def arena_format(tag_order: Sequence[str]) -> float:
    """Format: 1 if <relevance>, <analysis>, <answer> appear in that order, else 0."""
    return 1.0 if list(tag_order) == list(READER_ORDER) else 0.0


def arena_accuracy(prediction: str | None, golds: Iterable[str]) -> float:
    """Accuracy: normalised exact match of the <answer> text, 1 or 0."""
    return metrics.exact_match(prediction, golds) if prediction else 0.0


def arena_relevance(predicted: Iterable[int], gold: Iterable[int]) -> float:
    """Relevance: 1 if the predicted reference set equals the gold set, 0.5 on a partial
    overlap, 0 on none.

    >>> arena_relevance([1, 5], [5, 1]), arena_relevance([1, 2], [1, 5]), arena_relevance([3], [1, 5])
    (1.0, 0.5, 0.0)
    """
    p, g = set(predicted), set(gold)
    if p == g and g:
        return 1.0
    return 0.5 if p & g else 0.0


def arena_bonus(
    format_r: float, accuracy_r: float, relevance_r: float, bonus: float = 10.0
) -> float:
    """Bonus: +10 when format, accuracy and relevance are all 1."""
    return bonus if format_r == accuracy_r == relevance_r == 1.0 else 0.0


# ============================ R²AG (§2.4, appendix B.2) =======================================
R2AG_ALPHA, R2AG_BETA, R2AG_GAMMA, R2AG_ELL = 0.2, 0.3, 0.2, 1.25
R2AG_FORMAT_PER_BLOCK, R2AG_FORMAT_MAX = 0.01, 0.02


def r2ag_multi_hit(new_base: int, new_predicted: int, ell: float = R2AG_ELL) -> float:
    """R_MH = R_MH^b + ℓ R_MH^p (ℓ = 1.25): newly retrieved gold documents from base and
    predicted queries."""
    return float(new_base) + ell * float(new_predicted)


def r2ag_joint_hit(all_gold_found: bool, stop: bool) -> float:
    """R_JH = 1{|r̃ ∩ g| = |g| and stop}."""
    return 1.0 if all_gold_found and stop else 0.0


def r2ag_format(blocks_after_think: int) -> float:
    """R_f: 0.01 per <base-Q>/<predicted-Q> block that follows a <think> block, at most 0.02
    in total (appendix B.2: max ω R_f = 0.02, ω = 1)."""
    return min(R2AG_FORMAT_PER_BLOCK * blocks_after_think, R2AG_FORMAT_MAX)


def r2ag_gate(think_ok: bool, premature_stop: bool, output_truncated: bool) -> bool:
    """Whether the whole R²AG reward stands: it is 0 without a <think> block, on a stop before
    all gold is found, or when the output was truncated at the length limit (appendix B.2)."""
    return think_ok and not premature_stop and not output_truncated


# ============================ Eval-RAR (§4.2) ================================================
EVAL_RAR_R_EVAL = 0.1


def eval_rar_answer(prediction: str | None, golds: Iterable[str]) -> float:
    """R_ans (eq. 2): 1 if the extracted answer exactly matches a gold answer (normalised)."""
    return metrics.exact_match(prediction, golds) if prediction else 0.0


def eval_rar_evaluation(
    evaluations: Sequence[str], golds: Iterable[str], r_eval: float = EVAL_RAR_R_EVAL
) -> float:
    """R_eval (eqs. 3-4): ``r_eval`` when some gold answer is a substring of the concatenated
    <evaluate> texts (compared after answer normalisation), else 0.

    >>> eval_rar_evaluation(["The author is Ada Vell.", "Now the city."], ["ada vell"])
    0.1
    """
    joined = metrics.normalize_answer(" ".join(evaluations))
    hit = any((g := metrics.normalize_answer(a)) and g in joined for a in golds)
    return r_eval if hit else 0.0


def eval_rar_total(r_ans: float, r_eval: float) -> float:
    """R_total (eq. 5): R_ans if R_ans > 0, else R_eval."""
    return r_ans if r_ans > 0 else r_eval


# ============================ Learning When to Search (LWTS §3.3) ===============================
LWTS_BETA = 0.3
_LWTS_NO_SEARCH = re.compile(r"^think reflect answer$")
_LWTS_SEARCH = re.compile(r"^(?:think search information reflect )+answer$")

#: Words that make a search query not concise (LWTS §3.3's rule, our documented lists).
QUESTION_WORDS = frozenset(
    [
        "what",
        "who",
        "whom",
        "whose",
        "which",
        "when",
        "where",
        "why",
        "how",
        "is",
        "are",
        "was",
        "were",
        "do",
        "does",
        "did",
        "can",
        "could",
        "would",
        "should",
        "will",
        "shall",
        "may",
        "might",
    ]
)
PREPOSITIONS = frozenset(
    [
        "of",
        "in",
        "on",
        "at",
        "by",
        "for",
        "with",
        "about",
        "from",
        "to",
        "into",
        "onto",
        "during",
        "between",
        "among",
        "through",
        "over",
        "under",
        "above",
        "below",
        "after",
        "before",
        "since",
        "until",
        "upon",
        "within",
        "without",
        "against",
        "toward",
        "towards",
        "across",
        "behind",
    ]
)
FILLERS = frozenset(
    [
        "please",
        "exactly",
        "actually",
        "really",
        "very",
        "specifically",
        "basically",
        "just",
        "some",
        "any",
        "kind",
        "sort",
        "tell",
        "me",
        "find",
        "information",
        "know",
    ]
)


def lwts_format(tag_sequence: Sequence[str]) -> float:
    """r_f (eq. 6): +1 when the output's tags follow one of the two structures — think,
    reflect, answer (no retrieval); or one or more rounds of think, search, information,
    reflect, then answer — and −1 otherwise. Only the sequence of tags is compared.

    >>> lwts_format(["think", "reflect", "answer"]), lwts_format(["think", "search", "information", "reflect", "answer"])
    (1.0, 1.0)
    >>> lwts_format(["think", "search", "answer"])
    -1.0
    """
    seq = " ".join(tag_sequence)
    return 1.0 if _LWTS_NO_SEARCH.match(seq) or _LWTS_SEARCH.match(seq) else -1.0


def is_concise(query: str) -> bool:
    """LWTS's conciseness rule: no question word, preposition or filler word (the lists
    :data:`QUESTION_WORDS`, :data:`PREPOSITIONS`, :data:`FILLERS`) and no question mark.

    >>> is_concise("Lavinia Dickinson father death date"), is_concise("when did Lavinia Dickinson's father die")
    (True, False)
    """
    if "?" in query:
        return False
    words = re.findall(r"[a-z']+", query.lower())
    stop = QUESTION_WORDS | PREPOSITIONS | FILLERS
    return bool(words) and not any(w in stop for w in words)


def lwts_avg_sim(embeddings: np.ndarray, normalization: str = "printed") -> float:
    """avg_sim over the pairwise cosine similarities of N query embeddings.

    * ``"printed"`` (default): eq. 8 as printed, ``Σ_{i<j} cos(m_i, m_j) / (N (N − 1))`` —
      half the mean over pairs, since there are N (N − 1) / 2 pairs;
    * ``"mean"``: the plain mean over the N (N − 1) / 2 pairs, which the text describes
      ("the mean of pairwise cosine similarities").

    >>> e = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # cosines 1, 0, 0
    >>> lwts_avg_sim(e), lwts_avg_sim(e, "mean")
    (0.16666666666666666, 0.3333333333333333)
    """
    if normalization not in ("printed", "mean"):
        raise ValueError(f"expected normalization 'printed' or 'mean', got {normalization!r}")
    e = np.asarray(embeddings, dtype=np.float64)
    n = len(e)
    if n < 2:
        return 0.0
    unit = e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)
    sims = unit @ unit.T
    total = float(np.sum(np.triu(sims, k=1)))
    return total / (n * (n - 1)) if normalization == "printed" else total / (n * (n - 1) / 2)


def lwts_search(queries: Sequence[str], avg_sim: float) -> float:
    """r_s (eq. 9): 0 if the queries are concise and RC <= 1; −1 if not concise and RC <= 1;
    −avg_sim if RC > 1 (RC = the number of searches). With no search, RC = 0 counts as concise."""
    if len(queries) > 1:
        return -float(avg_sim)
    return 0.0 if all(is_concise(q) for q in queries) else -1.0


def lwts_answer(
    correct: bool, retrieval_count: int, stage: int = 1, beta: float = LWTS_BETA
) -> float:
    """r_a (eqs. 10-11), β = 0.3. Stage 1: correct 1, wrong −1 + β·RC. Stage 2: correct
    1 − β·RC, wrong −1.

    >>> lwts_answer(False, 2, stage=1), lwts_answer(True, 2, stage=2)
    (-0.4, 0.4)
    """
    if stage not in (1, 2):
        raise ValueError(f"expected stage 1 or 2, got {stage!r}")
    if stage == 1:
        return 1.0 if correct else -1.0 + beta * retrieval_count
    return 1.0 - beta * retrieval_count if correct else -1.0


@dataclass(frozen=True)
class Correctness:
    """How LWTS judges an answer: ``"em"``, ``"cover_em"``, or ``"judge"`` with a callable
    ``judge(question, prediction, golds) -> bool`` (an LLM judge)."""

    method: str = "em"
    judge: object | None = None

    def __post_init__(self) -> None:
        if self.method not in ("em", "cover_em", "judge"):
            raise ValueError(f"expected method 'em', 'cover_em' or 'judge', got {self.method!r}")
        if self.method == "judge" and not callable(self.judge):
            raise ValueError(
                "method='judge' needs judge=callable(question, prediction, golds) -> bool"
            )

    def __call__(self, question: str, prediction: str | None, golds: Sequence[str]) -> bool:
        if not prediction:
            return False
        if self.method == "em":
            return metrics.exact_match(prediction, golds) == 1.0
        if self.method == "cover_em":
            return metrics.cover_exact_match(prediction, golds) == 1.0
        return bool(self.judge(question, prediction, list(golds)))  # type: ignore[misc]
