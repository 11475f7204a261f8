"""EVO-RAG's preference training (EVO-RAG, "Curriculum-Guided Reinforcement Learning for Efficient
Multi-Hop Retrieval-Augmented Generation", arXiv:2505.17391, §3.3–3.5, Algorithm 1): sibling
branches, a multi-head preference model and DPO on LoRA adapters, over two curriculum stages.

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
  LoRA rank or the maximum number of cycles; the defaults of :class:`EvoRagDPOConfig` say so.

>>> preference_pairs([1.0, 0.7, 0.69, 0.0])  # |ΔR| ≥ 0.3, the higher first
[(0, 1), (0, 2), (0, 3), (1, 3), (2, 3)]
>>> policy_pair([0.1, 0.3, 0.25]), policy_pair([0.1, 0.29])  # the score gap must reach 0.2
((1, 0), None)
"""

from __future__ import annotations

from rag_gym.train.episodes import evaluate_policy, rollout_engine
from rag_gym.train.evo_rag_dpo.branching import (
    BranchJob,
    Replay,
    ReplayStep,
    Sibling,
    SiblingBrancher,
    VisitedState,
    branch_text,
    env_copies,
    replay,
)
from rag_gym.train.evo_rag_dpo.config import (
    POLICY_MARGIN,
    RM_MARGIN,
    SIBLING_ACTIONS,
    STAGES,
    EvoRagDPOConfig,
)
from rag_gym.train.evo_rag_dpo.dpo import policy_epoch
from rag_gym.train.evo_rag_dpo.loop import train
from rag_gym.train.evo_rag_dpo.preference import (
    PreferenceModel,
    policy_pair,
    policy_pairs,
    preference_pairs,
    reward_model_pairs,
)

__all__ = [
    "POLICY_MARGIN",
    "RM_MARGIN",
    "SIBLING_ACTIONS",
    "STAGES",
    "BranchJob",
    "EvoRagDPOConfig",
    "PreferenceModel",
    "Replay",
    "ReplayStep",
    "Sibling",
    "SiblingBrancher",
    "VisitedState",
    "branch_text",
    "env_copies",
    "evaluate_policy",
    "policy_epoch",
    "policy_pair",
    "policy_pairs",
    "preference_pairs",
    "replay",
    "reward_model_pairs",
    "rollout_engine",
    "train",
]
