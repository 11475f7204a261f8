"""ReAct: interleaved Thought / Action / Observation (Yao et al., 2023, "ReAct: Synergizing
Reasoning and Acting in Language Models").

Each step the model writes "Thought: …" then "Action: Search[query]" or
"Action: Finish[answer]"; a search's passages come back as the next "Observation". Prompt
(``react/v1``, our own words) states the two actions and shows the transcript so far; a reply
with no action is read as a search with its thought, and after ``max_searches`` (5) the model
must finish.
"""

from __future__ import annotations

import re

from rag_gym.agents.llm_agent import LLMAgent, answer, first_line, passages_text, search


class ReAct(LLMAgent):
    name = "react"
    max_tokens = 64
    stop = ("\nObservation", "Observation:")
    max_searches = 5

    def start(self, obs, info):
        return {"question": info["question"], "steps": 0, "transcript": ""}

    def decide(self, state, obs, info):
        if info.get("passages"):
            state["transcript"] += f"Observation: {passages_text(info['passages'])}\n"
        must_finish = info.get("num_searches", 0) >= self.max_searches
        rule = "You must now use Finish[answer]." if must_finish else ""
        return [
            {
                "role": "user",
                "content": (
                    "Solve the question with steps of 'Thought: <reasoning>' then 'Action: Search[<query>]' or "
                    f"'Action: Finish[<short answer>]'. {rule}\n\nQuestion: {state['question']}\n{state['transcript']}Thought:"
                ),
            }
        ]

    def parse(self, state, text, obs, info):
        state["transcript"] += f"Thought: {text.strip()}\n"
        finish = re.findall(r"Finish\[(.*?)\]", text)
        query = re.findall(r"Search\[(.*?)\]", text)
        if finish or info.get("num_searches", 0) >= self.max_searches:
            return answer(finish[-1] if finish else first_line(text))
        return search(
            query[0] if query and query[0].strip() else first_line(text) or state["question"]
        )
