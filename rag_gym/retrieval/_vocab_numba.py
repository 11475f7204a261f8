"""A memory-mapped BM25 vocabulary: token → column without reading a JSON dictionary at load.

bm25s keeps its vocabulary as ``vocab.index.json``, which a load parses into a Python ``dict``
(and a ``set`` of its ids). At wiki-18 scale that is millions of tokens: seconds of parsing and
gigabytes of RSS before the first query (docs/retrieval-scale.md). The index also holds the same
vocabulary as three arrays in ``serving/`` that a load maps and never reads whole:

``vocab_bytes.npy`` (``uint8``)
    every token's UTF-8 bytes, concatenated in column order.
``vocab_offsets.npy`` (``int64``, columns + 1)
    token ``i`` is ``vocab_bytes[vocab_offsets[i]:vocab_offsets[i + 1]]``.
``vocab_table.npy`` (``int32``, a power of two ≥ twice the tokens)
    an open-addressing hash table (64-bit FNV-1a of the bytes, linear probing): each slot holds a
    column or ``-1``.

A lookup hashes the token, probes the table and compares bytes: a few pages touched per query
token. Every value read from a file is bounds-checked before it is used as an index, so a damaged
file gives wrong tokens (which the manifest's checksums exist to catch), never a read outside an
array. The vocabulary is ``bm25s``'s ``vocab_dict`` (its empty token included), so
:class:`MappedVocab` stands in for it (a read-only ``Mapping``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
from numba import njit

from rag_gym.data.mapped import plain_view

FILES = ("vocab_bytes", "vocab_offsets", "vocab_table")
"""The vocabulary's files in ``serving/`` (``.npy``)."""


@njit(nogil=True, cache=True, inline="always")
def _fnv1a(blob, start, stop) -> np.uint64:
    h = np.uint64(0xCBF29CE484222325)
    for j in range(start, stop):
        h = (h ^ np.uint64(blob[j])) * np.uint64(0x100000001B3)
    return h


@njit(nogil=True, cache=True)
def _fill_table(blob, offsets, table) -> bool:
    # insert every column; False when two columns hold the same bytes
    mask = np.uint64(table.shape[0] - 1)
    for i in range(offsets.shape[0] - 1):
        start, stop = offsets[i], offsets[i + 1]
        slot = _fnv1a(blob, start, stop) & mask
        while table[slot] >= 0:
            other = table[slot]
            o_start, o_stop = offsets[other], offsets[other + 1]
            if o_stop - o_start == stop - start:
                same = True
                for j in range(stop - start):
                    if blob[o_start + j] != blob[start + j]:
                        same = False
                        break
                if same:
                    return False
            slot = (slot + np.uint64(1)) & mask
        table[slot] = i
    return True


@njit(nogil=True, cache=True)
def _lookup(blob, offsets, table, keys, key_offsets, out) -> None:
    # out[q] = the column of key q, or -1; every value read from a file is checked before use
    n_cols = offsets.shape[0] - 1
    n_bytes = blob.shape[0]
    size = table.shape[0]
    mask = np.uint64(size - 1)
    for q in range(key_offsets.shape[0] - 1):
        start, stop = key_offsets[q], key_offsets[q + 1]
        length = stop - start
        slot = _fnv1a(keys, start, stop) & mask
        out[q] = -1
        for _ in range(size):  # a full table without the key ends here
            col = table[slot]
            if col < 0 or col >= n_cols:
                break
            c_start, c_stop = offsets[col], offsets[col + 1]
            if 0 <= c_start <= c_stop <= n_bytes and c_stop - c_start == length:
                same = True
                for j in range(length):
                    if blob[c_start + j] != keys[start + j]:
                        same = False
                        break
                if same:
                    out[q] = col
                    break
            slot = (slot + np.uint64(1)) & mask


def _encode(tokens: list[str]) -> tuple[np.ndarray, np.ndarray]:
    encoded = [t.encode("utf-8", "surrogatepass") for t in tokens]
    offsets = np.fromiter(  # np.cumsum of a short list costs more than the lookup
        itertools.accumulate(map(len, encoded), initial=0), dtype=np.int64, count=len(encoded) + 1
    )
    return np.frombuffer(b"".join(encoded), dtype=np.uint8), offsets


