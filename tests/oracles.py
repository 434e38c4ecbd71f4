"""Exact references the tests check the code against: nothing at run time calls these, so
they live with the tests (formerly headway.core.sampling.inclusion_probabilities,
headway.core.fedlog.log_posterior and headway.core.fedpft.payload_values)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

import numpy as np
from headway.core.fedpft import components_for
from headway.core.gmm import parameter_count
from headway.core.sampling import clean_weights
from scipy.special import logsumexp


def inclusion_probabilities(weights: Sequence[float], k: int) -> np.ndarray:
    """π_i = P(position i is among the k drawn by successive sampling ∝ ``weights``)
    (headway.core.sampling's weighted draw). Exact, by recursion over the set already drawn
    (2^n states: meant for n ≲ 20; Σ π_i = k)."""
    w = clean_weights(weights)
    n = len(w)
    if np.count_nonzero(w) < k:
        raise ValueError("inclusion probabilities need at least k positive weights")
    if n > 22:
        raise ValueError(f"exact inclusion probabilities enumerate 2^n subsets; n={n} is too many")
    weights_t = tuple(w.tolist())

    @cache
    def reach(mask: int) -> float:
        """Probability that the first popcount(mask) draws are exactly the set ``mask``."""
        if mask == 0:
            return 1.0
        total = 0.0
        for i in range(n):
            if mask >> i & 1:
                prev = mask & ~(1 << i)
                left = sum(weights_t[j] for j in range(n) if not prev >> j & 1)
                total += reach(prev) * weights_t[i] / left
        return total

    pi = np.zeros(n)
    for mask in range(1 << n):
        if bin(mask).count("1") == k:
            p = reach(mask)
            for i in range(n):
                if mask >> i & 1:
                    pi[i] += p
    return pi


def log_posterior(eta: np.ndarray, stats: np.ndarray, count: float, chi: np.ndarray | float | None = None, nu: float = 1.0) -> float:
    """FedLog's objective, Eq. 12 (up to a constant): η·(χ+Φ) − (ν+n)·log Σ_y exp(‖η_y‖²/4)."""
    s = np.asarray(stats, dtype=np.float64) + (0.0 if chi is None else chi)
    return float(np.sum(eta * s) - (nu + count) * logsumexp(np.sum(eta**2, axis=1) / 4.0))


def payload_values(counts: list[int], dim: int, k: int, covariance: str) -> int:
    """float16 values of a FedPFT payload for classes of these sizes: Eqs. 9–11 with K_c per class."""
    return sum(parameter_count(dim, components_for(n, k), covariance) for n in counts)
