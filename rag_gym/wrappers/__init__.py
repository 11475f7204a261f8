"""Wrappers: text actions for LLM policies, and the papers' dense reward terms.

Each reward wrapper is one term (see :mod:`rag_gym.wrappers.base`); presets
(:mod:`rag_gym.wrappers.presets`) stack them as each paper does.
"""

from rag_gym.wrappers.arena import (
    ArenaBonus,
    ReaderAccuracyReward,
    ReaderFormatReward,
    RelevanceReward,
)
from rag_gym.wrappers.base import DropBaseReward, RewardTerm
from rag_gym.wrappers.eval_rar import EvaluationReward
from rag_gym.wrappers.evo_rag import (
    AnswerCorrectnessReward,
    BacktrackPenalty,
    QueryOverlapPenalty,
    RefusalReward,
    RetrievalActionPenalty,
    RetrievalHitReward,
    StepCost,
    TimeDynamicWeights,
)
from rag_gym.wrappers.judged import JudgedAnswerReward
from rag_gym.wrappers.r2ag import (
    JointHitReward,
    MultiHitReward,
    R2AGGate,
    TopTAPReward,
    TreeFormatReward,
)
from rag_gym.wrappers.text_actions import TextActions
from rag_gym.wrappers.when_to_search import (
    LWTSFormatReward,
    LWTSSearchReward,
    MultiStageAnswerReward,
)

__all__ = [
    "AnswerCorrectnessReward",
    "ArenaBonus",
    "BacktrackPenalty",
    "DropBaseReward",
    "EvaluationReward",
    "JointHitReward",
    "JudgedAnswerReward",
    "LWTSFormatReward",
    "LWTSSearchReward",
    "MultiHitReward",
    "MultiStageAnswerReward",
    "QueryOverlapPenalty",
    "R2AGGate",
    "ReaderAccuracyReward",
    "ReaderFormatReward",
    "RefusalReward",
    "RelevanceReward",
    "RetrievalActionPenalty",
    "RetrievalHitReward",
    "RewardTerm",
    "StepCost",
    "TextActions",
    "TimeDynamicWeights",
    "TopTAPReward",
    "TreeFormatReward",
]

from rag_gym.wrappers.macro import MacroActions
from rag_gym.wrappers.vectorize import TextToVector

__all__ += ["MacroActions", "TextToVector"]
