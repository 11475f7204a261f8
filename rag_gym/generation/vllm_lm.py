"""vLLM backend (GPU). Imported only when used; ``pip install 'rag-gym[gpu]'`` on a CUDA machine.

Chat prompts go through ``LLM.chat`` (the model's chat template), plain prompts through
``LLM.generate``, token ids (:meth:`VLLMLM.generate_ids`, a trainer's rollouts) through
``LLM.generate`` of ``prompt_token_ids``; a whole batch is one call, which vLLM schedules with
continuous batching.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rag_gym.generation.lm import Generation, GenerationConfig, LanguageModel, Prompt, check_prompts


def _import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise ImportError(
            "the vLLM backend needs vllm and a CUDA GPU: pip install 'rag-gym[gpu]'"
        ) from exc
    return vllm


class VLLMLM(LanguageModel):
    """Generation with vLLM.

    Args:
        model: a hub id or local directory.
        gpu_memory_utilization: fraction of GPU memory vLLM may take.
        max_model_len: context length (None: the model's).
        seed: engine seed.
        **engine_kwargs: passed to ``vllm.LLM``.
    """

    def __init__(
        self,
        model: str,
        gpu_memory_utilization: float = 0.8,
        max_model_len: int | None = None,
        seed: int = 0,
        **engine_kwargs,
    ) -> None:
        self._vllm = _import_vllm()
        self.name = model
        self.llm = self._vllm.LLM(
            model=model,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            seed=seed,
            **engine_kwargs,
        )

    @classmethod
    def from_llm(cls, llm: Any, name: str = "vllm") -> VLLMLM:
        """Wrap a ``vllm.LLM`` already running without loading anything: the engine TRL
        colocates with a GRPO trainer (:func:`~rag_gym.train.trl_compat.colocated_vllm`), whose
        weights follow the policy's."""
        lm = cls.__new__(cls)
        lm._vllm, lm.name, lm.llm = _import_vllm(), name, llm
        return lm

    def _params(self, config: GenerationConfig, **changes: Any) -> Any:
        options = {
            "n": config.n,
            "temperature": config.temperature,
            "top_p": config.top_p,
            "max_tokens": config.max_tokens,
            "stop": list(config.stop) or None,
            "seed": config.seed,
        }
        return self._vllm.SamplingParams(**{**options, **changes})

    def generate(
        self, prompts: Sequence[Prompt], config: GenerationConfig | None = None
    ) -> list[list[Generation]]:
        config = config or GenerationConfig()
        prompts = check_prompts(prompts)
        params = self._params(config)
        out: list[list[Generation] | None] = [None] * len(prompts)
        chats = [i for i, p in enumerate(prompts) if not isinstance(p, str)]
        plain = [i for i, p in enumerate(prompts) if isinstance(p, str)]
        if chats:
            for i, res in zip(
                chats,
                self.llm.chat([prompts[i] for i in chats], params, use_tqdm=False),
                strict=True,
            ):
                out[i] = self._convert(res)
        if plain:
            for i, res in zip(
                plain,
                self.llm.generate([prompts[i] for i in plain], params, use_tqdm=False),
                strict=True,
            ):
                out[i] = self._convert(res)
        return [o for o in out if o is not None]

    def generate_ids(
        self, prompts: Sequence[Sequence[int]], config: GenerationConfig
    ) -> list[tuple[list[int], str]]:
        """:meth:`LanguageModel.generate_ids`: prompt ``i`` sampled with seed ``seed + i``, a
        stop string kept in the output (``include_stop_str_in_output``)."""
        params = [
            self._params(config, n=1, seed=config.seed + i, include_stop_str_in_output=True)
            for i in range(len(prompts))
        ]
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False
        )
        return [
            (list(o.outputs[0].token_ids), o.outputs[0].finish_reason or "stop") for o in outputs
        ]

    @staticmethod
    def _convert(result) -> list[Generation]:
        n_prompt = len(result.prompt_token_ids or [])
        return [
            Generation(
                text=c.text,
                prompt_tokens=n_prompt,
                completion_tokens=len(c.token_ids),
                finish_reason=c.finish_reason or "stop",
            )
            for c in result.outputs
        ]

    def describe(self) -> dict[str, object]:
        return {"backend": "vllm", "model": self.name}
