"""Index folders: atomic writes and checked reads, shared by every retriever kind.

A folder holds ``params.json`` (package version, kind, options, corpus name, size and SHA-256
checksum), ``corpus.jsonl`` and the kind's own files. :func:`write_index` builds it under a
temporary name and renames it into place (a crash never leaves half an index behind; an
existing index is replaced). :func:`read_index` checks the params and the corpus and raises
``ValueError`` naming the file when anything does not match. No pickle anywhere.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rag_gym.data.types import Corpus


def write_index(
    out_dir: str | Path,
    kind: str,
    corpus: Corpus,
    params: dict[str, Any],
    write_files: Callable[[Path], None],
) -> Path:
    """Write ``params.json``, ``corpus.jsonl`` and (through ``write_files(tmp_dir)``) the kind's
    files into ``out_dir``, atomically."""
    from rag_gym import __version__

    out = Path(out_dir)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_files(tmp)
        corpus.to_jsonl(tmp / "corpus.jsonl", fmt="title_text")
        full = {
            "rag_gym_version": __version__,
            "kind": kind,
            **params,
            "corpus_name": corpus.name,
            "corpus_size": len(corpus),
            "corpus_checksum": corpus.checksum(),
        }
        (tmp / "params.json").write_text(json.dumps(full, indent=2) + "\n")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    if out.exists():
        out.rename(old)
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return out


def read_index(in_dir: str | Path, kind: str) -> tuple[dict[str, Any], Corpus]:
    """The params and the checked corpus of an index folder of ``kind``."""
    d = Path(in_dir)
    params_path = d / "params.json"
    if not params_path.is_file():
        raise ValueError(
            f"{d} is not a rag-gym index: params.json is missing; build one with rag-gym index build"
        )
    try:
        params = json.loads(params_path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{params_path} is not valid JSON ({exc}); rebuild the index") from None
    if params.get("kind") != kind:
        raise ValueError(f"{params_path}: expected kind {kind!r}, got {params.get('kind')!r}")
    corpus = Corpus.from_jsonl(d / "corpus.jsonl", name=params.get("corpus_name"))
    if len(corpus) != params.get("corpus_size") or corpus.checksum() != params.get(
        "corpus_checksum"
    ):
        raise ValueError(
            f"{d / 'corpus.jsonl'} does not match {params_path} (size or checksum); rebuild the index"
        )
    return params, corpus
