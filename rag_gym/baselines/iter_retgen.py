"""Iter-RetGen: retrieval and generation in turns (Shao et al., 2023, "Enhancing
Retrieval-Augmented Large Language Models with Iterative Retrieval-Generation Synergy").

Round 1 searches the question; each later round searches "question + the previous round's
answer draft"; after ``rounds`` (3) searches the model answers from all passages. Prompt
(``iter_retgen/v1``, our own words): the passages, the question, "Answer with a few words".
"""

from __future__ import annotations

from rag_gym.agents.llm_agent import (
    LLMAgent,
    answer,
    clean_answer,
    note,
    passages_text,
    search,
    user_message,
)


class IterRetGen(LLMAgent):
    name = "iter_retgen"
    max_tokens = 32
    stop = ("\n",)
    rounds = 3

    def start(self, obs, info):
        return {"question": info["question"], "steps": 0, "passages": [], "draft": None}

    def decide(self, state, obs, info):
        state["passages"].extend(p for p in info.get("passages", []) if p not in state["passages"])
        if info.get("num_searches", 0) == 0:
            return search(state["question"])
        if state["draft"] is not None and info.get("action_type") == "EVALUATE":
            return search(f"{state['question']} {state['draft']}")
        return user_message(
            f"Passages:\n{passages_text(state['passages'])}\n\nQuestion: {state['question']}\n"
            "Answer with a few words only.\nAnswer:"
        )

    def parse(self, state, text, obs, info):
        state["draft"] = clean_answer(text) or "unknown"
        if info.get("num_searches", 0) >= self.rounds:
            return answer(state["draft"])
        # record the draft in the transcript, then search with it (next step)
        return note(f"Draft answer: {state['draft']}")
