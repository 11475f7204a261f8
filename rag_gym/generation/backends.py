"""Language-model backends by name: ``make_lm("llama_cpp")``, ``make_lm("openai:model@url")``…

| spec | backend |
|---|---|
| ``llama_cpp`` or ``llama_cpp:PATH.gguf`` | :class:`~rag_gym.generation.llama_cpp.LlamaCppLM` (default: embedded SmolLM2-135M) |
| ``transformers`` or ``transformers:ID_OR_PATH`` | :class:`~rag_gym.generation.transformers_lm.TransformersLM` |
| ``vllm:ID_OR_PATH`` | :class:`~rag_gym.generation.vllm_lm.VLLMLM` (GPU) |
| ``openai:MODEL@BASE_URL`` | :class:`~rag_gym.generation.openai_compat.OpenAICompatibleLM` (key from ``OPENAI_API_KEY``) |
"""

from __future__ import annotations

from rag_gym._names import unknown_name
from rag_gym.generation.lm import LanguageModel

BACKENDS = ("llama_cpp", "transformers", "vllm", "openai")


def make_lm(spec: str = "llama_cpp", seed: int = 0) -> LanguageModel:
    """Build a backend from a spec string (see the module table)."""
    if not isinstance(spec, str) or not spec:
        raise TypeError(
            f"expected a backend spec such as 'llama_cpp' or 'openai:model@url', got {spec!r}"
        )
    name, _, arg = spec.partition(":")
    if name not in BACKENDS:
        raise unknown_name("backend", name, BACKENDS)
    if name == "llama_cpp":
        from rag_gym.generation.llama_cpp import LlamaCppLM

        return LlamaCppLM(model_path=arg or None, seed=seed)
    if name == "transformers":
        from rag_gym.generation.transformers_lm import TransformersLM

        return TransformersLM(arg or None)
    if name == "vllm":
        if not arg:
            raise ValueError("expected 'vllm:<model id or path>', got no model")
        from rag_gym.generation.vllm_lm import VLLMLM

        return VLLMLM(arg, seed=seed)
    model, at, url = arg.partition("@")
    if not model or not at or not url:
        raise ValueError(
            f"expected 'openai:<model>@<base_url>', e.g. 'openai:qwen@http://127.0.0.1:8000/v1', got {spec!r}"
        )
    from rag_gym.generation.openai_compat import OpenAICompatibleLM

    return OpenAICompatibleLM(model, base_url=url)
