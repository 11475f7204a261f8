"""Chat templates: the model's own, or one the user names, never a silent fallback.

A chat prompt (a list of ``{"role", "content"}`` messages) becomes text through a Jinja chat
template. A model that carries none (a base model, such as Gemma 3 270M) is refused by both
local backends (:class:`~rag_gym.generation.llama_cpp.LlamaCppLM` and
:class:`~rag_gym.generation.transformers_lm.TransformersLM`), with
:class:`MissingChatTemplate`, unless a template is named:

| name | format | for |
|---|---|---|
| ``chatml`` | ``<|im_start|>role\\n…<|im_end|>`` | SmolLM2, Qwen2/2.5 and other ChatML models |
| ``gemma`` | ``<start_of_turn>user\\n…<end_of_turn>`` (the system message opens the first user turn) | Gemma 2 and 3 |
| ``llama3`` | ``<|start_header_id|>role<|end_header_id|>\\n\\n…<|eot_id|>`` | Llama 3.x |

or a file holding a Jinja template (the ``chat_template`` of a ``tokenizer_config.json``,
unquoted). ``--chat-template`` on the command line, ``chat_template=`` in Python. The template a
backend uses is in its ``describe()`` (hence in a run's ``protocol.json``):
:meth:`ChatTemplate.describe`.

>>> chat_template("chatml").describe()["name"]
'chatml'
>>> print(chat_template("chatml").render([{"role": "user", "content": "Hi"}]), end="")
<|im_start|>user
Hi<|im_end|>
<|im_start|>assistant
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag_gym._names import unknown_name

#: The built-in templates, by name (the formats' reference templates: ChatML as Qwen2 and
#: SmolLM2 write it, without a default system message; Gemma 3's and Llama 3's as their
#: instruction-tuned models ship them, for text content)
BUILTIN: dict[str, str] = {
    "chatml": (
        "{% for message in messages %}"
        "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
    ),
    "gemma": (
        "{{ bos_token }}"
        "{%- if messages[0]['role'] == 'system' -%}"
        "{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
        "{%- set loop_messages = messages[1:] -%}"
        "{%- else -%}"
        "{%- set first_user_prefix = '' -%}"
        "{%- set loop_messages = messages -%}"
        "{%- endif -%}"
        "{%- for message in loop_messages -%}"
        "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
        "{%- endif -%}"
        "{%- if message['role'] == 'assistant' -%}{%- set role = 'model' -%}"
        "{%- else -%}{%- set role = message['role'] -%}{%- endif -%}"
        "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') }}"
        "{{ message['content'] | trim }}"
        "{{ '<end_of_turn>\n' }}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
    ),
    "llama3": (
        "{% set loop_messages = messages %}"
        "{% for message in loop_messages %}"
        "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' "
        "+ message['content'] | trim + '<|eot_id|>' %}"
        "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
        "{{ content }}"
        "{% endfor %}"
        "{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
        "{% endif %}"
    ),
}

#: what the missing-template error tells the user to pass
FIX = "--chat-template " + "|".join(BUILTIN) + "|FILE"


class MissingChatTemplate(ValueError):
    """A model without a chat template was asked to render chat messages, and no template was
    named."""


@dataclass(frozen=True)
class ChatTemplate:
    """A chat template's Jinja text and where it comes from: ``"model"`` (the model's own),
    ``"builtin"`` (:data:`BUILTIN`, by ``name``) or ``"file"`` (``file``)."""

    source: str
    origin: str
    name: str | None = None
    file: str | None = None

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    def describe(self) -> dict[str, str]:
        """What a run records: ``{"from": "model"|"builtin"|"file", "name"|"file": …,
        "sha256": …}``. A record without it (runs made before templates were recorded) means
        the model's own (:func:`same_template`)."""
        out = {"from": self.origin}
        if self.name is not None:
            out["name"] = self.name
        if self.file is not None:
            out["file"] = self.file
        out["sha256"] = self.sha256
        return out

    def render(
        self, messages: list[dict[str, Any]], bos_token: str = "", eos_token: str = ""
    ) -> str:
        """``messages`` with the assistant's generation prompt, rendered as transformers'
        ``apply_chat_template`` renders a template (a sandboxed Jinja environment with
        ``trim_blocks``, ``lstrip_blocks``, loop controls and ``raise_exception``); the
        backends use their own renderers of the same template (llama-cpp-python's
        ``Jinja2ChatFormatter``, the tokenizer's ``apply_chat_template``)."""
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise ValueError(message)

        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
        )
        return env.from_string(self.source).render(
            messages=messages,
            add_generation_prompt=True,
            bos_token=bos_token,
            eos_token=eos_token,
            raise_exception=raise_exception,
        )


