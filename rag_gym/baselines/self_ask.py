"""Self-Ask: follow-up questions with intermediate answers (Press et al., 2023, "Measuring and
Narrowing the Compositionality Gap in Language Models").

The model writes the self-ask scaffold: "Are follow up questions needed here: Yes.",
"Follow up: …", "Intermediate answer: …", …, "So the final answer is: …". Each follow-up
question is searched and the model writes its intermediate answer from the passages; at most
``max_follow_ups`` (4). Prompt (``self_ask/v1``, our own words) shows one worked example of the
scaffold on a fictional question.
"""

from __future__ import annotations

import re

from rag_gym.agents.llm_agent import LLMAgent, answer, note, passages_text, search, user_message

EXAMPLE = (
    "Question: Who founded the company that published The Glass Road?\n"
    "Are follow up questions needed here: Yes.\n"
    "Follow up: Which company published The Glass Road?\n"
    "Intermediate answer: Marlow Press.\n"
    "Follow up: Who founded Marlow Press?\n"
    "Intermediate answer: Ida Wren.\n"
    "So the final answer is: Ida Wren\n"
)


class SelfAsk(LLMAgent):
    name = "self_ask"
    max_tokens = 48
    stop = ("\n",)
    max_follow_ups = 4

    def start(self, obs, info):
        return {
            "question": info["question"],
            "steps": 0,
            "scratch": "Are follow up questions needed here: Yes.\n",
            "follow_ups": 0,
            "mode": "next",
        }

    def _prompt(self, state, passages):
        context = f"Passages:\n{passages_text(passages)}\n\n" if passages else ""
        return user_message(
            f"Answer by asking follow up questions, as in this example.\n\n{EXAMPLE}\n{context}"
            f"Question: {state['question']}\n{state['scratch']}"
        )

    def decide(self, state, obs, info):
        if state["mode"] == "answer_follow_up":  # after a search: write the intermediate answer
            state["mode"] = "intermediate"
            state["scratch"] += "Intermediate answer:"
            return self._prompt(state, info.get("passages", []))
        return self._prompt(state, [])

    def parse(self, state, text, obs, info):
        line = text.strip().splitlines()[0].strip() if text.strip() else ""
        if state["mode"] == "intermediate":
            state["scratch"] += f" {line}\n"
            state["mode"] = "next"
            if state["follow_ups"] >= self.max_follow_ups:
                return answer(line)
            return note(f"Intermediate answer: {line or 'unknown'}")
        final = re.findall(r"final answer is:?\s*(.+)", line, flags=re.IGNORECASE)
        follow = re.findall(r"follow up:\s*(.+)", line, flags=re.IGNORECASE)
        if follow and not final and state["follow_ups"] < self.max_follow_ups:
            state["follow_ups"] += 1
            state["scratch"] += f"Follow up: {follow[0]}\n"
            state["mode"] = "answer_follow_up"
            return search(follow[0])
        return answer(final[0] if final else line)
