"""FedProf's maths (Wu et al., §3.2 and Alg. 1): representation profiles, their
divergence from the server's baseline profile, client scores, and the aggregation rules
the paper compares: full (two readings: an unselected client counts with the current global
model, or with its cached last local model) and partial (scheme II of Li et al. 2020).

A profile is a (q, 2) array: per unit of one layer, the mean and the variance of its
output over a data set. For a convolutional layer a unit is a channel, its output summed
over spatial positions first (the paper's "channel-wise fused" representation).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where a model is profiled
    import torch

from headway.core.aggregate import weighted_average

VARIANCE_FLOOR = 1e-8  # absolute floor: a layer whose every unit is dead must not divide by zero
# Variances are floored relative to the layer's scale: at this fraction of the baseline's mean
# unit variance. A unit (nearly) dead in the baseline has a variance of ~0 whatever the data;
# against an absolute floor of 1e-8, a client on which it fires for a few rows gets a KL of
# var_k / 2e-8 (thousands), so the divergence measured dead units, not data (issue 23, item 11).
RELATIVE_VARIANCE_FLOOR = 0.01


def representation_profile(outputs: np.ndarray) -> np.ndarray:
    """(q, 2) per-unit mean and (population) variance of a layer's ``outputs``.

    ``outputs`` is (n, q) for a dense layer or (n, q, ...) for a convolutional one, whose
    spatial positions are summed first. An empty ``outputs`` gives zeros."""
    x = np.asarray(outputs, dtype=np.float64)
    if x.ndim < 2:
        raise ValueError(f"a layer's outputs must be (n, units, ...), got shape {x.shape}")
    if x.ndim > 2:
        x = x.reshape(x.shape[0], x.shape[1], -1).sum(axis=2)
    if x.shape[0] == 0:
        return np.zeros((x.shape[1], 2))
    return np.stack([x.mean(axis=0), x.var(axis=0)], axis=1)


def private_validation_rows(held_out: int, rng: np.random.Generator) -> np.ndarray:
    """Positions of D^V among the ``held_out`` rows the server keeps from clients: a
    uniformly random half (at least one row), drawn from ``rng``, which must be private to
    the server. The held-out rows follow from the run config, so a client knows them all;
    it cannot tell which half is D^V (there are C(h, h/2) halves). What remains: a profile
    of all h rows shares half its rows with D^V, so its means differ from the baseline's by
    a sampling variance of σ²/(2|D^V|), half that of any independent clean sample (σ²/|D^V|
    and more): close to the baseline, never equal to it."""
    if held_out <= 0:
        raise ValueError("the server holds out no rows to draw D^V from")
    return np.sort(rng.choice(held_out, size=max(1, held_out // 2), replace=False))


PRE_ACTIVATION = "pre-activation"  # fedprof-layer: the body's last linear operator, before its activation


def resolve_layer(model: torch.nn.Module, layer: str) -> str:
    """The module name ``layer`` stands for: itself, or for ``pre-activation`` the last ``Linear``
    or ``Conv*d`` inside ``model.body`` (Proposition 1's Gaussian premise holds for a linear
    operator's output, not for it after a ReLU); ``body`` when the body has none (e.g. ``linear``)."""
    if layer != PRE_ACTIVATION:
        return layer
    import torch

    linear = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)
    names = [name for name, module in model.named_modules() if name.startswith("body.") and isinstance(module, linear)]
    return names[-1] if names else "body"


def model_profile(
    model: torch.nn.Module, layer: str, x: torch.Tensor, device: torch.device | None = None, batch_size: int = 1000
) -> np.ndarray:
    """The profile of ``model``'s module ``layer`` (a name from ``named_modules()``, or
    ``pre-activation``: :func:`resolve_layer`) on inputs ``x``, in eval mode without gradients."""
    import torch

    layer = resolve_layer(model, layer)
    modules = dict(model.named_modules())
    if layer not in modules:
        names = ", ".join(n for n in modules if n)
        raise ValueError(f"fedprof-layer {layer!r} is not a module of this model; choose one of: {names}")
    captured: list[np.ndarray] = []
    hook = modules[layer].register_forward_hook(lambda _m, _i, out: captured.append(out.detach().float().cpu().numpy()))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            device = device or next(model.parameters()).device
            for i in range(0, max(len(x), 1), batch_size):  # an empty x still runs once: the layer's width
                model(x[i : i + batch_size].to(device))
    finally:
        hook.remove()
        model.train(was_training)
    return representation_profile(np.concatenate(captured))