def chat_template(value: str | Path | None) -> ChatTemplate | None:
    """The template the user names: a built-in name (:data:`BUILTIN`) or a file holding a Jinja
    template; ``None`` for ``None`` (the model's own). ``ValueError`` for an unknown name, a
    missing, empty or unreadable file, or a template Jinja cannot parse (naming the file and
    line)."""
    if value is None:
        return None
    if not isinstance(value, (str, Path)):
        raise TypeError(
            f"expected chat_template to be a template name ({', '.join(BUILTIN)}) or a file "
            f"path, got {type(value).__name__}"
        )
    if isinstance(value, str) and value in BUILTIN:
        return ChatTemplate(BUILTIN[value], "builtin", name=value)
    path = Path(value).expanduser()
    if not path.is_file():
        if isinstance(value, str) and "/" not in value and "." not in value:
            raise unknown_name(
                "chat template name (or an existing Jinja template file)", value, BUILTIN
            )
        raise ValueError(
            f"expected chat_template to be {', '.join(BUILTIN)} or a Jinja template file, got "
            f"{str(value)!r}, which is neither (no such file)"
        )
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read the chat template ({exc})") from None
    if not source.strip():
        raise ValueError(f"{path}: expected a Jinja chat template, got an empty file")
    try:
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(source)
    except ImportError:  # checked when rendered
        pass
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(
            f"{path}, line {exc.lineno}: not a valid Jinja template ({exc.message})"
        ) from None
    return ChatTemplate(source, "file", file=str(path.resolve()))


def own_template(source: Any) -> ChatTemplate | None:
    """The model's own template from its ``tokenizer.chat_template`` (a GGUF's metadata or a
    tokenizer's attribute; a dict of named templates gives its ``default``), ``None`` when it
    has none."""
    if isinstance(source, dict):
        source = source.get("default")
    if not isinstance(source, str) or not source.strip():
        return None
    return ChatTemplate(source, "model")


def tokenizer_template(tokenizer: Any) -> dict[str, str] | None:
    """The record (:meth:`ChatTemplate.describe`) of the template a tokenizer renders chats
    with, its own; ``None`` when it has none. What a training run writes down."""
    own = own_template(getattr(tokenizer, "chat_template", None))
    return None if own is None else own.describe()


def decide(named: ChatTemplate | None, own: ChatTemplate | None, model: str) -> ChatTemplate:
    """The template a backend renders chats with: the named one, else the model's own; a
    model with neither is refused (:class:`MissingChatTemplate`, naming ``model`` and the fix).
    Both local backends take this decision, so they agree on every model."""
    if named is not None:
        return named
    if own is not None:
        return own
    raise MissingChatTemplate(
        f"{model} has no chat template, so its chat prompts cannot be written without "
        f"guessing a format; name the one it was trained with: {FIX} (Python: "
        "chat_template='chatml', or a Jinja template file)"
    )


def same_template(saved: Any, now: Any) -> bool:
    """Whether two recorded templates (:meth:`ChatTemplate.describe`, or ``None``) are the same
    for resuming a run: an absent record is the model's own (runs made before templates were
    recorded)."""
    if saved is None and (now is None or (isinstance(now, dict) and now.get("from") == "model")):
        return True
    return saved == now
