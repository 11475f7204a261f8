"""Direct answer and chain-of-thought: no retrieval, the model's own knowledge only.

* ``direct`` (``direct/v1``): the question and "Answer with a few words."; the reply's first
  line is the answer. The closed-book floor every RAG paper reports.
* ``cot`` (``cot/v1``, Wei et al., 2022, "Chain-of-Thought Prompting Elicits Reasoning"):
  "Think step by step, then finish with 'So the answer is: …'"; the text after the last
  "answer is" is the answer (the whole reply's first line when the marker is missing).

On SynthHop both score about zero by design: the world is fictional, nothing can be recalled.
"""

from __future__ import annotations

import re

from rag_gym.agents.llm_agent import LLMAgent, answer, user_message


class DirectAnswer(LLMAgent):
    """Answer from the model's own knowledge, no search."""

    name = "direct"
    max_tokens = 32
    stop = ("\n\n",)

    def decide(self, state, obs, info):
        return user_message(
            f"Question: {state['question']}\nAnswer with a few words only.\nAnswer:"
        )

    def parse(self, state, text, obs, info):
        return answer(text)


class ChainOfThought(LLMAgent):
    """Reason step by step, then answer; no search."""

    name = "cot"
    max_tokens = 160

    def decide(self, state, obs, info):
        return user_message(
            f"Question: {state['question']}\nThink step by step in a few sentences, then finish with "
            "'So the answer is: <answer>'."
        )

    def parse(self, state, text, obs, info):
        found = re.findall(r"answer is:?\s*(.+)", text, flags=re.IGNORECASE)
        return answer(found[-1] if found else text)
