"""UnicodeText and sanitize: the ASCII fast path decides as the charset does."""

from __future__ import annotations

import pytest

from rag_gym.envs.spaces import UnicodeText, _ascii_in_charset, sanitize, text_charset

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
    "a\r\nb\rc",
    "line\nline\tcell",
    "  (1) Title: text\n  (2) Other: more text",
]


def test_the_ascii_fast_path_decides_as_the_charset():
    charset = text_charset()
    for cp in range(0x80):
        ch = chr(cp)
        assert _ascii_in_charset(ch) == (ch in charset)
        assert _ascii_in_charset(f"ok {ch} ok\n") == (ch in charset)


@pytest.mark.parametrize("text", TEXTS)
def test_contains_and_sanitize_agree_with_the_charset(text):
    charset = text_charset()
    assert UnicodeText(max_length=64).contains(text) == charset.issuperset(text)
    clean = sanitize(text)
    lines = text.replace("\r\n", "\n").replace("\r", "\n")
    assert clean == "".join(ch if ch in charset else "\ufffd" for ch in lines)
    assert charset.issuperset(clean)
