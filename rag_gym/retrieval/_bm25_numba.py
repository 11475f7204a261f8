"""Numba kernels behind :class:`~rag_gym.retrieval.bm25.BM25Retriever` (``backend="numba"``).

bm25s stores BM25 eagerly: one sparse column per token holding that token's score contribution to
every passage it occurs in (``data``, ``indices``, ``indptr``: CSC). A query's score for a passage
is the sum of its tokens' columns, in query order, in float32, plus a per-query constant
(``base``, non-zero for bm25l and bm25+ only). The top-``k`` kernel, :func:`top_k_blockmax`,
returns exactly what :func:`rag_gym.retrieval.base.top_k` returns on that full score array (same
float32 scores, ties broken by passage-id rank, excluded passages never returned) while reading
only what can change the top ``k``; it needs non-negative contributions and sorted posting lists,
which :func:`block_facts` checks once per index. :func:`full_scores` builds the full score array,
for any other index and for queries restricted to a pool.

Scratch arrays (:func:`new_scratch`) belong to the caller, one set per thread; stamps let the
kernel reuse them without clearing. Every kernel releases the GIL.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from rag_gym.retrieval.bm25_format import BLOCK, block_pointers

STAMP_LIMIT = 2**31 - 8
"""Stamps are int32; the clock restarts (and the stamps are reset) before reaching this."""


class Postings(NamedTuple):
    """The index's arrays every top-``k`` kernel reads.

    The kernels take this and the other argument groups below (:class:`Blocks`,
    :class:`Bounds`, :class:`Queries`, :class:`TopK`) as plain tuples in their fields' order
    (``tuple(Postings(...))``) and unpack them: numba's dispatcher types a plain tuple of arrays
    in C, a named tuple in Python, several microseconds a call, which a single query's time
    notices."""

    data: np.ndarray
    """bm25s's CSC columns: token ``t``'s contributions are ``data[indptr[t]:indptr[t + 1]]``,"""
    indices: np.ndarray
    """the passages they belong to (sorted within a column in a prunable index),"""
    indptr: np.ndarray
    """and each column's start."""
    token_max: np.ndarray
    """Each token's largest contribution (:func:`block_facts`)."""
    id_rank: np.ndarray
    """Each passage's rank by id: the tie-breaker."""
    by_rank: np.ndarray
    """The passages in id-rank order (``by_rank[id_rank[d]] == d``)."""


class Blocks(NamedTuple):
    """The block-max kernel's block arrays (:func:`compute_blocks`, :func:`block_min_rank`,
    :func:`best_blocks`)."""

    block: int
    """Postings per block."""
    block_ptr: np.ndarray
    """Token ``t``'s blocks are ``block_ptr[t]:block_ptr[t + 1]``,"""
    block_max: np.ndarray
    """each with its largest contribution,"""
    block_last: np.ndarray
    """its last passage,"""
    block_rank: np.ndarray
    """and its passages' smallest id rank."""
    best_block: np.ndarray
    """Each token's first block holding its list's maximum."""


class Bounds(NamedTuple):
    """The block-max kernel's length, pair and superblock bounds for one batch of queries
    (:func:`length_bounds`, :func:`pair_bounds`, :func:`super_blocks`), or none for an index
    saved without passage lengths (:func:`no_length_bounds`)."""

    doc_len: np.ndarray
    """Each passage's BM25 length (empty: length bounds off)."""
    block_minlen: np.ndarray
    """Each block's shortest passage, clipped to :data:`LENGTH_CAP`."""
    token_row: np.ndarray
    """Each query token occurrence's length-table row (-1: none)."""
    len_bound: np.ndarray
    """``len_bound[row, L]``: the row's largest contribution to a passage at least ``L`` long."""
    pair_bound: np.ndarray
    """``pair_bound[row(a), row(b)]``: ``b``'s largest contribution to a passage holding ``a``
    (-1: not computed)."""
    sb_off: np.ndarray
    """Each row's first superblock (-1: none),"""
    sb_max: np.ndarray
    """and per superblock its largest contribution,"""
    sb_last: np.ndarray
    """last passage,"""
    sb_rank: np.ndarray
    """smallest id rank,"""
    sb_minlen: np.ndarray
    """and shortest passage."""


class Queries(NamedTuple):
    """A batch of queries: query ``q``'s token ids are ``tokens[token_ptr[q]:token_ptr[q + 1]]``,
    its per-query constant ``base[q]`` (non-zero for bm25l and bm25+ only) and its excluded
    positions ``excluded[excluded_ptr[q]:excluded_ptr[q + 1]]``."""

    tokens: np.ndarray
    token_ptr: np.ndarray
    base: np.ndarray
    excluded: np.ndarray
    excluded_ptr: np.ndarray


class TopK(NamedTuple):
    """Where the kernels write: ``n[q]`` results of query ``q``, best first, in ``pos[q]``
    (corpus positions) and ``scores[q]``."""

    pos: np.ndarray
    scores: np.ndarray
    n: np.ndarray


@njit(nogil=True, cache=True, inline="always")
def _worse(s_a, r_a, s_b, r_b) -> bool:
    # a ranks below b: lower score, or equal score and a later passage id
    return s_a < s_b or (s_a == s_b and r_a > r_b)


@njit(nogil=True, cache=True)
def _sift_down(hs, hr, hp, i, size) -> None:
    # the heap's root is its worst entry
    while True:
        left = 2 * i + 1
        if left >= size:
            return
        child = left
        right = left + 1
        if right < size and _worse(hs[right], hr[right], hs[left], hr[left]):
            child = right
        if not _worse(hs[child], hr[child], hs[i], hr[i]):
            return
        hs[i], hs[child] = hs[child], hs[i]
        hr[i], hr[child] = hr[child], hr[i]
        hp[i], hp[child] = hp[child], hp[i]
        i = child


@njit(nogil=True, cache=True)
def _push(hs, hr, hp, size, k, score, rank, pos) -> int:
    if size < k:
        i = size
        hs[i] = score
        hr[i] = rank
        hp[i] = pos
        while i > 0:
            parent = (i - 1) // 2
            if not _worse(hs[i], hr[i], hs[parent], hr[parent]):
                break
            hs[i], hs[parent] = hs[parent], hs[i]
            hr[i], hr[parent] = hr[parent], hr[i]
            hp[i], hp[parent] = hp[parent], hp[i]
            i = parent
        return size + 1
    if _worse(hs[0], hr[0], score, rank):
        hs[0] = score
        hr[0] = rank
        hp[0] = pos
        _sift_down(hs, hr, hp, 0, size)
    return size


@njit(nogil=True, cache=True)
def _pop_into(hs, hr, hp, size, out, q) -> None:
    # pop the worst first, filling row q of ``out`` (TopK) from the back: best first
    out_pos, out_scores, out_n = out
    out_n[q] = size
    for i in range(size - 1, -1, -1):
        out_pos[q, i] = hp[0]
        out_scores[q, i] = hs[0]
        hs[0] = hs[i]
        hr[0] = hr[i]
        hp[0] = hp[i]
        _sift_down(hs, hr, hp, 0, i)


