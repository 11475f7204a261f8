"""Sharded indexes: one corpus in consecutive passage ranges, each an ordinary index folder, whose
merged top-k equals one index over the whole corpus: the same ids, scores and tie-breaks.

A sharded index is a folder::

    DIR/shards.json    the manifest: kind, shard count, each shard's folder, first passage and
                       size, and the checksum of its params.json; the corpus's size and checksum;
                       for BM25 the digest of the corpus statistics every shard was scored with
    DIR/shard-000/     an index folder (rag_gym.retrieval.persist) of the first range
    DIR/shard-001/     ...

**BM25.** A passage's BM25 score depends on the whole corpus (each word's document frequency,
the passage count, the average length), so shards scored with their own statistics rank
differently from one index. The build does what Lucene's distributed frequency phase does,
once: a first pass over the corpus, in parallel over byte ranges of its JSONL
(:func:`~rag_gym.retrieval.bm25_build.collect_stats`), merged in corpus order
(:func:`~rag_gym.retrieval.bm25_build.merge_stats`); then each shard is built from its range with
those statistics. Each shard then holds, bit for bit, the float32 contributions the single index
holds for its passages, in columns numbered as the single index numbers them, so a query's
score for a passage is the same number on a shard as on the whole.

**Dense.** Each shard encodes its own range (:func:`build_dense_shards`), starting where the
whole corpus's build starts an encoding call, so every passage gets the embedding one index
would give it; exact inner product then gives it the same score on its shard.

**Merge.** Each shard returns its own top ``k`` (ties broken by passage id, as every rag-gym
retriever breaks them); :func:`merge_top_k` orders their union by (score descending, passage id)
and keeps ``k``: the single index's ranking. :func:`shard_search` is what a shard runs for a
batch (the pools of ``within`` cut to the passages it holds); :class:`ShardedRetriever` fans
a batch out to shards in this process, and
:class:`~rag_gym.retrieval.ray_shards.RayShardedRetriever` to replicas on a Ray cluster.

A build writes into a temporary folder renamed into place at the end: a killed build leaves
nothing loadable.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import json
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from rag_gym.data._io import parse_line
from rag_gym.data.mapped import _Column, _IdLookup
from rag_gym.data.types import Corpus, Passage, passage_from_record
from rag_gym.retrieval.base import (
    BaseRetriever,
    Excludes,
    Pools,
    RetrievalResult,
    check_k,
    per_query,
)
from rag_gym.retrieval.bm25_build import (
    CorpusStats,
    build_bm25_index,
    collect_stats,
    merge_stats,
    parse_memory,
)
from rag_gym.retrieval.bm25_format import BM25Config
from rag_gym.retrieval.persist import (
    _shown,
    build_atomically,
    foreign_files,
    read_params,
    target_entries,
)

MANIFEST = "shards.json"
#: Sharded index format.
FORMAT = 1

Map = Callable[[Callable[..., Any], list[tuple]], list[Any]]


class ShardError(ValueError):
    """A sharded index that cannot be served as asked: shards of different corpora or kinds, a
    shard count other than the index's, a damaged manifest. The message names the fix."""


def local_map(fn: Callable[..., Any], calls: list[tuple]) -> list[Any]:
    """Run ``fn(*args)`` for each ``args`` of ``calls`` here, one after another."""
    return [fn(*args) for args in calls]


# ---- the corpus file in byte ranges -------------------------------------------------------------
def check_shard_count(shards: object, passages: int | None = None) -> int:
    """``shards`` as a shard count: an ``int`` (not a ``bool``) from 1 to ``passages`` (every
    shard holds at least one passage; ``passages`` shards is allowed). Raises ``TypeError`` or
    ``ValueError`` naming the bound, before any work that grows with ``shards``."""
    if not isinstance(shards, int) or isinstance(shards, bool):
        raise TypeError(f"expected the shard count to be an int, got {shards!r}")
    if shards < 1:
        raise ValueError(f"expected a shard count >= 1, got {shards}; pass --shards 1 or more")
    if passages is not None and shards > passages:
        raise ValueError(
            f"expected a shard count <= {passages} (the corpus's passages: each shard holds at "
            f"least one), got {shards}; pass fewer --shards"
        )
    return shards


