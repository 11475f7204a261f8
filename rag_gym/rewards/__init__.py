"""Reward formulas: the pure functions (:mod:`rag_gym.rewards.core`) behind both the env
wrappers (:mod:`rag_gym.wrappers`) and the TRL-style reward functions
(:mod:`rag_gym.rewards.trl`)."""
