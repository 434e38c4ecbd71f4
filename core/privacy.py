"""The Gaussian releases of the DP modes, as an accountant needs them: noise σ, the L2
sensitivity Δ₂ of the released statistic to one training example, the noise multiplier
z = σ/Δ₂, how many times it is released, and the (ε, δ) the noise was calibrated for.

Neighbouring datasets differ by adding or removing one training example of one client
(the relation of FedLog's Theorem 7 proof and of FedPFT's Theorem 4.1 proof). The ε an
accountant computes from z and the number of releases is per example; the accountant
itself is Flower's (strategies/privacy.py), since core does not import Flower.

The calibrations of σ (FedLog's Theorem 7 and its modes, FedPFT's Theorem 4.1) live here, not in
the methods' maths modules: the accounting reads both methods', and a method's maths module
imports shared modules only (tests/test_layering.py); core/fedlog.py and core/fedpft.py keep
their names for them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from headway.core.settings import Settings

# what one release is, per FedLog DP mode ("distributed": noise shares added by the clients
# before secure aggregation, with the total σ of central DP, so it is accounted as central)
FEDLOG_RELEASED = {
    "central": "the sum of the sampled clients' statistics T plus N(0, σ²I), drawn once by the server",
    "distributed": "the securely aggregated sum of the clients' statistics T, each noised by N(0, σ²/(min-replies − w) · I) before "
    "masking (w = fedlog-dp-withholding): a sum of at least min-replies clients, at most w of which withhold their share, "
    "carries at least N(0, σ²I)",
    "local": "each client's own statistics T plus N(0, σ²I), drawn by the client",
}
NEIGHBOURING = "add or remove one training example of one client"


# ----- calibration: the σ each mode adds ------------------------------------------------------


def fedlog_sigma(epsilon: float, delta: float, m: int, clip: float, rounds: int) -> float:
    """Theorem 7: σ = sqrt(8k(1+(m−1)b²)·ln(e+ε/δ))/ε for k rounds, m features, bound b."""
    return math.sqrt(8.0 * rounds * (1.0 + (m - 1) * clip**2) * math.log(math.e + epsilon / delta)) / epsilon


def fedlog_releases(cfg: Settings) -> int:
    """k, the number of times a client's statistics are released in a run: every round,
    plus the statistics round that starts the head when fedlog-init=stats."""
    return cfg.num_server_rounds + (1 if cfg.fedlog.init == "stats" else 0)


def fedlog_noise_sigma(cfg: Settings, m: int) -> float:
    """σ of the Gaussian noise for the run's DP mode (0 when fedlog-dp=off): on each client's
    statistics (local), or on their sum (central; distributed, where it is the clients' shares together)."""
    if cfg.fedlog.dp == "off":
        return 0.0
    return fedlog_sigma(cfg.fedlog.epsilon, cfg.fedlog.delta, m, cfg.fedlog.clip, fedlog_releases(cfg))


def fedlog_share_sigma(cfg: Settings, m: int) -> float:
    """fedlog-dp=distributed: the σ each client adds, σ/√(min-replies − w) with w = fedlog-dp-withholding,
    so that any sum the server accepts (at least min-replies clients' statistics, or the round fails)
    carries at least the central σ of Theorem 7 even when w of its clients add no noise. 0 in the other modes."""
    if cfg.fedlog.dp != "distributed":
        return 0.0
    return fedlog_noise_sigma(cfg, m) / math.sqrt(cfg.min_replies - cfg.fedlog.dp_withholding)


def fedpft_sigma(n: int, epsilon: float, delta: float) -> float:
    """Theorem 4.1's noise scale for a class of n examples with ‖f‖₂ ≤ 1:
    4/(n·ε) · sqrt(5·ln(4/δ))."""
    return 4.0 / (n * epsilon) * math.sqrt(5.0 * math.log(4.0 / delta))


def fedpft_delta(n: int, delta: float) -> float:
    """δ of a class: the configured one, or 1/n when it is 0."""
    return delta if delta > 0 else 1.0 / n


# ----- accounting: what an accountant needs of each release ------------------------------------


@dataclass(frozen=True)
class GaussianRelease:
    """``releases`` Gaussian mechanisms of std ``sigma`` on a statistic of L2 sensitivity
    ``sensitivity``, meant to be (``epsilon``, ``delta``)-DP by the paper's calibration."""

    sigma: float
    sensitivity: float
    releases: int
    epsilon: float
    delta: float

    @property
    def noise_multiplier(self) -> float:
        """z = σ/Δ₂: what the privacy loss of a Gaussian mechanism depends on."""
        return self.sigma / self.sensitivity


def fedlog_sensitivity(m: int, clip: float) -> float:
    """Δ₂ of T = Σ φ ⊗ e_y to one example: adding or removing it changes one row of T by
    [1, φ] with |φ_j| ≤ b (the clip), so Δ₂ = sqrt(1 + (m−1)·b²) (fedlog-extended App. C, Eq. 15–18)."""
    return math.sqrt(1.0 + (m - 1) * clip**2)


def fedlog_release(cfg: Settings, m: int) -> GaussianRelease | None:
    """The Gaussian release of DP-FedLog under the run config (None when fedlog-dp=off):
    σ of Theorem 7 for k = every release of the run, m statistics per class (the constant 1
    included). central, local and distributed share σ, Δ₂ and k; they differ in who adds
    the noise and what one release is (:data:`FEDLOG_RELEASED`)."""
    mode = cfg.fedlog.dp
    if mode == "off":
        return None
    if mode not in FEDLOG_RELEASED:
        raise ValueError(f"fedlog-dp={mode!r} has no privacy accounting here (known: off, {', '.join(FEDLOG_RELEASED)})")
    return GaussianRelease(
        sigma=fedlog_noise_sigma(cfg, m),
        sensitivity=fedlog_sensitivity(m, cfg.fedlog.clip),
        releases=fedlog_releases(cfg),
        epsilon=cfg.fedlog.epsilon,
        delta=cfg.fedlog.delta,
    )


def fedpft_sensitivity(n: int) -> float:
    """Δ₂ of a class's (mean, covariance) to one example when every feature has ‖f‖₂ ≤ 1:
    sqrt((2/n)² + (6/n)²) = 2·sqrt(10)/n (fedpft, proof of Theorem 4.1, App. B)."""
    return 2.0 * math.sqrt(10.0) / n


def fedpft_release(epsilon: float, delta: float, n: int) -> GaussianRelease:
    """One class's DP-FedPFT release (one shot: released once) for a class of n examples;
    ``delta`` 0 means 1/n (:func:`fedpft_delta`). Each example is in one class,
    so a client's release costs each of its examples only its class's release."""
    class_delta = fedpft_delta(n, delta)
    return GaussianRelease(
        sigma=fedpft_sigma(n, epsilon, class_delta),
        sensitivity=fedpft_sensitivity(n),
        releases=1,
        epsilon=epsilon,
        delta=class_delta,
    )


def withheld_release(cfg: Settings, m: int, withholding: int) -> GaussianRelease:
    """fedlog-dp=distributed: the release when ``withholding`` clients of the smallest accepted sum
    (min-replies clients) add no noise share: σ_share·√(min-replies − withholding), which is the
    calibrated σ for ``withholding`` = fedlog-dp-withholding and less for more (a weaker guarantee)."""
    noising = cfg.min_replies - withholding
    if cfg.fedlog.dp != "distributed" or not 0 < noising <= cfg.min_replies:
        raise ValueError(f"withholding must be in 0..min-replies-1 under fedlog-dp=distributed, got {withholding}")
    return GaussianRelease(
        sigma=fedlog_share_sigma(cfg, m) * math.sqrt(noising),
        sensitivity=fedlog_sensitivity(m, cfg.fedlog.clip),
        releases=fedlog_releases(cfg),
        epsilon=cfg.fedlog.epsilon,
        delta=cfg.fedlog.delta,
    )
