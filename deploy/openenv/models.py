"""The environment's pydantic models: rag-gym's own (``rag_gym.integrations.openenv_server``).

- ``RagGymAction``: ``type`` (search, answer, backtrack, refuse, evaluate) and ``text``; leave
  ``type`` out to send raw model text, parsed by the session's tag preset.
- ``RagGymObservation``: ``text``, ``reward``, ``done``, ``truncated``, and ``metadata`` (the
  env's JSON-safe ``info``, with ``reward_terms``).
- ``RagGymState``: the session's episode (env id, question, step count, return and its terms).
"""

from rag_gym.integrations.openenv_server import RagGymAction, RagGymObservation, RagGymState

__all__ = ["RagGymAction", "RagGymObservation", "RagGymState"]
