"""What every rag-gym environment shares: the question set, the corpus, the retriever.

:class:`QAEnv` loads a dataset split (or takes ``examples=``), builds the corpus an agent
searches (the SynthHop world, the split's pooled passages, or a corpus file) and a BM25 index
over it, and draws a question per episode with ``self.np_random``.

The data arguments (which questions, which corpus, which index) are one
:class:`DataConfig`, shared by every env class: pass ``data=DataConfig(...)`` or its fields as
keyword arguments (``SearchEnv(dataset="hotpotqa", data_path=...)``, as ``gym.make`` does).

Environments built with the same data arguments (and the same ``retriever=`` URL or ``index=``)
in one process share the loaded questions, corpus and index (a read-only cache of weak references, so copies made by
``gym.make_vec(..., vectorization_mode="sync")`` cost one index, and nothing outlives its
last env). What is shared is what the sources hold now: a data or corpus file is known by its
size, modification time and sampled checksum, an index folder by its ``params.json`` (which
holds every file's checksum), a server by the ``index_id`` its ``/health`` reports, so an env
made after a file is rewritten, an index rebuilt at the same path or a server restarted on
another index gets the new data (envs made before keep theirs).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
import warnings
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import gymnasium as gym
import numpy as np

from rag_gym import metrics
from rag_gym._names import unknown_name
from rag_gym.data import (
    Corpus,
    QAExample,
    canonical_name,
    dataset_defaults,
    dataset_loader,
    pooled_corpus,
)
from rag_gym.data import load as load_dataset
from rag_gym.data.splits import canonical_split
from rag_gym.envs.spaces import UnicodeText
from rag_gym.retrieval import BM25Retriever, Retriever
from rag_gym.retrieval.base import corpus_size

ANSWER_METRICS = ("em", "f1", "em_f1")
CORPUS_MODES = (None, "pool", "corpus")

#: Make-time arguments that belong to the wrappers, not to an env: the fix to name for each.
_WRAPPER_ARGUMENTS = {
    "reward_preset": (
        "a reward preset is a stack of wrappers around the env and its TimeLimit, not an env "
        "argument: use rag_gym.make(env_id, reward_preset=..., reward_kwargs=..., "
        "max_episode_steps=...) or rag_gym.wrappers.presets.apply(gym.make(env_id), preset)"
    ),
    "reward_kwargs": (
        "reward_kwargs are the options of a reward preset: use rag_gym.make(env_id, "
        "reward_preset=..., reward_kwargs=...)"
    ),
}


@dataclass(frozen=True)
class DataConfig:
    """The data an env is built on: its questions, the corpus it searches and the index over it.

    Every rag-gym env class takes one (``data=``) or its fields as keyword arguments; the
    registry's kwargs are these fields, so they stay plain JSON values. ``retriever`` (an
    object) and ``examples`` are live objects for direct construction, not for registration.

    >>> DataConfig.from_kwargs(dataset="hotpotqa", data_path="dev.json").split
    'train'
    >>> DataConfig.from_kwargs(datset="hotpotqa")
    Traceback (most recent call last):
    ...
    TypeError: expected a data argument in ['corpus', 'corpus_mode', 'data_path', 'dataset', 'dataset_kwargs', 'examples', 'index', 'retriever', 'split'], got 'datset'; did you mean 'dataset'?
    """

    dataset: str = "synthhop"
    """Dataset name: ``synthhop``, ``hotpotqa``, ``2wikimultihopqa``, ``musique``,
    ``bamboogle`` or ``flashrag``."""
    split: str = "train"
    """The split questions are drawn from: ``train``, ``validation`` (``dev``, ``val``) or
    ``test``; any other name is a ``ValueError``."""
    data_path: str | None = None
    """A file in the dataset's official format (``None``: SynthHop, or the hub for HotpotQA)."""
    dataset_kwargs: Mapping[str, Any] | None = None
    """Loader options, e.g. ``{"preset": "hard"}`` for SynthHop."""
    corpus: str | None = None
    """A corpus JSONL to search instead of the questions' own pools."""
    corpus_mode: str | None = None
    """``"pool"`` (each question's own passages), ``"corpus"`` (the whole corpus) or ``None``
    (``"corpus"`` for SynthHop or with ``corpus``/``index``/``retriever``, else ``"pool"``)."""
    index: str | None = None
    """A directory written by ``BM25Retriever.save`` (or ``rag-gym index build``), memory-mapped
    read-only, so the workers of an async vector env share one copy; or an index on an
    OpenSearch or Elasticsearch cluster, ``"opensearch+http://127.0.0.1:9200/wiki18"``
    (:class:`~rag_gym.retrieval.search_engine.SearchEngineRetriever`, searched in place)."""
    retriever: Retriever | str | None = None
    """A retrieval server URL (``"http://127.0.0.1:8000"``, see ``rag-gym serve``) or a live
    retriever object, searched instead of a built BM25 index."""
    examples: Sequence[QAExample] | None = None
    """Questions to pose instead of a loaded split (live objects)."""

    def __post_init__(self) -> None:
        for name in ("dataset", "split"):
            if not isinstance(getattr(self, name), str):
                raise TypeError(
                    f"expected {name} to be a str, got {type(getattr(self, name)).__name__}"
                )
        canonical_split(self.split)  # "dev" is "validation"; an unknown name is a ValueError
        for name in ("data_path", "corpus", "index"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise TypeError(
                    f"expected {name} to be a path (str) or None, got {type(value).__name__}"
                )
        if self.dataset_kwargs is not None and not isinstance(self.dataset_kwargs, Mapping):
            raise TypeError(
                f"expected dataset_kwargs to be a dict or None, got {type(self.dataset_kwargs).__name__}"
            )
        if self.corpus_mode not in CORPUS_MODES:
            raise ValueError(
                f"expected corpus_mode 'pool', 'corpus' or None, got {self.corpus_mode!r}"
            )
        retriever = self.retriever
        if not (
            retriever is None
            or isinstance(retriever, str)
            or (callable(getattr(retriever, "retrieve", None)) and hasattr(retriever, "corpus"))
        ):
            raise TypeError(
                "expected retriever to be a server URL (str), a retriever object (with retrieve "
                f"and corpus) or None, got {type(retriever).__name__}: {retriever!r}"
            )
        examples = self.examples
        if examples is not None and (
            isinstance(examples, (str, bytes, Mapping))
            or not isinstance(examples, Sequence)
            or not all(isinstance(ex, QAExample) for ex in examples)
        ):
            shown = type(examples).__name__
            if isinstance(examples, Sequence) and not isinstance(examples, (str, bytes)):
                bad = next(ex for ex in examples if not isinstance(ex, QAExample))
                shown = f"a {type(examples).__name__} holding {type(bad).__name__} {bad!r:.60}"
            raise TypeError(f"expected examples to be a sequence of QAExample or None, got {shown}")

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_kwargs(cls, data: DataConfig | None = None, /, **kwargs: Any) -> DataConfig:
        """``data`` with ``kwargs`` (data fields) replaced; a ``TypeError`` names an unknown
        argument (with "did you mean") or a wrapper's argument given to an env."""
        for name in kwargs:
            if name in _WRAPPER_ARGUMENTS:
                raise TypeError(f"{name}= is not an env argument: {_WRAPPER_ARGUMENTS[name]}")
            if name not in cls.fields():
                raise TypeError(str(unknown_name("data argument", name, cls.fields())))
        if data is None:
            return cls(**kwargs)
        if not isinstance(data, DataConfig):
            raise TypeError(f"expected data to be a DataConfig or None, got {type(data).__name__}")
        return dataclasses.replace(data, **kwargs) if kwargs else data


class SearchRequest(NamedTuple):
    """One query's retrieval: top ``k`` ids, never one of ``exclude``, among ``within`` (a
    question's pool) or the whole corpus."""

    query: str
    k: int
    exclude: list[str] | None
    within: list[str] | None


def retrieve_all(
    retriever: Retriever, requests: Sequence[SearchRequest]
) -> list[tuple[list[str], list[float]]]:
    """The ids and scores of every request, in one ``retriever.retrieve`` call per distinct ``k``
    (one call for the searches of every env of a vector env's step)."""
    out: list[tuple[list[str], list[float]]] = [([], []) for _ in requests]
    groups: dict[int, list[int]] = {}
    for i, request in enumerate(requests):
        groups.setdefault(request.k, []).append(i)
    for k, rows in groups.items():
        batch = [requests[i] for i in rows]
        exclude = [r.exclude for r in batch] if any(r.exclude for r in batch) else None
        within = [r.within for r in batch] if any(r.within is not None for r in batch) else None
        result = retriever.retrieve([r.query for r in batch], k, exclude=exclude, within=within)
        for i, ids, scores in zip(rows, result.ids, result.scores, strict=True):
            out[i] = (list(ids), [float(x) for x in scores])
    return out


class _SharedData:
    """Questions, corpus and retriever built for one set of data arguments."""

    def __init__(
        self, examples: list[QAExample], corpus: Corpus, corpus_mode: str, retriever: Retriever
    ) -> None:
        self.examples = examples
        self.corpus = corpus
        self.corpus_mode = corpus_mode
        self.retriever = retriever


_CACHE: weakref.WeakValueDictionary[str, _SharedData] = weakref.WeakValueDictionary()
_CACHE_LOCK = threading.Lock()


def source_fingerprint(path: str | os.PathLike | None) -> Any:
    """What tells the content of a data source at ``path`` apart, cheaply: a file's size,
    modification time, inode and sampled checksum; an index folder's ``params.json`` (its
    files' checksums); another folder's entries with their sizes and times; ``None`` for no
    path, or one that cannot be read (its loader reports that)."""
    from rag_gym._http import is_url

    if path is None or is_url(path):
        return None  # a hub name or a search-engine URL: not a file
    from rag_gym.retrieval.persist import PARAMS, sample_digest

    p = Path(path)
    try:
        if p.is_dir():
            if (p / PARAMS).is_file():
                return ["index", (p / PARAMS).read_text(encoding="utf-8", errors="replace")]
            return sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in os.scandir(p))
        st = p.stat()
        return [st.st_size, st.st_mtime_ns, st.st_ino, sample_digest(p)]
    except OSError:
        return None


