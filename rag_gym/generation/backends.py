"""Language-model backends by name: ``make_lm("llama_cpp")``, ``make_lm("openai:model@url")``…

| spec | backend |
|---|---|
| ``llama_cpp`` or ``llama_cpp:PATH.gguf`` | :class:`~rag_gym.generation.llama_cpp.LlamaCppLM` (default: embedded SmolLM2-135M) |
| ``transformers`` or ``transformers:ID_OR_PATH`` | :class:`~rag_gym.generation.transformers_lm.TransformersLM` |
| ``vllm:ID_OR_PATH`` | :class:`~rag_gym.generation.vllm_lm.VLLMLM` (GPU) |
| ``openai:MODEL@BASE_URL`` | :class:`~rag_gym.generation.openai_compat.OpenAICompatibleLM` (key from ``OPENAI_API_KEY``) |

Another backend is registered by :func:`register_lm_backend`, or by an installed package's entry
point in the group ``rag_gym.lm_backends`` (:mod:`rag_gym._registry`); ``--lm NAME:ARG`` then
builds it everywhere a spec is taken.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rag_gym._registry import Registry, caller_origin
from rag_gym.generation.lm import LanguageModel


@dataclass(frozen=True)
class LMBackend:
    """A backend that :func:`make_lm` builds from a spec ``NAME`` or ``NAME:ARG``."""

    factory: Callable[..., LanguageModel]
    """``factory(arg, *, seed, n_ctx, chat_template) -> LanguageModel``: ``arg`` is the spec's
    text after its first colon (``""`` when there is none); ``n_ctx`` and ``chat_template`` are
    ``None`` unless given, and a backend that cannot honour one must raise ``ValueError`` saying
    why, never ignore it (rag-gym's own do)."""
    spec: str = ""
    """How a spec of it is written, for listings (``openai:MODEL@BASE_URL``)."""
    description: str = ""
    """One line for listings."""


def _as_backend(name: str, value: object) -> LMBackend:
    if isinstance(value, LMBackend):
        return value
    if callable(value):
        return LMBackend(factory=value, spec=f"{name}[:ARG]")
    raise TypeError(
        f"expected an LMBackend or a factory function (arg, *, seed, n_ctx, chat_template) -> "
        f"LanguageModel, got {type(value).__name__}"
    )


BACKENDS: Registry[LMBackend] = Registry("backend", "rag_gym.lm_backends", _as_backend)
"""Every backend by name (a :class:`~rag_gym._registry.Registry`: ``in``, ``names()``, ``get``)."""


def register_lm_backend(
    name: str, backend: LMBackend | Callable[..., LanguageModel], *, replace: bool = False
) -> LMBackend:
    """Register ``backend`` (an :class:`LMBackend`, or its factory alone) as ``name``: ``--lm
    NAME:ARG`` and ``make_lm("NAME:ARG")`` then build it. ``replace=True`` replaces a backend of
    that name (rag-gym's own included).

    >>> BACKENDS.names()[:4]
    ['llama_cpp', 'transformers', 'vllm', 'openai']
    """
    return BACKENDS.register(name, backend, replace=replace, origin=caller_origin())


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
    backend = BACKENDS.get(name)
    if n_ctx is not None and (isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 16):
        raise ValueError(f"expected n_ctx to be an integer >= 16 (tokens), got {n_ctx!r}")
    lm = backend.factory(arg, seed=seed, n_ctx=n_ctx, chat_template=chat_template)
    if not isinstance(lm, LanguageModel):
        raise TypeError(
            f"the {name} backend's factory returned a {type(lm).__name__}, expected a "
            "rag_gym.generation.lm.LanguageModel"
        )
    return lm.set_options(max_new_tokens, temperature)


def _no_n_ctx(name: str, n_ctx: int | None, source: str) -> None:
    if n_ctx is not None:
        raise ValueError(
            f"the {name} backend takes its context window from the {source}, so n_ctx "
            "(--n-ctx) has no meaning for it: drop it, or use llama_cpp or vllm"
        )


def _no_chat_template(name: str, chat_template: str | None) -> None:
    if chat_template is not None:
        raise ValueError(
            f"the {name} backend renders chats with the server's template, so chat_template "
            "(--chat-template) cannot be applied here: start the server with it (vllm serve "
            "--chat-template FILE) and drop the option, or use llama_cpp or transformers"
        )


def _llama_cpp(
    arg: str, *, seed: int, n_ctx: int | None, chat_template: str | None
) -> LanguageModel:
    from rag_gym.generation.llama_cpp import LlamaCppLM

    extra = {} if n_ctx is None else {"n_ctx": n_ctx}
    return LlamaCppLM(model_path=arg or None, seed=seed, chat_template=chat_template, **extra)


def _transformers(
    arg: str, *, seed: int, n_ctx: int | None, chat_template: str | None
) -> LanguageModel:
    _no_n_ctx("transformers", n_ctx, "model")
    from rag_gym.generation.transformers_lm import TransformersLM

    return TransformersLM(arg or None, chat_template=chat_template)


def _vllm(arg: str, *, seed: int, n_ctx: int | None, chat_template: str | None) -> LanguageModel:
    _no_chat_template("vllm", chat_template)
    if not arg:
        raise ValueError("expected 'vllm:<model id or path>', got no model")
    from rag_gym.generation.vllm_lm import VLLMLM

    return VLLMLM(arg, seed=seed, max_model_len=n_ctx)


def _openai(arg: str, *, seed: int, n_ctx: int | None, chat_template: str | None) -> LanguageModel:
    _no_n_ctx("openai", n_ctx, "server")
    _no_chat_template("openai", chat_template)
    model, at, url = arg.partition("@")
    if not model or not at or not url:
        raise ValueError(
            "expected 'openai:<model>@<base_url>', e.g. 'openai:qwen@http://127.0.0.1:8000/v1', "
            f"got {'openai:' + arg if arg else 'openai'!r}"
        )
    from rag_gym.generation.openai_compat import OpenAICompatibleLM

    return OpenAICompatibleLM(model, base_url=url)


for _name, _backend in (
    ("llama_cpp", LMBackend(_llama_cpp, "llama_cpp[:PATH.gguf]", "llama.cpp on a GGUF file")),
    ("transformers", LMBackend(_transformers, "transformers[:ID_OR_PATH]", "transformers")),
    ("vllm", LMBackend(_vllm, "vllm:ID_OR_PATH", "vLLM (GPU)")),
    ("openai", LMBackend(_openai, "openai:MODEL@BASE_URL", "an OpenAI-compatible server")),
):
    BACKENDS.register(_name, _backend, origin="rag-gym")