def count_passages(path: str | Path) -> int:
    """The passages of a corpus JSONL file: its lines that are not blank."""
    with open(path, "rb") as f:
        return sum(1 for raw in f if raw.strip())


def shard_ranges(path: str | Path, shards: int) -> list[tuple[int, int]]:
    """``shards`` byte ranges ``[start, end)`` covering a corpus JSONL file, each starting at a
    passage's line and holding at least one passage, about equal in bytes otherwise.

    ``shards`` is checked first (:func:`check_shard_count`, against the passages counted in
    one pass over the file), so a count larger than the corpus is refused at once; then one more
    pass places the cuts."""
    check_shard_count(shards)
    path = Path(path)
    n = count_passages(path)
    if n == 0:
        raise ValueError(f"{path} holds no passages; expected at least one")
    check_shard_count(shards, n)
    size = path.stat().st_size
    cuts = [0]
    i, prev = 1, 0  # the next cut to place; the passage number of the last cut
    with open(path, "rb") as f:
        j = at = 0  # passage number, byte offset
        for raw in f:
            if i >= shards:
                break
            if raw.strip():
                # cut i is the first passage at or after byte size*i/shards, but after the
                # previous cut's passage and early enough to leave one for each later shard
                if j > prev and (at >= size * i // shards or j >= n - shards + i):
                    cuts.append(at)
                    prev = j
                    i += 1
                j += 1
            at += len(raw)
    cuts.append(size)
    return list(itertools.pairwise(cuts))


def iter_range(path: str | Path, start: int, end: int) -> Iterator[Passage]:
    """The passages of the lines that start in bytes ``[start, end)`` of a corpus JSONL file,
    parsed as :func:`~rag_gym.data.types.iter_corpus_jsonl` parses them; a bad line raises
    :class:`~rag_gym.data.errors.DataFormatError` naming its byte offset."""
    path = Path(path)
    with open(path, "rb") as f:
        f.seek(start)
        at = start
        while at < end:
            raw = f.readline()
            if not raw:
                break
            where = f"the line at byte {at}"
            at += len(raw)
            record = parse_line(raw, path, where)
            if record is not None:
                yield passage_from_record(record, path, where)


def _contents(p: Passage) -> str:
    return f"{p.title}\n{p.text}" if p.title else p.text


def _id_digests(ids: Iterable[str]) -> np.ndarray:
    return np.fromiter(
        (
            int.from_bytes(
                hashlib.blake2b(i.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                "little",
            )
            for i in ids
        ),
        dtype=np.uint64,
    )


def range_stats(path: str, start: int, end: int, config: dict) -> tuple[CorpusStats, np.ndarray]:
    """BM25 statistics of one byte range of the corpus, and a 64-bit digest of each passage id
    (to find an id repeated across ranges)."""
    ids: list[str] = []

    def contents() -> Iterator[str]:
        for p in iter_range(path, start, end):
            ids.append(p.id)
            yield _contents(p)

    stats = collect_stats(contents(), BM25Config(**config))
    return stats, _id_digests(ids)


def _check_unique_ids(path: Path, digests: list[np.ndarray]) -> None:
    all_ids = np.concatenate(digests) if digests else np.zeros(0, np.uint64)
    if len(np.unique(all_ids)) == len(all_ids):
        return
    seen: set[str] = set()
    for p in iter_range(path, 0, path.stat().st_size):
        if p.id in seen:
            raise ValueError(
                f"{path}: passage id {p.id!r} is repeated; every passage needs its own id"
            )
        seen.add(p.id)


def build_bm25_shard(
    path: str,
    start: int,
    end: int,
    out: str,
    info: dict,
    config: dict,
    stats: CorpusStats,
    memory: int,
) -> None:
    """Build one BM25 shard (the passages of bytes ``[start, end)``) scored with ``stats``."""
    build_bm25_index(
        iter_range(path, start, end),
        out,
        config=BM25Config(**config),
        memory=memory,
        corpus_name=info["corpus_name"],
        source=f"{path} (bytes {start}-{end})",
        stats=stats,
        extra_params={"shard": info},
    )


# ---- building -----------------------------------------------------------------------------------
def build_bm25_shards(
    corpus: str | Path,
    out_dir: str | Path,
    shards: int,
    config: BM25Config | None = None,
    memory: int | str = "2GB",
    force: bool = False,
    map_fn: Map = local_map,
) -> Path:
    """A sharded BM25 index of a corpus JSONL file in ``shards`` consecutive ranges, whose
    merged top-k equals ``build_bm25_index`` over the whole file.

    Two passes, each a ``map_fn`` over the ranges (:func:`local_map` here, one after another;
    :func:`rag_gym.retrieval.ray_shards.ray_map` on a Ray cluster, in parallel): the
    statistics of each range, merged in order; then each shard, scored with them. ``memory``
    is each shard build's budget for postings.
    """
    corpus = Path(corpus)
    if not corpus.is_file():
        raise FileNotFoundError(f"no corpus file at {corpus}; pass a corpus JSONL (--corpus)")
    config = config or BM25Config()
    budget = parse_memory(memory)
    check_shard_count(shards)
    _check_target(Path(out_dir), force)  # before any work: never build for minutes, then refuse
    ranges = shard_ranges(corpus, shards)
    cfg = asdict(config)
    parts = map_fn(range_stats, [(str(corpus), a, b, cfg) for a, b in ranges])
    stats = merge_stats(p[0] for p in parts)
    _check_unique_ids(corpus, [p[1] for p in parts])
    if stats.n_docs == 0:
        raise ValueError(f"{corpus} holds no passages; expected at least one")
    firsts = np.cumsum([0] + [p[0].n_docs for p in parts]).tolist()
    if min(p[0].n_docs for p in parts) == 0:
        raise ValueError(
            f"{corpus} holds {stats.n_docs} passages, too few for {shards} shards of at least one "
            "each; pass fewer --shards"
        )
    # the config and statistics digest every shard records, then build_bm25_shard's own options
    options = (cfg, stats.digest(), stats, budget)
    return _write_sharded(
        out_dir, "bm25", corpus, force, map_fn, build_bm25_shard, ranges, firsts, *options
    )


def passage_offsets(path: str | Path, starts: Sequence[int]) -> list[int]:
    """The byte offset of passage number ``i`` (counting non-blank lines) for each ``i`` of
    ``starts`` (increasing); the file's size for an ``i`` past the last passage."""
    path = Path(path)
    out: list[int] = []
    wanted = iter(starts)
    nxt = next(wanted, None)
    n = at = 0
    with open(path, "rb") as f:
        for raw in f:
            while nxt is not None and nxt == n and raw.strip():
                out.append(at)
                nxt = next(wanted, None)
            if raw.strip():
                n += 1
            at += len(raw)
    while nxt is not None:
        out.append(at)
        nxt = next(wanted, None)
    return out


def build_dense_shard(path: str, start: int, end: int, out: str, info: dict, config: dict) -> None:
    """Encode one range of the corpus (bytes ``[start, end)``) into a dense index folder."""
    from rag_gym.data.types import Corpus
    from rag_gym.retrieval.dense import DenseConfig, DenseRetriever

    corpus = Corpus(iter_range(path, start, end), name=info["corpus_name"])
    DenseRetriever(corpus, DenseConfig(**config)).save(out)


def build_dense_shards(
    corpus: str | Path,
    out_dir: str | Path,
    shards: int,
    config=None,
    force: bool = False,
    map_fn: Map = local_map,
) -> Path:
    """A sharded dense index of a corpus JSONL file: each shard's passages encoded by its own
    ``map_fn`` call (a Ray task with :func:`~rag_gym.retrieval.ray_shards.ray_map`).

    Shards start at multiples of the passages the dense build encodes in one call
    (``16 * batch_size``), so each passage is encoded in the same company as in one index over
    the whole file, and gets the same embedding: with a flat (exact) index, the merged top-k
    is the single index's. Only ``index="flat"`` is accepted.
    """
    from rag_gym.retrieval.dense import DenseConfig

    corpus = Path(corpus)
    if not corpus.is_file():
        raise FileNotFoundError(f"no corpus file at {corpus}; pass a corpus JSONL (--corpus)")
    config = config or DenseConfig()
    if config.index != "flat":
        raise ValueError(
            f"a sharded dense index needs exact search (index='flat'), got {config.index!r}: "
            "approximate indexes rank differently on shards than on the whole corpus"
        )
    check_shard_count(shards)
    _check_target(Path(out_dir), force)
    n = count_passages(corpus)
    step = max(config.batch_size * 16, 1)
    chunks = -(-n // step)
    if shards > chunks:
        raise ValueError(
            f"expected 1 <= shards <= {chunks} ({n} passages, encoded {step} at a time), "
            f"got {shards!r}; pass fewer --shards"
        )
    firsts = [min(n, chunks * i // shards * step) for i in range(shards)] + [n]
    offsets = passage_offsets(corpus, firsts)
    cfg = asdict(config)
    _check_unique_ids(corpus, [_id_digests(p.id for p in iter_range(corpus, 0, offsets[-1]))])
    ranges = list(itertools.pairwise(offsets))
    return _write_sharded(
        out_dir, "dense", corpus, force, map_fn, build_dense_shard, ranges, firsts, cfg, None
    )


def _shard_dir(i: int) -> str:
    return f"shard-{i:03d}"


def _digest(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _write_sharded(
    out_dir: str | Path,
    kind: str,
    source: Path,
    force: bool,
    map_fn: Map,
    build_shard: Callable[..., None],
    ranges: list[tuple[int, int]],
    firsts: list[int],
    config: dict,
    stats_sha256: str | None,
    *args: Any,
) -> Path:
    """Build shard ``i`` from bytes ``ranges[i]`` of the corpus file ``source`` (``map_fn`` over
    ``build_shard(path, start, end, out, info, config, *args)``), then the manifest, in a
    temporary folder renamed into place (:func:`~rag_gym.retrieval.persist.build_atomically`)."""
    from rag_gym import __version__

    def build(tmp: Path) -> None:
        calls = []
        for i, (a, b) in enumerate(ranges):
            scored = {"stats_sha256": stats_sha256} if stats_sha256 is not None else {}
            info = {"index": i, "of": len(ranges), "first": int(firsts[i]), **scored}
            info["corpus_name"] = source.stem
            calls.append((str(source), a, b, str(tmp / _shard_dir(i)), info, config, *args))
        map_fn(build_shard, calls)
        shard_params = [read_params(tmp / _shard_dir(i)) for i in range(len(ranges))]
        checksums = "".join(p["corpus_checksum"] for p in shard_params)
        entries = [
            {
                "dir": _shard_dir(i),
                "first": int(firsts[i]),
                "size": int(params["corpus_size"]),
                "params_sha256": params["params_sha256"],
            }
            for i, params in enumerate(shard_params)
        ]
        manifest = {
            "rag_gym_version": __version__,
            "format": FORMAT,
            "kind": kind,
            "n_shards": len(ranges),
            "source": source.name,
            "corpus_size": int(sum(e["size"] for e in entries)),
            "corpus_checksum": hashlib.sha256(checksums.encode()).hexdigest(),
            "stats_sha256": stats_sha256,
            "config": config,
            "shards": entries,
        }
        manifest["manifest_sha256"] = _digest(manifest)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")

    out = Path(out_dir)
    return build_atomically(out, lambda: _check_target(out, force), build)


def _check_target(out: Path, force: bool) -> None:
    """Raise ``FileExistsError`` unless ``out`` may be replaced by a sharded build: absent, an
    empty folder, or a sharded index holding nothing but its own files (``shards.json`` and
    ``shard-NNN`` index folders that hold only their own files, as
    :func:`~rag_gym.retrieval.persist.check_target` checks them), or ``force``."""
    fix = "; pick another --out, or pass --force to replace it"
    names = target_entries(out, force, fix)
    if not names:
        return
    if MANIFEST not in names:
        raise FileExistsError(
            f"{out} exists and is not a sharded rag-gym index (no {MANIFEST}), so building "
            f"there would delete {_shown(names)}{fix}"
        )
    foreign: list[str] = []
    for name in names:
        path = out / name
        if name == MANIFEST:
            if path.is_symlink() or not path.is_file():
                foreign.append(name)
        elif not re.fullmatch(r"shard-\d{3,}", name) or path.is_symlink() or not path.is_dir():
            foreign.append(name)
        else:
            extra = foreign_files(path)
            foreign += [name] if extra is None else [f"{name}/{rel}" for rel in extra]
    if foreign:
        raise FileExistsError(
            f"{out} is a sharded rag-gym index but also holds files that are not its own "
            f"({_shown(foreign)}), which replacing it would delete{fix}"
        )


# ---- reading ------------------------------------------------------------------------------------
def is_sharded(path: str | Path) -> bool:
    """Whether ``path`` is a sharded index folder (it holds ``shards.json``)."""
    return (Path(path) / MANIFEST).is_file()


def read_shards(path: str | Path, shards: int | None = None) -> dict[str, Any]:
    """The checked manifest of a sharded index: unedited, and every shard's ``params.json``
    the one it lists, of its kind, built from the same corpus split and (BM25) scored with
    the same statistics. ``shards``: the count the caller expects (``--shards``), checked
    against the index's. Raises :class:`ShardError` naming what is wrong and the fix."""
    d = Path(path)
    mpath = d / MANIFEST
    if not mpath.is_file():
        raise ShardError(
            f"{d} is not a sharded index ({MANIFEST} is missing); build one with "
            "rag-gym index build --shards S"
        )
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardError(f"{mpath} is not valid JSON ({exc}); rebuild the sharded index") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ShardError(f"{mpath}: expected a sharded index of format {FORMAT}; rebuild it")
    body = {k: v for k, v in manifest.items() if k != "manifest_sha256"}
    if manifest.get("manifest_sha256") != _digest(body):
        raise ShardError(f"{mpath} was edited or damaged (its checksum does not match); rebuild it")
    n = manifest["n_shards"]
    if shards is not None and shards != n:
        raise ShardError(
            f"{d} has {n} shards, not {shards}: pass --shards {n}, or rebuild the index with "
            f"rag-gym index build --shards {shards}"
        )
    kind = manifest["kind"]
    for i, entry in enumerate(manifest["shards"]):
        sdir = d / entry["dir"]
        try:
            params = read_params(sdir)
        except ValueError as exc:
            raise ShardError(f"shard {i}: {exc}") from None
        if params["kind"] != kind:
            raise ShardError(
                f"{sdir} is a {params['kind']} index, the others are {kind}: shards built by "
                "different retriever kinds cannot be merged; rebuild the sharded index"
            )
        info = params.get("shard") or {}
        if params["params_sha256"] != entry["params_sha256"]:
            why = (
                "it was scored with other corpus statistics, so it is a shard of another corpus"
                if kind == "bm25" and info.get("stats_sha256") != manifest["stats_sha256"]
                else "it is another index than the one this sharded index was built with"
            )
            raise ShardError(
                f"{sdir} is not the shard {d / MANIFEST} lists ({why}); shards built from "
                "different corpora cannot be merged: rebuild the sharded index"
            )
    return manifest


def layout(manifest: dict[str, Any]) -> dict[str, Any]:
    """:class:`ShardedRetriever`'s ``size``, ``name`` and ``starts`` for a checked manifest."""
    starts = [e["first"] for e in manifest["shards"]]
    return {"size": manifest["corpus_size"], "name": manifest["source"], "starts": starts}


def load_shard(path: str | Path, index: int, verify: bool = False):
    """Shard ``index`` of a sharded index folder, loaded as its kind's retriever, after the
    manifest's checks (:func:`read_shards`)."""
    from rag_gym.retrieval.load import load_index

    manifest = read_shards(path)
    if not 0 <= index < manifest["n_shards"]:
        raise ShardError(f"{path} has shards 0 to {manifest['n_shards'] - 1}, not {index}")
    retriever, _ = load_index(Path(path) / manifest["shards"][index]["dir"], verify=verify)
    return retriever


# ---- searching ----------------------------------------------------------------------------------
def shard_search(
    retriever, queries: Sequence[str], k: int, exclude: Excludes = None, within: Pools = None
) -> dict[str, list]:
    """One shard's part of a batch: each query's top ``min(k, shard size)`` (for a query with
    a pool, of the pool's passages on this shard). Returns ``{"ids", "scores", "rows",
    "found"}``: ``rows`` are the passages' rows in the shard's corpus; ``found[i]`` is how many
    of query ``i``'s pool ids the shard holds (``None`` without a pool). Passages' text is not
    sent: the router reads what it needs from the shards' corpora (:class:`ShardedCorpus`)."""
    corpus = retriever.corpus
    n = len(corpus)
    excl = per_query(exclude, len(queries), "exclude")
    pools = per_query(within, len(queries), "within")
    ids: list[list[str]] = [[] for _ in queries]
    scores: list[list[float]] = [[] for _ in queries]
    found: list[int | None] = [None] * len(queries)
    free = [i for i, p in enumerate(pools) if p is None]
    if free:
        res = retriever.retrieve(
            [queries[i] for i in free],
            min(k, n),
            exclude=[excl[i] for i in free] if exclude is not None else None,
        )
        for row, i in enumerate(free):
            ids[i], scores[i] = res.ids[row], res.scores[row]
    for i, pool in enumerate(pools):
        if pool is None:
            continue
        mine = [p for p in dict.fromkeys(pool) if p in corpus]
        found[i] = len(mine)
        if not mine:
            continue
        res = retriever.retrieve(
            [queries[i]], min(k, len(mine)), exclude=[excl[i]] if excl[i] else None, within=[mine]
        )
        ids[i], scores[i] = res.ids[0], res.scores[0]
    position = corpus.position  # the ids a retriever just returned: a dict lookup
    rows = [[position(p) for p in row] for row in ids]
    return {"ids": ids, "scores": scores, "rows": rows, "found": found}


def merge_top_k(
    parts: Sequence[dict[str, list]], k: int
) -> list[list[tuple[float, str, int, int]]]:
    """Each query's ``k`` best of the shards' results, ordered by (score descending, passage
    id): the order one index over the whole corpus gives. Items are ``(score, id, shard,
    row)``: ``shard`` the position of the part that returned it, ``row`` its row there."""
    n = len(parts[0]["ids"]) if parts else 0
    if len(parts) == 1:  # one shard's top-k is already in this order
        ids, scores, rows = parts[0]["ids"], parts[0]["scores"], parts[0]["rows"]
        return [
            [
                (float(x), pid, 0, r)
                for x, pid, r in zip(scores[i][:k], ids[i][:k], rows[i][:k], strict=True)
            ]
            for i in range(n)
        ]
    out = []
    for i in range(n):
        items = [
            (float(x), pid, s, r)
            for s, part in enumerate(parts)
            for x, pid, r in zip(part["scores"][i], part["ids"][i], part["rows"][i], strict=True)
        ]
        items.sort(key=lambda it: (-it[0], it[1]))
        out.append(items[:k])
    return out


class _ShardedIds(_IdLookup):
    """``id -> row`` of a :class:`ShardedCorpus`: the rows the router noted lately (a bounded
    dict), else each shard's own lookup in turn (the rest is :class:`_IdLookup`'s)."""

    __slots__ = ()

    def find(self, pid: object) -> int:
        if not isinstance(pid, str):
            return -1
        c = self._corpus
        row = c._recent.get(pid)
        if row is not None:
            return row
        for s, start in enumerate(c._starts):
            local = c._shard(s)._index.get(pid)
            if local is not None:
                return start + int(local)
        return -1


class ShardedCorpus(Corpus):
    """The whole corpus of a sharded index, read on access from its shards' corpora: rows are
    numbered as in one corpus (shard ``s``'s row ``r`` is ``starts[s] + r``), and ``ids``,
    ``titles`` and ``texts`` read the shard that holds the row. Nothing is copied, so the
    router's memory does not grow with the passages it serves; the ids it has just returned are
    remembered (a bounded dict) so that looking them up costs a dict lookup.

    Args:
        size: passages in all (``server_size``, what
            :func:`~rag_gym.retrieval.base.corpus_size` reports).
        name: a label for messages.
        starts: each shard's first row.
        shard: ``s -> corpus`` of shard ``s`` (opened on first use).
    """

    __slots__ = ("_recent", "_shard", "_starts", "server_size")

    #: ids remembered from recent results
    recent_ids = 1 << 16

    def __init__(
        self, size: int, name: str, starts: Sequence[int], shard: Callable[[int], Corpus]
    ) -> None:
        self.name = name
        self.server_size = size
        self._starts = [int(x) for x in starts]
        self._shard = shard
        self._recent: dict[str, int] = {}
        self.ids = _Column(size, lambda i: self._cell(i, "ids"))  # type: ignore[assignment]
        self.titles = _Column(size, lambda i: self._cell(i, "titles"))  # type: ignore[assignment]
        self.texts = _Column(size, lambda i: self._cell(i, "texts"))  # type: ignore[assignment]
        self._index = _ShardedIds(self)  # type: ignore[assignment]

    def _cell(self, row: int, column: str) -> str:
        s = bisect.bisect_right(self._starts, row) - 1
        return getattr(self._shard(s), column)[row - self._starts[s]]

    def note(self, ids: Iterable[str], shards: Iterable[int], rows: Iterable[int]) -> None:
        """Remember where the ids just returned are (shard ``shards[i]``, its row ``rows[i]``)."""
        recent = self._recent
        if len(recent) >= self.recent_ids:
            recent.clear()
        starts = self._starts
        recent.update((pid, starts[s] + r) for pid, s, r in zip(ids, shards, rows, strict=True))

    def add(self, passage: Passage) -> None:
        raise TypeError(f"{self!r} is read-only (the corpus of a sharded index)")

    def __repr__(self) -> str:
        return f"ShardedCorpus(name={self.name!r}, passages={self.server_size}, shards={len(self._starts)})"


class ShardedRetriever(BaseRetriever):
    """A sharded index searched as one: each batch goes to every shard (:func:`shard_search`)
    and their top-k are merged (:func:`merge_top_k`), which gives the ranking of one index over
    the whole corpus. ``search(s, queries, k, exclude, within)`` runs shard ``s``'s part; here
    it calls the shard's retriever in this process (``shards``, one per shard), and
    :class:`~rag_gym.retrieval.ray_shards.RayShardedRetriever` overrides it to call a replica
    on a Ray cluster.

    ``corpus`` holds the passages returned so far (:class:`ShardedCorpus`).
    """

    def __init__(
        self,
        shards: Sequence[Any],
        size: int | None = None,
        name: str = "shards",
        starts: Sequence[int] | None = None,
    ) -> None:
        self.shards = list(shards)
        if not self.shards:
            raise ValueError("expected at least one shard, got none")
        if starts is None:
            starts = list(itertools.accumulate((len(s.corpus) for s in self.shards), initial=0))
        total = size if size is not None else sum(len(s.corpus) for s in self.shards)
        self.size = total
        self.corpus = ShardedCorpus(
            total, name, list(starts)[: len(self.shards)], self.shard_corpus
        )

    @classmethod
    def load(
        cls, path: str | Path, shards: int | None = None, verify: bool = False
    ) -> ShardedRetriever:
        """Every shard of a sharded index folder, in this process."""
        manifest = read_shards(path, shards)
        loaded = [load_shard(path, i, verify=verify) for i in range(manifest["n_shards"])]
        return cls(loaded, **layout(manifest))

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    def index(self, corpus) -> None:
        raise NotImplementedError(
            "a sharded index is built with rag-gym index build --shards S, not indexed in place"
        )

    def search(self, shard: int, queries, k, exclude, within) -> dict[str, list]:
        return shard_search(self.shards[shard], queries, k, exclude, within)

    def search_all(self, queries, k, exclude, within) -> list[dict[str, list]]:
        """Every shard's part of a batch (one after another here)."""
        return [self.search(s, queries, k, exclude, within) for s in range(self.n_shards)]

    def searchable(self) -> int:
        return self.size

    def _retrieve(self, queries, k, excl, pools) -> RetrievalResult:
        for pool in pools:
            if pool is not None:
                check_k(k, len(dict.fromkeys(pool)), "the candidate pool")
        if not queries:
            return RetrievalResult([], [])
        parts = self.search_all(
            queries,
            k,
            [list(e) if e else None for e in excl] if any(e is not None for e in excl) else None,
            [list(p) if p is not None else None for p in pools]
            if any(p is not None for p in pools)
            else None,
        )
        for i, pool in enumerate(pools):
            if pool is None:
                continue
            held = sum(part["found"][i] or 0 for part in parts)
            if held != len(dict.fromkeys(pool)):
                raise KeyError(
                    f"{len(dict.fromkeys(pool)) - held} id(s) of the pool are not in the sharded "
                    f"corpus {self.corpus.name!r}"
                )
        merged = merge_top_k(parts, k)
        flat = [it for row in merged for it in row]
        self.corpus.note((it[1] for it in flat), (it[2] for it in flat), (it[3] for it in flat))
        ids = [[it[1] for it in row] for row in merged]
        scores = [[it[0] for it in row] for row in merged]
        return RetrievalResult(ids, scores)

    def shard_corpus(self, shard: int):
        """Shard ``shard``'s corpus, where the router reads its passages: here its
        retriever's."""
        return self.shards[shard].corpus

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.n_shards} shards, {self.size} passages)"
