"""The name verifiers' CLI loads rag-gym's taskset by: ``vf-eval rag-gym-verifiers ...``.

verifiers resolves a taskset id to a top-level module (``rag-gym-verifiers`` →
``rag_gym_verifiers``) that exports its classes through ``__all__``; a dotted id such as
``rag_gym.integrations.verifiers_taskset`` is not found. This module re-exports
:mod:`rag_gym.integrations.verifiers_taskset`, where the taskset lives.
"""

from rag_gym.integrations import verifiers_taskset as _impl

__all__ = list(_impl.__all__)


def __getattr__(name: str):
    return getattr(_impl, name)
