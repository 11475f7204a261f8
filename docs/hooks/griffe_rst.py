"""Griffe extension: read rag-gym's docstrings as Markdown.

The docstrings are Markdown with a few reStructuredText habits: Sphinx roles
(``:class:`~rag_gym.envs.SearchEnv` ``), double-backtick literals and doctest blocks. Roles
become code spans (the text after ``~`` keeps its last dotted part, as Sphinx shows it), and a
run of ``>>>`` lines with their output becomes a fenced ``pycon`` block, so that it does not
render as nested block quotes.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|mod|func|meth|attr|data|exc|obj|const|ref):`~?([^`]+)`")


def _role(match: re.Match[str]) -> str:
    whole = match.group(0)
    target = match.group(1)
    if "`~" in whole:
        target = target.rsplit(".", 1)[-1]
    return f"``{target}``"


def _fence_doctests(text: str) -> str:
    out: list[str] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.lstrip().startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            block = []
            while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
                block.append(lines[i][len(indent) :])
                i += 1
            out.append(f"{indent}```pycon")
            out.extend(indent + b for b in block)
            out.append(f"{indent}```")
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


class RstToMarkdown(griffe.Extension):
    """Rewrite each docstring's Sphinx roles and doctest blocks before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        docstring = obj.docstring
        if docstring is None:
            return
        value = _ROLE.sub(_role, docstring.value)
        if ">>>" in value:
            value = _fence_doctests(value)
        docstring.value = value
