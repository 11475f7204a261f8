"""Naive RAG: retrieve once with the question, then answer from the passages.

The standard single-retrieval baseline (Lewis et al., 2020, "Retrieval-Augmented Generation
for Knowledge-Intensive NLP Tasks"; FlashRAG's "Standard RAG"). Episode: ``SEARCH(question)``,
then ``ANSWER(LLM(question + top-k passages))``. It never searches twice, so on SynthHop a
2-hop question is answerable only when the single search happens to bring both hops.

Prompt (``naive_rag/v1``, our own words): a system message asking for the bare answer, and a
user message with the numbered passages, the question and ``Answer:``. The reply's first line,
minus an ``Answer:`` prefix, quotes and a final full stop, is the answer; an empty reply
answers ``unknown``.
"""

from __future__ import annotations

from rag_gym.agents.llm_agent import LLMAgent, answer, clean_answer, passages_text, search

__all__ = ["SYSTEM_PROMPT", "NaiveRAG", "clean_answer"]

SYSTEM_PROMPT = (
    "You answer questions using the passages you are given. Reply with the answer only: "
    "a name, a place, a year or a short phrase. Do not write a sentence."
)


def reader_prompt(passages: list[dict[str, str]], question: str) -> list[dict[str, str]]:
    """The ``naive_rag/v1`` prompt: :data:`SYSTEM_PROMPT`, then the numbered ``passages``, the
    question and ``Answer:``."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": f"Passages:\n{passages_text(passages)}\n\nQuestion: {question}\nAnswer:",
        },
    ]


class NaiveRAG(LLMAgent):
    """Retrieve once with the question, answer from the top-k passages."""

    name = "naive_rag"
    max_tokens = 32
    stop = ("\n\n",)

    def decide(self, state, obs, info):
        if info.get("num_searches", 0) == 0:
            return search(state["question"])
        return reader_prompt(info["passages"], state["question"])

    def parse(self, state, text, obs, info):
        return answer(text)
