"""Agents: the slot-based :class:`Agent` interface and :class:`~rag_gym.agents.llm_agent.LLMAgent`,
the base of prompted agents (the backends they call live in :mod:`rag_gym.generation`)."""

from rag_gym.agents.base import Agent
from rag_gym.generation.lm import Generation, GenerationConfig, LanguageModel

__all__ = ["Agent", "Generation", "GenerationConfig", "LanguageModel"]
