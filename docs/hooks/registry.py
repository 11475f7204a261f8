"""MkDocs hook: the environment table of ``environments/index.md``, generated from the registry.

A page that holds the line ``<!-- rag_gym:registry -->`` gets, in its place, one row per
registered ``rag_gym/*`` id: its kind, env class, dataset, step limit and description, read from
``gymnasium.registry`` after ``import rag_gym`` (which needs only the base install).
"""

from __future__ import annotations

MARKER = "<!-- rag_gym:registry -->"
_PAGES = {"search": "search.md", "tree": "tree.md", "reader": "reader.md"}


def _table() -> str:
    import gymnasium as gym

    import rag_gym  # noqa: F401  (registers the ids)
    from rag_gym.envs.registration import ENTRIES, NAMESPACE

    rows = [
        "| id | kind | class | dataset | step limit | description |",
        "|---|---|---|---|---|---|",
    ]
    for entry in ENTRIES:
        env_id = f"{NAMESPACE}/{entry.name}"
        spec = gym.spec(env_id)
        cls = spec.entry_point.split(":")[-1]
        dataset = spec.kwargs.get("dataset", "")
        limit = spec.max_episode_steps if spec.max_episode_steps is not None else "one step"
        description = entry.description.split(" — ", 1)[-1]
        rows.append(
            f"| `{env_id}` | {entry.kind} | [`{cls}`]({_PAGES[entry.kind]}) | `{dataset}` "
            f"| {limit} | {description} |"
        )
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, _table())
