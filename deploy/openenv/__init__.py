"""rag-gym's multi-hop retrieval QA envs as an OpenEnv environment (see README.md)."""

from .client import RagGymEnvClient
from .models import RagGymAction, RagGymObservation, RagGymState

__all__ = ["RagGymAction", "RagGymEnvClient", "RagGymObservation", "RagGymState"]