@njit(nogil=True, cache=True)
def _fill_untouched(hs, hr, hp, size, k, b, by_rank, stamp, gone) -> int:
    # passages no query token occurs in all score b: the first in id order are the candidates
    added = 0
    for r in range(by_rank.shape[0]):
        if added >= k:
            break
        d = by_rank[r]
        if d < 0 or d >= stamp.shape[0]:  # a damaged by_rank.npy: never read outside stamp
            continue
        if stamp[d] == gone:
            continue
        if size == k and not _worse(hs[0], hr[0], b, r):
            break
        size = _push(hs, hr, hp, size, k, b, r, d)
        added += 1
    return size


@njit(nogil=True, cache=True)
def _new_heap(k, like):
    # a k-slot heap of (score, id rank, position), scores of ``like``'s dtype
    return np.empty(k, dtype=like.dtype), np.empty(k, dtype=np.int64), np.empty(k, dtype=np.int64)


@njit(nogil=True, cache=True, inline="always")
def _open_query(stamp, clock, queries, q) -> int:
    """A fresh stamp ``s`` for query ``q`` (``s + 1`` marks a passage gone), with ``q``'s
    excluded passages marked gone; the clock restarts (every stamp reset) before it overflows."""
    if clock[0] >= STAMP_LIMIT:
        stamp[:] = -1
        clock[0] = 0
    s = clock[0]
    clock[0] = s + 2
    _, _, _, excluded, excluded_ptr = queries
    for j in range(excluded_ptr[q], excluded_ptr[q + 1]):
        stamp[excluded[j]] = s + 1
    return s


@njit(nogil=True, cache=True, inline="always")
def _rounding_margin(m, total):
    # more than any float32 rounding of a sum of m + 1 terms whose magnitudes add up to ``total``
    return (m + 2) * 2.0**-22 * total


@njit(nogil=True, cache=True)
def _find(indices, lo, hi, d) -> int:
    # position of passage d in the posting list indices[lo:hi] (sorted by passage), or -1
    end = hi
    while lo < hi:
        mid = (lo + hi) >> 1
        if indices[mid] < d:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < end and indices[lo] == d else -1


@njit(nogil=True, cache=True)
def _gallop(indices, j, hi, d) -> int:
    # first position p in [j, hi) with indices[p] >= d (hi if none): exponential, then binary
    if j >= hi or indices[j] >= d:
        return j
    prev, step = j, 1
    while prev + step < hi and indices[prev + step] < d:
        prev += step
        step *= 2
    lo, hi = prev + 1, min(prev + step, hi)
    while lo < hi:
        mid = (lo + hi) >> 1
        if indices[mid] < d:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(nogil=True, cache=True)
def full_scores(data, indices, indptr, tokens, scores) -> None:
    """Every passage's score for one query (``scores`` zeroed by the caller), summed in bm25s's
    order; used for queries restricted to a candidate pool, and for every query of an index
    that :func:`top_k_blockmax` does not accept."""
    for t in range(tokens.shape[0]):
        tid = tokens[t]
        for j in range(indptr[tid], indptr[tid + 1]):
            scores[indices[j]] += data[j]


