"""Weighted averaging of named arrays, the bound a model update must respect before it is
averaged (shared by FedAvg and every layer-averaging method), and the cut of clients' mean
features far above the others' (FedDBE's mean feature, FedLog's class means)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def weighted_average(
    arrays: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float] | np.ndarray, like: Mapping[str, np.ndarray] | None = None
) -> dict[str, np.ndarray]:
    """Σ_k w_k A_k / Σ_k w_k for every name, in float64, cast to the dtype of ``like``
    (the server's own arrays; default the first's). Integer arrays are rounded."""
    if not arrays:
        raise ValueError("nothing to average")
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or w.sum() <= 0:
        raise ValueError(f"weights must be >= 0 with a positive sum, got {w.tolist()}")
    w = w / w.sum()
    reference = like if like is not None else arrays[0]
    out = {}
    for name, ref in reference.items():
        acc = np.zeros(np.shape(ref), dtype=np.float64)
        for wk, a in zip(w, arrays):
            acc += wk * np.asarray(a[name], dtype=np.float64)
        dtype = np.asarray(ref).dtype
        out[name] = acc.astype(dtype) if np.issubdtype(dtype, np.floating) else np.rint(acc).astype(dtype)
    return out


def float_norm(arrays: Mapping[str, np.ndarray]) -> float:
    """The Euclidean norm of all floating-point entries together."""
    return float(
        np.sqrt(
            sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays.values() if np.issubdtype(np.asarray(a).dtype, np.floating))
        )
    )


def relative_update_norm(reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> float:
    """‖candidate − reference‖ / max(‖reference‖, 1) over the float entries: how far a
    client moved the model it was sent, in units of that model's size (a sign flip is 2)."""
    delta = {
        k: np.asarray(candidate[k], np.float64) - np.asarray(v, np.float64)
        for k, v in reference.items()
        if np.issubdtype(np.asarray(v).dtype, np.floating)
    }
    return float_norm(delta) / max(float_norm(reference), 1.0)


# Robust aggregation rules (run-config ``aggregation``; Flower's implementations, called from strategies/robust.py)
AGGREGATIONS = ("mean", "median", "trimmed-mean", "krum", "multi-krum", "bulyan")
SELECTING = ("krum", "multi-krum", "bulyan")  # the rules that pick replies by Krum's score, sized by malicious-clients f


def replies_needed(rule: str, f: int) -> int:
    """The fewest replies ``rule`` aggregates when ``f`` of them may be poisoned: Krum and
    Multi-Krum score each update by its n − f − 2 nearest, so n > 2f + 2 (Blanchard et al.
    2017); Bulyan keeps n − 2f by Krum and then n − 4f per coordinate, so n ≥ 4f + 3 (El Mhamdi
    et al. 2018, Flower's check); mean, median and trimmed mean need one."""
    if rule in ("krum", "multi-krum"):
        return 2 * f + 3
    if rule == "bulyan":
        return 4 * f + 3
    return 1


def multi_krum_count(m: int, n: int, f: int) -> int:
    """How many of ``n`` replies Multi-Krum averages: ``m`` (0: n − f, El Mhamdi et al.'s
    choice), never more than the n − f that can all be honest."""
    return min(m, n - f) if m else n - f


MEAN_NORM_FACTOR = 2.0  # a client mean counts at most this many times the round's median mean norm
MIN_MEANS_TO_CLIP = 3  # below this many means a median says nothing about an honest majority


def cut_to_norm(vectors: Sequence[np.ndarray], cap: float) -> tuple[list[np.ndarray], int]:
    """``vectors`` (float64) with each L2 norm above ``cap`` scaled down to ``cap``, and how many were."""
    norms = [float(np.linalg.norm(v)) for v in vectors]
    out = [np.asarray(v, np.float64) * (cap / n if n > cap else 1.0) for v, n in zip(vectors, norms)]
    return out, sum(n > cap for n in norms)


def clipped_means(means: Sequence[np.ndarray], factor: float = MEAN_NORM_FACTOR) -> tuple[list[np.ndarray], int]:
    """``means`` with each one's L2 norm cut to ``factor`` × the median norm of them all (from 3 means on), and
    how many were cut. ``max-feature-value`` bounds each entry only far above honest scale, so without this one
    client could send a mean thousands of times the others', move the global mean every client is pulled towards
    and make every honest update exceed ``max-update-norm`` (an outside probe froze training so); with an honest
    majority the median norm is an honest one, and one client moves the mean by at most factor × that × n_k/n."""
    if len(means) < MIN_MEANS_TO_CLIP:
        return [np.asarray(m, np.float64) for m in means], 0
    return cut_to_norm(means, factor * float(np.median([np.linalg.norm(m) for m in means])))
