"""FedProto's prototype arithmetic (Tan et al. 2022): per-class mean features on a
client, their count-weighted average on the server, and nearest-prototype prediction.

Prototypes are per-class feature sums (the quantity FedLog shares) divided by the class
counts; the sums come from the shared :func:`headway.core.statistics.class_sums`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from headway.core.statistics import class_sums


def class_prototypes(features: np.ndarray, labels: np.ndarray, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """(classes × m mean features, per-class counts); rows of absent classes are 0."""
    sums = class_sums(features, labels, num_classes)
    counts = np.bincount(labels, minlength=num_classes).astype(np.float64)
    protos = np.divide(sums, counts[:, None], out=np.zeros_like(sums), where=counts[:, None] > 0)
    return protos, counts


def average_prototypes(protos: Sequence[np.ndarray], counts: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Global prototype of class j = Σ_k n_kj P_kj / Σ_k n_kj over the clients holding j.

    Returns (classes × m prototypes, total counts); classes nobody holds stay 0 with count 0.
    """
    if not protos:
        raise ValueError("no prototypes to average")
    c = np.stack([np.asarray(n, dtype=np.float64) for n in counts])  # clients × classes
    p = np.stack([np.asarray(q, dtype=np.float64) for q in protos])  # clients × classes × m
    total = c.sum(0)
    weighted = np.einsum("kc,kcm->cm", c, p)
    out = np.divide(weighted, total[:, None], out=np.zeros_like(weighted), where=total[:, None] > 0)
    return out, total


def nearest_prototype(features: np.ndarray, protos: np.ndarray, known: np.ndarray) -> np.ndarray:
    """The label of the closest (Euclidean) known prototype for every feature row."""
    d = ((features[:, None, :] - protos[None, :, :]) ** 2).sum(-1)
    d[:, ~np.asarray(known, dtype=bool)] = np.inf
    return d.argmin(1)


def prototype_problem(protos: np.ndarray, counts: np.ndarray, n: float, shape: tuple[int, int]) -> str | None:
    """Why a client's (prototypes, counts) cannot be real, or None."""
    if protos.shape != shape:
        return f"prototypes have shape {protos.shape}, expected {shape}"
    if counts.shape != (shape[0],):
        return f"class counts have shape {counts.shape}, expected ({shape[0]},)"
    if not (np.all(np.isfinite(protos)) and np.all(np.isfinite(counts))):
        return "prototypes or counts contain NaN or Inf"
    if np.any(counts < 0) or not np.allclose(counts, np.round(counts)):
        return "class counts must be non-negative integers"
    if abs(counts.sum() - n) > 0.5:
        return f"class counts add up to {counts.sum():.0f}, but num-examples is {n:.0f}"
    if np.any(protos[counts == 0] != 0):
        return "prototype given for a class with no examples"
    return None
