"""Text generation: the :class:`LanguageModel` protocol every LLM backend implements, the
backends (llama.cpp, transformers with its continuous-batching engine, vLLM, OpenAI-compatible
servers) chosen by :func:`~rag_gym.generation.backends.make_lm`, and LLM judges.

Backends import their heavy dependencies lazily; ``import rag_gym.generation`` needs none.
"""

from rag_gym.generation.lm import Generation, GenerationConfig, LanguageModel

__all__ = ["Generation", "GenerationConfig", "LanguageModel"]
