"""FedDBE's maths (Zhang et al., NeurIPS 2023, "Eliminating Domain Bias for Federated Learning in
Representation Space"): the mean regularization (MR) a client adds to its loss, the running mean of
its body's features it regularizes, and the server's count-weighted global mean with the check a
client's mean must pass (the cut of outlying means is core/aggregate.py's ``clipped_means``, shared with FedLog). The personalized representation bias (PRBM) is a plain vector added to the
features before the head (client/procedures/feddbe.py)."""

from __future__ import annotations

import math

import numpy as np
import torch


def running_mean(previous: torch.Tensor | None, features: torch.Tensor, momentum: float) -> torch.Tensor:
    """(1 − μ)·previous + μ·(the batch's mean feature): the local mean MR pulls, as the authors keep it
    (reset to zero every round; ``previous`` detached, so a step's gradient flows through its own batch only)."""
    batch = features.mean(dim=0)
    if previous is None:
        previous = torch.zeros_like(batch)
    return (1.0 - momentum) * previous.detach() + momentum * batch


def mean_regularization(local: torch.Tensor, global_mean: torch.Tensor) -> torch.Tensor:
    """MR: the mean over features of ½(local − global)², to be weighted by κ (``feddbe-kappa``)."""
    return torch.mean(0.5 * (local - global_mean) ** 2)


def global_mean(means: list[np.ndarray], counts: list[float]) -> np.ndarray:
    """Σ n_k·mean_k / Σ n_k in float64: the server's global mean feature from the clients' local means."""
    total = float(sum(counts))
    if not means or total <= 0:
        raise ValueError("a global mean needs at least one client mean with a positive count")
    return np.sum([np.asarray(m, np.float64) * (float(n) / total) for m, n in zip(means, counts)], axis=0)


def mean_problem(mean: np.ndarray, width: int, bound: float) -> str | None:
    """Why ``mean`` cannot be a client's mean feature of ``width`` features each within ±``bound`` (None: it can)."""
    if mean.shape != (width,):
        return f"feature mean has shape {tuple(mean.shape)}, expected ({width},)"
    if not np.all(np.isfinite(mean)):
        return "feature mean contains NaN or Inf"
    top = float(np.max(np.abs(mean), initial=0.0))
    if math.isfinite(bound) and top > bound:
        return f"a feature mean entry is {top:.4g}, beyond max-feature-value={bound:g}"
    return None