def _stale(shared: _SharedData, retriever: Any) -> bool:
    """Whether the server behind a shared ``retriever=`` URL now serves another index."""
    changed = getattr(shared.retriever, "index_changed", None)
    return isinstance(retriever, str) and callable(changed) and changed()


class QAEnv(gym.Env):
    """Base class: data, corpus, retriever, question choice, answer scoring, rendering."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "human"], "render_fps": 4}

    def __init__(
        self,
        data: DataConfig | None = None,
        *,
        k: int = 3,
        answer_metric: str = "em",
        max_obs_chars: int = 16384,
        render_mode: str | None = None,
        **data_kwargs: Any,
    ) -> None:
        data = DataConfig.from_kwargs(data, **data_kwargs)
        check_int("k", k, 1)
        check_int("max_obs_chars", max_obs_chars, 256)
        if answer_metric not in ANSWER_METRICS:
            raise ValueError(f"expected answer_metric in {ANSWER_METRICS}, got {answer_metric!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"expected render_mode in {self.metadata['render_modes']} or None, got {render_mode!r}"
            )
        self.data = data
        self.dataset = canonical_name(data.dataset)
        self.split = data.split
        self.k = k
        self.answer_metric = answer_metric
        self.max_obs_chars = max_obs_chars
        self.render_mode = render_mode
        self.observation_space = UnicodeText(max_length=max_obs_chars)

        # a name with defaults (synthhop-hard): the given options extend them
        dataset_kwargs = {**dataset_defaults(data.dataset), **(data.dataset_kwargs or {})}
        data_path, corpus, corpus_mode = data.data_path, data.corpus, data.corpus_mode
        index, retriever, examples = data.index, data.retriever, data.examples
        if examples is None and (retriever is None or isinstance(retriever, str)):
            key = json.dumps(
                [
                    type(self).__name__,
                    self.dataset,
                    id(dataset_loader(self.dataset)),  # a loader registered again is new data
                    self.split,
                    data_path,
                    dataset_kwargs,
                    corpus,
                    corpus_mode,
                    index,
                    retriever,  # a server URL or None: never share one retriever for another
                    # what the files hold now: a rewritten file or a rebuilt index is new data
                    [source_fingerprint(p) for p in (data_path, corpus, index)],
                ],
                sort_keys=True,
                default=str,
            )
            with _CACHE_LOCK:
                shared = _CACHE.get(key)
                if shared is None or _stale(shared, retriever):
                    shared = self._build(
                        data_path, dataset_kwargs, corpus, corpus_mode, None, retriever, index
                    )
                    _CACHE[key] = shared
        else:
            shared = self._build(
                data_path, dataset_kwargs, corpus, corpus_mode, examples, retriever, index
            )
        self._shared = shared  # keeps the cache entry alive as long as this env
        self.examples = shared.examples
        self.corpus = shared.corpus
        self.corpus_mode = shared.corpus_mode
        self.retriever = shared.retriever
        if not self.examples:
            raise ValueError(f"dataset {self.dataset!r} split {self.split!r} has no questions")
        self._by_id = {ex.id: i for i, ex in enumerate(self.examples)}
        if len(self._by_id) != len(self.examples):  # one question would be posed twice, one never
            first: dict[str, int] = {}
            for i, ex in enumerate(self.examples):
                if ex.id in first:
                    raise ValueError(
                        f"expected unique question ids, got {ex.id!r} at examples[{first[ex.id]}] "
                        f"and examples[{i}]; give one of them another id"
                    )
                first[ex.id] = i
        self._example: QAExample | None = None
        self._done = True

    def _build(
        self, data_path, dataset_kwargs, corpus_path, corpus_mode, examples, retriever, index
    ) -> _SharedData:
        if examples is None:
            examples = load_dataset(self.dataset, self.split, path=data_path, **dataset_kwargs)
        examples = [ex for ex in examples if self.keep_example(ex)]
        from rag_gym.retrieval.source import Source

        if isinstance(retriever, str):
            retriever = Source.parse(retriever, "retriever").open()
        if index is not None:
            if retriever is not None or corpus_path is not None:
                raise ValueError("pass one of index=, corpus= and retriever=, not several")
            retriever = Source.parse(index, "index").open()
        if retriever is not None:
            return _SharedData(examples, retriever.corpus, corpus_mode or "corpus", retriever)
        if corpus_path is not None:
            if corpus_mode == "pool":
                raise ValueError(
                    "corpus=... searches that corpus; drop corpus_mode='pool' or the corpus"
                )
            corpus = Corpus.from_jsonl(corpus_path)
            return _SharedData(examples, corpus, "corpus", BM25Retriever(corpus))
        if self.dataset == "synthhop":
            from rag_gym.data.synthhop import world_for

            world = world_for(**dataset_kwargs)
            return _SharedData(
                examples, world.corpus, corpus_mode or "corpus", BM25Retriever(world.corpus)
            )
        if not any(ex.passages for ex in examples):
            raise ValueError(
                f"{self.dataset} has no passages of its own: give a corpus to search, as "
                "corpus='path/to/corpus.jsonl' (a JSONL corpus of {id, contents} or {id, title, "
                "text} records), index='path/to/index' (rag-gym index build) or "
                "retriever='http://host:port' (rag-gym serve)"
            )
        pooled, examples = pooled_corpus(examples, name=f"{self.dataset}-{self.split}")
        return _SharedData(examples, pooled, corpus_mode or "pool", BM25Retriever(pooled))

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(self._not_copyable("pickled"))

    def __deepcopy__(self, memo: dict) -> Any:
        raise TypeError(self._not_copyable("deep-copied"))

    def __copy__(self) -> QAEnv:
        """A shallow copy, as ``copy.copy`` makes of any object (it shares every attribute)."""
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def _not_copyable(self, how: str) -> str:
        """Why this env cannot be ``how`` (pickled, deep-copied), and what to do instead."""
        import types

        retriever = self.__dict__.get("retriever")
        slots = getattr(type(retriever), "__slots__", ())
        fields = {
            **getattr(retriever, "__dict__", {}),
            **{k: getattr(retriever, k, None) for k in slots},
        }
        modules = sorted(v.__name__ for v in fields.values() if isinstance(v, types.ModuleType))
        holder = f"its retriever ({type(retriever).__name__})"
        if modules:
            holder += (
                f" holds the module{'s' * (len(modules) > 1)} {' and '.join(modules)} (its "
                "search backend), and"
            )
        else:
            holder = f"it holds {holder}, and"
        spec = self.__dict__.get("spec")
        remake = (
            f"gym.make(env.spec) in this process (for {spec.id}; it reuses the loaded data), or "
            "send env.spec (picklable; env.spec.to_json()) to the other process and gym.make "
            "it there"
            if spec is not None
            else f"build another {type(self).__name__} with the same arguments"
        )
        return (
            f"a {type(self).__name__} cannot be {how}: {holder} its questions, corpus and index "
            f"are shared with every env made with the same data arguments. Make another env "
            f"instead: {remake}"
        )

    @property
    def current_example(self) -> QAExample:
        """The question of the current episode (for reward wrappers and evaluation code, not
        for agents: it holds the answers)."""
        if self._example is None:
            raise RuntimeError("no episode yet; call reset() first")
        return self._example

    @staticmethod
    def keep_example(example: QAExample) -> bool:
        """Whether the env poses ``example`` (of its loaded split): subclasses may skip those they
        cannot pose (the reader env needs a pool)."""
        return True

    # ---- shared pieces of reset/step -------------------------------------------------------------
    #: What ``step`` raises (a ``RuntimeError``) once the episode has ended.
    _ended = "the episode has ended; call reset()"

    def _check_running(self) -> None:
        if self._example is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError(self._ended)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Seed ``self.np_random`` (Gymnasium's ``Env.reset``); a seed that is not an int >= 0
        is a ``TypeError`` or ``ValueError`` here, before Gymnasium's untyped error."""
        if seed is not None:
            if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
                raise TypeError(f"expected seed to be an int or None, got {seed!r}")
            if seed < 0:
                raise ValueError(
                    f"expected seed >= 0 or None, got {seed}; numpy's seeding takes no negative seeds"
                )
            seed = int(seed)  # Gymnasium takes a Python int only
        return super().reset(seed=seed, options=options)

    def _choose_example(self, options: dict[str, Any] | None) -> QAExample:
        options = reset_options(options)
        if "question_id" in options:
            qid = options["question_id"]
            if qid not in self._by_id:
                raise ValueError(f"no question with id {qid!r} in {self.dataset}/{self.split}")
            index = self._by_id[qid]
        elif "question_index" in options:
            index = options["question_index"]
            if not 0 <= index < len(self.examples):
                raise ValueError(
                    f"expected options['question_index'] in [0, {len(self.examples)}), got {index!r}"
                )
        else:
            index = int(self.np_random.integers(len(self.examples)))
        example = self.examples[int(index)]
        self._pool = (
            list(dict.fromkeys(p.id for p in example.passages))
            if self.corpus_mode == "pool"
            else None
        )
        if self._pool is not None and not self._pool:
            raise ValueError(f"question {example.id!r} has an empty pool; use corpus_mode='corpus'")
        self._example = example
        return example

    def _request(self, query: str, k: int, exclude: list[str] | None = None) -> SearchRequest:
        """The retrieval of ``query`` in this episode: within the question's pool in pool mode,
        ``k`` capped at the candidates there are."""
        if self._pool is not None:
            return SearchRequest(query, min(k, len(self._pool)), exclude, self._pool)
        return SearchRequest(query, min(k, corpus_size(self.retriever)), exclude, None)

    def _retrieve(
        self, queries: list[str], k: int, exclude: list[str] | None = None
    ) -> list[list[str]]:
        """Top-k ids per query, within the question's pool in pool mode; k is capped at the pool.
        Their scores are kept in ``self._last_scores`` (one list per query)."""
        results = retrieve_all(self.retriever, [self._request(q, k, exclude) for q in queries])
        self._last_scores = [scores for _, scores in results]
        return [ids for ids, _ in results]

    def _answer_reward(self, scores: dict[str, float]) -> float:
        if self.answer_metric == "em":
            return scores["em"]
        if self.answer_metric == "f1":
            return scores["f1"]
        return (scores["em"] + scores["f1"]) / 2

    def _score(self, answer: str) -> dict[str, float]:
        assert self._example is not None
        if not self._example.answers:
            return {"em": 0.0, "f1": 0.0, "cover_em": 0.0}
        return metrics.answer_scores(answer, self._example.answers)

    def _render_obs(self) -> str:
        raise NotImplementedError

    def _transcript(self) -> str:
        """What ``render`` shows: by default the current observation."""
        return self._render_obs()

    def render(self) -> str | None:
        if self.render_mode is None:
            gym.logger.warn(
                "render() was called without a render_mode; pass render_mode='ansi' or 'human'"
            )
            return None
        obs = self._transcript() if self._example is not None else ""
        if self.render_mode == "ansi":
            return obs
        print(obs)
        return None


