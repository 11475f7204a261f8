"""Confidence intervals for per-question scores: the percentile bootstrap of a mean and of a
paired difference.

Held-out figures in rag-gym are means of per-question scores (EM, F1, recall, searches) over a
few hundred questions, so their sampling error is large and must be reported. Both functions
resample *questions* with replacement (Efron and Tibshirani, *An Introduction to the Bootstrap*,
1993, ch. 13), with a seeded generator so that the same scores always give the same interval.

:func:`paired_difference` compares two agents (or two checkpoints) on the *same* questions: it
resamples questions and recomputes the mean of ``a - b`` on each resample, which removes the
variance the two share (hard questions are hard for both). Its interval is much narrower than
the difference of two independent intervals, and "the 95% CI of the paired difference lies above
0" is the test the learning results use.

>>> low, high = bootstrap_ci([1, 0, 1, 1, 0, 1, 1, 1, 0, 1])
>>> 0.3 < low < 0.7 < high <= 1.0
True
>>> d = paired_difference([1, 1, 1, 0, 1, 1], [0, 1, 0, 0, 1, 0])
>>> round(d.mean, 3), d.n, d.low > 0
(0.5, 6, True)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

DEFAULT_RESAMPLES = 10_000
#: the most resamples an interval takes (a million give three stable decimals; more only cost)
MAX_RESAMPLES = 1_000_000


def _scores(values: Sequence[float] | np.ndarray, name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(
            f"expected {name} to be a flat sequence of numbers, got shape {array.shape}"
        )
    if array.size == 0:
        raise ValueError(f"expected at least one score in {name}, got none")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"expected finite scores in {name}, got NaN or infinity")
    return array


def _check(confidence: float, n_resamples: int) -> None:
    if not 0.0 < confidence < 1.0 or not math.isfinite(confidence):
        raise ValueError(f"expected 0 < confidence < 1, got {confidence!r}")
    if (
        not isinstance(n_resamples, int)
        or isinstance(n_resamples, bool)
        or not 1 <= n_resamples <= MAX_RESAMPLES
    ):
        raise ValueError(
            f"expected n_resamples to be an int in 1..{MAX_RESAMPLES:,}, got {n_resamples!r}"
        )


def _resampled_means(
    values: np.ndarray, n_resamples: int, seed: int, chunk: int = 1_000
) -> np.ndarray:
    rng = np.random.default_rng(seed)
    n = values.size
    chunk = max(1, min(chunk, (1 << 24) // n))  # at most 16M indices (128 MB) at a time
    out = np.empty(n_resamples, dtype=np.float64)
    for start in range(0, n_resamples, chunk):
        stop = min(start + chunk, n_resamples)
        idx = rng.integers(0, n, size=(stop - start, n))
        out[start:stop] = values[idx].mean(axis=1)
    return out


def _interval(means: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central ``confidence`` interval of the resampled means (its percentiles)."""
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile-bootstrap interval of the mean of ``values`` (one score per question)."""
    _check(confidence, n_resamples)
    array = _scores(values, "values")
    return _interval(_resampled_means(array, n_resamples, seed), confidence)


def macro_average_ci(
    groups: Sequence[Sequence[float] | np.ndarray],
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> tuple[float, float]:
    """The percentile-bootstrap interval of the average of the groups' means (a table's
    "average" column over datasets): each group's questions are resampled within the group, so
    every resample keeps each dataset's weight.

    >>> low, high = macro_average_ci([[1, 1, 0, 1], [0, 0, 1, 0, 0, 0]])
    >>> low < (0.75 + 1 / 6) / 2 < high
    True
    """
    _check(confidence, n_resamples)
    if not groups:
        raise ValueError("expected at least one group of scores, got none")
    means = np.zeros(n_resamples, dtype=np.float64)
    for i, group in enumerate(groups):
        means += _resampled_means(_scores(group, f"groups[{i}]"), n_resamples, seed + i)
    return _interval(means / len(groups), confidence)


@dataclasses.dataclass(frozen=True)
class PairedDifference:
    """The mean of ``a - b`` over shared questions and its bootstrap interval."""

    mean: float
    low: float
    high: float
    n: int
    """Questions both sides answered."""
    wins: int
    """Questions where ``a`` scored higher."""
    losses: int
    """Questions where ``b`` scored higher."""
    p_not_above_zero: float
    """Share of resamples whose mean difference is <= 0 (a one-sided bootstrap p-value)."""
    confidence: float = 0.95

    def to_dict(self) -> dict[str, float | int]:
        return dataclasses.asdict(self)


def paired_difference(
    a: Sequence[float] | np.ndarray,
    b: Sequence[float] | np.ndarray,
    confidence: float = 0.95,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> PairedDifference:
    """The paired-bootstrap interval of ``mean(a - b)``; ``a[i]`` and ``b[i]`` score the same
    question."""
    _check(confidence, n_resamples)
    left, right = _scores(a, "a"), _scores(b, "b")
    if left.shape != right.shape:
        raise ValueError(
            f"expected one score per question on both sides, got {left.size} and {right.size}: "
            "align them by question id first"
        )
    diff = left - right
    means = _resampled_means(diff, n_resamples, seed)
    low, high = _interval(means, confidence)
    return PairedDifference(
        mean=float(diff.mean()),
        low=low,
        high=high,
        n=int(diff.size),
        wins=int((diff > 0).sum()),
        losses=int((diff < 0).sum()),
        p_not_above_zero=float((means <= 0).mean()),
        confidence=confidence,
    )
