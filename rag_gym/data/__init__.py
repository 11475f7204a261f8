"""Datasets: the data model, one loader module per benchmark, and the SynthHop world.

One entry point, :func:`load`::

    examples = rag_gym.data.load("hotpotqa", "validation", path="hotpot_dev_distractor_v1.json")
    examples = rag_gym.data.load("synthhop", "validation")            # embedded, no download

>>> len(load("synthhop", "validation", n_passages=2000, n_questions=(40, 10, 10)))
10
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from rag_gym._registry import Registry, caller_origin
from rag_gym.data.errors import DataFormatError
from rag_gym.data.splits import SPLIT_NAMES, canonical_split, file_split, select
from rag_gym.data.types import Corpus, Passage, QAExample

__all__ = [
    "DATASETS",
    "Corpus",
    "DataFormatError",
    "DatasetSpec",
    "Passage",
    "QAExample",
    "dataset_defaults",
    "dataset_loader",
    "load",
    "pooled_corpus",
    "register_dataset",
]


@dataclass(frozen=True)
class DatasetSpec:
    """A dataset :func:`load` reads by name: its own loader, or another dataset's with default
    options (a variant: ``synthhop-hard`` is ``synthhop`` with ``preset="hard"``)."""

    load: Callable[..., list[QAExample]] | None = None
    """``load(path, split, **options) -> list[QAExample]``: ``path`` a file in the dataset's
    format (or ``None``: generated, or its hub copy), ``split`` a canonical split name
    (``train``, ``validation``, ``test``). :func:`load` reads a folder file by file with it."""
    base: str | None = None
    """The registered dataset this one reads with (``load`` then stays ``None``)."""
    defaults: Mapping[str, Any] = field(default_factory=dict)
    """Loader options this name stands for; a caller's own options override them one by one."""
    description: str = ""

    def __post_init__(self) -> None:
        if (self.load is None) == (self.base is None):
            raise TypeError("expected a dataset's own load function or the base it reads with")
        if self.load is not None and not callable(self.load):
            raise TypeError(f"expected load to be callable, got {type(self.load).__name__}")
        if not isinstance(self.defaults, Mapping):
            raise TypeError(f"expected defaults to be a dict, got {type(self.defaults).__name__}")


def _key(name: str) -> str:
    if not isinstance(name, str):
        raise TypeError(f"expected a dataset name (str), got {type(name).__name__}")
    return name.lower().replace("-", "").replace(" ", "")


def _as_dataset(name: str, value: Any) -> DatasetSpec:
    if isinstance(value, DatasetSpec):
        return value
    if isinstance(value, str):
        return DatasetSpec(base=value)
    if isinstance(value, ModuleType) and callable(getattr(value, "load", None)):
        return DatasetSpec(load=value.load)
    if callable(value):
        return DatasetSpec(load=value)
    raise TypeError(
        "expected a loader function load(path, split, **options), a module with one, a "
        f"DatasetSpec or a registered dataset's name, got {type(value).__name__}"
    )


DATASETS: Registry[DatasetSpec] = Registry("dataset", "rag_gym.datasets", _as_dataset, _key)
"""Every dataset by name (case, ``-`` and spaces ignored; a :class:`~rag_gym._registry.Registry`)."""


def register_dataset(
    name: str,
    dataset: DatasetSpec | Callable[..., list[QAExample]] | ModuleType | str,
    *,
    defaults: Mapping[str, Any] | None = None,
    aliases: tuple[str, ...] = (),
    replace: bool = False,
) -> DatasetSpec:
    """Register a dataset as ``name``: its loader ``load(path, split, **options) ->
    list[QAExample]`` (or a module with one, or a :class:`DatasetSpec`), or the name of a
    registered dataset it reads with; ``defaults`` are the loader options it stands for. The
    envs' ``dataset=`` (``rag_gym.make(..., dataset="mine", data_path=...)``), suites and
    :func:`load` then take the name. An installed package registers one through an entry point
    in the group ``rag_gym.datasets`` (to a loader function or a :class:`DatasetSpec`).

    >>> DATASETS.get("nq")  # a variant, as register_dataset("nq", "flashrag", defaults=...) makes
    DatasetSpec(load=None, base='flashrag', defaults={'subset': 'nq'}, description='')
    """
    spec = _as_dataset(_key(name), dataset)
    if defaults:
        from dataclasses import replace as with_fields

        spec = with_fields(spec, defaults={**spec.defaults, **defaults})
    if spec.base is not None:
        base = DATASETS.key(spec.base)  # a typed error for an unknown base
        while base is not None:  # and none that reads through this name again
            if _key(base) == _key(name):
                raise ValueError(f"dataset {name!r} cannot read through itself ({spec.base!r})")
            base = DATASETS.get(base).base
    return DATASETS.register(name, spec, aliases=aliases, replace=replace, origin=caller_origin())


