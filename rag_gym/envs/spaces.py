"""Text spaces that really validate: type, length and characters.

Gymnasium's default :class:`~gymnasium.spaces.Text` charset is ASCII letters and digits, so a
sentence ("Who wrote it?") lies outside it. rag-gym's :class:`UnicodeText` uses a documented
charset instead: every printable character of the Unicode Basic Multilingual Plane (all code
points U+0020–U+FFFF except the categories Cc, Cf, Cs, Co and Cn: controls, format characters,
surrogates, private use, unassigned) plus newline and tab. Its ``contains`` still rejects a
non-string, a string longer than ``max_length``, and any control character, NUL, lone
surrogate or astral-plane character (emoji, for instance).

:func:`sanitize` maps any text into the charset (carriage returns become newlines, other
characters outside the charset become U+FFFD), which is how environments guarantee that their
observations lie inside their observation space.

>>> space = UnicodeText(max_length=20)
>>> space.contains("Who wrote it?"), space.contains("bad\\x00byte"), space.contains("x" * 21)
(True, False, False)
>>> sanitize("a\\r\\nb\\x07c")
'a\\nb\\ufffdc'
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.spaces import Text
from gymnasium.vector.utils import shared_memory

_EXCLUDED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})


@functools.cache
def text_charset() -> frozenset[str]:
    """The characters :class:`UnicodeText` accepts (built once, about 55,000 characters)."""
    chars = {"\n", "\t"}
    for cp in range(0x20, 0x10000):
        ch = chr(cp)
        if unicodedata.category(ch) not in _EXCLUDED_CATEGORIES:
            chars.add(ch)
    return frozenset(chars)


@functools.cache
def _charset_tables() -> tuple[frozenset[str], tuple[str, ...], dict[str, np.int32], str]:
    """What :class:`~gymnasium.spaces.Text` derives from a charset, for :func:`text_charset`."""
    chars = sorted(text_charset())
    index = {c: np.int32(i) for i, c in enumerate(chars)}
    return frozenset(chars), tuple(chars), index, "".join(chars)


class UnicodeText(Text):
    """A :class:`~gymnasium.spaces.Text` over printable BMP characters (see the module doc)."""

    def __init__(self, max_length: int, min_length: int = 0, seed: Any = None) -> None:
        # Gymnasium checks the lengths and seed; the charset's sorted list, index and string
        # (about 50 ms to build for 55,000 characters, and an env has two of these spaces) are
        # built once per process and shared, read-only, by every UnicodeText.
        super().__init__(max_length, min_length=min_length, charset="a", seed=seed)
        self._char_set, self._char_list, self._char_index, self._char_str = _charset_tables()

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, str)
            and self.min_length <= len(x) <= self.max_length
            and (_ascii_in_charset(x) or self.character_set.issuperset(x))
        )

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length}, charset=printable BMP)"


#: the ASCII characters of :func:`text_charset`: U+0020–U+007E, newline and tab
_ASCII_IN_CHARSET = bytes(range(0x20, 0x7F)) + b"\n\t"


def _ascii_in_charset(text: str) -> bool:
    """Whether ``text`` is ASCII lying in :func:`text_charset` (tested with C string methods,
    not a set lookup per character); a non-ASCII text is checked against the charset itself."""
    return text.isascii() and (
        text.isprintable() or not text.encode("ascii").translate(None, _ASCII_IN_CHARSET)
    )


def sanitize(text: str) -> str:
    """Map ``text`` into :func:`text_charset`: ``\\r\\n``/``\\r`` → ``\\n``, others → U+FFFD."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    charset = text_charset()
    if _ascii_in_charset(text) or charset.issuperset(text):
        return text
    return "".join(ch if ch in charset else "\ufffd" for ch in text)


# ---- async vector envs ---------------------------------------------------------------------------
# Gymnasium's AsyncVectorEnv reads its shared observation memory once, at construction, and for a
# Text space that read returns a tuple of strings: a copy, not a view, so every later observation
# would come back as that first (empty) read. For UnicodeText the read returns a live view instead,
# decoded when indexed; the env's ``deepcopy`` of it (AsyncVectorEnv's default ``copy=True``) is a
# plain tuple of the current strings.
@functools.cache
def _codec() -> tuple[np.ndarray, np.ndarray]:
    """(code point → charset index, charset index → code point) for the sorted charset."""
    chars = sorted(text_charset())
    to_code = np.array([ord(c) for c in chars], dtype=np.uint32)
    to_index = np.full(0x10000, len(chars), dtype=np.int32)
    to_index[to_code] = np.arange(len(chars), dtype=np.int32)
    return to_index, to_code


class SharedTextView(Sequence):
    """The strings in a shared-memory block of a :class:`UnicodeText` space, decoded on access."""

    def __init__(self, space: UnicodeText, memory: Any, n: int) -> None:
        self._space = space
        self._memory = memory
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(self._n)))
        if not -self._n <= i < self._n:
            raise IndexError(i)
        size = self._space.max_length
        data = np.frombuffer(self._memory.get_obj(), dtype=np.int32).reshape(self._n, size)[i]
        _, to_code = _codec()
        return to_code[data[data < len(to_code)]].tobytes().decode("utf-32-le")

    def __deepcopy__(self, memo: dict) -> tuple[str, ...]:
        return tuple(self)

    def __repr__(self) -> str:
        return f"SharedTextView({tuple(self)!r})"


@shared_memory.read_from_shared_memory.register(UnicodeText)
def _read_unicode_text(space: UnicodeText, memory: Any, n: int = 1) -> SharedTextView:
    return SharedTextView(space, memory, n)


@shared_memory.write_to_shared_memory.register(UnicodeText)
def _write_unicode_text(space: UnicodeText, index: int, value: str, memory: Any) -> None:
    # vectorised version of Gymnasium's per-character flatten: same layout, same padding
    to_index, _ = _codec()
    size = space.max_length
    codes = np.frombuffer(value.encode("utf-32-le"), dtype=np.uint32)
    row = np.full(size, len(space.character_list), dtype=np.int32)
    row[: len(codes)] = to_index[codes]
    np.frombuffer(memory.get_obj(), dtype=np.int32)[index * size : (index + 1) * size] = row