def gaussian_kl(mu_p: np.ndarray, var_p: np.ndarray, mu_q: np.ndarray, var_q: np.ndarray, floor: float = VARIANCE_FLOOR) -> np.ndarray:
    """KL(N(mu_p, var_p) ‖ N(mu_q, var_q)) per unit, variances floored at ``floor``.

    The paper's Eq. 4 leaves out the constant −1/2; it scales every score by the same
    factor exp(α/2), so selection probabilities λ/Λ do not change. With it, identical
    profiles have divergence 0."""
    vp, vq = np.maximum(var_p, floor), np.maximum(var_q, floor)
    return 0.5 * np.log(vq / vp) + (vp + (np.asarray(mu_p) - np.asarray(mu_q)) ** 2) / (2.0 * vq) - 0.5


def variance_floor(baseline: np.ndarray) -> float:
    """The variance below which a unit's spread is not told apart, for profiles compared
    with ``baseline``: RELATIVE_VARIANCE_FLOOR times the baseline's mean unit variance (the
    layer's scale; it scales with the layer, so the divergence does not depend on the units'
    scale), and at least VARIANCE_FLOOR. Taken from the server's baseline only: a client
    cannot raise it by reporting large variances."""
    return max(RELATIVE_VARIANCE_FLOOR * float(np.mean(baseline[:, 1])), VARIANCE_FLOOR)


def unit_divergences(profile: np.ndarray, baseline: np.ndarray) -> np.ndarray:
    """The per-unit KL(RP_k ‖ RP^B) terms of Eq. 3, variances floored at :func:`variance_floor`."""
    if profile.shape != baseline.shape:
        raise ValueError(f"profile shape {profile.shape} does not match the baseline's {baseline.shape}")
    return gaussian_kl(profile[:, 0], profile[:, 1], baseline[:, 0], baseline[:, 1], floor=variance_floor(baseline))


def divergence(profile: np.ndarray, baseline: np.ndarray) -> float:
    """div(RP_k, RP^B) of Eq. 3: the mean over units of the per-unit KL divergence."""
    return float(np.mean(unit_divergences(profile, baseline)))


def score(div: float, alpha: float) -> float:
    """λ_k = exp(−α · div) (Eq. 7)."""
    return float(np.exp(-alpha * div))


def profile_problem(profile: np.ndarray, units: int) -> str | None:
    """Why a client's profile cannot be scored, or None."""
    if profile.shape != (units, 2):
        return f"profile has shape {tuple(profile.shape)}, expected ({units}, 2): (mean, variance) per unit"
    if not np.all(np.isfinite(profile)):
        return "profile holds NaN or Inf"
    if np.any(profile[:, 1] < 0):
        return "profile holds a negative variance"
    return None


def full_aggregate(
    previous: Mapping[str, np.ndarray], models: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float], total: float
) -> dict[str, np.ndarray]:
    """Full aggregation: θ ← Σ_{k=1..N} ρ_k θ_k with ρ_k = n_k / n over all N clients,
    where a client not selected this round contributes the previous global model:
    θ ← Σ_{k∈S} ρ_k θ_k + (1 − Σ_{k∈S} ρ_k) θ."""
    rho = np.asarray(sizes, dtype=np.float64) / float(total)
    if np.any(rho < 0) or rho.sum() > 1 + 1e-9:
        raise ValueError(f"selected clients' shares {rho.tolist()} must be >= 0 and sum to at most 1")
    return weighted_average([previous, *models], [max(1.0 - rho.sum(), 0.0), *rho], like=previous)


def cached_aggregate(
    initial: Mapping[str, np.ndarray], latest: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float], total: float
) -> dict[str, np.ndarray]:
    """Full aggregation over a cache of every client's last local model (as in the authors'
    SAFA/CFCFM line of work): θ ← Σ_{k=1..N} ρ_k θ_k^last, where ``latest`` are the cached
    models of the clients trained so far and a client never trained still holds the
    ``initial`` model every client was seeded with (Alg. 1 line 3)."""
    return full_aggregate(initial, latest, sizes, total)


def partial_aggregate(
    models: Sequence[Mapping[str, np.ndarray]], sizes: Sequence[float], total: float, num_clients: int, like: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Partial aggregation, scheme II of Li et al. (2020): θ ← Σ_{k∈S} ρ_k (N/K) θ_k,
    K = |S|. With equal data sizes this is the plain mean of FedProf's Eq. 36; with
    unequal sizes the weights sum to 1 only in expectation, as [5] defines it."""
    if not models:
        raise ValueError("nothing to aggregate")
    w = np.asarray(sizes, dtype=np.float64) / float(total) * num_clients / len(models)
    mean = weighted_average(models, w, like=like)  # Σ w_k θ_k / Σ w_k
    return {k: (np.asarray(v, np.float64) * w.sum()).astype(np.asarray(like[k]).dtype) for k, v in mean.items()}
