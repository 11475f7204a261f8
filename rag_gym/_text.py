"""Text from elsewhere (a server's reply, a recorded error) made safe to print in a message."""

from __future__ import annotations


def shown(text: object, limit: int = 300, keep: str = "") -> str:
    """``text`` as a message may quote it: at most ``limit`` characters (then ``…``), every
    control or other unprintable character but those in ``keep`` (``"\\n"`` for a message of
    several lines) written as its escape, so that a terminal shows the text instead of obeying
    it.

    >>> shown("ok\\x1b[2Jgone\\r\\n")
    'ok\\\\x1b[2Jgone\\\\r\\\\n'
    >>> shown("é" * 5, limit=3)
    'ééé…'
    """
    text = text if isinstance(text, str) else str(text)
    cut = text[:limit]
    out = "".join(c if c.isprintable() or c in keep else repr(c)[1:-1] for c in cut)
    return out + "…" if len(text) > limit else out
