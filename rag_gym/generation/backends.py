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


def make_lm(
    spec: str = "llama_cpp",
    seed: int = 0,
    n_ctx: int | None = None,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    chat_template: str | None = None,
) -> LanguageModel:
    """Build a backend from a spec string (see the module table), with its options (``None``:
    the backend's default):

    * ``n_ctx``: the context window in tokens (``llama_cpp``; ``vllm``'s ``max_model_len``);
      the other backends take it from the model or the server, and refuse it;
    * ``max_new_tokens``, ``temperature``: every agent's reply limit and sampling temperature
      on this model, instead of the agent's own (:attr:`LanguageModel.max_new_tokens`);
    * ``chat_template``: ``chatml``, ``gemma``, ``llama3`` or a Jinja template file, for a model
      without a chat template of its own or to replace it (``llama_cpp``, ``transformers``;
      a server renders its own, so the others refuse it; see
      :mod:`~rag_gym.generation.chat_templates`).
    """
    if not isinstance(spec, str) or not spec:
        raise TypeError(
            f"expected a backend spec such as 'llama_cpp' or 'openai:model@url', got {spec!r}"
        )
    name, _, arg = spec.partition(":")
    if name not in BACKENDS:
        raise unknown_name("backend", name, BACKENDS)
    if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 16):
        raise ValueError(f"expected n_ctx to be an integer >= 16 (tokens), got {n_ctx!r}")
    if n_ctx is not None and name in ("transformers", "openai"):
        raise ValueError(
            f"the {name} backend takes its context window from the "
            f"{'model' if name == 'transformers' else 'server'}, so n_ctx (--n-ctx) has no "
            "meaning for it: drop it, or use llama_cpp or vllm"
        )
    if chat_template is not None and name in ("vllm", "openai"):
        raise ValueError(
            f"the {name} backend renders chats with the server's template, so chat_template "
            "(--chat-template) cannot be applied here: start the server with it (vllm serve "
            "--chat-template FILE) and drop the option, or use llama_cpp or transformers"
        )
    lm = _backend(name, arg, spec, seed, n_ctx, chat_template)
    return lm.set_options(max_new_tokens, temperature)


def _backend(
    name: str, arg: str, spec: str, seed: int, n_ctx: int | None, chat_template: str | None
) -> LanguageModel:
    if name == "llama_cpp":
        from rag_gym.generation.llama_cpp import LlamaCppLM

        extra = {} if n_ctx is None else {"n_ctx": n_ctx}
        return LlamaCppLM(model_path=arg or None, seed=seed, chat_template=chat_template, **extra)
    if name == "transformers":
        from rag_gym.generation.transformers_lm import TransformersLM

        return TransformersLM(arg or None, chat_template=chat_template)
    if name == "vllm":
        if not arg:
            raise ValueError("expected 'vllm:<model id or path>', got no model")
        from rag_gym.generation.vllm_lm import VLLMLM

        return VLLMLM(arg, seed=seed, max_model_len=n_ctx)
    model, at, url = arg.partition("@")
    if not model or not at or not url:
        raise ValueError(
            f"expected 'openai:<model>@<base_url>', e.g. 'openai:qwen@http://127.0.0.1:8000/v1', got {spec!r}"
        )
    from rag_gym.generation.openai_compat import OpenAICompatibleLM

    return OpenAICompatibleLM(model, base_url=url)
