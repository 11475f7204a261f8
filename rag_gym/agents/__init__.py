"""Agents and the LLM backends behind them."""

from rag_gym.agents.base import Agent
from rag_gym.agents.lm import Generation, GenerationConfig, LanguageModel

__all__ = ["Agent", "Generation", "GenerationConfig", "LanguageModel"]
