"""IRCoT: interleave chain-of-thought sentences with retrieval (Trivedi et al., 2023,
"Interleaving Retrieval with Chain-of-Thought Reasoning for Knowledge-Intensive Multi-Step
Questions").

Episode: search the question; then repeatedly ask the model for the *next* sentence of its
reasoning given all passages so far, and search with that sentence; stop when the sentence
says "answer is", or after ``max_rounds`` (4) reasoning sentences, and answer. Prompt
(``ircot/v1``, our own words): the passages, the question, the reasoning so far, and "Write
the next sentence of the reasoning. When you know the answer, write 'So the answer is: …'".
"""

from __future__ import annotations

import re

from rag_gym.agents.llm_agent import (
    LLMAgent,
    answer,
    first_line,
    passages_text,
    search,
    user_message,
)


class IRCoT(LLMAgent):
    name = "ircot"
    max_tokens = 48
    stop = ("\n",)
    max_rounds = 4

    def start(self, obs, info):
        return {"question": info["question"], "steps": 0, "passages": [], "thoughts": []}

    def decide(self, state, obs, info):
        state["passages"].extend(p for p in info.get("passages", []) if p not in state["passages"])
        if info.get("num_searches", 0) == 0:
            return search(state["question"])
        return user_message(
            f"Passages:\n{passages_text(state['passages'])}\n\nQuestion: {state['question']}\n"
            f"Reasoning so far: {' '.join(state['thoughts']) or '(none)'}\n"
            "Write the next sentence of the reasoning. When you know the answer, write "
            "'So the answer is: <answer>'."
        )

    def parse(self, state, text, obs, info):
        thought = first_line(text)
        state["thoughts"].append(thought)
        found = re.findall(r"answer is:?\s*(.+)", thought, flags=re.IGNORECASE)
        if found or len(state["thoughts"]) >= self.max_rounds or not thought:
            return answer(found[-1] if found else thought or "unknown")
        return search(thought)
