"""Naive RAG: retrieve once with the question, then answer from the passages.

The standard single-retrieval baseline (Lewis et al., 2020, "Retrieval-Augmented Generation
for Knowledge-Intensive NLP Tasks"; FlashRAG's "Standard RAG"). Episode: ``SEARCH(question)``,
then ``ANSWER(LLM(question + top-k passages))``. It never searches twice, so on SynthHop a
2-hop question is answerable only when the single search happens to bring both hops.

Prompt (version ``naive_rag/v1``, our own words): a system message asking for the bare answer,
and a user message with the env's observation (question and numbered passages) followed by
``Answer:``. The reply's first line, minus an ``Answer:`` prefix, quotes and a final full stop,
is the answer; an empty reply answers ``unknown``.
"""

from __future__ import annotations

from typing import Any

from rag_gym.agents.base import Agent
from rag_gym.agents.lm import GenerationConfig, LanguageModel
from rag_gym.envs.search import ActionType

PROMPT_VERSION = "naive_rag/v1"
SYSTEM_PROMPT = (
    "You answer questions using the passages you are given. Reply with the answer only: "
    "a name, a place, a year or a short phrase. Do not write a sentence."
)


def clean_answer(text: str) -> str:
    """First non-empty line, without an ``Answer:`` prefix, quotes or a final full stop.

    >>> clean_answer("Answer: \\"Velmora\\".\\nBecause ...")
    'Velmora'
    """
    line = next((ln.strip() for ln in text.strip().splitlines() if ln.strip()), "")
    for prefix in ("answer:", "final answer:", "a:"):
        if line.lower().startswith(prefix):
            line = line[len(prefix) :].strip()
    line = line.rstrip(". ").strip("\"'` ").rstrip(". ")
    return line


class NaiveRAG(Agent):
    """Retrieve once with the question, answer from the top-k passages."""

    name = "naive_rag"

    def __init__(self, lm: LanguageModel, max_tokens: int = 32) -> None:
        super().__init__()
        self.lm = lm
        self.config = GenerationConfig(max_tokens=max_tokens, temperature=0.0, stop=("\n\n",))

    def _needs_search(self, info: dict[str, Any]) -> bool:
        return info.get("num_searches", 0) == 0

    def act(self, observation: str, info: dict[str, Any]) -> dict[str, Any]:
        return self.act_batch([observation], [info])[0]

    def act_batch(self, observations, infos) -> list[dict[str, Any]]:
        actions: list[dict[str, Any] | None] = [None] * len(observations)
        prompts, slots = [], []
        for i, (obs, info) in enumerate(zip(observations, infos, strict=True)):
            if self._needs_search(info):
                actions[i] = {"type": ActionType.SEARCH, "text": info["question"]}
            else:
                prompts.append(
                    [
                        {"role": "system", "content": SYSTEM_PROMPT},
                        {
                            "role": "user",
                            "content": f"{obs}\n\nAnswer the question in a few words.\nAnswer:",
                        },
                    ]
                )
                slots.append(i)
        if prompts:
            for slot, gens in zip(slots, self.lm.generate(prompts, self.config), strict=True):
                gen = gens[0]
                self.usage["prompt_tokens"] += gen.prompt_tokens
                self.usage["completion_tokens"] += gen.completion_tokens
                actions[slot] = {
                    "type": ActionType.ANSWER,
                    "text": clean_answer(gen.text)[:200] or "unknown",
                }
        return [a for a in actions if a is not None]

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "prompt_version": PROMPT_VERSION,
            "lm": self.lm.describe(),
            "max_tokens": self.config.max_tokens,
        }
