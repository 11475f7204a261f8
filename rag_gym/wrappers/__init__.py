"""Wrappers: text actions for LLM policies (dense reward wrappers come here too)."""

from rag_gym.wrappers.text_actions import TextActions

__all__ = ["TextActions"]
