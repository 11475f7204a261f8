"""Tag conventions of the papers, and a parser for what an LLM writes.

The papers mark actions with XML-like tags: ``<search>…</search>`` and ``<answer>…</answer>``
(Search-R1, Eval-RAR §4 Algorithm 1, LWTS §3.2), ``<evaluate>…</evaluate>`` (Eval-RAR §4),
``<think>…</think>`` and ``<reflect>…</reflect>`` as reasoning (LWTS appendix prompt), and
EVO-RAG's BACKTRACK and REFUSE actions (EVO-RAG §3.1), which rag-gym writes as
``<backtrack/>`` and ``<refuse/>`` (an empty pair ``<refuse></refuse>`` or one with a reason
inside is accepted too). Retrieved passages come back inside ``<information>…</information>``.

The papers: EVO-RAG is Ji et al., "Curriculum-Guided Reinforcement Learning for Efficient
Multi-Hop Retrieval-Augmented Generation", arXiv:2505.17391; Eval-RAR is Yu et al., "Eval-RAR:
Evaluation-Driven Retrieval-Augmented Reasoning via Reinforcement Learning", Findings of ACL 2026
(no arXiv id); LWTS is "Learning When to Search: Multi-Stage Reward Design for Efficient Agentic
RAG with Reasoning Language Models" (anonymous ACL submission, no arXiv id).

A :class:`TagSet` says which tags a preset uses; :func:`parse` finds the tags in a text.

>>> turn = parse("<think>need the author</think><search>author of The Lantern</search>")
>>> [(t.name, t.content) for t in turn.tags]
[('think', 'need the author'), ('search', 'author of The Lantern')]
>>> turn.unclosed
()
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rag_gym._registry import Registry, caller_origin
from rag_gym.envs.search import ActionType

# ``<``, optional ``/``, a name, optional ``/``, ``>``, with whitespace allowed around each part.
# Each slash takes the whitespace after it inside its own optional group, so no two ``\s*`` sit
# side by side: ``"<" + " " * n`` fails in O(n), not O(n**2) (two adjacent ``\s*`` made the
# engine try every split of the run between them).
_TAG = re.compile(r"<\s*(?:(/)\s*)?([A-Za-z][\w-]*)\s*(?:(/)\s*)?>")


@dataclass(frozen=True)
class Tag:
    """One complete tag: its name, its inner text (stripped), and where it sits in the text."""

    name: str
    content: str
    start: int
    end: int


@dataclass(frozen=True)
class ParsedText:
    """The complete tags of a text in order of their opening, and the names left unclosed."""

    tags: tuple[Tag, ...]
    unclosed: tuple[str, ...]

    def names(self) -> list[str]:
        return [t.name for t in self.tags]


def parse(
    text: str, names: frozenset[str] | None = None, self_closing: frozenset[str] = frozenset()
) -> ParsedText:
    """Find the complete ``<name>…</name>`` pairs (and ``<name/>`` for ``self_closing`` names).

    Only tags in ``names`` count (all names when ``None``); other text, including unknown tags,
    is content. A pair closes at the first matching closing tag (no nesting of a tag inside
    itself). An opening tag with no closing tag is reported in ``unclosed``; a self-closing
    name needs no closing tag. Tag names are case-insensitive.
    """
    tags: list[Tag] = []
    unclosed: list[str] = []
    open_at: dict[str, tuple[int, int]] = {}
    for m in _TAG.finditer(text):
        closing, name, slash = m.group(1), m.group(2).lower(), m.group(3)
        if names is not None and name not in names:
            continue
        if closing:
            if name in open_at:
                start, inner = open_at.pop(name)
                tags.append(Tag(name, text[inner : m.start()].strip(), start, m.end()))
            continue
        if slash:
            if name in self_closing and name not in open_at:
                tags.append(Tag(name, "", m.start(), m.end()))
            continue
        if name in open_at:
            continue  # a second opening before the first closed: the first one wins
        open_at[name] = (m.start(), m.end())
    for name, (start, inner) in sorted(open_at.items(), key=lambda kv: kv[1][0]):
        if name in self_closing:
            tags.append(Tag(name, text[inner:].strip(), start, start))
        else:
            unclosed.append(name)
    tags.sort(key=lambda t: t.start)
    return ParsedText(tuple(tags), tuple(unclosed))


@dataclass(frozen=True)
class TagSet:
    """Which tags a preset uses. ``None`` disables an action."""

    search: str | None = "search"
    answer: str | None = "answer"
    evaluate: str | None = "evaluate"
    backtrack: str | None = "backtrack"
    refuse: str | None = "refuse"
    reasoning: tuple[str, ...] = ("think", "reflect")
    information: str = "information"
    name: str = "all"

    def actions(self) -> dict[str, ActionType]:
        """Tag name → action type, for the enabled actions."""
        pairs = {
            self.search: ActionType.SEARCH,
            self.answer: ActionType.ANSWER,
            self.evaluate: ActionType.EVALUATE,
            self.backtrack: ActionType.BACKTRACK,
            self.refuse: ActionType.REFUSE,
        }
        return {tag: action for tag, action in pairs.items() if tag is not None}

    def self_closing(self) -> frozenset[str]:
        return frozenset(t for t in (self.backtrack, self.refuse) if t is not None)

    def all_names(self) -> frozenset[str]:
        return frozenset([*self.actions(), *self.reasoning, self.information])


def _as_tag_set(name: str, value: object) -> TagSet:
    if not isinstance(value, TagSet):
        raise TypeError(f"expected a TagSet, got {type(value).__name__}")
    if value.name != name:
        raise ValueError(
            f"expected the TagSet's name to be the name it is registered as ({name!r}), got "
            f"{value.name!r}: a TextActions env records its tag set by name"
        )
    return value


TAG_PRESETS: Registry[TagSet] = Registry("tag preset", "rag_gym.tag_sets", _as_tag_set)
"""Every tag set by name (a :class:`~rag_gym._registry.Registry`)."""


def register_tag_set(tags: TagSet, *, replace: bool = False) -> TagSet:
    """Register ``tags`` under its ``name``: :class:`~rag_gym.wrappers.TextActions`,
    ``search_r1`` agents and the trainers then take that name (``tags="mine"``). An installed
    package registers one through an entry point in the group ``rag_gym.tag_sets``.

    >>> sorted(tag_set("search_r1").actions())
    ['answer', 'search']
    """
    return TAG_PRESETS.register(tags.name, tags, replace=replace, origin=caller_origin())


for _tags in (
    TagSet(),
    TagSet(evaluate=None, backtrack=None, refuse=None, reasoning=("think",), name="search_r1"),
    TagSet(backtrack=None, refuse=None, reasoning=("think",), name="eval_rar"),
    TagSet(evaluate=None, reasoning=("think",), name="evo_rag"),
    TagSet(
        evaluate=None,
        backtrack=None,
        refuse=None,
        reasoning=("think", "reflect"),
        name="when_to_search",
    ),
):
    TAG_PRESETS.register(_tags.name, _tags, origin="rag-gym")


def tag_set(preset: str | TagSet) -> TagSet:
    """A :class:`TagSet` by preset name (``all``, ``search_r1``, ``eval_rar``, ``evo_rag``,
    ``when_to_search``, or one registered by :func:`register_tag_set`), or the given one."""
    if isinstance(preset, TagSet):
        return preset
    return TAG_PRESETS.get(preset)
