"""Weighted averaging of named arrays and the checks a reply must pass before it is
averaged (shared by FedAvg and every head-averaging method)."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def weighted_average(arrays: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float]) -> dict[str, np.ndarray]:
    """Σ_k w_k A_k / Σ_k w_k for every name, in float64, cast back to the first's dtype."""
    if not arrays:
        raise ValueError("nothing to average")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {w.tolist()}")
    w = w / w.sum()
    out = {}
    for name, first in arrays[0].items():
        acc = np.zeros(first.shape, dtype=np.float64)
        for wk, a in zip(w, arrays):
            acc += wk * np.asarray(a[name], dtype=np.float64)
        out[name] = acc.astype(first.dtype) if np.issubdtype(first.dtype, np.floating) else np.rint(acc).astype(first.dtype)
    return out


def array_problem(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> str | None:
    """Why ``candidate`` cannot be averaged with ``reference`` (names, shapes, finiteness), or None."""
    if set(candidate) != set(reference):
        missing, extra = sorted(set(reference) - set(candidate)), sorted(set(candidate) - set(reference))
        return f"array names differ (missing {missing[:5]}, unexpected {extra[:5]})"
    for name, ref in reference.items():
        arr = candidate[name]
        if arr.shape != ref.shape:
            return f"array {name!r} has shape {arr.shape}, expected {ref.shape}"
        if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
            return f"array {name!r} contains NaN or Inf"
    return None
