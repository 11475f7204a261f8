"""The mapped BM25 vocabulary (rag_gym.retrieval._vocab_numba): the same mapping as the JSON
dictionary it stands in for, and a typed error for arrays that do not hold one."""

from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("numba") is None,
    reason="the mapped vocabulary needs numba: pip install 'rag-gym[fast]'",
)


def _vocab(n: int, seed: int = 0) -> dict[str, int]:
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789éßжλ中_"
    words: set[str] = {"", "a" * 500}
    while len(words) < n:
        words.add("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))))
    return {w: i for i, w in enumerate(sorted(words, key=lambda w: (len(w), w)))}


def test_the_mapped_vocabulary_is_the_dictionary(tmp_path):
    from rag_gym.retrieval._vocab_numba import MappedVocab, write_vocab

    vocab = _vocab(20_000)  # about 10,000 probes collide at a load factor of 0.3
    assert write_vocab(tmp_path, vocab)
    mapped = MappedVocab.load(tmp_path)
    assert len(mapped) == len(vocab) and dict(mapped) == vocab
    tokens = [*list(vocab)[::7], "not-a-token", "ZZ", "a" * 499]
    expected = [vocab.get(t, -1) for t in tokens]
    assert mapped.columns(tokens).tolist() == expected
    assert mapped.token_ids(tokens) == [c for c in expected if c >= 0]
    assert mapped[""] == vocab[""] and "ZZ" not in mapped and mapped.get("ZZ") is None
    with pytest.raises(KeyError):
        mapped["ZZ"]


def test_a_vocabulary_whose_columns_are_not_dense_is_not_mapped(tmp_path):
    from rag_gym.retrieval._vocab_numba import vocab_arrays, write_vocab

    assert vocab_arrays({"a": 0, "b": 2}) is None
    assert vocab_arrays({"a": 0, "b": 0}) is None
    assert not write_vocab(tmp_path, {"a": 1})
    assert list(tmp_path.iterdir()) == []


def test_arrays_that_are_no_vocabulary_are_a_value_error():
    from rag_gym.retrieval._vocab_numba import MappedVocab, vocab_arrays

    good = vocab_arrays({"a": 0, "b": 1})
    blob, offsets, table = good["vocab_bytes"], good["vocab_offsets"], good["vocab_table"]
    with pytest.raises(ValueError, match="not a power of two"):
        MappedVocab(blob, offsets, table[:3])
    with pytest.raises(ValueError, match="does not span"):
        MappedVocab(blob[:1], offsets, table)
    with pytest.raises(ValueError, match="must be uint8"):
        MappedVocab(blob, offsets, table.astype(np.int64))
