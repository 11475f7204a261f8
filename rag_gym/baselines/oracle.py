"""Oracle reader: answers from the gold passages themselves — an upper bound for the reader.

It searches nothing: its prompt (``oracle/v1``, the Naive RAG prompt) holds the question's gold
passages, which it reads from the env's corpus by ``info["gold_ids"]`` (so it needs the env,
given at construction). Its EM is what the language model can do when retrieval is perfect;
the gap to Naive RAG is what retrieval costs.
"""

from __future__ import annotations

from rag_gym.baselines.naive_rag import NaiveRAG, reader_prompt


class OracleReader(NaiveRAG):
    name = "oracle"

    def __init__(self, lm, corpus=None, max_tokens=None) -> None:
        super().__init__(lm, max_tokens=max_tokens)
        self.corpus = corpus

    def decide(self, state, obs, info):
        if self.corpus is None:
            raise ValueError(
                "the oracle reads gold passages from the corpus: build it with make_agent(..., env=env)"
            )
        gold = [self.corpus[g] for g in info.get("gold_ids", []) if g in self.corpus]
        passages = [{"title": p.title, "text": p.text} for p in gold]
        return reader_prompt(passages, state["question"])
