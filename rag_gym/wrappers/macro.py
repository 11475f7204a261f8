"""``MacroActions``: a ``Discrete`` action set over a :class:`~rag_gym.envs.SearchEnv`, for
classic RL (PPO, DQN) that cannot write text.

Each discrete action is a *macro*: a rule that writes the query or the answer from what the
episode shows so far (the question, the passages of the latest search), then takes one env
step with it. The rules are plain text processing, documented below, so a learned policy only
chooses *which* rule to apply when: which entity to follow, how many hops to make, which
extracted candidate to answer, when to backtrack or refuse.

Candidate extraction (:func:`candidates`) reads one passage and lists, in order of appearance:

* names: maximal runs of capitalised words ("Korvashin Guild", "The Kanuthom Loom"), minus a
  leading sentence word such as "It", "Its", "In" (``STARTERS``);
* numbers of 3 or 4 digits (years);
* descriptors: the lower-case words after "is/are/was/were a/an/the", up to a function word,
  a verb of the world's fact sentences or punctuation ("cartographer", "goukreik shell").

The passage's own title is never a candidate, and each candidate appears once.

The *focus passage* (:func:`focus_passage`) is the passage of the latest active search whose
title occurs in that search's query (the entity the query named), else its top-ranked passage.

>>> candidates("Ada Vell is a painter born in 1901 in Orrin. It was sold to Kestrel Guild.", "Ada Vell")
['painter', '1901', 'Orrin', 'Kestrel Guild']
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rag_gym.envs.search import ActionType, SearchEnv

#: capitalised words that begin sentences and are no part of a name
_STARTER_WORDS = (
    "A An The It Its He She His Her They Their This These That Those In On At By For From Of "
    "Who Whom Whose Which What Where When Why How Was Were Is Are And But Or"
)
STARTERS = frozenset(_STARTER_WORDS.split())
#: words that end a descriptor ("a chemist born in …" → "chemist")
_STOP_WORDS = (
    "born published founded established written built made based located known named whose "
    "who which that in of by with and or for at on from to since under than as"
)
_DESCRIPTOR_STOP = frozenset(_STOP_WORDS.split())
_NAME = re.compile(r"[A-Z][\w'’\-]*(?:[ \t]+[A-Z][\w'’\-]*)*")
_NUMBER = re.compile(r"(?<![\w.,])\d{3,4}(?!\w|[.,]\d)")
_DESCRIPTOR = re.compile(r"\b(?:is|are|was|were) (?:a|an|the) ((?:[a-z][\w'’\-]*[,.;:]?[ \t]*)+)")


def _names(text: str) -> list[tuple[int, str]]:
    out = []
    for m in _NAME.finditer(text):
        words = m.group(0).split()
        start = m.start()
        # drop a sentence word in front ("In Orrin" → "Orrin"); keep "The" inside a name
        while words and words[0] in STARTERS and (words[0] != "The" or len(words) == 1):
            start += text[start:].index(words[0]) + len(words[0])
            words = words[1:]
        if words:
            out.append((text.index(words[0], start), " ".join(words)))
    return out


def _descriptors(text: str) -> list[tuple[int, str]]:
    out = []
    for m in _DESCRIPTOR.finditer(text):
        words: list[str] = []
        for raw in m.group(1).split():
            word = raw.rstrip(",.;:")
            if word in _DESCRIPTOR_STOP:
                break
            words.append(word)
            if word != raw:  # punctuation ends the phrase
                break
        if words:
            out.append((m.start(1), " ".join(words)))
    return out


def candidate_spans(text: str, title: str = "") -> list[tuple[int, str, str]]:
    """``(position, candidate, kind)`` for each candidate of ``text`` in order of appearance,
    without ``title``; ``kind`` is ``"name"``, ``"number"`` or ``"descriptor"``."""
    found = [(i, c, "name") for i, c in _names(text)]
    found += [(m.start(), m.group(0), "number") for m in _NUMBER.finditer(text)]
    found += [(i, c, "descriptor") for i, c in _descriptors(text)]
    seen = {title.strip().lower()} if title.strip() else set()
    out = []
    for item in sorted(found, key=lambda x: x[0]):
        key = item[1].lower()
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def candidates(text: str, title: str = "") -> list[str]:
    """Names, numbers and descriptors of ``text`` in order of appearance, without ``title``.

    >>> candidates("Orrin is a city in Tamaria, founded in 1415.", "Orrin")
    ['city', 'Tamaria', '1415']
    """
    return [cand for _, cand, _ in candidate_spans(text, title)]


def question_entities(question: str) -> list[str]:
    """The names in a question ("Who was born first, Ada Vell or Bo Rann?" → both names).

    >>> question_entities("Which was published first, The Iron Bell or The Tide Atlas?")
    ['The Iron Bell', 'The Tide Atlas']
    """
    return [name for _, name in _names(question)]


def focus_passage(query: str, passages: Sequence[dict[str, str]]) -> dict[str, str] | None:
    """The first passage (in rank order) whose title occurs in ``query``, else the first one;
    ``None`` when there are none. Passages are ``{"title", "text"}`` dicts."""
    if not passages:
        return None
    q = query.lower()
    for p in passages:
        title = p.get("title", "").strip().lower()
        if title and title in q:
            return p
    return passages[0]


def first_number(text: str) -> int | None:
    m = _NUMBER.search(text)
    return int(m.group(0)) if m else None


class MacroActions(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """``Discrete(2 * n_candidates + 4)`` macro actions over a SearchEnv's ``Dict`` actions.

    ## Action Space

    With ``K = n_candidates`` (5 by default, so ``Discrete(14)``); "focus" is the focus
    passage of the latest active search, "candidates" its :func:`candidates`:

    | action | name | env step |
    |--------|------|----------|
    | 0 | ``SEARCH_QUESTION`` | SEARCH the question text |
    | 1 … K | ``SEARCH_CANDIDATE_j`` | SEARCH candidate j (1-based) of the focus passage |
    | K+1 … 2K | ``ANSWER_CANDIDATE_j`` | ANSWER candidate j of the focus passage |
    | 2K+1 | ``ANSWER_EARLIEST`` | ANSWER the name in the question whose passage in the context states the smallest number (year): "Who was born first, A or B?" |
    | 2K+2 | ``BACKTRACK`` | BACKTRACK (drop the latest search; the focus returns to the one before) |
    | 2K+3 | ``REFUSE`` | REFUSE |

    :attr:`macro_names` lists the names by index; :meth:`action_masks` (also
    ``info["macro_mask"]``) says which macros apply now, for maskable policies.

    **Inapplicable and out-of-range actions.** A macro that cannot apply (no search yet, no
    candidate j, fewer than two question names with a passage and a year, nothing to
    backtrack) and an integer outside ``0 … 2K+3`` (what a buggy policy might emit) are not
    errors: the step becomes the env's invalid action (an empty EVALUATE), so it is spent,
    ``info["invalid_action"]`` is ``True``, the reward is the env's ``invalid_action_penalty``
    and the episode goes on; ``info["macro_ok"]`` is ``False`` and ``info["macro_message"]``
    says why. A value that is not an integer (a float, a string, an array of several values)
    raises ``TypeError``.

    ## Observation Space, Rewards, Episode End

    Those of the wrapped env (the text observation; put
    :class:`~rag_gym.wrappers.vectorize.TextToVector` outside for a vector).

    ## Information

    The wrapped env's ``info`` plus ``macro`` (the name of this step's macro, ``None`` after
    reset, ``"OUT_OF_RANGE"`` for an integer outside the space), ``macro_ok``,
    ``macro_message``, ``macro_text`` (the query or answer written) and ``macro_mask``
    (``int8[n]``: 1 where a macro applies next).

    Args:
        env: a SearchEnv (through ``gym.make`` and reward wrappers or not).
        n_candidates: K, candidates offered per focus passage (1–20).

    >>> import gymnasium as gym, rag_gym
    >>> env = MacroActions(gym.make("rag_gym/SynthHop-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]}))
    >>> env.action_space, env.macro_names[:2]
    (Discrete(14), ['SEARCH_QUESTION', 'SEARCH_CANDIDATE_1'])
    >>> obs, info = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step(0)
    >>> info["macro"], info["query"] == info["question"], info["macro_ok"]
    ('SEARCH_QUESTION', True, True)
    >>> obs, reward, terminated, truncated, info = env.step(99)
    >>> info["macro"], info["invalid_action"], terminated
    ('OUT_OF_RANGE', True, False)
    """

    def __init__(self, env: gym.Env, n_candidates: int = 5) -> None:
        if isinstance(n_candidates, bool) or not isinstance(n_candidates, (int, np.integer)):
            raise TypeError(f"expected n_candidates to be an int, got {n_candidates!r}")
        if not 1 <= n_candidates <= 20:
            raise ValueError(f"expected n_candidates in 1..20, got {n_candidates}")
        if not isinstance(env.unwrapped, SearchEnv):
            raise ValueError(
                f"MacroActions needs a SearchEnv, got {type(env.unwrapped).__name__}; "
                "use a rag_gym/<Dataset>-v0 id"
            )
        gym.utils.RecordConstructorArgs.__init__(self, n_candidates=int(n_candidates))
        gym.ActionWrapper.__init__(self, env)
        self.n_candidates = int(n_candidates)
        k = self.n_candidates
        self.macro_names = [
            "SEARCH_QUESTION",
            *(f"SEARCH_CANDIDATE_{j}" for j in range(1, k + 1)),
            *(f"ANSWER_CANDIDATE_{j}" for j in range(1, k + 1)),
            "ANSWER_EARLIEST",
            "BACKTRACK",
            "REFUSE",
        ]
        self.action_space = spaces.Discrete(len(self.macro_names))
        self._text_limit = min(env.unwrapped.max_query_chars, env.action_space["text"].max_length)
        self._question = ""
        self._stack: list[tuple[str, list[dict[str, str]]]] = []
        self._pending: dict[str, Any] = {}

    # ---- state ----------------------------------------------------------------------------------
    def focus(self) -> dict[str, str] | None:
        """The focus passage (``{"id", "title", "text"}``), ``None`` before the first search."""
        if not self._stack:
            return None
        query, passages = self._stack[-1]
        return focus_passage(query, passages)

    def focus_candidates(self) -> list[str]:
        """The focus passage's candidates, at most ``n_candidates``."""
        p = self.focus()
        if p is None:
            return []
        return candidates(p["text"], p.get("title", ""))[: self.n_candidates]

    def earliest(self) -> str | None:
        """``ANSWER_EARLIEST``'s answer: of the question's names that title a passage in the
        active context and state a number, the one with the smallest; ``None`` with fewer than
        two."""
        by_title: dict[str, dict[str, str]] = {}
        for _, passages in self._stack:
            for p in passages:
                by_title.setdefault(p.get("title", "").strip().lower(), p)
        years = []
        for name in question_entities(self._question):
            p = by_title.get(name.lower())
            year = first_number(p["text"]) if p is not None else None
            if year is not None:
                years.append((year, name))
        if len({n for _, n in years}) < 2:
            return None
        return min(years)[1]

    def action_masks(self) -> np.ndarray:
        """``bool[n]``: True where a macro applies now (the method sb3-contrib's MaskablePPO
        calls)."""
        k = self.n_candidates
        n_cand = len(self.focus_candidates())
        mask = np.zeros(len(self.macro_names), dtype=bool)
        mask[0] = bool(self._question.strip())
        mask[1 : 1 + n_cand] = True
        mask[1 + k : 1 + k + n_cand] = True
        mask[2 * k + 1] = self.earliest() is not None
        mask[2 * k + 2] = bool(self._stack)
        mask[2 * k + 3] = True
        return mask

    # ---- Gymnasium API --------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._question = info.get("question", "")
        self._stack = []
        return obs, self._info(info, None, True, "", "")

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = super().step(action)
        pending = self._pending
        if not info.get("invalid_action", False):
            if info.get("action_type") == "SEARCH":
                self._stack.append((info.get("query") or "", list(info.get("passages", []))))
            elif info.get("action_type") == "BACKTRACK" and self._stack:
                self._stack.pop()
        assert "context_ids" not in info or len(self._stack) == len(info["context_ids"])
        info = self._info(
            info, pending["macro"], pending["ok"], pending["message"], pending["text"]
        )
        return obs, reward, terminated, truncated, info

    def action(self, action: Any) -> dict[str, Any]:
        """The env action of macro ``action`` (and the macro's record for ``info``)."""
        index = _as_index(action)
        n = len(self.macro_names)
        if not 0 <= index < n:
            return self._invalid("OUT_OF_RANGE", f"action {index} is outside 0..{n - 1}")
        name = self.macro_names[index]
        k = self.n_candidates
        if index == 0:
            return self._do(name, ActionType.SEARCH, self._question)
        if index <= 2 * k:
            j = (index - 1) % k
            kind = ActionType.SEARCH if index <= k else ActionType.ANSWER
            cands = self.focus_candidates()
            if self.focus() is None:
                return self._invalid(name, "no search yet, so no passage to take a candidate from")
            if j >= len(cands):
                return self._invalid(name, f"the focus passage has {len(cands)} candidates")
            return self._do(name, kind, cands[j])
        if name == "ANSWER_EARLIEST":
            answer = self.earliest()
            if answer is None:
                return self._invalid(
                    name, "fewer than two names of the question have a passage with a year"
                )
            return self._do(name, ActionType.ANSWER, answer)
        if name == "BACKTRACK":
            if not self._stack:
                return self._invalid(name, "no search to drop")
            return self._do(name, ActionType.BACKTRACK, "")
        return self._do(name, ActionType.REFUSE, "")

    # ---- internals ------------------------------------------------------------------------------
    def _do(self, name: str, kind: ActionType, text: str) -> dict[str, Any]:
        text = text[: self._text_limit]
        self._pending = {"macro": name, "ok": True, "message": "", "text": text}
        return {"type": int(kind), "text": text}

    def _invalid(self, name: str, why: str) -> dict[str, Any]:
        self._pending = {"macro": name, "ok": False, "message": f"{name}: {why}", "text": ""}
        return {"type": int(ActionType.EVALUATE), "text": ""}

    def _info(self, info: dict[str, Any], macro, ok: bool, message: str, text: str):
        mask = self.action_masks().astype(np.int8)
        return {
            **info,
            "macro": macro,
            "macro_ok": ok,
            "macro_message": message,
            "macro_text": text,
            "macro_mask": mask,
        }


def _as_index(action: Any) -> int:
    if isinstance(action, np.ndarray):
        if action.size != 1:
            raise TypeError(
                f"expected one macro index, got an array of shape {action.shape}; pass one int"
            )
        action = action.reshape(()).item()
    if isinstance(action, bool) or not isinstance(action, (int, np.integer)):
        raise TypeError(
            f"expected the macro index to be an int, got {type(action).__name__}: {action!r}"
        )
    return int(action)
