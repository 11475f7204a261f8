"""Split names, the split a data file's name declares, and a fixed split of any file by id.

A split is ``train``, ``validation`` or ``test``; ``dev``, ``val`` and ``valid`` are names of
``validation`` (:data:`SPLIT_NAMES`). :func:`canonical_split` refuses any other name, and
:func:`file_split` reads the split a benchmark's file name declares (``hotpot_train_v1.1.json``:
train, ``musique_ans_v1.0_dev.jsonl``: validation, FlashRAG's ``test.jsonl``: test), which is
how a folder given as a data path is narrowed to the requested split's files.

>>> canonical_split("dev"), file_split("hotpot_dev_distractor_v1.json"), file_split("corpus.jsonl")
('validation', {'validation'}, set())

The benchmark samples a user has at hand are usually dev-set files, one file per benchmark, and
training on them needs a split that never moves: a question must be in the same split whatever
file it is read from, in whatever order, next to whatever other questions. :func:`id_split`
assigns each question id to a split by a hash of the id alone, so adding questions to a file, or
reading two files together, leaves every earlier assignment as it was.

``rag_gym.data.load(name, split, path, split_by_id=True)`` (and so ``gym.make(id,
data_path=..., split="test", dataset_kwargs={"split_by_id": True})``) keeps the questions of the
file whose id falls in ``split``.

>>> [id_split(q) for q in ("5a8b57f25542995d1e6f1371", "5a7a06935542990198eaf050")]
['test', 'train']
>>> sum(id_split(str(i)) == "test" for i in range(10_000)) / 10_000
0.3925
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

from rag_gym._names import unknown_name

#: The split names, and the share of question ids each receives.
SPLIT_FRACTIONS: dict[str, float] = {"train": 0.5, "validation": 0.1, "test": 0.4}
#: A fixed salt, so that the split is rag-gym's own and not a hash another tool may also use.
_SALT = b"rag-gym/split-by-id/v1\x00"


#: Every split name a user may give (``--split``, ``split=``), and the split it stands for.
SPLIT_NAMES: dict[str, str] = {
    "train": "train",
    "validation": "validation",
    "dev": "validation",
    "val": "validation",
    "valid": "validation",
    "test": "test",
}


def canonical_split(split: object) -> str:
    """The split ``split`` names (``"dev"`` → ``"validation"``); a ``TypeError`` for a value
    that is not a string, a ``ValueError`` with "did you mean" for any other name.

    >>> canonical_split("val")
    'validation'
    >>> canonical_split("tset")
    Traceback (most recent call last):
    ...
    ValueError: expected a split in ['dev', 'test', 'train', 'val', 'valid', 'validation'], got 'tset'; did you mean 'test'?
    """
    if not isinstance(split, str):
        raise TypeError(f"expected split to be a str, got {type(split).__name__}: {split!r}")
    if split not in SPLIT_NAMES:
        raise unknown_name("split", split, list(SPLIT_NAMES))
    return SPLIT_NAMES[split]


def file_split(name: str) -> set[str]:
    """The splits a data file's name declares: each run of letters in its name that is a split
    name (:data:`SPLIT_NAMES`). Empty when the name declares none; two or more when it
    is ambiguous (``train_dev.json``).

    >>> file_split("musique_ans_v1.0_dev.jsonl"), file_split("train-00000-of-00001.parquet")
    ({'validation'}, {'train'})
    >>> sorted(file_split("train_dev.json")), file_split("interval.json")
    (['train', 'validation'], set())
    """
    words = re.split(r"[^a-z]+", name.rsplit("/", 1)[-1].lower())
    return {SPLIT_NAMES[w] for w in words if w in SPLIT_NAMES}


def id_split(question_id: str) -> str:
    """The split of ``question_id``: ``train``, ``validation`` or ``test`` (50 / 10 / 40 % of ids),
    from the first 8 bytes of SHA-256 over a fixed salt and the id's UTF-8 bytes."""
    digest = hashlib.sha256(_SALT + str(question_id).encode("utf-8", "surrogatepass")).digest()
    u = int.from_bytes(digest[:8], "big") / 2**64
    edge = 0.0
    for name, share in SPLIT_FRACTIONS.items():
        edge += share
        if u < edge:
            return name
    return name  # u is below 1.0, so the last edge (1.0) was reached: float rounding only


def check_split(split: str) -> str:
    """The split of :data:`SPLIT_FRACTIONS` that ``split`` names (``"dev"``: ``"validation"``),
    else a ``ValueError`` with a fix."""
    if not isinstance(split, str):
        raise TypeError(f"expected split to be a str, got {type(split).__name__}: {split!r}")
    if split not in SPLIT_NAMES:
        raise unknown_name("split (with split_by_id)", split, list(SPLIT_NAMES))
    return SPLIT_NAMES[split]


def select(examples: Iterable, split: str) -> list:
    """The examples whose id falls in ``split`` (file order kept)."""
    split = check_split(split)
    return [ex for ex in examples if id_split(ex.id) == split]
