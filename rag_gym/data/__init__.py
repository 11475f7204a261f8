"""Datasets: the data model, one loader module per benchmark, and the SynthHop world.

One entry point, :func:`load`::

    examples = rag_gym.data.load("hotpotqa", "validation", path="hotpot_dev_distractor_v1.json")
    examples = rag_gym.data.load("synthhop", "validation")            # embedded, no download

>>> len(load("synthhop", "validation", n_passages=2000, n_questions=(40, 10, 10)))
10
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from rag_gym._names import unknown_name
from rag_gym.data.errors import DataFormatError
from rag_gym.data.splits import SPLIT_NAMES, canonical_split, file_split, select
from rag_gym.data.types import Corpus, Passage, QAExample

__all__ = [
    "DATASETS",
    "Corpus",
    "DataFormatError",
    "Passage",
    "QAExample",
    "dataset_defaults",
    "load",
    "pooled_corpus",
]

#: Dataset name → loader module (each has ``load(path, split, **kwargs)``).
DATASETS: dict[str, str] = {
    "synthhop": "rag_gym.data.synthhop",
    "hotpotqa": "rag_gym.data.hotpotqa",
    "2wikimultihopqa": "rag_gym.data.twowikimultihopqa",
    "musique": "rag_gym.data.musique",
    "bamboogle": "rag_gym.data.bamboogle",
    "flashrag": "rag_gym.data.flashrag",
}
_ALIASES = {
    "2wiki": "2wikimultihopqa",
    "twowiki": "2wikimultihopqa",
    "hotpot": "hotpotqa",
    "hotpot_qa": "hotpotqa",
}

#: Names that stand for a dataset with default loader options, which ``dataset_kwargs`` extend
#: rather than replace: ``gym.make("rag_gym/SynthHop-Hard-v0", dataset_kwargs={"n_questions":
#: ...})`` keeps the hard world (Gymnasium merges ``gym.make`` keyword arguments one level deep).
_WITH_DEFAULTS: dict[str, tuple[str, dict[str, Any]]] = {
    "synthhop-hard": ("synthhop", {"preset": "hard"}),
    # the open-domain sets in FlashRAG's JSONL (``subset``: their hub name)
    "nq": ("flashrag", {"subset": "nq"}),
    "triviaqa": ("flashrag", {"subset": "triviaqa"}),
    "popqa": ("flashrag", {"subset": "popqa"}),
}


def _key(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"expected a dataset name (str), got {type(name).__name__}")
    key = name.lower().replace("-", "").replace(" ", "")
    return _ALIASES.get(key, key)


#: :data:`_WITH_DEFAULTS` by the key :func:`_key` makes of a name
_DEFAULTS_BY_KEY = {_key(name): value for name, value in _WITH_DEFAULTS.items()}


def canonical_name(name: str) -> str:
    """The registered dataset name for ``name`` (case-insensitive, common aliases accepted).

    >>> canonical_name("SynthHop-Hard"), canonical_name("hotpot")
    ('synthhop', 'hotpotqa')
    """
    key = _key(name)
    if key in _DEFAULTS_BY_KEY:
        return _DEFAULTS_BY_KEY[key][0]
    if key not in DATASETS:
        raise unknown_name("dataset", name, [*DATASETS, *_WITH_DEFAULTS], _ALIASES)
    return key


def dataset_defaults(name: str) -> dict[str, Any]:
    """The loader options ``name`` stands for (``{"preset": "hard"}`` for ``synthhop-hard``),
    which a dataset's own keyword arguments override one by one.

    >>> dataset_defaults("synthhop-hard"), dataset_defaults("synthhop"), dataset_defaults("NQ")
    ({'preset': 'hard'}, {}, {'subset': 'nq'})
    """
    canonical_name(name)  # a typed error for an unknown name
    return dict(_DEFAULTS_BY_KEY.get(_key(name), ("", {}))[1])


def load(
    name: str, split: str = "validation", path: str | Path | None = None, **kwargs: Any
) -> list[QAExample]:
    """Load a dataset's examples.

    Args:
        name: one of :data:`DATASETS` (``"synthhop"``, ``"hotpotqa"``, ``"2wikimultihopqa"``,
            ``"musique"``, ``"bamboogle"``, ``"flashrag"``), ``"synthhop-hard"`` (SynthHop
            with ``preset="hard"`` unless ``kwargs`` name another), or ``"nq"``,
            ``"triviaqa"``, ``"popqa"`` (FlashRAG's JSONL with that ``subset``).
        split: ``"train"``, ``"validation"`` (or ``"dev"``, ``"val"``, ``"valid"``) or
            ``"test"`` (:data:`rag_gym.data.splits.SPLIT_NAMES`); any other name is a
            ``ValueError``. SynthHop and the hub take that split; a file given as ``path`` *is*
            the split (the name labels it); a folder is narrowed to the split's files (below).
        path: a local file in the dataset's official format, or a folder of such files;
            ``None`` means SynthHop's generator, or the hub where the dataset has an official
            copy there.
        **kwargs: loader options (SynthHop: ``preset`` and config fields; HotpotQA:
            ``setting``; FlashRAG: ``subset``). ``split_by_id=True`` (any file) keeps only the
            questions whose id :func:`rag_gym.data.splits.id_split` puts in ``split``.

    A folder is read file by file (its ``.json``, ``.jsonl``, ``.ndjson`` and ``.parquet``
    files, in name order; a question id in two files is an error), as the benchmarks ship
    their files: when the file names declare their split (:func:`~rag_gym.data.splits.file_split`:
    ``hotpot_dev_distractor_v1.json``, ``hotpot_train_v1.1.json``, 2Wiki's ``dev.json`` and
    ``train.json``, ``musique_ans_v1.0_dev.jsonl``, FlashRAG's ``dev.jsonl``/``test.jsonl``/
    ``train.jsonl``), only the requested split's files are read, and a :class:`DataFormatError` names the folder when no
    file is of the split, or when a file's name declares no split (or two) while others do.
    A folder whose file names declare no split at all is read whole: the folder is the split.
    With ``split_by_id`` every file is read, and the ids choose the split. Each example read
    from a folder names its file in ``meta["source_file"]``.

    >>> load("synthhop", "dev", n_passages=2000, n_questions=(40, 10, 10))[0].id == (
    ...     load("synthhop", "validation", n_passages=2000, n_questions=(40, 10, 10))[0].id)
    True
    """
    module = importlib.import_module(DATASETS[canonical_name(name)])
    canonical = canonical_split(split)
    split_by_id = kwargs.pop("split_by_id", False)
    if not isinstance(split_by_id, bool):
        raise TypeError(f"expected split_by_id to be True or False, got {split_by_id!r}")
    if split_by_id and path is None:
        raise ValueError(
            "split_by_id splits the questions of a file: give the file (path=, or data_path= "
            "for an env)"
        )
    options = {**dataset_defaults(name), **kwargs}
    if path is not None and Path(path).is_dir():
        examples = _load_folder(module, Path(path), split, options, every_file=split_by_id)
    else:
        examples = module.load(path, split=canonical, **options)
    return select(examples, canonical) if split_by_id else examples


#: The file types a loader reads (a folder given as ``path`` is read file by file).
DATA_SUFFIXES = (".json", ".jsonl", ".ndjson", ".parquet")


def _load_folder(
    module: Any, folder: Path, split: str, options: dict[str, Any], every_file: bool = False
) -> list:
    """The data files of ``folder`` of ``split`` (every file when no name declares a split, or
    with ``every_file``), sorted by name and read by ``module``; each example's
    ``meta["source_file"]`` names its file. A question id in two files is a
    :class:`DataFormatError` naming both. See :func:`load` for how a file's split is told."""
    from dataclasses import replace

    files = sorted(f for f in folder.iterdir() if f.is_file() and f.suffix.lower() in DATA_SUFFIXES)
    if not files:
        raise DataFormatError(
            folder, "(folder)", "(files)", f"at least one {'/'.join(DATA_SUFFIXES)} file", "none"
        )
    chosen = files if every_file else _files_of_split(folder, files, split)
    examples: list[QAExample] = []
    first: dict[str, Path] = {}
    for file in chosen:
        for ex in module.load(file, split=canonical_split(split), **options):
            if ex.id in first:
                raise DataFormatError(
                    file, "(file)", "id", f"ids not already read from {first[ex.id].name}", ex.id
                )
            first[ex.id] = file
            examples.append(replace(ex, meta={"source_file": file.name, **ex.meta}))
    return examples


def _files_of_split(folder: Path, files: list[Path], split: str) -> list[Path]:
    """The files of ``split`` among ``files`` (all of them when no name declares a split)."""
    want = canonical_split(split)
    declared = {f: file_split(f.name) for f in files}
    if not any(declared.values()):
        return files  # no name declares a split: the folder is the split
    named = [f"{f.name} ({'/'.join(sorted(s))})" for f, s in declared.items() if len(s) == 1]
    unclear = [f.name for f, s in declared.items() if len(s) != 1]
    if unclear:
        raise DataFormatError(
            folder,
            "(folder)",
            "(file names)",
            "every data file's name to declare one split (train, dev/validation or test) "
            f"when some do ({', '.join(named)}), so that split {split!r} reads its own files "
            "only: rename or move the others, or pass the data file itself as the path",
            unclear,
        )
    chosen = [f for f, s in declared.items() if s == {want}]
    if not chosen:
        names = " or ".join(repr(n) for n, c in SPLIT_NAMES.items() if c == want)
        raise DataFormatError(
            folder,
            "(folder)",
            "(file names)",
            f"a data file of split {split!r} (a name holding {names}) beside "
            f"{', '.join(named)}: pass the split these files hold, or add the file",
            "no file of that split",
        )
    return chosen


def pooled_corpus(
    examples: list[QAExample], name: str = "pooled"
) -> tuple[Corpus, list[QAExample]]:
    """All passages of the examples' own pools in one corpus, deduplicated, and the examples.

    Passages with the same id and text are stored once. Real datasets reuse a title for
    different paragraphs (HotpotQA has several "Harry Morgan"s), so a second, different text
    under a known id is stored as ``"<id> #2"`` (``#3``…), and the examples that use it are
    returned with their passages and gold ids renamed to match. The corpus is what a
    full-corpus ("fullwiki") env searches.

    >>> a = QAExample("q1", "?", ("x",), ("T",), (Passage("T", "T", "one"),))
    >>> b = QAExample("q2", "?", ("y",), ("T",), (Passage("T", "T", "two"),))
    >>> corpus, (a2, b2) = pooled_corpus([a, b])
    >>> corpus.ids, b2.supporting_ids
    (['T', 'T #2'], ('T #2',))
    """
    from dataclasses import replace

    corpus = Corpus(name=name)
    out: list[QAExample] = []
    for ex in examples:
        renamed: dict[str, str] = {}
        passages = []
        for p in ex.passages:
            pid, n = p.id, 1
            while pid in corpus and corpus[pid].text != p.text:
                n += 1
                pid = f"{p.id} #{n}"
            if pid not in corpus:
                corpus.add(Passage(pid, p.title, p.text))
            if pid != p.id:
                renamed[p.id] = pid
            passages.append(Passage(pid, p.title, p.text))
        if renamed:
            ex = replace(
                ex,
                passages=tuple(passages),
                supporting_ids=tuple(renamed.get(g, g) for g in ex.supporting_ids),
            )
        out.append(ex)
    return corpus, out
