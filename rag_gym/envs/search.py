"""``SearchEnv``: search, evaluate, backtrack, then answer or refuse a multi-hop question."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from gymnasium import spaces

from rag_gym.data.types import Passage
from rag_gym.envs.base import DataConfig, QAEnv, SearchRequest, check_bool, check_int
from rag_gym.envs.spaces import UnicodeText, sanitize


class ActionType(enum.IntEnum):
    """The discrete part of a :class:`SearchEnv` action."""

    SEARCH = 0
    ANSWER = 1
    BACKTRACK = 2
    REFUSE = 3
    EVALUATE = 4


#: ``info["action_mask"]`` with a search in the context, and without one (no BACKTRACK)
_MASK_ALL = np.ones(len(ActionType), dtype=np.int8)
_MASK_NO_BACKTRACK = _MASK_ALL.copy()
_MASK_NO_BACKTRACK[ActionType.BACKTRACK] = 0


@dataclass
class _Hop:
    step: int
    kind: str  # "search" or "evaluate"
    text: str
    ids: list[str] = field(default_factory=list)
    #: the passages of ``ids``, read from the corpus once (the info and the rendering share them)
    passages: list[Passage] = field(default_factory=list, repr=False, compare=False)
    #: ``(position, sanitised block)``: a hop's rendering, made once per position in the context
    rendered: tuple[int, str] | None = field(default=None, repr=False, compare=False)


class SearchEnv(QAEnv):
    """Multi-hop question answering by searching a corpus.

    ## Description

    Each episode poses one question of a dataset. The agent searches with free-text queries
    (BM25 top-``k`` passages come back into its context), may write self-evaluation notes,
    may backtrack (drop its most recent search from the context), and ends the episode by
    answering or refusing. Questions whose evidence is missing on purpose (SynthHop-Hard,
    MuSiQue-Full) should be refused.

    ## Action Space

    ``Dict({"type": Discrete(5), "text": UnicodeText(max_text_chars)})``:

    | type | name      | text                | effect                                              |
    |------|-----------|---------------------|-----------------------------------------------------|
    | 0    | SEARCH    | the query           | retrieve top-``k`` passages, append them as a hop   |
    | 1    | ANSWER    | the answer          | end the episode, scored against the gold aliases    |
    | 2    | BACKTRACK | ignored             | drop the most recent search hop (and notes after it) from the context; it stays in the history |
    | 3    | REFUSE    | ignored             | end the episode, declaring the question unanswerable |
    | 4    | EVALUATE  | the note            | append a self-evaluation note, no retrieval          |

    Use :class:`ActionType` for the ``type`` values. A value outside the action space raises
    ``TypeError`` or ``ValueError``. A well-typed but meaningless action (an empty or
    over-long query, an empty answer or note, a backtrack with nothing to drop) is *invalid*:
    the step is spent, the observation says what was wrong, ``info["invalid_action"]`` is
    ``True``, the reward is ``invalid_action_penalty`` (0 by default) and the episode goes on.

    ## Observation Space

    ``UnicodeText(max_obs_chars)`` (printable Unicode, see :mod:`rag_gym.envs.spaces`): the
    question, then the active context in order (each search with its query and numbered
    passages ``(i) Title: text``, each evaluation note), then a line about the last action
    (what was invalid, what a backtrack dropped). Rendering is deterministic. When longer than
    ``max_obs_chars``, the question is kept and the *oldest* context is cut, marked
    ``[... earlier context clipped ...]``.

    ## Rewards

    At termination only (dense terms are wrappers, :mod:`rag_gym.wrappers`):

    * ANSWER on an answerable question: ``EM`` (``answer_metric="em"``, the default), ``F1``
      (``"f1"``) or ``(EM + F1) / 2`` (``"em_f1"``), best over the gold aliases;
    * ANSWER on an unanswerable question: 0; REFUSE: 1 if unanswerable, 0 if answerable;
    * every other step: 0 (``invalid_action_penalty`` for an invalid one).

    ``info["reward_terms"]`` holds ``{"answer": ..., "invalid": ...}``; their sum is the reward.

    ## Starting State

    ``reset`` draws a question with ``self.np_random`` (seeded by ``reset(seed=...)``), or
    takes ``options={"question_index": i}`` or ``options={"question_id": "..."}``.

    ## Episode End

    * Termination: ANSWER or REFUSE.
    * Truncation: ``max_episode_steps`` (20 in every registration, the EVO-RAG horizon),
      through Gymnasium's ``TimeLimit``; a truncated episode scores 0.

    ## Information

    | key | value |
    |-----|-------|
    | ``question_id``, ``question`` | the episode's question |
    | ``answerable`` | whether its evidence is in the corpus |
    | ``gold_ids`` | gold passage ids in hop order |
    | ``step`` | steps taken so far (0 after reset) |
    | ``action_type`` | name of this step's action (``None`` after reset) |
    | ``query`` | this step's query (``None`` unless a SEARCH) |
    | ``retrieved_ids`` | ids this step retrieved (ranked) |
    | ``retrieved_scores`` | the retriever's score of each of them |
    | ``passages`` | those passages as ``{id, title, text}`` (what agents read) |
    | ``gold_hits`` | the gold ids among them |
    | ``context_ids`` | ids per active search hop, oldest first |
    | ``retrieved_history`` | every distinct id retrieved this episode, in order |
    | ``gold_found`` | gold ids retrieved so far this episode |
    | ``num_searches`` | SEARCH actions so far (valid ones) |
    | ``invalid_action``, ``message`` | whether this step was invalid, and why |
    | ``action_mask`` | ``int8[5]``: 1 where the action type is currently meaningful |
    | ``reward_terms`` | the reward's terms (see Rewards) |
    | ``prediction``, ``scores`` | at ANSWER/REFUSE: the answer text and ``{em, f1, cover_em}`` |

    ## Arguments

    * The data arguments (:class:`~rag_gym.envs.DataConfig`, as ``data=`` or as keywords):
      ``dataset``, ``split``, ``data_path``, ``dataset_kwargs`` (e.g. ``{"preset": "hard"}``
      for SynthHop), ``corpus`` (a JSONL to search instead of the questions' own pools),
      ``corpus_mode`` (``"pool"`` or ``"corpus"``), ``index`` (a saved BM25 index directory,
      memory-mapped, so the workers of an async vector env share one copy), ``retriever`` (a
      server URL or a live retriever object) and ``examples`` (live questions).
    * ``k`` (3): passages per search, capped at the candidates there are (the question's pool
      in pool mode, else the corpus): a ``k`` above them returns every candidate, ranked.
      ``exclude_seen`` (False): never return a passage already retrieved this episode.
    * ``answer_metric``: ``"em"``, ``"f1"`` or ``"em_f1"``.
    * ``max_query_chars`` (512), ``max_text_chars`` (4096, the action text space),
      ``max_obs_chars`` (16384).
    * ``invalid_action_penalty`` (0.0): reward of an invalid action (finite: NaN and
      infinities are a ``ValueError``).

    ## Registered Configurations

    ``rag_gym/SynthHop-v0`` (2-hop, default world), ``rag_gym/SynthHop-Hard-v0`` (2–4 hops,
    10 % unanswerable), ``rag_gym/HotpotQA-v0``, ``rag_gym/2WikiMultiHopQA-v0``,
    ``rag_gym/MuSiQue-v0``, ``rag_gym/Bamboogle-v0`` (needs ``corpus=``). See
    :mod:`rag_gym.envs.registration`. Each has a native vector entry point,
    :class:`~rag_gym.envs.vector.SearchVectorEnv` (``gym.make_vec(id, num_envs=N,
    vectorization_mode="vector_entry_point")``): N episodes in one process, their searches
    retrieved in one batched call.

    ## References

    Action set: EVO-RAG (Ji et al., "Curriculum-Guided Reinforcement Learning for Efficient
    Multi-Hop Retrieval-Augmented Generation", arXiv:2505.17391, §3.1: SEARCH, BACKTRACK, ANSWER,
    REFUSE) and Eval-RAR (Yu et al., "Eval-RAR: Evaluation-Driven Retrieval-Augmented Reasoning
    via Reinforcement Learning", Findings of ACL 2026, §4: EVALUATE); the 20-step horizon is
    EVO-RAG's T_max.

    ## Version History

    * v0: initial release.

    >>> import gymnasium as gym, rag_gym
    >>> env = gym.make("rag_gym/SynthHop-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})
    >>> obs, info = env.reset(seed=0)
    >>> obs.startswith("Question: ")
    True
    >>> obs, reward, terminated, truncated, info = env.step({"type": ActionType.SEARCH, "text": info["question"]})
    >>> len(info["retrieved_ids"]), terminated
    (3, False)
    """

    _ended = "the episode has ended (ANSWER or REFUSE); call reset() to start a new one"

    def __init__(
        self,
        data: DataConfig | None = None,
        *,
        k: int = 3,
        exclude_seen: bool = False,
        answer_metric: str = "em",
        max_query_chars: int = 512,
        max_text_chars: int = 4096,
        max_obs_chars: int = 16384,
        invalid_action_penalty: float = 0.0,
        render_mode: str | None = None,
        **data_kwargs: Any,
    ) -> None:
        check_int("max_query_chars", max_query_chars, 1)
        check_int("max_text_chars", max_text_chars, max_query_chars)
        exclude_seen = check_bool("exclude_seen", exclude_seen)
        if isinstance(invalid_action_penalty, bool) or not isinstance(
            invalid_action_penalty, (int, float)
        ):
            raise TypeError(
                f"expected invalid_action_penalty to be a float, got {invalid_action_penalty!r}"
            )
        if not math.isfinite(invalid_action_penalty):
            raise ValueError(
                f"expected a finite invalid_action_penalty, got {invalid_action_penalty}; "
                "a NaN or infinite reward poisons every return it is summed into"
            )
        super().__init__(
            data,
            k=k,
            answer_metric=answer_metric,
            max_obs_chars=max_obs_chars,
            render_mode=render_mode,
            **data_kwargs,
        )
        self.exclude_seen = exclude_seen
        self.max_query_chars = max_query_chars
        self.invalid_action_penalty = float(invalid_action_penalty)

        self.action_space = spaces.Dict(
            {
                "type": spaces.Discrete(len(ActionType)),
                "text": UnicodeText(max_length=max_text_chars),
            }
        )

    # ---- Gymnasium API --------------------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self._choose_example(options)
        self._gold = list(self._example.supporting_ids)
        self._context: list[_Hop] = []
        self._history: list[_Hop] = []
        self._seen: dict[str, None] = {}
        self._step_count = 0
        self._num_searches = 0
        self._done = False
        self._last_message = ""
        # per-episode constants and the rendered context, extended as hops are added
        self._gold_set = frozenset(self._gold)
        self._head = sanitize(f"Question: {self._example.question}")
        self._body: tuple[int, str] = (0, "")
        info = self._info(
            action_type=None,
            query=None,
            retrieved=[],
            invalid=False,
            terms={"answer": 0.0, "invalid": 0.0},
        )
        return self._render_obs(), info

    def step(self, action: dict[str, Any]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._check_running()
        return self._apply(*self._validate(action), None)

    def _request_for(self, atype: int, text: str) -> SearchRequest | None:
        """The retrieval ``step`` will make for an action :meth:`_validate` has checked, or
        ``None`` when it retrieves nothing (no SEARCH, or an invalid one). The native vector env
        (:class:`~rag_gym.envs.vector.SearchVectorEnv`) batches these."""
        query = text.strip()
        if atype != ActionType.SEARCH or not query or len(query) > self.max_query_chars:
            return None
        exclude = list(self._seen) if self.exclude_seen and self._seen else None
        return self._request(query, self.k, exclude)

    def _apply(
        self, atype: int, text: str, prefetched: tuple[list[str], list[float]] | None
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """``step`` of an action :meth:`_validate` has checked, in a running episode, with the
        ids and scores of :meth:`_request_for`'s retrieval when already made."""
        assert self._example is not None and not self._done
        self._step_count += 1
        self._last_message = ""
        invalid = False
        terminated = False
        answer_term = 0.0
        query = None
        retrieved: list[str] = []
        passages: list[Passage] = []
        self._last_scores = []
        extra: dict[str, Any] = {}

        if atype == ActionType.SEARCH:
            query = text.strip()
            if not query:
                invalid, self._last_message = (
                    True,
                    "Invalid action: SEARCH needs a non-empty query.",
                )
            elif len(query) > self.max_query_chars:
                invalid = True
                self._last_message = f"Invalid action: the query has {len(query)} characters; the limit is {self.max_query_chars}."
            else:
                if prefetched is None:
                    retrieved = self._search(query)
                else:
                    retrieved, scores = prefetched
                    self._last_scores = [scores]
                corpus = self.corpus
                passages = [corpus[pid] for pid in retrieved]
                hop = _Hop(self._step_count, "search", query, retrieved, passages)
                self._context.append(hop)
                self._history.append(hop)
                self._num_searches += 1
                for pid in retrieved:
                    self._seen.setdefault(pid, None)
                if not retrieved:
                    self._last_message = "No new passages: every candidate was already retrieved."
        elif atype == ActionType.EVALUATE:
            note = text.strip()
            if not note:
                invalid, self._last_message = (
                    True,
                    "Invalid action: EVALUATE needs a non-empty note.",
                )
            elif len(note) > self.max_query_chars:
                invalid = True
                self._last_message = f"Invalid action: the note has {len(note)} characters; the limit is {self.max_query_chars}."
            else:
                hop = _Hop(self._step_count, "evaluate", note)
                self._context.append(hop)
                self._history.append(hop)
        elif atype == ActionType.BACKTRACK:
            last_search = max(
                (i for i, h in enumerate(self._context) if h.kind == "search"), default=None
            )
            if last_search is None:
                invalid, self._last_message = (
                    True,
                    "Invalid action: BACKTRACK needs a search in the context to drop.",
                )
            else:
                dropped = self._context[last_search]
                del self._context[last_search:]
                self._body = (0, "")  # rendered again from the kept hops' blocks
                self._last_message = (
                    f'Backtracked: dropped the search "{dropped.text}" (step {dropped.step}).'
                )
                self._history.append(_Hop(self._step_count, "backtrack", dropped.text))
        elif atype == ActionType.ANSWER:
            answer = text.strip()
            if not answer:
                invalid, self._last_message = (
                    True,
                    "Invalid action: ANSWER needs a non-empty answer.",
                )
            else:
                terminated = True
                scores = self._score(answer)
                if self._example.answerable:
                    answer_term = self._answer_reward(scores)
                extra = {"prediction": answer, "scores": scores}
        else:  # REFUSE
            terminated = True
            answer_term = 0.0 if self._example.answerable else 1.0
            extra = {"prediction": None, "scores": {"em": 0.0, "f1": 0.0, "cover_em": 0.0}}

        self._done = terminated
        invalid_term = self.invalid_action_penalty if invalid else 0.0
        terms = {"answer": answer_term, "invalid": invalid_term}
        info = self._info(ActionType(atype).name, query, retrieved, invalid, terms, passages)
        info.update(extra)
        obs = self._render_obs()
        if self.render_mode == "human":
            print(obs)
        return obs, float(answer_term + invalid_term), terminated, False, info

    # ---- internals ----------------------------------------------------------------------------
    def _validate(self, action: Any) -> tuple[int, str]:
        if not isinstance(action, dict):
            raise TypeError(
                f"expected an action dict {{'type': ActionType, 'text': str}}, got {type(action).__name__}"
            )
        if len(action) != 2 or "type" not in action or "text" not in action:
            raise ValueError(
                f"expected action keys {{'type', 'text'}}, got {sorted(action)}; e.g. "
                "{'type': ActionType.SEARCH, 'text': 'query'}"
            )
        atype, text = action["type"], action["text"]
        if isinstance(atype, np.ndarray) and atype.shape == ():
            atype = atype.item()
        if not isinstance(atype, (int, np.integer)):  # bools are ints, as in Discrete.contains
            raise TypeError(
                f"expected action['type'] to be an int (use rag_gym.envs.ActionType), got {type(atype).__name__}: {atype!r}"
            )
        if not 0 <= int(atype) < len(ActionType):
            raise ValueError(
                f"expected action['type'] in 0..{len(ActionType) - 1} (ActionType), got {atype}"
            )
        if not isinstance(text, str):
            raise TypeError(f"expected action['text'] to be a str, got {type(text).__name__}")
        text_space = self.action_space["text"]
        if len(text) > text_space.max_length:
            raise ValueError(
                f"expected action['text'] of at most {text_space.max_length} characters, got {len(text)}; "
                "clip the text (or raise max_text_chars)"
            )
        if not text_space.contains(text):
            bad = next(ch for ch in text if ch not in text_space.character_set)
            raise ValueError(
                f"expected action['text'] in printable Unicode, got character {bad!r}; "
                "clean it with rag_gym.envs.spaces.sanitize"
            )
        return int(atype), text

    def _search(self, query: str) -> list[str]:
        exclude = list(self._seen) if self.exclude_seen and self._seen else None
        return self._retrieve([query], self.k, exclude)[0]

    def _info(self, action_type, query, retrieved, invalid, terms, passages=()) -> dict[str, Any]:
        ex = self._example
        assert ex is not None
        gold, seen = self._gold_set, self._seen
        context_ids = [list(h.ids) for h in self._context if h.kind == "search"]
        return {
            "question_id": ex.id,
            "question": ex.question,
            "answerable": ex.answerable,
            "gold_ids": list(self._gold),
            "step": self._step_count,
            "action_type": action_type,
            "query": query,
            "retrieved_ids": list(retrieved),
            "retrieved_scores": list(self._last_scores[0])
            if retrieved and self._last_scores
            else [],
            "passages": [{"id": p.id, "title": p.title, "text": p.text} for p in passages],
            "gold_hits": [pid for pid in retrieved if pid in gold],
            "context_ids": context_ids,
            "retrieved_history": list(seen),
            "gold_found": [pid for pid in self._gold if pid in seen],
            "num_searches": self._num_searches,
            "invalid_action": invalid,
            "message": self._last_message,
            # BACKTRACK is meaningful only with a search in the context
            "action_mask": (_MASK_ALL if context_ids else _MASK_NO_BACKTRACK).copy(),
            "reward_terms": dict(terms),
        }

    def _render_obs(self) -> str:
        body = self._context_text()
        if self._last_message:
            note = sanitize(f"Note: {self._last_message}")
            body = f"{body}\n\n{note}" if body else note
        return _clip(self._head, body, self.max_obs_chars)

    def _context_text(self) -> str:
        """The context's blocks joined; the hops added since the last call are rendered and
        appended (a BACKTRACK resets ``self._body``, so the kept hops are joined again)."""
        done, text = self._body
        context = self._context
        if done < len(context):
            blocks = [self._block(n, hop) for n, hop in enumerate(context[done:], done + 1)]
            if text:
                blocks.insert(0, text)
            text = "\n\n".join(blocks)
            self._body = (len(context), text)
        return text

    def _block(self, n: int, hop: _Hop) -> str:
        """Hop ``hop`` rendered at position ``n`` of the context (kept: a hop never changes)."""
        if hop.rendered is None or hop.rendered[0] != n:
            if hop.kind == "search":
                lines = [f"[{n}] Search: {hop.text}"]
                for r, p in enumerate(hop.passages, 1):
                    lines.append(f"  ({r}) {p.title}: {p.text}" if p.title else f"  ({r}) {p.text}")
                if not hop.ids:
                    lines.append("  (no new passages)")
                text = "\n".join(lines)
            else:
                text = f"[{n}] Evaluation: {hop.text}"
            hop.rendered = (n, sanitize(text))
        return hop.rendered[1]


def _clip(head: str, body: str, limit: int) -> str:
    """Join head and body (the blocks, joined); if too long keep the head and the newest text
    that fits."""
    text = f"{head}\n\n{body}" if body else head
    if len(text) <= limit:
        return text
    marker = "[... earlier context clipped ...]"
    head = head[: limit // 2]
    budget = limit - len(head) - len(marker) - 4
    return f"{head}\n\n{marker}\n\n{body[len(body) - budget :] if budget > 0 else ''}"