def new_scratch(n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """``(stamp, clock)`` for :func:`top_k_blockmax`."""
    return np.full(n_docs, -1, dtype=np.int32), np.zeros(1, dtype=np.int64)


def warm_up(data, indices, indptr, id_rank, doc_len=None) -> None:
    """Compile (or load from numba's cache) every kernel for these array types (and
    ``doc_len``'s, for the length bounds), so that no ``retrieve`` call pays for the JIT."""

    def like(array, values):  # same dtype and writeability (numba compiles read-only apart)
        out = np.array(values, dtype=array.dtype)
        out.flags.writeable = array.flags.writeable
        return out

    d, ix, ip, rank = like(data, [1]), like(indices, [0]), like(indptr, [0, 1]), like(id_rank, [0])
    tok, ptr, none = np.zeros(1, np.int64), np.array([0, 1], np.int64), np.zeros(2, np.int64)
    base = np.zeros(1, dtype=data.dtype)
    out = tuple(
        TopK(np.zeros((1, 1), np.int64), np.zeros((1, 1), data.dtype), np.zeros(1, np.int64))
    )
    stamp, clock = new_scratch(1)
    blocks = compute_blocks(d, ix, ip)
    blocks["block_rank"] = block_min_rank(ix, ip, blocks, rank)
    blocks["best_block"] = best_blocks(blocks)
    index = tuple(Postings(d, ix, ip, blocks["token_max"], rank, rank))
    queries = tuple(Queries(tok, ptr, base, none[:0], none))
    for_blocks = tuple(block_arrays(blocks))
    no_lengths = tuple(no_length_bounds(data.dtype))
    top_k_blockmax(index, for_blocks, no_lengths, queries, 1, stamp, clock, out)
    lengths = like(doc_len, [1]) if doc_len is not None else np.ones(1, dtype=np.int32)
    state: dict = {}
    minlen, rows, table = length_bounds(tok, d, ix, ip, blocks, lengths, state)
    pairs = pair_bounds(tok, ptr, rows, d, ix, ip, state)
    supers = super_blocks(tok, rows, blocks, state)
    bounds = tuple(Bounds(lengths, minlen, rows, table, pairs, *supers))
    top_k_blockmax(index, for_blocks, bounds, queries, 1, stamp, clock, out)
    check_lists(tok, ip, ix, 1, blocks, np.zeros(1, np.uint8))
    full_scores(d, ix, ip, tok, np.zeros(1, dtype=data.dtype))


# ---- block-max pruning --------------------------------------------------------------------------
# blocks of BLOCK postings (rag_gym.retrieval.bm25_format)


@njit(nogil=True, cache=True)
def block_facts(data, indices, indptr, block, token_max, block_ptr, block_max, block_last) -> bool:
    """Fill each token's largest contribution (``token_max``), its blocks of ``block`` postings
    (token ``t``'s are ``block_ptr[t]:block_ptr[t + 1]``, with their largest contribution in
    ``block_max`` and last passage in ``block_last``), and say whether the index allows
    :func:`top_k_blockmax`: every contribution >= 0 and each posting list sorted by passage.
    ``block_ptr`` is filled by the caller (:func:`block_pointers`)."""
    ok = True
    for t in range(indptr.shape[0] - 1):
        best = 0.0
        lo, hi = indptr[t], indptr[t + 1]
        b = block_ptr[t]
        for start in range(lo, hi, block):
            stop = min(start + block, hi)
            top = data[start]
            for j in range(start, stop):
                v = data[j]
                if v < 0 or v != v:
                    ok = False
                if v > top:
                    top = v
                if j > lo and indices[j] <= indices[j - 1]:
                    ok = False
            block_max[b] = top
            block_last[b] = indices[stop - 1]
            if top > best:
                best = top
            b += 1
        token_max[t] = best
    return ok


@njit(nogil=True, cache=True, inline="always")
def _clip_length(doc_len, d, cap) -> int:
    # passage d's length as the length tables index it: clipped to [0, cap]
    return min(max(doc_len[d], 0), cap)


@njit(nogil=True, cache=True, inline="always")
def _bound_at(tmax_u, row_u, len_bound, length):
    # a list's bound on passages at least ``length`` long: its length table there when it has
    # one and that is lower, else its maximum
    if row_u >= 0 and len_bound[row_u, length] < tmax_u:
        return len_bound[row_u, length]
    return tmax_u


@njit(nogil=True, cache=True, inline="always")
def _pair_at(pair_bound, row_a, row_b, tmax_b):
    """The bound on token ``b``'s contribution to a passage holding token ``a`` (rows of the
    length tables; -1: none): :func:`pair_bounds`'s entry where computed, else ``b``'s list
    maximum."""
    n = pair_bound.shape[0]
    if 0 <= row_a < n and 0 <= row_b < n:
        v = pair_bound[row_a, row_b]
        if v >= 0 and v < tmax_b:
            return v
    return tmax_b


SUPERBLOCK = 64
"""Blocks per superblock (:func:`top_k_blockmax`'s wide ranges): each keeps its blocks' largest
contribution, last passage, smallest id rank and shortest passage."""


@njit(nogil=True, cache=True)
def _find_blocked(indices, lo, hi, block, b_lo, b_hi, block_last, d) -> int:
    # position of passage d in the posting list indices[lo:hi], whose blocks are
    # block_last[b_lo:b_hi], or -1: a binary search over the blocks, then within one
    first, top = b_lo, b_hi
    while b_lo < top:
        mid = (b_lo + top) >> 1
        if block_last[mid] < d:
            b_lo = mid + 1
        else:
            top = mid
    if b_lo == b_hi:
        return -1
    start = lo + (b_lo - first) * block
    return _find(indices, start, min(start + block, hi), d)


@njit(nogil=True, cache=True, inline="always")
def _distinct_tokens(tokens, t0, t1, token_row, use_len):
    """The distinct tokens ``tok[:n_u]`` of the query ``tokens[t0:t1]``, each one's multiplicity
    and length-table row (-1: its list's maximum bounds it), and each occurrence's index into
    them: ``(tok, mult, occ, row, n_u)``."""
    m = t1 - t0
    tok = np.empty(m, dtype=np.int64)
    mult = np.zeros(m, dtype=np.int64)
    occ = np.empty(m, dtype=np.int64)
    row = np.empty(m, dtype=np.int64)
    n_u = 0
    for i in range(m):
        t = tokens[t0 + i]
        u = 0
        while u < n_u and tok[u] != t:
            u += 1
        if u == n_u:
            tok[u] = t
            row[u] = token_row[t0 + i] if use_len else -1
            n_u += 1
        mult[u] += 1
        occ[i] = u
    return tok, mult, occ, row, n_u


@njit(nogil=True, cache=True, inline="always")
def _head_start(index, blocks, tok, occ, k, b, stamp, seen, hs, hr, hp, contrib, hit, zero):
    """Push the k largest contributions of each list's best block (its first block holding the
    list's maximum) onto the heap, each passage scored exactly (its contributions from the lists
    ``tok``, in the query's order ``occ``, plus ``b``) and stamped ``seen``; passages stamped
    gone (``seen + 1``) are skipped. ``contrib`` and ``hit`` are scratch of ``tok``'s length
    (``hit`` all false, and left so); ``zero`` is 0 in the scores' dtype. Returns the heap's
    size."""
    data, indices, indptr, _, id_rank, _ = index
    block, block_ptr, _, block_last, _, best_block = blocks
    n_u = tok.shape[0]
    gone = seen + 1
    size = 0
    taken = np.empty(block, dtype=np.bool_)
    for u in range(n_u):
        lo_b, hi_b = block_ptr[tok[u]], block_ptr[tok[u] + 1]
        if lo_b == hi_b:
            continue
        start = indptr[tok[u]] + (best_block[tok[u]] - lo_b) * block
        stop = min(start + block, indptr[tok[u] + 1])
        taken[:] = False
        for _ in range(min(k, stop - start)):
            j = -1
            for i in range(start, stop):
                if not taken[i - start] and (j < 0 or data[i] > data[j]):
                    j = i
            taken[j - start] = True
            d = indices[j]
            if stamp[d] == gone or stamp[d] == seen:
                continue
            stamp[d] = seen
            for v in range(n_u):
                t = tok[v]
                p = _find_blocked(
                    indices,
                    indptr[t],
                    indptr[t + 1],
                    block,
                    block_ptr[t],
                    block_ptr[t + 1],
                    block_last,
                    d,
                )
                if p >= 0:
                    contrib[v] = data[p]
                    hit[v] = True
            s = zero
            for i in range(occ.shape[0]):
                if hit[occ[i]]:
                    s += contrib[occ[i]]
            for v in range(n_u):
                hit[v] = False
            size = _push(hs, hr, hp, size, k, s + b, id_rank[d], d)
    return size


@njit(nogil=True, cache=True)
def top_k_blockmax(index, blocks, bounds, queries, k, stamp, clock, out) -> None:
    """Top-``k`` of each of ``queries`` (:class:`Queries`) into ``out`` (:class:`TopK`):
    exhaustive scoring's results (:func:`full_scores`, then
    :func:`~rag_gym.retrieval.base.top_k`), bit for bit, reading a fraction of the postings.
    Needs ``blocks`` (:class:`Blocks`) and an ``index`` (:class:`Postings`) that
    :func:`block_facts` accepted (contributions >= 0, sorted lists); ``bounds``
    (:class:`Bounds`) are the length, pair and superblock bounds of ``queries``' tokens, or none
    (:func:`no_length_bounds`). ``stamp`` and ``clock`` are scratch (:func:`new_scratch`).

    Document-at-a-time block-max MaxScore (Turtle & Flood 1995; Ding & Suel 2011; Mallia et al.
    2019). A repeated query token is one posting list whose bound counts it that many times.
    Lists are ordered by bound; those whose bounds together cannot reach the k-th best score are
    *non-essential*: they are only probed (galloping search) for passages found in the others,
    and a passage is dropped as soon as its known part plus the bounds of the unprobed lists
    (their current block's largest contribution) falls short. A range of passages where every
    list's current block together cannot reach the k-th best score is skipped whole. A passage
    that survives is scored exactly as bm25s sums: its contributions in query order, in float32.
    Every comparison that drops a passage keeps a margin larger than any float32 rounding of the
    sums, so a dropped passage scores strictly below the k-th best and cannot even tie with it.

    Ties are skipped exactly: a range is also skipped when its bound, summed as bm25s sums (each
    occurrence's block maximum, or its list's maximum for a non-essential list, in query order, in
    float32, then the base; rounding is monotone, so this bounds every passage's exact score),
    is below the k-th best score, or equals it while every passage of the range's blocks ranks
    after the k-th best's passage (``block_rank``: each block's smallest id rank). A corpus where
    thousands of passages tie at the k-th best score (templated text) is then not walked passage
    by passage.

    Length bounds (with ``doc_len``, the passages' BM25 lengths; empty: off): a BM25
    contribution falls as a passage grows, so the largest contribution a token makes to any
    passage of length at least ``L`` bounds it on such passages. :func:`length_bounds` prepares
    them: ``len_bound[token_row[j]]`` for the query token ``tokens[j]`` (-1: none, its list's
    maximum then), indexed by a length clipped to the table's last column, and each block's
    shortest passage (``block_minlen``). A non-essential list is then bounded by its table at
    the range's shortest passage (the shortest of the essential lists' current blocks: any
    passage that can score holds an essential token), and on one passage by its table at that
    passage's length. On templated text, where every passage of a kind holds the same template
    words and the k-th best score is a tie among the shortest of them, those bounds equal the
    tied passages' exact contributions: whole blocks of tied passages are skipped by the tie
    rule above, and a longer passage is dropped before any probe.

    Pair bounds (with the length bounds): a passage that
    holds token ``a`` gets from token ``b`` at most the largest contribution ``b`` makes to any
    passage holding ``a``, ``pair_bound[row(a), row(b)]`` (rows of ``token_row``; -1: not
    computed, the list's maximum then; :func:`pair_bounds`). A range's passages each hold one
    of the essential lists whose current block covers it, so a non-essential list is bounded
    there by its largest pair bound with those lists; a passage holds every essential list it
    was found in, so on one passage the smallest of those pair bounds applies. Where two
    frequent words never share a passage (``quarri`` and ``atlas`` in a SynthHop world, whose
    passages about a quarry never mention an atlas), the bound is 0: a query naming both kinds
    then skips every block of either list whose bound alone cannot pass the k-th best score,
    instead of probing the other list for each of its passages. A query uses pair bounds, and
    the wide ranges below, only where one of them is at most half its list's maximum, or where
    an essential list (after the head start) spans two superblocks or more; else it runs as
    without them (most pairs of common words in natural text share passages, and their lists
    are mostly non-essential). With them, a range is first tried whole over superblocks
    (:data:`SUPERBLOCK` blocks of a list with a length table: ``sb_*`` from :func:`super_blocks`,
    ``sb_off`` each row's first), then over blocks (see the comments in the scan), so that a scan
    of thousands of tied passages costs a few checks per superblock, not one per block.
    """
    data, indices, indptr, token_max, id_rank, by_rank = index
    block, block_ptr, block_max, block_last, block_rank, _ = blocks
    (doc_len, block_minlen, token_row, len_bound, pair_bound,
     sb_off, sb_max, sb_last, sb_rank, sb_minlen) = bounds  # fmt: skip
    tokens, token_ptr, base, _, _ = queries
    out_scores = out[1]
    hs, hr, hp = _new_heap(k, out_scores)
    zero = np.zeros(1, dtype=out_scores.dtype)[0]
    big = np.iinfo(np.int64).max
    use_len = doc_len.shape[0] > 0
    cap = len_bound.shape[1] - 1
    for q in range(token_ptr.shape[0] - 1):
        seen = _open_query(stamp, clock, queries, q)
        gone = seen + 1
        t0, t1 = token_ptr[q], token_ptr[q + 1]
        m = t1 - t0
        b = base[q]
        tok, mult, occ, row, n_u = _distinct_tokens(tokens, t0, t1, token_row, use_len)
        bound = np.empty(n_u, dtype=np.float64)
        for u in range(n_u):
            bound[u] = mult[u] * token_max[tok[u]]
        # lists by increasing bound; prefix[i]: the bounds of lists ord[0..i] together
        ord_ = np.argsort(bound, kind="mergesort")
        prefix = np.empty(n_u, dtype=np.float64)
        total = 0.0
        for i in range(n_u):
            total += bound[ord_[i]]
            prefix[i] = total
        delta = _rounding_margin(m, total + abs(b))
        margin = b + 2 * delta
        pos = np.empty(n_u, dtype=np.int64)
        end = np.empty(n_u, dtype=np.int64)
        bcur = np.empty(n_u, dtype=np.int64)
        bend = np.empty(n_u, dtype=np.int64)
        for u in range(n_u):
            pos[u] = indptr[tok[u]]
            end[u] = indptr[tok[u] + 1]
            bcur[u] = block_ptr[tok[u]]
            bend[u] = block_ptr[tok[u] + 1]
        contrib = np.zeros(n_u, dtype=out_scores.dtype)
        hit = np.zeros(n_u, dtype=np.bool_)
        ess = np.zeros(n_u, dtype=np.bool_)
        noness = np.zeros(n_u, dtype=np.bool_)
        tmax = np.empty(n_u, dtype=out_scores.dtype)
        for u in range(n_u):
            tmax[u] = token_max[tok[u]]  # a float32 maximum, so exact
        lb = np.empty(n_u, dtype=out_scores.dtype)  # each list's bound at one length
        # pb[e, v]: v's bound on a passage holding e; this query uses pair bounds (and the
        # wide ranges) only where one of them is at most half its list's maximum
        pq = False
        pb = np.empty((n_u if use_len else 0, n_u), dtype=out_scores.dtype)
        if use_len:
            for e in range(n_u):
                for v in range(n_u):
                    pb[e, v] = tmax[v] if e == v else _pair_at(pair_bound, row[e], row[v], tmax[v])
                    if e != v and 2 * pb[e, v] <= tmax[v]:
                        pq = True
        umax = np.empty(n_u, dtype=out_scores.dtype)  # the wide ranges' units of the lists
        ulast = np.empty(n_u, dtype=np.int64)
        urank = np.empty(n_u, dtype=np.int64)
        ulen = np.empty(n_u, dtype=np.int64)
        lrest = np.empty(n_u + 1, dtype=np.float64)
        # a head start: the k largest contributions of each list's best block, scored exactly,
        # set a k-th best score that lets the scan below skip from its first passage on
        size = _head_start(
            index, blocks, tok[:n_u], occ, k, b, stamp, seen, hs, hr, hp, contrib, hit, zero
        )
        theta = hs[0] if size == k else -np.inf
        ne = 0  # ord_[:ne] are the non-essential lists
        while size == k and ne < n_u and prefix[ne] + margin < theta:
            ne += 1
        if use_len and not pq:
            # the wide ranges also where an essential list spans superblocks: a list of
            # templated passages tied at the k-th best score is then skipped a superblock at
            # a time
            for i in range(ne, n_u):
                u = ord_[i]
                r = row[u]
                n_blocks = block_ptr[tok[u] + 1] - block_ptr[tok[u]]
                if 0 <= r < sb_off.shape[0] and sb_off[r] >= 0 and n_blocks >= 2 * SUPERBLOCK:
                    pq = True
        region_hi = -1  # passages up to here score at most region_bound
        region_bound = np.inf
        region_ub = zero  # the same bound summed in float32 as bm25s sums: exact, no margin
        region_rank = -1  # the smallest id rank of the passages in the range's blocks
        sb_fails = 0  # superblock ranges not skipped in a row
        sb_wait = 0  # ranges before superblocks are tried again
        while ne < n_u:
            # the next passage of an essential list
            d = big
            for i in range(ne, n_u):
                u = ord_[i]
                if pos[u] < end[u] and indices[pos[u]] < d:
                    d = indices[pos[u]]
            if d == big:
                break
            if size == k:
                if d > region_hi and pq:
                    # with pair bounds, a range from d over the current unit of every
                    # essential list: its superblock (level 0, where it has them), skipped
                    # whole where it cannot reach the k best, else its block (level 1). It
                    # ends where the first unit of the lists at d ends. A list whose next
                    # passage comes later adds nothing there and is left out; over
                    # superblocks any other list is included (ess) and ends the range at its
                    # unit's end too, over blocks it ends the range before its next passage.
                    # A passage of the range that can score holds an included list e: it
                    # gets at most e's unit maximum plus, from every other list, the smaller
                    # of its own bound (unit maximum, or a non-essential list's length bound
                    # at the units' shortest passage; 0 with no posting in the range) and its
                    # pair bound with e. The range's bound is the largest over e: where two
                    # lists never share a passage, one unit's maximum, not their sum.
                    # Superblocks are tried again after 2**n - 1 ranges once they failed n
                    # times in a row.
                    level = 0 if sb_wait == 0 else 1
                    while True:
                        region_hi = big
                        for u in range(n_u):
                            ess[u] = False
                        for i in range(ne, n_u):
                            u = ord_[i]
                            if pos[u] >= end[u]:
                                continue
                            t = tok[u]
                            j = pos[u] - indptr[t]  # the list's postings before its next one
                            c = block_ptr[t] + j // block
                            r = row[u]
                            if level == 0 and 0 <= r < sb_off.shape[0] and sb_off[r] >= 0:
                                xs = sb_off[r] + j // (block * SUPERBLOCK)
                                umax[u], ulast[u] = sb_max[xs], sb_last[xs]
                                urank[u], ulen[u] = sb_rank[xs], sb_minlen[xs]
                            else:
                                umax[u], ulast[u], urank[u] = (
                                    block_max[c],
                                    block_last[c],
                                    block_rank[c],
                                )
                                ulen[u] = block_minlen[c]
                            if indices[pos[u]] == d and ulast[u] < region_hi:
                                region_hi = ulast[u]
                        region_rank = big
                        shortest = cap
                        for i in range(ne, n_u):
                            u = ord_[i]
                            if pos[u] >= end[u]:
                                continue
                            nxt = indices[pos[u]]
                            if nxt == d or (level == 0 and nxt <= region_hi):
                                ess[u] = True
                            elif nxt <= region_hi:  # blocks: end the range before it instead
                                region_hi = nxt - 1
                        for i in range(ne, n_u):
                            u = ord_[i]
                            if ess[u]:
                                region_hi = min(region_hi, ulast[u])
                                region_rank = min(region_rank, urank[u])
                                shortest = min(shortest, ulen[u])
                        for u in range(n_u):
                            noness[u] = False
                        for i in range(ne):
                            u = ord_[i]
                            p = _gallop(indices, pos[u], end[u], d)
                            pos[u] = p
                            noness[u] = p < end[u] and indices[p] <= region_hi
                            lb[u] = _bound_at(tmax[u], row[u], len_bound, shortest)
                        region_bound = 0.0
                        region_ub = zero
                        for e in range(n_u):
                            if not ess[e]:
                                continue
                            tot = 0.0
                            sub = zero
                            for i in range(m):  # in query order, summed as bm25s sums
                                v = occ[i]
                                if v == e:
                                    x = umax[e]
                                elif ess[v] or noness[v]:
                                    x = umax[v] if ess[v] else lb[v]
                                    y = pb[e, v]
                                    if y < x:
                                        x = y
                                else:
                                    x = zero  # no posting in the range
                                tot += x
                                sub += x
                            if tot > region_bound:
                                region_bound = tot
                            if sub > region_ub:
                                region_ub = sub
                        region_ub += b
                        if level == 1:
                            sb_wait = max(sb_wait - 1, 0)
                            break
                        if (
                            region_bound + margin < theta
                            or region_ub < hs[0]
                            or (region_ub == hs[0] and region_rank > hr[0])
                        ):
                            sb_fails = 0
                            break
                        sb_fails = min(sb_fails + 1, 16)
                        sb_wait = (1 << sb_fails) - 1
                        level = 1
                elif d > region_hi:
                    # the essential lists' blocks holding d (a list whose next passage comes
                    # after d adds nothing before it), and the non-essential lists' bounds,
                    # bound every passage up to the first block end or next passage
                    region_bound = 0.0
                    region_hi = big
                    region_rank = big
                    shortest = cap  # the shortest passage of the essential lists' blocks
                    for u in range(n_u):
                        ess[u] = False
                        noness[u] = False
                    for i in range(ne):
                        noness[ord_[i]] = True  # bounded by its list's maximum
                    for i in range(ne, n_u):
                        u = ord_[i]
                        c = _gallop(block_last, bcur[u], bend[u], d)
                        bcur[u] = c
                        nxt = indices[pos[u]] if pos[u] < end[u] else big
                        if nxt > d:
                            # u has no posting from d to nxt - 1: it adds nothing there
                            region_hi = min(region_hi, nxt - 1)
                        else:
                            ess[u] = True  # u's current block bounds it
                            region_bound += mult[u] * block_max[c]
                            region_hi = min(region_hi, block_last[c])
                            region_rank = min(region_rank, block_rank[c])
                            if use_len and block_minlen[c] < shortest:
                                shortest = block_minlen[c]
                    for i in range(ne):
                        u = ord_[i]
                        # a non-essential list with no posting up to region_hi adds nothing
                        p = _gallop(indices, pos[u], end[u], d)
                        pos[u] = p
                        if p >= end[u] or indices[p] > region_hi:
                            lb[u] = zero
                            continue
                        lb[u] = _bound_at(tmax[u], row[u], len_bound, shortest)
                        region_bound += mult[u] * lb[u]
                    ub = zero
                    for i in range(m):
                        u = occ[i]
                        if ess[u]:
                            ub += block_max[bcur[u]]
                        elif noness[u]:
                            ub += lb[u]
                    region_ub = ub + b
                if (
                    region_bound + margin < theta
                    or region_ub < hs[0]
                    or (region_ub == hs[0] and region_rank > hr[0])
                ):
                    # nothing up to region_hi can reach the k best: skip past it
                    for i in range(ne, n_u):
                        u = ord_[i]
                        pos[u] = _gallop(indices, pos[u], end[u], region_hi + 1)
                    continue
            # the essential lists' part of d
            known = 0.0
            for i in range(ne, n_u):
                u = ord_[i]
                p = pos[u]
                if p < end[u] and indices[p] == d:
                    contrib[u] = data[p]
                    hit[u] = True
                    known += mult[u] * data[p]
                    pos[u] = p + 1
            if stamp[d] == gone or stamp[d] == seen:
                for u in range(n_u):
                    hit[u] = False
                continue
            # with every list essential, the known part is the whole score
            dropped = ne == 0 and known + margin < theta
            if ne > 0:
                # each non-essential list's bound on d: its list's maximum, or its length
                # bound at d's length; lrest[i]: lists ord_[0..i-1] together
                if use_len:
                    ln = _clip_length(doc_len, d, cap)
                    lrest[0] = 0.0
                    for i in range(ne):
                        u = ord_[i]
                        lb[u] = _bound_at(tmax[u], row[u], len_bound, ln)
                        if pq:  # d holds every essential list it was found in
                            for e in range(n_u):
                                if hit[e]:
                                    v = pb[e, u]
                                    if v < lb[u]:
                                        lb[u] = v
                        lrest[i + 1] = lrest[i] + mult[u] * lb[u]
                    dropped = known + lrest[ne] + margin < theta
                # probe the non-essential lists, largest bound first, while d can still make it
                for i in range(ne - 1, -1, -1):
                    if dropped:
                        break
                    u = ord_[i]
                    rest = lrest[i] if use_len else (prefix[i - 1] if i > 0 else 0.0)
                    c = _gallop(block_last, bcur[u], bend[u], d)
                    bcur[u] = c
                    here = mult[u] * block_max[c] if c < bend[u] else 0.0
                    if use_len and mult[u] * lb[u] < here:
                        here = mult[u] * lb[u]
                    if known + here + rest + margin < theta:
                        dropped = True
                        break
                    p = _gallop(indices, pos[u], end[u], d)
                    pos[u] = p
                    if p < end[u] and indices[p] == d:
                        contrib[u] = data[p]
                        hit[u] = True
                        known += mult[u] * data[p]
            if not dropped:
                s = zero
                for i in range(m):
                    u = occ[i]
                    if hit[u]:
                        s += contrib[u]
                size = _push(hs, hr, hp, size, k, s + b, id_rank[d], d)
                if size == k and hs[0] > theta:
                    theta = hs[0]
                    while ne < n_u and prefix[ne] + margin < theta:
                        ne += 1
                        region_hi = -1  # a tighter bound for the next range
            for u in range(n_u):
                hit[u] = False
        if size < k or hs[0] <= b:
            # passages no token occurs in score b and may still enter; nothing was dropped
            # (every bound is >= 0), so mark every touched passage and fill in id order
            for u in range(n_u):
                for j in range(indptr[tok[u]], indptr[tok[u] + 1]):
                    stamp[indices[j]] = gone
            size = _fill_untouched(hs, hr, hp, size, k, b, by_rank, stamp, gone)
        _pop_into(hs, hr, hp, size, out, q)


LENGTH_CAP = 255
"""Length bounds (:func:`length_bounds`) tell lengths apart up to this; a longer passage counts
as this long (its table column holds the bound over every longer passage too)."""
LENGTH_TABLE_DF = 256
"""A token gets a length-bound table when its list holds at least this many passages (and at
least one passage in 8,192): a shorter list costs little to probe."""


@njit(nogil=True, cache=True)
def _length_bounds(
    tokens,
    data,
    indices,
    indptr,
    block,
    block_ptr,
    doc_len,
    min_df,
    n_rows,
    minlen_done,
    block_minlen,
    row_of,
    table,
    out,
) -> int:
    cap = table.shape[1] - 1
    for q in range(tokens.shape[0]):
        t = tokens[q]
        lo, hi = indptr[t], indptr[t + 1]
        if not minlen_done[t]:
            c = block_ptr[t]
            for start in range(lo, hi, block):
                shortest = cap
                for j in range(start, min(start + block, hi)):
                    ln = _clip_length(doc_len, indices[j], cap)
                    if ln < shortest:
                        shortest = ln
                block_minlen[c] = shortest
                c += 1
            minlen_done[t] = 1
        r = row_of[t]
        if r == 0:  # not decided yet
            if hi - lo < min_df:
                r = -1
            else:
                if n_rows[0] >= table.shape[0]:
                    return q  # full: the caller grows the table and calls again
                r = n_rows[0] + 1
                best = table[r - 1]
                best[:] = 0
                for j in range(lo, hi):
                    ln = _clip_length(doc_len, indices[j], cap)
                    if data[j] > best[ln]:
                        best[ln] = data[j]
                for ln in range(cap - 1, -1, -1):  # the bound over every longer passage too
                    if best[ln + 1] > best[ln]:
                        best[ln] = best[ln + 1]
                n_rows[0] = r
            row_of[t] = r
        out[q] = r - 1 if r > 0 else -1
    return -1


def length_bounds(tokens, data, indices, indptr, blocks: dict, doc_len, state: dict) -> tuple:
    """What :func:`top_k_blockmax` needs for its length bounds on the lists of ``tokens``:
    ``(block_minlen, token_row, len_bound)``, computed the first time a query reads a list and
    kept in ``state`` (``{}`` to start).

    ``len_bound[r, L]`` is the largest contribution the token of row ``r`` makes to a passage
    of length at least ``L`` (lengths clipped to :data:`LENGTH_CAP`); ``token_row`` gives each
    entry of ``tokens`` its row, or -1 for a list too short to need one
    (:data:`LENGTH_TABLE_DF`); ``block_minlen[c]`` is the length of block ``c``'s shortest
    passage (for ``blocks``' layout: other blocks start ``state`` again). A row never changes
    once written; growing the table copies it, so the array a running kernel holds stays whole.
    Not thread-safe: call it under the caller's lock, after the lists were checked
    (:func:`check_lists`)."""
    if state.get("blocks") is not blocks["block_max"]:  # new, or blocks of another size
        state.clear()
        state["blocks"] = blocks["block_max"]
        n_tok = len(indptr) - 1
        state["row_of"] = np.zeros(n_tok, dtype=np.int32)  # untouched pages cost no memory
        state["minlen_done"] = np.zeros(n_tok, dtype=np.uint8)
        state["block_minlen"] = np.zeros(len(blocks["block_max"]), dtype=np.uint8)
        state["table"] = np.zeros((0, LENGTH_CAP + 1), dtype=data.dtype)
        state["n_rows"] = np.zeros(1, dtype=np.int64)
        state["min_df"] = max(LENGTH_TABLE_DF, len(doc_len) // 8192)
    out = np.empty(len(tokens), dtype=np.int64)
    while True:
        full = _length_bounds(
            tokens,
            data,
            indices,
            indptr,
            int(blocks["block"]),
            blocks["block_ptr"],
            doc_len,
            state["min_df"],
            state["n_rows"],
            state["minlen_done"],
            state["block_minlen"],
            state["row_of"],
            state["table"],
            out,
        )
        if full < 0:
            return state["block_minlen"], out, state["table"]
        old = state["table"]
        grown = np.zeros((max(16, 2 * old.shape[0]), old.shape[1]), dtype=old.dtype)
        grown[: old.shape[0]] = old
        state["table"] = grown


def super_blocks(tokens, rows, blocks: dict, state: dict) -> tuple:
    """:func:`top_k_blockmax`'s superblock arguments ``(sb_off, sb_max, sb_last, sb_rank,
    sb_minlen)`` for the lists of ``tokens``, whose length-table rows are ``rows``
    (:func:`length_bounds`, with the same ``state``): each row's superblocks (:data:`SUPERBLOCK`
    blocks: their largest contribution, last passage, smallest id rank and shortest passage),
    computed the first time a query reads the row's list and kept in ``state``, from
    ``blocks["block_rank"]`` (:func:`block_min_rank`) and the rest of ``blocks``. A row never
    changes once written, and growing the pool copies it. Not thread-safe: call it under the caller's lock."""
    _super_blocks(tokens, rows, blocks, state)
    return tuple(state[name] for name in ("sb_off", "sb_max", "sb_last", "sb_rank", "sb_minlen"))


@njit(nogil=True, cache=True)
def _fill_super_blocks(
    tokens, rows, block_ptr, block_max, block_last, block_rank, block_minlen, sb_off, sb_max,
    sb_last, sb_rank, sb_minlen, n_used,
) -> int:  # fmt: skip
    for q in range(tokens.shape[0]):
        r = rows[q]
        if r < 0 or sb_off[r] >= 0:
            continue
        t = tokens[q]
        lo, hi = block_ptr[t], block_ptr[t + 1]
        n_sb = (hi - lo + SUPERBLOCK - 1) // SUPERBLOCK
        off = n_used[0]
        if off + n_sb > sb_max.shape[0]:
            return q  # full: the caller grows the pool and calls again
        for x in range(n_sb):
            c0 = lo + x * SUPERBLOCK
            c1 = min(c0 + SUPERBLOCK, hi)
            most, rank, shortest = block_max[c0], block_rank[c0], block_minlen[c0]
            for c in range(c0 + 1, c1):
                most = max(most, block_max[c])
                rank = min(rank, block_rank[c])
                shortest = min(shortest, block_minlen[c])
            sb_max[off + x] = most
            sb_last[off + x] = block_last[c1 - 1]
            sb_rank[off + x] = rank
            sb_minlen[off + x] = shortest
        n_used[0] = off + n_sb
        sb_off[r] = off  # written last: a row is whole once it has an offset
    return -1


def _super_blocks(tokens, rows, blocks: dict, state: dict) -> None:
    """Fill :func:`super_blocks`'s pool in ``state`` for the rows of ``tokens``."""
    n_rows = state["table"].shape[0]
    if "sb_off" not in state:
        state["sb_off"] = np.zeros(0, dtype=np.int64)
        state["sb_n"] = np.zeros(1, dtype=np.int64)
        for name, dtype in (
            ("sb_max", state["table"].dtype),
            ("sb_last", np.int64),
            ("sb_rank", np.int64),
            ("sb_minlen", np.uint8),
        ):
            state[name] = np.zeros(0, dtype=dtype)
    if state["sb_off"].shape[0] < n_rows:
        grown = np.full(n_rows, -1, dtype=np.int64)
        grown[: state["sb_off"].shape[0]] = state["sb_off"]
        state["sb_off"] = grown
    while True:
        full = _fill_super_blocks(
            tokens,
            rows,
            blocks["block_ptr"],
            blocks["block_max"],
            blocks["block_last"],
            blocks["block_rank"],
            state["block_minlen"],
            state["sb_off"],
            state["sb_max"],
            state["sb_last"],
            state["sb_rank"],
            state["sb_minlen"],
            state["sb_n"],
        )
        if full < 0:
            return
        size = max(1024, 2 * state["sb_max"].shape[0])
        for name in ("sb_max", "sb_last", "sb_rank", "sb_minlen"):
            grown = np.zeros(size, dtype=state[name].dtype)
            grown[: state[name].shape[0]] = state[name]
            state[name] = grown


def no_length_bounds(dtype) -> Bounds:
    """:func:`top_k_blockmax`'s bounds for an index saved without passage lengths: none."""
    ints = np.zeros(0, dtype=np.int64)
    return Bounds(
        np.zeros(0, dtype=np.int32),
        np.zeros(0, dtype=np.uint8),
        ints,
        np.zeros((0, 1), dtype=dtype),
        np.zeros((0, 0), dtype=dtype),
        ints,
        np.zeros(0, dtype=dtype),
        ints,
        ints,
        np.zeros(0, dtype=np.uint8),
    )


PAIR_ROWS = 2048
"""Pair bounds (:func:`pair_bounds`) are kept between the tokens of the first this many
length-table rows: a float32 table of at most 16 MiB, whatever the vocabulary."""


@njit(nogil=True, cache=True)
def _pair_bounds(tokens, token_ptr, rows, data, indices, indptr, pair) -> None:
    n = pair.shape[0]
    zero = np.zeros(1, dtype=data.dtype)[0]
    for q in range(token_ptr.shape[0] - 1):
        for i in range(token_ptr[q], token_ptr[q + 1]):
            ra = rows[i]
            if ra < 0 or ra >= n:
                continue
            for j in range(token_ptr[q], token_ptr[q + 1]):
                rb = rows[j]
                if rb < 0 or rb >= n or rb == ra or pair[ra, rb] >= 0:
                    continue
                # the shorter list (sh) is walked, the longer (lo) galloped in
                sh, lo, r_sh, r_lo = tokens[i], tokens[j], ra, rb
                if indptr[sh + 1] - indptr[sh] > indptr[lo + 1] - indptr[lo]:
                    sh, lo, r_sh, r_lo = lo, sh, rb, ra
                most_sh, most_lo = zero, zero
                p, hi = indptr[lo], indptr[lo + 1]
                for x in range(indptr[sh], indptr[sh + 1]):
                    if p >= hi:
                        break
                    d = indices[x]
                    p = _gallop(indices, p, hi, d)
                    if p < hi and indices[p] == d:
                        if data[x] > most_sh:
                            most_sh = data[x]
                        if data[p] > most_lo:
                            most_lo = data[p]
                pair[r_lo, r_sh] = most_sh  # sh's largest contribution to a passage holding lo
                pair[r_sh, r_lo] = most_lo


def pair_bounds(tokens, token_ptr, rows, data, indices, indptr, state: dict) -> np.ndarray:
    """:func:`top_k_blockmax`'s ``pair_bound`` for the queries ``tokens``/``token_ptr`` (CSR,
    as the kernel takes them), whose length-table rows are ``rows`` (:func:`length_bounds`):
    ``pair_bound[r, s]`` is the largest contribution the token of row ``s`` makes to a passage
    that holds the token of row ``r`` (0 where they never share a passage; -1: not computed).

    Each pair of tokens that share a query, both with a row below :data:`PAIR_ROWS`, is
    computed the first time a query holds both (one walk of the shorter list, galloping in the
    longer) and kept in ``state`` (the length bounds' ``state``): a list long enough to have a
    length table is where a bound pays. An entry never changes once written, and growing the
    table copies it, so the array a running kernel holds stays whole. Not thread-safe: call it
    under the caller's lock, after :func:`length_bounds` for the same tokens."""
    used = int(rows.max()) + 1 if len(rows) else 0
    need = min(used, PAIR_ROWS)
    pair = state.get("pairs")
    if pair is None or pair.shape[0] < need:
        size = min(PAIR_ROWS, max(16, need, 2 * (0 if pair is None else pair.shape[0])))
        grown = np.full((size, size), -1, dtype=data.dtype)
        if pair is not None:
            grown[: pair.shape[0], : pair.shape[1]] = pair
        state["pairs"] = pair = grown
    _pair_bounds(tokens, token_ptr, rows, data, indices, indptr, pair)
    return pair


@njit(nogil=True, cache=True)
def _block_min_rank(indices, indptr, block, block_ptr, id_rank, out) -> None:
    for t in range(indptr.shape[0] - 1):
        lo, hi = indptr[t], indptr[t + 1]
        c = block_ptr[t]
        for start in range(lo, hi, block):
            r = id_rank[indices[start]]
            for j in range(start + 1, min(start + block, hi)):
                if id_rank[indices[j]] < r:
                    r = id_rank[indices[j]]
            out[c] = r
            c += 1


def block_min_rank(indices, indptr, blocks: dict, id_rank) -> np.ndarray:
    """Each block's smallest passage-id rank (``block_rank`` of :func:`top_k_blockmax`): the
    blocks of :func:`compute_blocks`'s ``blocks``, ranks ``id_rank`` (one read of every
    posting)."""
    out = np.empty(int(blocks["block_ptr"][-1]), dtype=np.int64)
    _block_min_rank(indices, indptr, int(blocks["block"]), blocks["block_ptr"], id_rank, out)
    return out


@njit(nogil=True, cache=True)
def _check_lists(
    tokens, indptr, indices, n_docs, block, block_ptr, block_max, block_last, checked, best
):
    n_tok = indptr.shape[0] - 1
    n_data = indices.shape[0]
    n_blocks = block_max.shape[0]
    for q in range(tokens.shape[0]):
        t = tokens[q]
        if t < 0 or t >= n_tok:
            return t
        if checked[t]:
            continue
        lo, hi = indptr[t], indptr[t + 1]
        if lo < 0 or lo > hi or hi > n_data:
            return t
        for j in range(lo, hi):
            if indices[j] < 0 or indices[j] >= n_docs:
                return t
        b_lo, b_hi = block_ptr[t], block_ptr[t + 1]
        if b_lo < 0 or b_hi > n_blocks or b_hi - b_lo != (hi - lo + block - 1) // block:
            return t
        top = b_lo
        for c in range(b_lo, b_hi):
            if block_last[c] < 0 or block_last[c] >= n_docs:
                return t
            if block_max[c] > block_max[top]:
                top = c
        best[t] = top
        checked[t] = 1
    return -1


def check_lists(tokens, indptr, indices, n_docs: int, blocks: dict, checked) -> int:
    """The first of ``tokens`` (columns) whose posting list could make a kernel read outside an
    array, or ``-1``: its ``indptr`` span inside the postings, its passage numbers in
    ``[0, n_docs)``, and its block span (as :func:`compute_blocks` lays ``blocks`` out) and block
    ends in range. A loaded index checks each list the first time a query reads it
    (``checked`` marks those found sound) instead of reading every posting at load; the same
    pass records each checked token's ``best_block`` (:func:`best_blocks`)."""
    return int(
        _check_lists(
            tokens,
            indptr,
            indices,
            n_docs,
            int(blocks["block"]),
            blocks["block_ptr"],
            blocks["block_max"],
            blocks["block_last"],
            checked,
            blocks["best_block"],
        )
    )


@njit(nogil=True, cache=True)
def _best_blocks(block_ptr, block_max, out) -> None:
    for t in range(block_ptr.shape[0] - 1):
        best = block_ptr[t]
        for c in range(block_ptr[t] + 1, block_ptr[t + 1]):
            if block_max[c] > block_max[best]:
                best = c
        out[t] = best


def block_arrays(blocks: dict) -> Blocks:
    """The block-max kernel's :class:`Blocks` from :func:`compute_blocks`'s dict, once
    ``block_rank`` (:func:`block_min_rank`) and ``best_block`` (:func:`best_blocks`) are in it."""
    return Blocks(
        int(blocks["block"]),
        blocks["block_ptr"],
        blocks["block_max"],
        blocks["block_last"],
        blocks["block_rank"],
        blocks["best_block"],
    )


def best_blocks(blocks: dict) -> np.ndarray:
    """Each token's first block holding its largest contribution (``best_block`` of
    :func:`top_k_blockmax`, where the head start begins); a token without postings gets its
    (empty) first block."""
    out = np.empty(len(blocks["block_ptr"]) - 1, dtype=np.int64)
    _best_blocks(blocks["block_ptr"], blocks["block_max"], out)
    return out


def compute_blocks(data, indices, indptr, block: int = BLOCK) -> dict:
    """:func:`block_facts` of an index: ``{"block", "token_max", "block_ptr", "block_max",
    "block_last", "prunable"}``."""
    block_ptr = block_pointers(indptr, block)
    n_blocks = int(block_ptr[-1])
    token_max = np.zeros(len(indptr) - 1, dtype=np.float64)
    block_max = np.zeros(n_blocks, dtype=data.dtype)
    block_last = np.zeros(n_blocks, dtype=indices.dtype)
    ok = block_facts(data, indices, indptr, block, token_max, block_ptr, block_max, block_last)
    return {
        "block": block,
        "token_max": token_max,
        "block_ptr": block_ptr,
        "block_max": block_max,
        "block_last": block_last,
        "prunable": bool(ok),
    }