def vocab_arrays(vocab: Mapping[str, int]) -> dict[str, np.ndarray] | None:
    """The three arrays of ``vocab`` (token → column), or ``None`` when its columns are not
    ``0 … len(vocab) - 1`` (such an index keeps its JSON vocabulary only)."""
    n = len(vocab)
    if n >= 2**31 - 1:
        return None
    tokens: list[str | None] = [None] * n
    for token, col in vocab.items():
        if not isinstance(col, int) or not 0 <= col < n or tokens[col] is not None:
            return None
        tokens[col] = token
    blob, offsets = _encode(tokens)  # type: ignore[arg-type]
    table = np.full(max(2, 1 << max(1, 2 * n - 1).bit_length()), -1, dtype=np.int32)
    if not _fill_table(blob, offsets, table):
        return None
    return {"vocab_bytes": blob, "vocab_offsets": offsets, "vocab_table": table}


def write_vocab(folder: Path, vocab: Mapping[str, int]) -> bool:
    """Write ``vocab``'s arrays into ``folder``; ``False`` (nothing written) when
    :func:`vocab_arrays` cannot hold it."""
    arrays = vocab_arrays(vocab)
    if arrays is None:
        return False
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)
    return True


class MappedVocab(Mapping):
    """bm25s's ``vocab_dict`` (token → column) over the mapped arrays of :data:`FILES`.

    Looking up many tokens at once (:meth:`columns`) is one compiled call; ``[]``, ``in`` and
    ``get`` look up one. Iterating decodes every token (slow at scale; nothing in serving does
    it).
    """

    def __init__(self, blob: np.ndarray, offsets: np.ndarray, table: np.ndarray) -> None:
        if blob.ndim != 1 or offsets.ndim != 1 or table.ndim != 1 or len(offsets) < 1:
            raise ValueError("vocab_bytes.npy, vocab_offsets.npy and vocab_table.npy must be 1-D")
        size = len(table)
        if size < 2 or size & (size - 1):
            raise ValueError(f"vocab_table.npy has {size} slots, not a power of two")
        if blob.dtype != np.uint8 or offsets.dtype != np.int64 or table.dtype != np.int32:
            raise ValueError(
                "vocab_bytes.npy must be uint8, vocab_offsets.npy int64 and vocab_table.npy int32"
            )
        if int(offsets[0]) != 0 or int(offsets[-1]) != len(blob):
            raise ValueError("vocab_offsets.npy does not span vocab_bytes.npy")
        self._blob, self._offsets, self._table = map(plain_view, (blob, offsets, table))

    @classmethod
    def load(cls, folder: Path, mmap: bool = True) -> MappedVocab:
        """The vocabulary in ``folder`` (mapped with ``mmap``), its lookup compiled (or loaded
        from numba's cache) for these arrays so that no query pays for the JIT."""
        mode = "r" if mmap else None
        arrays = [
            np.load(folder / f"{name}.npy", mmap_mode=mode, allow_pickle=False) for name in FILES
        ]
        vocab = cls(*arrays)
        vocab.columns([""])
        return vocab

    def columns(self, tokens: list[str]) -> np.ndarray:
        """Each token's column, ``-1`` for a token outside the vocabulary."""
        keys, key_offsets = _encode(tokens)
        out = np.empty(len(tokens), dtype=np.int64)
        _lookup(self._blob, self._offsets, self._table, keys, key_offsets, out)
        return out

    def token_ids(self, tokens: list[str]) -> list[int]:
        """``bm25s.BM25.get_tokens_ids``: the columns of the known tokens, in order."""
        if not tokens:
            return []
        return [int(c) for c in self.columns(tokens) if c >= 0]

    def __getitem__(self, token: str) -> int:
        if not isinstance(token, str):
            raise KeyError(token)
        col = int(self.columns([token])[0])
        if col < 0:
            raise KeyError(token)
        return col

    def __contains__(self, token: object) -> bool:
        return isinstance(token, str) and int(self.columns([token])[0]) >= 0

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __iter__(self) -> Iterator[str]:
        blob, offsets = self._blob, self._offsets
        for i in range(len(self)):
            yield bytes(blob[offsets[i] : offsets[i + 1]]).decode("utf-8", "surrogatepass")

    def __repr__(self) -> str:
        return f"MappedVocab({len(self)} tokens)"
