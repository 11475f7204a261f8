"""rag-gym environments: search (``SearchEnv``), retrieval tree (``TreeSearchEnv``), reader
(``ReaderEnv``)."""

from rag_gym.envs.base import DataConfig, QAEnv
from rag_gym.envs.reader import ReaderEnv
from rag_gym.envs.registration import env_ids, register_envs
from rag_gym.envs.search import ActionType, SearchEnv
from rag_gym.envs.spaces import UnicodeText, sanitize
from rag_gym.envs.tree import TreeSearchEnv

__all__ = [
    "ActionType",
    "DataConfig",
    "QAEnv",
    "ReaderEnv",
    "SearchEnv",
    "TreeSearchEnv",
    "UnicodeText",
    "env_ids",
    "register_envs",
    "sanitize",
]
