"""Index folders: atomic writes and checked reads, shared by every retriever kind.

A folder holds ``params.json``, ``corpus.jsonl`` and the kind's own files. ``params.json``
records the package version, the kind, its options (the tokenizer settings of BM25, the encoder
of a dense index), the corpus name, size and content checksum, and a manifest of **every other
file** of the folder (``files``: size, SHA-256, and a SHA-256 of sampled blocks), and it carries
a checksum of itself (``params_sha256``). So an index is bound to its corpus: another index's
arrays, a flipped byte, an edited tokenizer setting or a missing file is an error naming the
file, never a silently different ranking.

:func:`write_index` builds the folder under a temporary name and renames it into place (a crash
never leaves half an index behind). It replaces only what is an index already (an empty folder,
or one whose ``params.json`` says it is a rag-gym index and that holds nothing but its files),
and refuses anything else unless ``force=True``: an index build never deletes what it did not
create. :func:`read_index` checks ``params.json``, every file's size and sampled checksum (the
full SHA-256 with ``verify=True``) and the corpus, and raises ``ValueError`` naming the file.
No pickle anywhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rag_gym.data.mapped import CORPUS_MAP, MAP_FILES, MappedCorpus, write_corpus_files
from rag_gym.data.types import Corpus
from rag_gym.retrieval.kinds import RETRIEVER_KINDS, kinds_text

PARAMS = "params.json"
#: Index folder format: 2 added the file manifest and the params checksum.
FORMAT = 2

# the sampled checksum: a file up to _SAMPLE_WHOLE bytes is hashed whole, a larger one in
# _SAMPLE_BLOCKS blocks of _BLOCK bytes spread evenly over it (first and last included)
_BLOCK = 1 << 12
_SAMPLE_BLOCKS = 64
_SAMPLE_WHOLE = _BLOCK * _SAMPLE_BLOCKS


def write_index(
    out_dir: str | Path,
    kind: str,
    corpus: Corpus | None,
    params: dict[str, Any],
    write_files: Callable[[Path], dict[str, Any] | None],
    force: bool = False,
) -> Path:
    """Write ``params.json``, ``corpus.jsonl`` and (through ``write_files(tmp_dir)``) the kind's
    files into ``out_dir``, atomically.

    ``write_files`` may return ``{"params": {...}}``, entries added to ``params.json`` after
    ``params``. With ``corpus=None`` it writes ``corpus.jsonl`` itself (a corpus streamed from a
    file) and returns its facts too: ``{"corpus": {"corpus_name", "corpus_size",
    "corpus_checksum"}}``.

    ``out_dir`` may be absent, an empty folder or a rag-gym index (replaced); anything else
    raises ``FileExistsError`` before any work, unless ``force=True`` (then it is replaced too).
    """
    from rag_gym import __version__

    def build(tmp: Path) -> None:
        written = write_files(tmp) or {}
        if corpus is not None:
            written_corpus = write_corpus_files(corpus, tmp)
            facts = {
                "corpus_name": corpus.name,
                "corpus_size": written_corpus["size"],
                "corpus_checksum": written_corpus["checksum"],
            }
        else:
            facts = written["corpus"]
        full = {
            "rag_gym_version": __version__,
            "format": FORMAT,
            "kind": kind,
            **params,
            **written.get("params", {}),
            **facts,
            "files": {name: _file_entry(tmp / name) for name in _files(tmp)},
        }
        full["params_sha256"] = _params_digest(full)
        (tmp / PARAMS).write_text(json.dumps(full, indent=2) + "\n")

    out = Path(out_dir)
    return build_atomically(out, lambda: check_target(out, force), build)


def build_atomically(out: Path, check: Callable[[], None], build: Callable[[Path], None]) -> Path:
    """Run ``check()`` (raising when ``out`` may not be replaced), then ``build(tmp)`` into a
    temporary sibling folder, ``check()`` again (the folder may have changed meanwhile), and
    rename the result into place; a failure removes the temporary folder."""
    check()
    _remove_stale_siblings(out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        check()  # again: the folder may have changed while the index was built
        _swap_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def check_target(out: Path, force: bool = False) -> None:
    """Raise ``FileExistsError`` unless ``out`` may be replaced by an index build: absent, an
    empty folder, or a rag-gym index holding nothing but its own files (or ``force``)."""
    fix = "; pick another --out, or pass --force (force=True) to replace it"
    entries = target_entries(out, force, fix)
    if not entries:
        return
    extra = foreign_files(out)
    if extra is None:
        raise FileExistsError(
            f"{out} exists and is not a rag-gym index (no {PARAMS} saying so), so building "
            f"there would delete {_shown(entries)}{fix}"
        )
    if extra:
        raise FileExistsError(
            f"{out} is a rag-gym index but also holds files that are not its own "
            f"({_shown(extra)}), which replacing it would delete{fix}"
        )


def target_entries(out: Path, force: bool, fix: str) -> list[str]:
    """The sorted names in the folder ``out`` that a build would replace: none when ``out`` is
    absent or with ``force``; ``FileExistsError`` (its message ending in ``fix``) when ``out`` is
    a symbolic link or a file."""
    if force or (not out.exists() and not out.is_symlink()):
        return []
    if out.is_symlink():
        raise FileExistsError(f"{out} is a symbolic link, not an index folder{fix}")
    if not out.is_dir():
        raise FileExistsError(f"{out} is a file, not an index folder{fix}")
    return sorted(p.name for p in out.iterdir())


def foreign_files(folder: Path) -> list[str] | None:
    """What an index folder holds beyond its own files (``params.json`` and those its manifest
    lists), as sorted POSIX paths relative to ``folder``; ``None`` when ``folder`` is not a
    rag-gym index (no ``params.json`` saying so)."""
    params = _read_params_quietly(folder / PARAMS)
    if (
        params is None
        or params.get("kind") not in RETRIEVER_KINDS
        or "rag_gym_version" not in params
    ):
        return None
    files = params.get("files")
    listed = set(files if isinstance(files, dict) else _LEGACY_FILES.get(params["kind"], ()))
    folders = {parent.as_posix() for name in listed for parent in Path(name).parents}
    return [
        rel
        for rel in sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))
        if rel != PARAMS and rel not in listed and rel not in folders
    ]


# the files of an index written before the manifest (format 1)
_LEGACY_FILES = {
    "bm25": (
        "corpus.jsonl",
        "bm25s/data.csc.index.npy",
        "bm25s/indices.csc.index.npy",
        "bm25s/indptr.csc.index.npy",
        "bm25s/vocab.index.json",
        "bm25s/params.index.json",
        "bm25s/nonoccurrence_array.index.npy",
        "bm25s/corpus.jsonl",
        "bm25s/corpus.mmindex.json",
    ),
    "dense": ("corpus.jsonl", "embeddings.npy", "faiss.index"),
}


def _shown(names: list[str], limit: int = 5) -> str:
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


def _read_params_quietly(path: Path) -> dict[str, Any] | None:
    try:
        params = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    return params if isinstance(params, dict) else None


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` (already checked) is moved aside first and
    deleted after, and moved back if the second rename fails."""
    if not out.exists() and not out.is_symlink():
        tmp.rename(out)
        return
    if out.is_symlink() or not out.is_dir():  # only with force
        out.unlink()
        tmp.rename(out)
        return
    old = out.with_name(f".{out.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        old.rename(out)
        raise
    shutil.rmtree(old)  # an error here names the leftover folder rather than leaving it silently


def _remove_stale_siblings(out: Path) -> None:
    """Delete ``.name.tmp-PID`` / ``.name.old-PID`` folders that a killed build of ``out`` left
    (their process is gone); nothing else."""
    parent = out.parent
    if not parent.is_dir():
        return
    for prefix in (f".{out.name}.tmp-", f".{out.name}.old-"):
        for path in parent.glob(f"{prefix}*"):
            pid = path.name[len(prefix) :]
            if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


# ---- checksums ----------------------------------------------------------------------------------
def _files(root: Path) -> list[str]:
    """Every file under ``root`` except ``params.json``, as sorted POSIX relative paths."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and p.relative_to(root).as_posix() != PARAMS
    )


def _file_entry(path: Path) -> dict[str, Any]:
    return {"size": path.stat().st_size, "sha256": _sha256(path), "sample": sample_digest(path)}


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _sample_starts(size: int) -> list[int] | None:
    """Where the _SAMPLE_BLOCKS evenly spread blocks of a ``size``-byte file start (each _BLOCK
    long), or ``None`` for a small file, which is hashed whole."""
    if size <= _SAMPLE_WHOLE:
        return None
    last = size - _BLOCK
    return [i * last // (_SAMPLE_BLOCKS - 1) for i in range(_SAMPLE_BLOCKS)]


def sample_digest(path: str | Path) -> str:
    """SHA-256 of a file's size and of _SAMPLE_BLOCKS evenly spread blocks of it (the whole of a
    file up to 256 KiB), as the index manifest checks them on load: cheap enough to tell, at
    each use, that a file was rewritten."""
    size = os.stat(path).st_size
    h = hashlib.sha256(str(size).encode() + b"\x00")
    starts = _sample_starts(size)
    with open(path, "rb") as f:
        if starts is None:
            h.update(f.read())
        else:
            fd = f.fileno()
            for start in starts:
                h.update(os.pread(fd, _BLOCK, start))
    return h.hexdigest()


def _params_digest(params: dict[str, Any]) -> str:
    body = {key: val for key, val in params.items() if key != "params_sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


# ---- reading ------------------------------------------------------------------------------------
def read_params(in_dir: str | Path) -> dict[str, Any]:
    """The checked ``params.json`` of an index folder (any kind): present, UTF-8 JSON, an
    object, of a known format and kind, and unedited (its own checksum matches)."""
    d = Path(in_dir)
    path = d / PARAMS
    if not path.is_file():
        why = "" if d.is_dir() else " (there is no such folder)"
        raise ValueError(
            f"{d} is not a rag-gym index: {PARAMS} is missing{why}; build one with rag-gym index "
            "build"
        )
    try:
        params = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"{path} is not valid JSON ({exc}); rebuild the index") from None
    if not isinstance(params, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(params).__name__}; rebuild")
    if params.get("kind") not in RETRIEVER_KINDS:
        raise ValueError(f"{path}: expected kind {kinds_text()}, got {params.get('kind')!r}")
    if params.get("format") != FORMAT or not isinstance(params.get("files"), dict):
        raise ValueError(
            f"{path}: expected an index of format {FORMAT} (every file checksummed), got format "
            f"{params.get('format', 1)!r} (rag-gym {params.get('rag_gym_version', '?')}); "
            "rebuild it with rag-gym index build"
        )
    if params.get("params_sha256") != _params_digest(params):
        raise ValueError(
            f"{path} was edited or damaged: its checksum (params_sha256) does not match its "
            "content; rebuild the index"
        )
    return params


def read_index(
    in_dir: str | Path, kind: str, verify: bool = False
) -> tuple[dict[str, Any], Corpus]:
    """The params and the checked corpus of an index folder of ``kind``.

    Every file of the manifest must be there with its size and sampled checksum (its full
    SHA-256 when ``verify``), and the corpus must match its size and content checksum.
    """
    d = Path(in_dir)
    params = read_params(d)
    if params["kind"] != kind:
        raise ValueError(f"{d / PARAMS}: expected kind {kind!r}, got {params['kind']!r}")
    verify_files(d, params, full=verify)
    mapped = all(f"{CORPUS_MAP}/{name}" in params["files"] for name in MAP_FILES)
    try:
        if mapped:
            # read on access: the manifest's sampled checksum (whole, for small files) covers
            # the file; the content checksum reads all of it, so only ``verify`` computes it
            corpus: Corpus = MappedCorpus(
                d, name=params.get("corpus_name") or "corpus", size=params.get("corpus_size")
            )
        else:  # an index written before corpus maps: read whole
            corpus = Corpus.from_jsonl(d / "corpus.jsonl", name=params.get("corpus_name"))
    except ValueError as exc:  # DataFormatError names the file and line
        raise ValueError(f"{exc}; rebuild the index") from None
    facts = {"size": params.get("corpus_size"), "checksum": params.get("corpus_checksum")}
    if (
        (mapped and corpus.facts() != facts)  # what the build wrote, checked without reading it
        or len(corpus) != facts["size"]
        or ((verify or not mapped) and corpus.checksum() != facts["checksum"])
    ):
        raise ValueError(
            f"{d / 'corpus.jsonl'} does not match {d / PARAMS} (size or checksum); rebuild the index"
        )
    return params, corpus


def verify_files(d: Path, params: dict[str, Any], full: bool = False) -> None:
    """Check every file of the manifest: present, its size, its sampled (or ``full``) SHA-256."""
    files = params["files"]
    for name in sorted(files):
        entry = files[name]
        path = d / name
        if not isinstance(entry, dict) or ".." in Path(name).parts or Path(name).is_absolute():
            raise ValueError(f"{d / PARAMS}: a bad entry {name!r} in 'files'; rebuild the index")
        if not path.is_file():
            raise ValueError(f"{path} is missing from the index; rebuild the index")
        try:
            size = path.stat().st_size
            if size != entry.get("size"):
                raise ValueError(
                    f"{path} has {size} bytes, the index was built with {entry.get('size')}; "
                    "it was truncated, replaced or damaged: rebuild the index"
                )
            digest = _sha256(path) if full else sample_digest(path)
        except OSError as exc:
            raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from None
        if digest != entry.get("sha256" if full else "sample"):
            raise ValueError(
                f"{path} does not match its checksum in {d / PARAMS}: it was replaced or "
                "damaged; rebuild the index"
            )


# ---- serving ------------------------------------------------------------------------------------
class IndexWatch:
    """The files of an index folder (or of every shard of a sharded one) as they were when it
    was loaded: each held open, its size and modification time noted.

    An index is read through memory maps, so a file rewritten in place while it is served
    (``cp -r`` over the folder, ``np.save`` onto a file) changes under the server: a truncated
    file faults the process (``SIGBUS``) on its next read, a rewritten one is read as another
    index's data. :meth:`changed` (an ``fstat`` per file: microseconds) names the first file
    whose size or modification time differs, so a server asks it before each batch and stops
    serving. A file *replaced* (a new file renamed over the old one, as ``rag-gym index build``
    does) is not a change: the server keeps the old file open and mapped, and serves it as it
    was loaded.
    """

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._files: list[tuple[Path, int, int, int]] = []
        manifest = self.folder / "shards.json"
        if manifest.is_file():
            entries = json.loads(manifest.read_text(encoding="utf-8")).get("shards", [])
            dirs = [self.folder / e["dir"] for e in entries]
            self._hold(manifest)
        else:
            dirs = [self.folder]
        try:
            for d in dirs:
                params = read_params(d)
                for name in [PARAMS, *sorted(params["files"])]:
                    self._hold(d / name)
        except BaseException:
            self.close()
            raise

    def _hold(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        st = os.fstat(fd)
        self._files.append((path, fd, st.st_size, st.st_mtime_ns))

    def changed(self) -> Path | None:
        """The first file changed in place since loading (its size or modification time), or
        ``None``."""
        for path, fd, size, mtime in self._files:
            st = os.fstat(fd)
            if st.st_size != size or st.st_mtime_ns != mtime:
                return path
        return None

    def close(self) -> None:
        for _, fd, _, _ in self._files:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._files = []
