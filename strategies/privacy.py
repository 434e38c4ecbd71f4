"""ε of the DP modes' releases by Flower's RDP accountant (``flwr.supercore.privacy_accounting``,
backed by Google's dp-accounting), reported in summary.json beside the ε the paper's
calibration of σ promises. The releases themselves (σ, Δ₂, count) are :mod:`headway.core.privacy`'s.

No amplification by sampling is claimed: which clients train in a round is drawn from the
run seed and is no secret (the server logs who took part), and the statistics round and
FedPFT's one shot ask every client."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

import numpy as np
from flwr.supercore.privacy_accounting import GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, SamplingMethod
from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant
from headway.core.fedlog import add_noise, share_sigma
from headway.core.privacy import FEDLOG_RELEASED, NEIGHBOURING, GaussianRelease, fedlog_release, fedpft_release, withheld_release
from headway.core.settings import Settings


class Release(Protocol):
    """What the server releases of a round's summed statistics ``phi`` of ``n`` examples: (phi, n) as the head is solved from."""

    def __call__(self, phi: np.ndarray, n: float) -> tuple[np.ndarray, float]: ...  # noqa: D102


def exact_release(phi: np.ndarray, n: float) -> tuple[np.ndarray, float]:
    """The sum as it is (no central DP)."""
    return phi, n


@dataclass(frozen=True)
class CentralNoise:
    """DP-FedLog's central mode, wrapped around the method's aggregation: the sum is noised once with
    σ from OS entropy, and n is read from its noised count row (the head is then post-processing of the
    release; the clean n would release the round's total count)."""

    sigma: float
    stream: np.random.Generator

    def __call__(self, phi: np.ndarray, n: float) -> tuple[np.ndarray, float]:
        """The noised sum and the count its count row gives (at least 0)."""
        noised = add_noise(phi, self.sigma, self.stream)
        return noised, max(float(np.sum(noised[:, 0])), 0.0)


def release_for(dp: str, sigma: float, private: np.random.Generator) -> Release:
    """The run's release of FedLog's summed statistics: with central noise under ``fedlog-dp=central``, else exact."""
    return CentralNoise(sigma, private) if dp == "central" else exact_release


def _backend() -> str:
    try:
        return f"dp-accounting {version('dp-accounting')}"
    except PackageNotFoundError:
        return "dp-accounting missing"


ACCOUNTANT = f"flwr.supercore.privacy_accounting.RdpAccountant ({_backend()}): Gaussian releases composed, no amplification by sampling"


# Rényi orders tried: dp-accounting's defaults are 1.1..10.9 by 0.1, 11..63, then 128, 256, 512,
# 1024, which can cost ε several per cent when the best order falls in a gap (small ε, small δ);
# here every whole order up to 256, then every 16th up to 4096
ORDERS = tuple([1 + x / 10 for x in range(1, 100)] + list(range(11, 256)) + list(range(256, 4097, 16)))


@lru_cache(maxsize=4096)
def rdp_epsilon(noise_multiplier: float, releases: int, delta: float) -> tuple[float, float]:
    """(ε at δ, the Rényi order that gives it) of ``releases`` Gaussian mechanisms with
    noise multiplier z = σ/Δ₂, by Flower's RdpAccountant (add or remove one, no sampling).
    The "population" is one unit, the unit Δ₂ is measured for; without amplification the
    accountant uses nothing else of it."""
    config = PrivacyConfig(
        target_delta=delta,
        population_size=1,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION,
    )
    accountant = RdpAccountant(config, orders=ORDERS)
    accountant.compose(GaussianPrivacyEvent(noise_multiplier=noise_multiplier, sample_size=1, population_size=1), count=releases)
    spent = accountant.get_privacy_spent()
    assert spent.optimal_order is not None  # the RDP backend always names its order
    return spent.epsilon, spent.optimal_order


def release_epsilon(release: GaussianRelease) -> tuple[float, float]:
    """:func:`rdp_epsilon` of a release at its own δ."""
    return rdp_epsilon(release.noise_multiplier, release.releases, release.delta)


def fedlog_dp_report(settings: Settings, m: int) -> dict[str, Any] | None:
    """DP-FedLog's report for summary.json (None when fedlog-dp=off): the paper's ε (what
    Theorem 7's σ is calibrated for) beside the RDP ε of the same noise, both at fedlog-delta."""
    release = fedlog_release(settings, m)
    if release is None:
        return None
    epsilon_rdp, order = release_epsilon(release)
    extra: dict[str, Any] = {}
    if settings.fedlog.dp == "distributed":  # ε holds while at most w clients of a sum withhold their share; what more would cost
        w = settings.fedlog.dp_withholding
        extra = {
            "withholding_clients": w,
            "assumption": f"at most {w} of the at least min-replies={settings.min_replies} clients in an accepted sum withhold "
            "their noise share (undetectable under secure aggregation); epsilon and epsilon_rdp hold only under it",
            "share_sigma": share_sigma(settings, m),
            "epsilon_rdp_if_withholding": {
                str(k): release_epsilon(withheld_release(settings, m, k))[0] for k in range(settings.min_replies)
            },
        }
    return {
        "mode": settings.fedlog.dp,
        "epsilon": release.epsilon,
        "delta": release.delta,
        "clip": settings.fedlog.clip,
        "k": release.releases,
        "sigma": release.sigma,
        "sensitivity": release.sensitivity,
        "noise_multiplier": release.noise_multiplier,
        "epsilon_rdp": epsilon_rdp,
        "rdp_order": order,
        "neighbouring": NEIGHBOURING,
        "release": FEDLOG_RELEASED[settings.fedlog.dp],
        "accountant": ACCOUNTANT,
        **extra,
    }


def fedpft_dp_report(epsilon: float, delta: float, counts: list[int]) -> dict[str, Any]:
    """DP-FedPFT's report for the classes received (their example counts): the configured
    per-class ε beside the RDP ε of each class's release (one shot) at its δ; the worst class
    is reported (with a fixed δ every class has the same z = sqrt(2·ln(4/δ))/ε, so the same ε)."""
    releases = [fedpft_release(epsilon, delta, int(n)) for n in counts]
    sigmas = [r.sigma for r in releases]
    worst = max(((release_epsilon(r), r) for r in releases), key=lambda item: item[0][0], default=None)
    return {
        "epsilon": epsilon,
        "delta": delta or "1/n per class",
        "sigma_min": float(np.min(sigmas)) if sigmas else None,
        "sigma_median": float(np.median(sigmas)) if sigmas else None,
        "sigma_max": float(np.max(sigmas)) if sigmas else None,
        "releases": 1,
        "noise_multiplier": worst[1].noise_multiplier if worst else None,
        "epsilon_rdp": worst[0][0] if worst else None,
        "delta_rdp": worst[1].delta if worst else None,
        "rdp_order": worst[0][1] if worst else None,
        "neighbouring": NEIGHBOURING,
        "accountant": ACCOUNTANT,
        "not_covered": "the class counts, sent in the clear (σ depends on them)",
    }
