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
from typing import Any

from gymnasium.spaces import Text

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


class UnicodeText(Text):
    """A :class:`~gymnasium.spaces.Text` over printable BMP characters (see the module doc)."""

    def __init__(self, max_length: int, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=text_charset(), seed=seed)

    def contains(self, x: Any) -> bool:
        return (
            isinstance(x, str)
            and self.min_length <= len(x) <= self.max_length
            and self.character_set.issuperset(x)
        )

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length}, charset=printable BMP)"


def sanitize(text: str) -> str:
    """Map ``text`` into :func:`text_charset`: ``\\r\\n``/``\\r`` → ``\\n``, others → U+FFFD."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    charset = text_charset()
    if charset.issuperset(text):
        return text
    return "".join(ch if ch in charset else "\ufffd" for ch in text)
