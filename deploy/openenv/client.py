"""The environment's typed client: rag-gym's own (``rag_gym.integrations.openenv_client``)."""

from rag_gym.integrations.openenv_client import RagGymEnvClient

__all__ = ["RagGymEnvClient"]
