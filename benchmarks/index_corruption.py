"""Index corruptions detected out of those tried, and what verification costs at load.

    python benchmarks/index_corruption.py --passages 2000 --scale 100000

Builds two BM25 indexes of the same size over different corpora (the second gives each passage
id the next passage's text, so every array has the same shape) and, when faiss is installed,
two dense indexes (a stub hashing encoder, no model download). Then, on a fresh copy each time,
it tries every corruption below on every file of the index and loads it with
:func:`rag_gym.retrieval.load.load_index` (what ``rag-gym serve`` and ``index=`` envs use),
in the default (sampled) mode and with ``verify=True``:

* truncate to half, to zero; append a byte; flip a byte at the start, middle and end; overwrite
  the whole file with random bytes of the same size;
* swap in the other index's file (same name, same size for the arrays); delete the file;
* ``params.json``: edit the tokenizer settings, k1, the corpus size and checksum, the kind, the
  encoder; invalid JSON, not UTF-8, nesting 100k deep, a JSON list.

A corruption that leaves the bytes unchanged (the two files are identical) is not counted.
Detected means: ``ValueError`` whose message names the damaged file (or ``params.json``). A
load that succeeds is "silent", any other exception a "traceback". Then the load time of a
``--scale``-passage BM25 index (memory-mapped), with and without the full check.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from rag_gym.data import Corpus
from rag_gym.retrieval import BM25Retriever
from rag_gym.retrieval.load import load_index
from rag_gym.retrieval.persist import read_params, verify_files


def corpora(n: int, seed: int = 0) -> tuple[Corpus, Corpus]:
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(max(200, n // 4))]
    ids, titles, texts = [], [], []
    for i in range(n):
        ids.append(f"p{i:07d}")
        titles.append(f"Title {i}")
        texts.append(" ".join(rng.choice(words, size=int(rng.integers(8, 40)))))
    a = Corpus.from_columns(ids, titles, texts, name="a")
    b = Corpus.from_columns(ids, titles[1:] + titles[:1], texts[1:] + texts[:1], name="b")
    return a, b


def hashing_encoder(texts: list[str]) -> np.ndarray:
    out = np.zeros((len(texts), 32), np.float32)
    for row, text in enumerate(texts):
        for word in text.split():
            out[row, int(hashlib.md5(word.encode()).hexdigest(), 16) % 32] += 1.0
    return out + 1e-3


def corruptions(name: str, kind: str) -> list[str]:
    tried = [
        "truncate-half",
        "truncate-zero",
        "append-byte",
        "flip-start",
        "flip-middle",
        "flip-end",
        "random-same-size",
        "swap-other-index",
        "delete",
    ]
    if name == "params.json":
        tried += ["edit-corpus_size", "edit-corpus_checksum", "edit-kind", "not-json"]
        tried += ["not-utf8", "deep-nesting", "json-list"]
        tried += ["edit-stemmer", "edit-stopwords", "edit-k1"] if kind == "bm25" else []
        tried += ["edit-encoder", "edit-model"] if kind == "dense" else []
    return tried


def damage(out: Path, other: Path, name: str, how: str, rng) -> bool:
    """Apply ``how`` to ``out/name``; False when it leaves the bytes as they were."""
    path = out / name
    before = path.read_bytes()
    if how == "delete":
        path.unlink()
        return True
    raw = bytearray(before)
    if how == "truncate-half":
        raw = raw[: len(raw) // 2]
    elif how == "truncate-zero":
        raw = bytearray()
    elif how == "append-byte":
        raw += b"x"
    elif how.startswith("flip-"):
        at = {"start": 0, "middle": len(raw) // 2, "end": len(raw) - 1}[how[5:]]
        raw[at] ^= 0x01
    elif how == "random-same-size":
        raw = bytearray(rng.bytes(len(raw)))
    elif how == "swap-other-index":
        raw = bytearray((other / name).read_bytes())
    elif how == "not-json":
        raw = bytearray(b"{" + bytes(raw[1:]))[: len(raw) // 2]
    elif how == "not-utf8":
        raw = bytearray(b"\xff\xfe" + bytes(raw))
    elif how == "deep-nesting":
        raw = bytearray(b"[" * 100_000 + b"]" * 100_000)
    elif how == "json-list":
        raw = bytearray(b"[1, 2, 3]")
    elif how.startswith("edit-"):
        params = json.loads(before)
        key = how[5:]
        if key in ("stemmer", "stopwords", "k1"):
            params["config"][key] = {"stemmer": None, "stopwords": None, "k1": 0.9}[key]
        elif key == "model":
            params["config"]["model"] = "some/other-model"
        else:
            params[key] = {"corpus_size": 1, "corpus_checksum": "0" * 64}.get(
                key, "dense" if params["kind"] == "bm25" else "bm25"
            )
            if key == "encoder":
                params[key] = "some/other-model"
        raw = bytearray(json.dumps(params, indent=2).encode())
    path.write_bytes(bytes(raw))
    return bytes(raw) != before


def try_all(a: Path, b: Path, kind: str, tmp: Path, encoder=None) -> dict[str, dict[str, int]]:
    rng = np.random.default_rng(0)
    files = sorted(p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file())
    tally = {
        mode: {"tried": 0, "detected": 0, "silent": 0, "traceback": 0}
        for mode in ("sampled", "verify")
    }
    for name in files:
        for how in corruptions(name, kind):
            for mode in ("sampled", "verify"):
                out = tmp / f"{kind}-copy"
                shutil.rmtree(out, ignore_errors=True)
                shutil.copytree(a, out)
                if not damage(out, b, name, how, rng):
                    continue
                counts = tally[mode]
                counts["tried"] += 1
                verify = mode == "verify"
                try:
                    if kind == "dense":
                        from rag_gym.retrieval.dense import DenseRetriever

                        DenseRetriever.load(out, encoder=encoder, verify=verify)
                    else:
                        load_index(out, verify=verify)
                except ValueError as exc:
                    named = Path(name).name in str(exc) or "params.json" in str(exc)
                    counts["detected" if named else "traceback"] += 1
                    if not named:
                        print(f"  {kind} {mode}: {how} {name}: unnamed: {str(exc)[:160]}")
                    continue
                except Exception as exc:
                    counts["traceback"] += 1
                    print(f"  {kind} {mode}: {how} {name}: {type(exc).__name__}: {str(exc)[:120]}")
                    continue
                counts["silent"] += 1
                print(f"  {kind} {mode}: {how} {name}: loaded silently")
    return tally


def load_cost(n: int, tmp: Path) -> None:
    corpus, _ = corpora(n, seed=1)
    t0 = time.perf_counter()
    out = BM25Retriever(corpus).save(tmp / f"scale-{n}")
    build = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    params = read_params(out)
    timings = {}
    for label, full in (("sampled", False), ("full", True)):
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            verify_files(out, params, full=full)
            best = min(best, time.perf_counter() - t)
        timings[label] = best
    best_load = float("inf")
    for _ in range(2):
        t = time.perf_counter()
        BM25Retriever.load(out)
        best_load = min(best_load, time.perf_counter() - t)
    print(
        f"scale: {n} passages, {size / 2**20:.0f} MiB on disk (built in {build:.0f} s); "
        f"load (mmap, sampled check) {best_load:.2f} s, of which the sampled check "
        f"{timings['sampled'] * 1000:.1f} ms; the full SHA-256 check (verify=True) "
        f"{timings['full']:.2f} s ({timings['full'] / best_load:.2f}x the default load)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--passages", type=int, default=2000, help="size of the tampered indexes")
    parser.add_argument("--scale", type=int, default=100_000, help="0 skips the load-cost run")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ca, cb = corpora(args.passages)
        a = BM25Retriever(ca).save(tmp / "a")
        b = BM25Retriever(cb).save(tmp / "b")
        results = {"bm25": try_all(a, b, "bm25", tmp)}
        try:
            from rag_gym.retrieval.dense import DenseRetriever
        except ImportError:
            DenseRetriever = None
        if DenseRetriever is not None:
            try:
                da = DenseRetriever(ca, encoder=hashing_encoder).save(tmp / "da")
                db = DenseRetriever(cb, encoder=hashing_encoder).save(tmp / "db")
                results["dense"] = try_all(da, db, "dense", tmp, encoder=hashing_encoder)
            except ImportError as exc:
                print(f"dense skipped: {exc}")
        for kind, tally in results.items():
            for mode, c in tally.items():
                print(
                    f"{kind:5s} {mode:7s}: detected {c['detected']}/{c['tried']} "
                    f"(silent {c['silent']}, traceback {c['traceback']})"
                )
        total = {
            mode: sum(t[mode]["detected"] for t in results.values())
            for mode in ("sampled", "verify")
        }
        tried = {
            mode: sum(t[mode]["tried"] for t in results.values()) for mode in ("sampled", "verify")
        }
        for mode in ("sampled", "verify"):
            print(f"all   {mode:7s}: detected {total[mode]}/{tried[mode]}")
        if args.scale:
            load_cost(args.scale, tmp)


if __name__ == "__main__":
    main()
