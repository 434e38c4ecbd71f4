"""Choosing k clients out of n without replacement, uniformly or by weight, and the
probability that each one is chosen; and k draws with replacement (Li et al.'s scheme I).

Weighted sampling is *successive* sampling (numpy's ``choice(replace=False, p=...)``):
the first pick has probability w_i / Σw, and each later pick is drawn the same way from
the clients not yet picked. The resulting inclusion probability π_i = P(i is among the k)
is not k·w_i/Σw in general (the tests compute it exactly, by enumeration).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def clean_weights(weights: Sequence[float]) -> np.ndarray:
    """Weights as float64 with non-finite or negative entries set to 0."""
    w = np.asarray(weights, dtype=np.float64)
    return np.where(np.isfinite(w) & (w > 0), w, 0.0)


def sample_size(n: int, fraction: float) -> int:
    """How many of ``n`` a ``fraction`` takes: max(1, round(n·fraction)), the K of FedAvg's C."""
    return max(1, int(round(fraction * n)))


def sample_positions(n: int, k: int, rng: np.random.Generator, weights: Sequence[float] | None = None) -> list[int]:
    """``min(k, n)`` distinct positions out of ``n``, uniformly or by successive sampling ∝ ``weights``.

    With fewer than k positive weights, the positive ones are all taken and the rest are
    drawn uniformly from the others.
    """
    k = max(0, min(k, n))
    if k == 0:
        return []
    if weights is None:
        return sorted(rng.choice(n, size=k, replace=False).tolist())
    w = clean_weights(weights)
    if len(w) != n:
        raise ValueError(f"{len(w)} weights for {n} positions")
    positive = np.flatnonzero(w > 0)
    if len(positive) <= k:
        rest = np.setdiff1d(np.arange(n), positive)
        extra = rng.choice(rest, size=k - len(positive), replace=False).tolist() if k > len(positive) else []
        return sorted(positive.tolist() + extra)
    return sorted(rng.choice(n, size=k, replace=False, p=w / w.sum()).tolist())


def draw_with_replacement(n: int, k: int, rng: np.random.Generator, weights: Sequence[float]) -> np.ndarray:
    """How often each of ``n`` positions comes up in ``k`` independent draws ∝ ``weights``
    (sampling with replacement: scheme I of Li et al. 2020, FedProx's device sampling).
    Returns counts that sum to k (0 for every position when k or the weights are 0)."""
    w = clean_weights(weights)
    if len(w) != n:
        raise ValueError(f"{len(w)} weights for {n} positions")
    if k <= 0 or w.sum() == 0:
        return np.zeros(n, dtype=np.int64)
    return rng.multinomial(k, w / w.sum()).astype(np.int64)
