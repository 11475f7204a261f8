"""Loading records from the Hugging Face hub through ``datasets`` (needs a network)."""

from __future__ import annotations

from typing import Any


def load_hub_records(repo: str, config: str | None, split: str, label: str) -> list[dict[str, Any]]:
    """Download ``repo``/``config``/``split`` with ``datasets`` and return its rows as dicts.

    Raises ``ImportError`` naming the extra when ``datasets`` is missing, and ``ConnectionError``
    with the local-file alternative when the hub cannot be reached.
    """
    try:
        import datasets
    except ImportError as exc:
        raise ImportError(
            f"loading {label} from the hub needs the 'datasets' package: pip install 'rag-gym[hub]', "
            "or pass path=... to a local file"
        ) from exc
    try:
        ds = datasets.load_dataset(repo, config, split=split)
    except Exception as exc:  # datasets raises many types for network problems
        raise ConnectionError(
            f"could not load {label} from the hub ({repo}, {config}, {split}): {exc}. "
            "Offline? Download the file once and pass path=... to it."
        ) from exc
    return [dict(row) for row in ds]
