"""UnicodeText and sanitize: the ASCII fast path decides as the charset does."""

from __future__ import annotations

import pytest

from rag_gym.envs.spaces import UnicodeText, _printable_ascii, sanitize, text_charset

TEXTS = [
    "Who wrote it?",
    "",
    " ",
    "tab\there",
    "new\nline",
    "é 漢",
    "bad\x00byte",
    "\x7f",
    "\U0001f600",
]


def test_the_ascii_fast_path_accepts_only_charset_characters():
    charset = text_charset()
    for cp in range(0x80):
        ch = chr(cp)
        assert _printable_ascii(ch) == (0x20 <= cp < 0x7F)
        if _printable_ascii(ch):
            assert ch in charset


@pytest.mark.parametrize("text", TEXTS)
def test_contains_and_sanitize_agree_with_the_charset(text):
    charset = text_charset()
    assert UnicodeText(max_length=64).contains(text) == charset.issuperset(text)
    clean = sanitize(text)
    assert clean == "".join(ch if ch in charset else "\ufffd" for ch in text)
    assert charset.issuperset(clean)