def _module_loader(module: str) -> Callable[..., list[QAExample]]:
    """``module``'s ``load``, imported on the first call."""

    def load(path: str | Path | None, split: str, **options: Any) -> list[QAExample]:
        return importlib.import_module(module).load(path, split=split, **options)

    load.__qualname__ = f"{module}.load"
    return load


for _name, _module, _aliases in (
    ("synthhop", "rag_gym.data.synthhop", ()),
    ("hotpotqa", "rag_gym.data.hotpotqa", ("hotpot", "hotpot_qa")),
    ("2wikimultihopqa", "rag_gym.data.twowikimultihopqa", ("2wiki", "twowiki")),
    ("musique", "rag_gym.data.musique", ()),
    ("bamboogle", "rag_gym.data.bamboogle", ()),
    ("flashrag", "rag_gym.data.flashrag", ()),
):
    DATASETS.register(_name, _module_loader(_module), aliases=_aliases, origin="rag-gym")
#: names that stand for a dataset with default loader options, which ``dataset_kwargs`` extend
#: rather than replace: ``gym.make("rag_gym/SynthHop-Hard-v0", dataset_kwargs={"n_questions":
#: ...})`` keeps the hard world (Gymnasium merges ``gym.make`` keyword arguments one level deep)
for _name, _base, _defaults in (
    ("synthhop-hard", "synthhop", {"preset": "hard"}),
    # the open-domain sets in FlashRAG's JSONL (``subset``: their hub name)
    ("nq", "flashrag", {"subset": "nq"}),
    ("triviaqa", "flashrag", {"subset": "triviaqa"}),
    ("popqa", "flashrag", {"subset": "popqa"}),
):
    DATASETS.register(_name, DatasetSpec(base=_base, defaults=_defaults), origin="rag-gym")


def canonical_name(name: str) -> str:
    """The registered dataset whose loader reads ``name`` (case-insensitive, common aliases
    accepted; a variant's base).

    >>> canonical_name("SynthHop-Hard"), canonical_name("hotpot")
    ('synthhop', 'hotpotqa')
    """
    key = DATASETS.key(name)
    base = DATASETS.get(key).base
    return key if base is None else canonical_name(base)


def dataset_loader(name: str) -> Callable[..., list[QAExample]]:
    """The loader function that reads ``name`` (a variant's base's)."""
    return DATASETS.get(canonical_name(name)).load


def dataset_defaults(name: str) -> dict[str, Any]:
    """The loader options ``name`` stands for (``{"preset": "hard"}`` for ``synthhop-hard``),
    which a dataset's own keyword arguments override one by one.

    >>> dataset_defaults("synthhop-hard"), dataset_defaults("synthhop"), dataset_defaults("NQ")
    ({'preset': 'hard'}, {}, {'subset': 'nq'})
    """
    spec = DATASETS.get(name)
    inherited = dataset_defaults(spec.base) if spec.base is not None else {}
    return {**inherited, **spec.defaults}


def load(
    name: str, split: str = "validation", path: str | Path | None = None, **kwargs: Any
) -> list[QAExample]:
    """Load a dataset's examples.

    Args:
        name: one of :data:`DATASETS` (``"synthhop"``, ``"hotpotqa"``, ``"2wikimultihopqa"``,
            ``"musique"``, ``"bamboogle"``, ``"flashrag"``), ``"synthhop-hard"`` (SynthHop
            with ``preset="hard"`` unless ``kwargs`` name another), ``"nq"``,
            ``"triviaqa"``, ``"popqa"`` (FlashRAG's JSONL with that ``subset``), or one
            registered by :func:`register_dataset`.
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
    loader = dataset_loader(name)
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
        examples = _load_folder(loader, Path(path), split, options, every_file=split_by_id)
    else:
        examples = loader(path, split=canonical, **options)
    return select(examples, canonical) if split_by_id else examples


#: The file types a loader reads (a folder given as ``path`` is read file by file).
DATA_SUFFIXES = (".json", ".jsonl", ".ndjson", ".parquet")


def _load_folder(
    loader: Callable[..., list[QAExample]],
    folder: Path,
    split: str,
    options: dict[str, Any],
    every_file: bool = False,
) -> list:
    """The data files of ``folder`` of ``split`` (every file when no name declares a split, or
    with ``every_file``), sorted by name and read by ``loader``; each example's
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
        for ex in loader(file, split=canonical_split(split), **options):
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
