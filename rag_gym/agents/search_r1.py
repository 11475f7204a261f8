"""``search_r1``: the generic text-action policy, as the RL trainers play it.

The agent plays the search env through :class:`~rag_gym.wrappers.TextActions` (its
``env_kind`` is ``"text"``: the evaluator wraps the search env with the agent's tag preset) and
sees exactly the token stream a policy sees in training (:mod:`rag_gym.train.rollout`):

* the prompt is the model's chat template of :func:`~rag_gym.wrappers.text_actions.start_messages`
  (the tag set's instructions as the system message, then ``Question: …``) with the generation
  prompt;
* each turn the model continues that one assistant message until an action tag closes
  (``</search>``, ``</answer>``, or the ``/>`` of ``<backtrack/>`` and ``<refuse/>``: the same
  stop strings, :func:`turn_stops`), and the
  observation is appended with :data:`~rag_gym.wrappers.text_actions.OBS_TEMPLATE`.

So a checkpoint trained here (a full model, or a LoRA adapter over its base; see
:func:`rag_gym.generation.backends.make_lm`), or a released Search-R1 checkpoint served by vLLM,
is evaluated under rag-gym's protocol unchanged. Backends that cannot render a chat template
locally (an OpenAI-compatible server) get the episode as chat messages instead: each reply an
assistant message, each observation a user message. A local backend whose model has no chat
template, and none named, is refused when the agent is made (never a guessed format).

Tag presets: ``search_r1`` (default), ``eval_rar``, ``evo_rag``, ``when_to_search``, ``all``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from rag_gym.agents.llm_agent import LLMAgent, user_message
from rag_gym.envs.tags import TagSet, parse, tag_set
from rag_gym.generation.lm import LanguageModel
from rag_gym.wrappers.text_actions import OBS_TEMPLATE, start_messages

#: the answer that ends an episode whose policy ran out of turns
GIVE_UP = "unknown"
_OPEN_TAIL = re.compile(r"<\s*([A-Za-z][\w-]*)\s*$")


def turn_stops(tags: TagSet) -> tuple[str, ...]:
    """The stop strings that end a policy's turn: the closing action tags (not
    ``</evaluate>``: Eval-RAR writes an evaluation and a search in one turn), and ``/>`` for the
    self-closing ones (``<backtrack/>``, ``<refuse/>``).

    Backends (llama.cpp, vLLM, OpenAI-compatible servers, transformers) return the text without
    the stop string they met, and do not say which one it was. A closing tag is put back from the
    tag left open (:func:`restore_stop`); a whole self-closing tag would leave nothing behind, so
    its stop string is the ``/>`` they share: the text keeps ``<refuse`` and :func:`restore_stop`
    completes it. (With ``<refuse/>`` itself as the stop string, a refusal came back as a
    reply with no action at all.)"""
    stops = [f"</{tags.search}>", f"</{tags.answer}>"]
    if tags.backtrack or tags.refuse:
        stops.append("/>")
    return tuple(stops)


def restore_stop(text: str, tags: TagSet) -> str:
    """Put back the stop string a backend cut off the end of ``text`` (backends return text
    without it; a trainer's rollout keeps it): a closing tag for an action tag left open, or
    ``/>`` after a self-closing action's name (``<refuse``)."""
    m = _OPEN_TAIL.search(text)
    if m is not None and m.group(1).lower() in tags.self_closing():
        return text[: m.start()] + f"<{m.group(1).lower()}/>"
    parsed = parse(text, names=tags.all_names(), self_closing=tags.self_closing())
    for name in (tags.search, tags.answer):
        if name in parsed.unclosed and text.rfind(f"<{name}>") > text.rfind(f"</{name}>"):
            return text + f"</{name}>"
    return text


class SearchR1Agent(LLMAgent):
    """The text-action policy (see the module doc).

    Args:
        lm: any backend; one that renders chat templates (``chat_prompt``) gets the trainers'
            exact prompt.
        tags: the TextActions tag preset the policy writes.
        max_tokens: new tokens per turn at most (the trainers' ``max_turn_tokens``).
        max_turns: model turns per episode at most (the trainers' ``max_turns``); after them the
            episode is ended with the answer :data:`GIVE_UP`, counted as a bad reply. An episode
            whose prompt fills the model's context window ends the same way.
        prompt: a prompt template instead of the trainers' prompt: the episode's first (user)
            message, with ``{question}`` replaced by the question; for a checkpoint trained on
            another project's prompt, which the user supplies. Its SHA-256 is in
            :meth:`describe`.
    """

    name = "search_r1"
    env_kind = "text"
    prompt_version = "v1"
    max_tokens = 128

    def __init__(
        self,
        lm: LanguageModel,
        tags: str | TagSet = "search_r1",
        max_tokens: int | None = None,
        max_turns: int = 8,
        prompt: str | None = None,
    ) -> None:
        super().__init__(lm, max_tokens=max_tokens)
        if prompt is not None and (not isinstance(prompt, str) or "{question}" not in prompt):
            raise ValueError(
                "expected the prompt template to be a string holding {question} where the "
                f"question goes, got {prompt!r:.80}"
            )
        self.prompt = prompt
        self.tags = tag_set(tags)
        if self.tags.search is None or self.tags.answer is None:
            raise ValueError(
                f"expected a tag preset with search and answer, got {self.tags.name!r}"
            )
        if not isinstance(max_turns, int) or max_turns < 1:
            raise ValueError(f"expected max_turns >= 1, got {max_turns!r}")
        self.max_turns = max_turns
        self.config = replace(self.config, stop=turn_stops(self.tags))

    def start(self, obs: Any, info: dict[str, Any]) -> dict[str, Any]:
        if self.prompt is None:
            messages = start_messages(self.tags, info["question"])
        else:
            messages = user_message(self.prompt.replace("{question}", info["question"]))
        try:
            head = self.lm.chat_prompt(messages)
        except NotImplementedError:  # a server renders the chat (OpenAI-compatible backends)
            head = None
        return {"messages": messages, "head": head, "turns": [], "steps": 0}

    def decide(self, state: dict[str, Any], obs: Any, info: dict[str, Any]) -> Any:
        if state["head"] is not None:
            return state["head"] + completion_text(state["turns"])
        chat = list(state["messages"])
        for reply, observation in state["turns"]:
            chat.append({"role": "assistant", "content": reply})
            chat.append({"role": "user", "content": observation})
        return chat

    def parse(self, state: dict[str, Any], text: str, obs: Any, info: dict[str, Any]) -> str:
        reply = restore_stop(text, self.tags)
        state["turns"].append([reply, ""])
        return reply

    def act_batch(self, observations, infos, slots):
        actions: list[Any] = [None] * len(slots)
        todo = []
        for i, (obs, info, slot) in enumerate(zip(observations, infos, slots, strict=True)):
            state = self._states.get(slot)
            if state is None:
                state = self._states[slot] = self.start(obs, info)
            elif state["turns"]:
                state["turns"][-1][1] = obs  # what the env answered to the last reply
            if len(state["turns"]) >= self.max_turns:
                actions[i] = f"<{self.tags.answer}>{GIVE_UP}</{self.tags.answer}>"
                self.usage_of(slot)["bad_replies"] += 1
            else:
                todo.append(i)
        if todo:
            done = super().act_batch(
                [observations[i] for i in todo],
                [infos[i] for i in todo],
                [slots[i] for i in todo],
            )
            for i, action in zip(todo, done, strict=True):
                # the episode no longer fits the model's context window: give up at once (the
                # empty reply already counts as a bad reply)
                full = self._states[slots[i]].get("context_full")
                actions[i] = (
                    f"<{self.tags.answer}>{GIVE_UP}</{self.tags.answer}>" if full else action
                )
        return actions

    def describe(self) -> dict[str, Any]:
        out = {**super().describe(), "tags": self.tags.name, "max_turns": self.max_turns}
        if self.prompt is not None:
            out["prompt_sha256"] = hashlib.sha256(self.prompt.encode("utf-8")).hexdigest()
        return out


def completion_text(turns: list[list[str]], obs_template: str = OBS_TEMPLATE) -> str:
    """The assistant message so far: each reply followed by its observation (the last reply's
    observation once the env has answered it)."""
    parts = []
    for reply, observation in turns:
        parts.append(reply)
        parts.append(obs_template.format(obs=observation) if observation else "\n")
    return "".join(parts)


#: checkpoints that ship with rag-gym, by name (folders under ``rag_gym/checkpoints``)
SHIPPED = {"synthhop": "synthhop-search-r1"}


def checkpoint_path(name: str) -> Path:
    """A shipped checkpoint's folder by name (``synthhop``), or the given path (an adapter
    folder, a training run folder, or a ``.gguf`` adapter)."""
    if name in SHIPPED:
        folder = Path(__file__).resolve().parent.parent / "checkpoints" / SHIPPED[name]
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(
                f"the shipped checkpoint {name!r} is missing from {folder}; reinstall rag-gym"
            )
        return folder
    path = Path(name).expanduser()
    if not path.exists():
        raise FileNotFoundError(
            f"expected a shipped checkpoint ({', '.join(SHIPPED)}) or an existing adapter folder, "
            f"run folder or .gguf file, got {name!r}"
        )
    return path


def checkpoint_tags(path: str | Path) -> str | None:
    """The tag preset a checkpoint was trained with, or ``None`` where it does not say.

    A packaged checkpoint records it in ``rag_gym.json``; a training run folder in its
    ``config.json`` (``tags``). ``path`` may be the run folder, an adapter folder inside it
    (``final/``, ``checkpoint-N/``, an EVO-RAG DPO ``<stage>/cycle<n>/``) or a ``.gguf`` adapter
    file: the folders searched are :func:`~rag_gym.agents.provenance.training_sets`' own
    (:func:`~rag_gym.agents.provenance.record_folders`), stopping at the first that holds a
    record."""
    from rag_gym.agents.provenance import read_record, record_folders

    for where in record_folders(path):
        records = [read_record(where / name) for name in ("rag_gym.json", "config.json")]
        for meta in records:
            if meta and isinstance(meta.get("tags"), str):
                return meta["tags"]
        if any(meta and isinstance(meta.get("env_id"), str) for meta in records):
            return None  # the run's record, silent on its tags
    return None
