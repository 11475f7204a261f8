"""A fixed train / validation / test split of any question file, by question id.

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
from collections.abc import Iterable

from rag_gym._names import unknown_name

#: The split names, and the share of question ids each receives.
SPLIT_FRACTIONS: dict[str, float] = {"train": 0.5, "validation": 0.1, "test": 0.4}
#: A fixed salt, so that the split is rag-gym's own and not a hash another tool may also use.
_SALT = b"rag-gym/split-by-id/v1\x00"


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
    """``split`` if it is a split of :data:`SPLIT_FRACTIONS`, else a ``ValueError`` with a fix."""
    if split not in SPLIT_FRACTIONS:
        raise unknown_name("split (with split_by_id)", split, list(SPLIT_FRACTIONS))
    return split


def select(examples: Iterable, split: str) -> list:
    """The examples whose id falls in ``split`` (file order kept)."""
    check_split(split)
    return [ex for ex in examples if id_split(ex.id) == split]