def reset_options(options: Any) -> dict[str, Any]:
    """``reset``'s ``options`` as a dict, checked: ``None`` or a dict, whose ``question_id``
    is a str and whose ``question_index`` is an int (not a bool), not both; other keys pass
    through (a subclass's or a wrapper's). A ``TypeError`` or ``ValueError`` names the option.
    ``index``, the former name of ``question_index``, is read as it with a
    ``DeprecationWarning`` (``index=`` of ``make`` is the search index).

    >>> reset_options(None), reset_options({"question_index": 2})
    ({}, {'question_index': 2})
    >>> reset_options({"question_index": True})
    Traceback (most recent call last):
    ...
    TypeError: expected options['question_index'] to be an int (a question's position), got bool: True
    """
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(
            f"expected options to be a dict or None, got {type(options).__name__}: "
            f"{_short(options)}; pass options={{'question_index': 0}} or {{'question_id': '...'}}"
        )
    options = dict(options)
    if "index" in options:
        if "question_index" in options:
            raise ValueError(
                "expected options['question_index'], got it and options['index'], its former "
                "name: pass question_index only"
            )
        warnings.warn(
            "reset(options={'index': i}) is deprecated: pass options={'question_index': i}",
            DeprecationWarning,
            stacklevel=3,
        )
        options["question_index"] = options.pop("index")
    if "question_id" in options and "question_index" in options:
        raise ValueError(
            "expected options['question_id'] or options['question_index'], got both "
            f"({_short(options['question_id'])} and {_short(options['question_index'])}); pass one"
        )
    qid = options.get("question_id")
    if "question_id" in options and not isinstance(qid, str):
        raise TypeError(
            f"expected options['question_id'] to be a str (a question's id), got "
            f"{type(qid).__name__}: {_short(qid)}"
        )
    index = options.get("question_index")
    if "question_index" in options and (
        isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer))
    ):
        raise TypeError(
            f"expected options['question_index'] to be an int (a question's position), got "
            f"{type(index).__name__}: {_short(index)}"
        )
    return options


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_bool(name: str, value: Any) -> bool:
    """``value`` if it is a bool (numpy's included); a ``TypeError`` otherwise, so that the
    string ``"false"`` does not turn an option on."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"expected {name} to be a bool (true or false), got {type(value).__name__}: {value!r}"
        )
    return bool(value)


def check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"expected {name} to be an int, got {type(value).__name__}: {value!r}")
    if value < minimum:
        raise ValueError(f"expected {name} >= {minimum}, got {value}")


def read_text_action(action: Any, limit: int) -> tuple[str, bool]:
    """An LLM's text action, sanitised and cut to ``limit``; ``TypeError`` for a non-string."""
    from rag_gym.envs.spaces import sanitize

    if not isinstance(action, str):
        raise TypeError(
            f"expected the action to be the model's text (str), got {type(action).__name__}"
        )
    return sanitize(action[:limit]), len(action) > limit


def clip_text(text: str, limit: int, marker: str = " [... clipped]") -> str:
    """``text`` cut to ``limit`` characters, marked where it was cut."""
    return text if len(text) <= limit else text[: limit - len(marker)] + marker
