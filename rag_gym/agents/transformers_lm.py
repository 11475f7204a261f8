"""Hugging Face transformers backend: a hub id, a local directory or a GGUF file; CPU or GPU; batched.

The default model is the embedded SmolLM2-135M-Instruct GGUF (dequantised by transformers at
load, about 20 s on 2 cores), so this backend works offline and is the one that can be trained
(:attr:`TransformersLM.model` is a regular ``PreTrainedModel``). Needs ``pip install
'rag-gym[hf]'`` (transformers, accelerate and gguf; install torch first).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_gym.agents.lm import Generation, GenerationConfig, LanguageModel, Prompt, check_prompts


def _split_model(model: str | Path | None) -> tuple[str, str | None, str]:
    """(path or id to load, gguf file name or None, label)."""
    if model is None:
        from rag_gym.agents.llama_cpp import embedded_gguf_path

        path = embedded_gguf_path()
        return str(path.parent), path.name, path.stem
    p = Path(model)
    if p.suffix == ".gguf":
        if not p.is_file():
            raise FileNotFoundError(
                f"no GGUF model file at {p}; pass an existing .gguf file, a directory or a hub id"
            )
        return str(p.parent), p.name, p.stem
    return str(model), None, str(model)


class TransformersLM(LanguageModel):
    """Batched generation with ``transformers``.

    Args:
        model: a hub id, a local model directory, or a ``.gguf`` file; ``None`` is the embedded
            SmolLM2-135M-Instruct.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``…; default: CUDA when available.
        dtype: torch dtype name (``"float32"``, ``"bfloat16"``…); default float32 on CPU,
            bfloat16 on GPU.
        batch_size: prompts per forward batch.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        device: str | None = None,
        dtype: str | None = None,
        batch_size: int = 8,
    ) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ImportError(
                "the transformers backend needs torch and transformers: pip install 'rag-gym[hf]'"
            ) from exc
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"expected batch_size >= 1, got {batch_size!r}")
        source, gguf, label = _split_model(model)
        self.name = label
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = dtype or ("float32" if self.device == "cpu" else "bfloat16")
        if not hasattr(torch, dtype):
            raise ValueError(
                f"expected a torch dtype name such as 'float32' or 'bfloat16', got {dtype!r}"
            )
        kwargs: dict[str, Any] = {"dtype": getattr(torch, dtype)}
        if gguf:
            kwargs["gguf_file"] = gguf
            try:
                import accelerate  # noqa: F401
                import gguf as _gguf  # noqa: F401
            except ImportError as exc:
                raise ImportError(
                    "loading a GGUF file with transformers needs accelerate and gguf: "
                    "pip install 'rag-gym[hf]'"
                ) from exc
        self.tokenizer = AutoTokenizer.from_pretrained(
            source, **({"gguf_file": gguf} if gguf else {})
        )
        self.model = AutoModelForCausalLM.from_pretrained(source, **kwargs).to(self.device)
        self.model.eval()
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.batch_size = batch_size
        self._torch = torch

    def render(self, prompt: Prompt) -> str:
        """The text a prompt becomes (chat template with the generation prompt for chats)."""
        if isinstance(prompt, str):
            return prompt
        return self.tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, tokenize=False
        )

    def generate(
        self, prompts: Sequence[Prompt], config: GenerationConfig | None = None
    ) -> list[list[Generation]]:
        config = config or GenerationConfig()
        texts = [self.render(p) for p in check_prompts(prompts)]
        out: list[list[Generation]] = []
        for start in range(0, len(texts), self.batch_size):
            out.extend(
                self._batch(
                    texts[start : start + self.batch_size], config, seed=config.seed + start
                )
            )
        return out

    def _batch(
        self, texts: list[str], config: GenerationConfig, seed: int
    ) -> list[list[Generation]]:
        torch, tok = self._torch, self.tokenizer
        enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(
            self.device
        )
        kwargs: dict[str, Any] = {
            "max_new_tokens": config.max_tokens,
            "pad_token_id": tok.pad_token_id,
            "num_return_sequences": config.n,
        }
        if config.temperature > 0:
            kwargs.update(do_sample=True, temperature=config.temperature, top_p=config.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if config.stop:
            kwargs.update(stop_strings=list(config.stop), tokenizer=tok)
        torch.manual_seed(seed)
        with torch.inference_mode():
            sequences = self.model.generate(**enc, **kwargs)
        width = enc["input_ids"].shape[1]
        prompt_lens = enc["attention_mask"].sum(dim=1).tolist()
        results: list[list[Generation]] = []
        special = {tok.pad_token_id, tok.eos_token_id}
        for i in range(len(texts)):
            samples = []
            for j in range(config.n):
                new = sequences[i * config.n + j, width:].tolist()
                n_tokens = next((k for k, t in enumerate(new) if t in special), len(new))
                text = tok.decode(new[:n_tokens], skip_special_tokens=True)
                finish = "stop" if n_tokens < len(new) or n_tokens < config.max_tokens else "length"
                for s in config.stop:
                    cut = text.find(s)
                    if cut >= 0:
                        text, finish = text[:cut], "stop"
                samples.append(
                    Generation(
                        text=text,
                        prompt_tokens=int(prompt_lens[i]),
                        completion_tokens=n_tokens,
                        finish_reason=finish,
                    )
                )
            results.append(samples)
        return results

    def describe(self) -> dict[str, object]:
        return {"backend": "transformers", "model": self.name, "device": self.device}
