"""Build a persistent index (``rag-gym index build``): BM25 or dense, over a corpus file, the
pooled passages of datasets, or a SynthHop world; one index, or shards of one."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

KINDS = ("bm25", "dense")


@dataclass
class IndexBuild:
    """What to index, how, and where."""

    out: str
    """Index directory to write, atomically; an existing one must be a rag-gym index (or
    empty) unless ``force``."""
    corpus: str | None = None
    """Corpus JSONL (``{id, contents}`` or ``{id, title, text}``)."""
    dataset: str | None = None
    """Or dataset names, comma-separated: their split's passages pooled into one corpus (a
    suite's shared corpus from the samples' paragraphs)."""
    data_path: str | None = None
    """The dataset files (with ``dataset``), comma-separated, one a dataset."""
    split: str = "validation"
    """The split (with ``dataset``)."""
    synthhop: str | None = None
    """Or a SynthHop preset: its world."""
    kind: str = "bm25"
    """``bm25`` or ``dense``."""
    model: str | None = None
    """Dense encoder id or path (default: the embedded MiniLM)."""
    force: bool = False
    """Replace ``out`` even if it is not a rag-gym index (deletes it)."""
    verify: bool = False
    """Load the written index back, checking every file's full SHA-256 and every array's
    values."""
    memory: str = "2GB"
    """BM25 from a corpus file: the memory budget for postings (``4GB``, ``512MB``); the file
    is streamed and postings beyond the budget are spilled to disk, then merged."""
    shards: int | None = None
    """From a corpus file: a sharded index of S consecutive passage ranges whose merged top-k
    equals one index (``rag-gym serve --ray``; docs/scale-out.md)."""
    ray: str | None = None
    """With ``shards``: build the shards as tasks on this Ray cluster (``auto``,
    ``HOST:PORT``, or ``local`` to start one here); default: one after another here."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"expected --kind bm25 or dense, got {self.kind!r}")
        sources = [x for x in (self.corpus, self.dataset, self.synthhop) if x is not None]
        if self.shards is not None or self.ray is not None:
            if self.shards is None:
                raise ValueError("--ray builds a sharded index: give --shards S too")
            if self.corpus is None or len(sources) != 1:
                raise ValueError(
                    "a sharded index is built from a corpus file: give --corpus FILE (not "
                    "--dataset or --synthhop)"
                )
        elif len(sources) != 1:
            raise ValueError("expected exactly one of --corpus, --dataset and --synthhop")


def build_index(config: IndexBuild) -> str:
    """Build the index ``config`` describes; the line that says what was written."""
    from rag_gym.retrieval.persist import check_target

    t0 = time.perf_counter()
    if config.shards is not None:
        return _build_shards(config, t0)
    check_target(Path(config.out), config.force)  # before any work: never build, then refuse
    if config.kind == "bm25" and config.corpus is not None:
        from rag_gym.data.types import iter_corpus_jsonl
        from rag_gym.retrieval.bm25_build import build_bm25_index, parse_memory
        from rag_gym.retrieval.persist import read_params

        path = build_bm25_index(
            (p for _, p in iter_corpus_jsonl(config.corpus)),
            config.out,
            memory=parse_memory(config.memory),
            corpus_name=Path(config.corpus).stem,
            force=config.force,
            source=config.corpus,
        )
        size = read_params(path)["corpus_size"]
    else:
        passages = _passages(config)
        if config.kind == "bm25":
            from rag_gym.retrieval import BM25Retriever

            retriever = BM25Retriever(passages, show_progress=True)
        else:
            from rag_gym.retrieval.dense import DenseConfig, DenseRetriever

            retriever = DenseRetriever(
                passages, DenseConfig(model=config.model), show_progress=True
            )
        path, size = retriever.save(config.out, force=config.force), len(passages)
    if config.verify:
        from rag_gym.retrieval.load import load_index

        load_index(path, verify=True)
    seconds = time.perf_counter() - t0
    return f"wrote a {config.kind} index of {size} passages to {path} in {seconds:.1f}s"


def _passages(config: IndexBuild):
    """The corpus of a corpus file, of datasets' pooled passages, or of a SynthHop world."""
    from rag_gym.data import Corpus, load, pooled_corpus

    if config.corpus is not None:
        return Corpus.from_jsonl(config.corpus)
    if config.dataset is not None:
        names = [x.strip() for x in config.dataset.split(",")]
        paths: list[str | None] = (
            [None] * len(names)
            if config.data_path is None
            else [x.strip() for x in config.data_path.split(",")]
        )
        if len(paths) != len(names):
            raise ValueError(
                f"expected one --data-path a --dataset, got {len(names)} datasets and "
                f"{len(paths)} paths"
            )
        examples = [
            ex for n, p in zip(names, paths, strict=True) for ex in load(n, config.split, path=p)
        ]
        return pooled_corpus(examples, name=f"{'+'.join(names)}-{config.split}")[0]
    from rag_gym.data.synthhop import world_for

    return world_for(config.synthhop).corpus


def _build_shards(config: IndexBuild, t0: float) -> str:
    """``rag-gym index build --shards S [--ray ADDRESS]``."""
    from rag_gym.retrieval.shards import (
        build_bm25_shards,
        build_dense_shards,
        local_map,
        read_shards,
    )

    map_fn = local_map
    if config.ray is not None:
        from rag_gym.retrieval.ray_shards import ray_map

        map_fn = ray_map(config.ray)
    if config.kind == "bm25":
        build, options = build_bm25_shards, {"memory": config.memory}
    else:
        from rag_gym.retrieval.dense import DenseConfig

        build, options = build_dense_shards, {"config": DenseConfig(model=config.model)}
    path = build(
        config.corpus, config.out, config.shards, force=config.force, map_fn=map_fn, **options
    )
    size = read_shards(path)["corpus_size"]
    return (
        f"wrote a {config.kind} index of {size} passages in {config.shards} shards to {path} "
        f"in {time.perf_counter() - t0:.1f}s"
    )
