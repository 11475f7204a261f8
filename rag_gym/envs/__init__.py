"""rag-gym environments."""

from rag_gym.envs.registration import env_ids, register_envs
from rag_gym.envs.search import ActionType, SearchEnv
from rag_gym.envs.spaces import UnicodeText, sanitize

__all__ = ["ActionType", "SearchEnv", "UnicodeText", "env_ids", "register_envs", "sanitize"]
