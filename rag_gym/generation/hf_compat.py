"""What the continuous-batching engine (:mod:`rag_gym.generation.transformers_lm`) takes from
transformers and torch beyond their public APIs, in one place.

The engine drives a model's own forward pass, with three hooks:

* its attention function is registered through transformers' public ``AttentionInterface``,
  and the sdpa function it calls per row is read from the same registry (``"sdpa"``);
* :func:`attention_implementation` selects it for one forward pass by setting the *private*
  ``model.config._attn_implementation``, which the attention layers read on every call
  (the public ``set_attn_implementation`` validates and walks every sub-config: too slow per
  decoding step);
* :func:`cache_argument` names the forward parameter that takes the KV cache
  (``cache`` from transformers 5.24, ``past_key_values`` before it);
* :func:`linear_forwards` binds a replacement ``forward`` to given ``nn.Linear`` *instances* for
  one forward pass (an instance attribute shadows the class's method; deleting it restores
  the class's).

:data:`SUPPORTED` is the transformers range this was tested with. Outside it
:func:`version_problem` names the range and the fix; the engine then warns. Which models run on
the engine is decided first by their architecture and config
(:func:`~rag_gym.generation.transformers_lm.check_engine_support`), then by a numerical
self-check on a short prompt
(:attr:`~rag_gym.generation.transformers_lm.TransformersLM.engine_fallback` records why not).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

#: The transformers versions the engine was tested with (PEP 440).
SUPPORTED = ">=5.23,<5.25"
#: The parameters the engine passes to transformers' sdpa attention function, in order.
SDPA_PARAMETERS = ("module", "query", "key", "value", "attention_mask")


def version_problem(version: str | None = None) -> str | None:
    """Why transformers ``version`` (default: the installed one) is outside :data:`SUPPORTED`,
    with the fix; ``None`` when it is inside.

    >>> version_problem("5.23.0") is None
    True
    >>> version_problem("4.46.0")
    "the continuous-batching engine is tested with transformers >=5.23,<5.25, got 4.46.0; pip install 'transformers>=5.23,<5.25'"
    """
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    if version is None:
        import transformers

        version = transformers.__version__
    if Version(version) in SpecifierSet(SUPPORTED):
        return None
    return (
        f"the continuous-batching engine is tested with transformers {SUPPORTED}, got {version}; "
        f"pip install 'transformers{SUPPORTED}'"
    )


def register_attention(name: str, fn: Callable[..., Any]) -> None:
    """Register ``fn`` as attention implementation ``name`` (transformers' public registry)."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, fn)


def sdpa_attention() -> Callable[..., Any]:
    """transformers' sdpa attention function, from the public registry."""
    from transformers import AttentionInterface

    return AttentionInterface()["sdpa"]


@contextlib.contextmanager
def attention_implementation(model: Any, name: str) -> Iterator[None]:
    """``model``'s layers attend with the registered implementation ``name`` inside the block."""
    config = model.config
    previous = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous


def cache_argument(model: Any) -> str:
    """The keyword ``model.forward`` takes its KV cache by: ``"cache"`` (transformers 5.24
    renamed it; ``past_key_values`` warns there) or ``"past_key_values"`` (5.23 and older).

    The answer is read from the forward's signature once per model class and kept; a PEFT
    wrapper (whose forward takes ``**kwargs``) is answered for by the model it wraps.
    """
    cls = type(model)
    name = _CACHE_ARGUMENT.get(cls)
    if name is None:
        import inspect

        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        parameters = inspect.signature(type(base).forward).parameters
        name = "cache" if "cache" in parameters else "past_key_values"
        _CACHE_ARGUMENT[cls] = name
    return name


_CACHE_ARGUMENT: dict[type, str] = {}


@contextlib.contextmanager
def linear_forwards(linears: Sequence[Any], forward: Callable[[Any, Any], Any]) -> Iterator[None]:
    """Each module of ``linears`` runs ``forward(self, x)`` in place of ``nn.Linear.forward``
    inside the block (bound to the instance; the class is untouched)."""
    for linear in linears:
        linear.forward = forward.__get__(linear)
    try:
        yield
    finally:
        for linear in linears:
            vars(linear).pop("forward", None)
