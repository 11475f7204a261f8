"""rag-gym: the Gymnasium of multi-hop retrieval QA.

``import rag_gym`` registers the environments, so ``gym.make("rag_gym/SynthHop-v0")`` works.
"""

__version__ = "0.1.0"

from rag_gym.envs.registration import register_envs as _register_envs

_register_envs()
