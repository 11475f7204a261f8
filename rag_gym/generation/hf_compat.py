"""What the continuous-batching engine (:mod:`rag_gym.generation.transformers_lm`) takes from
transformers and torch beyond their public APIs, in one place.

The engine drives a model's own forward pass, with three hooks:

* its attention function is registered through transformers' public ``AttentionInterface``,
  and the sdpa function it calls per row is read from the same registry (``"sdpa"``);
* :func:`attention_implementation` selects it for one forward pass by setting the *private*
  ``model.config._attn_implementation``, which the attention layers read on every call
  (the public ``set_attn_implementation`` validates and walks every sub-config: too slow per
  decoding step);
* :func:`linear_forwards` binds a replacement ``forward`` to given ``nn.Linear`` *instances* for
  one forward pass (an instance attribute shadows the class's method; deleting it restores
  the class's).

:data:`SUPPORTED` is the transformers range this was tested with. Outside it
:func:`version_problem` names the range and the fix; the engine then warns, and its
numerical self-check still decides whether the model runs on it
(:attr:`~rag_gym.generation.transformers_lm.TransformersLM.engine_fallback` records why not).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

#: The transformers versions the engine was tested with (PEP 440).
SUPPORTED = ">=5.23,<5.24"
#: The parameters the engine passes to transformers' sdpa attention function, in order.
SDPA_PARAMETERS = ("module", "query", "key", "value", "attention_mask")


def version_problem(version: str | None = None) -> str | None:
    """Why transformers ``version`` (default: the installed one) is outside :data:`SUPPORTED`,
    with the fix; ``None`` when it is inside.

    >>> version_problem("5.23.0") is None
    True
    >>> version_problem("4.46.0")
    "the continuous-batching engine is tested with transformers >=5.23,<5.24, got 4.46.0; pip install 'transformers>=5.23,<5.24'"
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
