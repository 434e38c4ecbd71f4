"""FedLog maths (fedlog-extended §3.2–3.6): sufficient statistics, the exact MAP head
of Eq. 12, FedLog-C's class means, and the statistic checks and DP noise of App. C.

Everything here works on numpy arrays; the torch side (features with a constant 1)
lives in the client procedure.

The MAP problem  max_η  Σ_y η_y·S_y − N·log Σ_y exp(‖η_y‖²/4),  S = χ + Φ, N = ν + n,
is concave. At its maximizer η_y = 2 S_y / (N p_y) with p = softmax(‖η_y‖²/4), so η_y
is parallel to S_y: η_y = 2 z_y S_y/‖S_y‖ where z_y = ‖η_y‖/2 solves
z_y exp(z_y²) = (‖S_y‖/N)·Z and Σ_y exp(z_y²) = Z. For each candidate log Z the z_y
follow from a monotone scalar equation; the one log Z with Σ p_y = 1 is found by
bracketed root finding. The result is the maximizer to machine precision, not the
end of a fixed number of gradient steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from headway.core import privacy, statistics
from headway.core.aggregate import MIN_MEANS_TO_CLIP, cut_to_norm
from scipy.optimize import brentq
from scipy.special import logsumexp

# the per-class sums and the DP calibration are shared with other methods (FedProto's prototypes,
# the privacy accounting), so they live in shared modules; FedLog's names for them stay
sufficient_statistics = statistics.class_sums
dp_sigma = privacy.fedlog_sigma
releases = privacy.fedlog_releases
noise_sigma = privacy.fedlog_noise_sigma
share_sigma = privacy.fedlog_share_sigma


def _log_z_of(v_rhs: np.ndarray) -> np.ndarray:
    """Solve v + exp(2v) = r for v (elementwise; the left side is convex and increasing)."""
    r = v_rhs
    v = np.where(r > 1.0, 0.5 * np.log(np.maximum(r, 1.0)), r)  # a start with g(v) >= r
    for _ in range(200):
        e = np.exp(2.0 * v)
        step = (v + e - r) / (1.0 + 2.0 * e)
        v = v - step
        if np.all(np.abs(step) <= 1e-15 * np.maximum(1.0, np.abs(v))):
            break
    return v


def _z_given(log_z: float, log_a: np.ndarray) -> np.ndarray:
    """z_y = ‖η_y‖/2 for a candidate log Z: z e^{z²} = a Z, i.e. log z + z² = log a + log Z."""
    z = np.zeros_like(log_a)
    pos = np.isfinite(log_a)
    z[pos] = np.exp(_log_z_of(log_a[pos] + log_z))
    return z


def solve_head(stats: np.ndarray, count: float, chi: np.ndarray | float | None = None, nu: float = 1.0) -> np.ndarray:
    """The MAP head η (classes × m) of FedLog Eq. 12 from summed statistics and count."""
    stats = np.asarray(stats, dtype=np.float64)
    if stats.ndim != 2:
        raise ValueError(f"stats must be a classes × m array, got shape {stats.shape}")
    s = stats + (0.0 if chi is None else np.asarray(chi, dtype=np.float64))
    n_total = float(nu) + float(count)
    if not n_total > 0:
        raise ValueError(f"nu + count must be > 0, got nu={nu}, count={count}")
    if not np.all(np.isfinite(s)):
        raise ValueError("stats (plus chi) contain NaN or Inf")
    classes = s.shape[0]
    norms = np.linalg.norm(s, axis=1)
    with np.errstate(divide="ignore"):
        log_a = np.log(norms / n_total)  # -inf where S_y = 0

    def excess(log_z: float) -> float:
        z = _z_given(log_z, log_a)
        return float(logsumexp(z**2) - log_z)  # log Σ p_y: decreasing in log Z

    lo = math.log(classes)
    a_max = float(np.exp(np.max(log_a))) if np.any(np.isfinite(log_a)) else 0.0
    hi = lo + (classes * a_max) ** 2 + 1.0
    if excess(lo) <= 0.0:
        log_z = lo  # only when every S_y = 0: η = 0
    else:
        while excess(hi) > 0.0:  # the bound above holds; widening guards rounding
            hi = lo + 2.0 * (hi - lo)
        log_z = brentq(excess, lo, hi, xtol=1e-15, rtol=4 * np.finfo(float).eps, maxiter=500)
    z = _z_given(log_z, log_a)
    eta = np.zeros_like(s)
    pos = norms > 0
    eta[pos] = (2.0 * z[pos] / norms[pos])[:, None] * s[pos]
    return eta


def stationarity_residual(
    eta: np.ndarray, stats: np.ndarray, count: float, chi: np.ndarray | float | None = None, nu: float = 1.0
) -> float:
    """max relative gap between η_y and 2(χ+Φ)_y/((ν+n)p_y), p = softmax(‖η_y‖²/4)."""
    s = np.asarray(stats, dtype=np.float64) + (0.0 if chi is None else chi)
    q = np.sum(eta**2, axis=1) / 4.0
    p = np.exp(q - logsumexp(q))
    target = 2.0 * s / ((nu + count) * p[:, None])
    return float(np.max(np.abs(eta - target)) / max(np.max(np.abs(target)), 1e-300))


def downlink_statistics(stats: np.ndarray) -> tuple[np.ndarray, float]:
    """Φ as ``fedlog-c-downlink=stats`` sends it (float32), back in float64, and the count n read from
    its count column: the server solves η from these very values, so a client's solve of the same
    array gives the server's η bit for bit, and nothing but Φ goes down."""
    phi = np.asarray(stats, dtype=np.float64).astype(np.float32).astype(np.float64)
    return phi, max(float(np.sum(phi[:, 0])), 0.0)


def head_from_downlink(stats: np.ndarray | None, shape: tuple[int, int], chi: float, nu: float) -> np.ndarray:
    """A client's η from the server's Φ (``fedlog-c-downlink=stats``, "clients can optimize the same η
    locally"): Eq. 12 solved from Φ and its count column, or ValueError naming what the server sent wrong."""
    if stats is None:
        raise ValueError(
            "fedlog client: the server sent neither the head 'eta' nor the statistics 'stats-sum'; check that server and client run the same headway"
        )
    if stats.shape != shape:
        raise ValueError(
            f"fedlog client: the server's statistics have shape {stats.shape}, expected {shape} (classes × m); server and client disagree on the data set or body"
        )
    if not np.all(np.isfinite(stats)):
        raise ValueError("fedlog client: the server's statistics are not finite (NaN or Inf)")
    phi, n = downlink_statistics(stats)  # as sent: the very values the server solved from
    if not n + nu > 0:
        raise ValueError(
            f"fedlog client: the server's statistics count no examples (n = {n:g}) and fedlog-prior-nu is {nu:g}: no head to solve"
        )
    return solve_head(phi, n, chi=chi, nu=nu)


def class_means(stats: np.ndarray) -> np.ndarray:
    """FedLog-C's global class means Φ̄_y = Φ_y / Φ_{y,0} (rows with no data stay 0)."""
    counts = stats[:, :1]
    return np.divide(stats, counts, out=np.zeros_like(stats, dtype=np.float64), where=counts > 0)


def add_noise(stats: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """The Gaussian mechanism: stats + N(0, σ² I); σ = 0 returns stats unchanged."""
    if sigma <= 0:
        return stats
    return stats + rng.normal(0.0, sigma, size=stats.shape)


# A client's class mean counts at most this many times the reference norm (below); the default of the key
# fedlog-mean-cut. FedLog's bodies are never averaged, so each client's feature scale is its own: on honest
# MNIST runs (4 clients, 3 rounds, seed 0) the largest ratio of a class mean's norm to its reference was 1.39
# (iid, 1 local epoch), 1.41 (FedLog-C), 2.25 (bodies mnist-cnn and mlp), 1.85 / 1.91 (pathological, 4 / 10
# clients) and 3.34 (iid, 5 local epochs, where a factor of 3 cut 3 honest means and moved accuracy by 0.4
# points); an outside tester's 8x8 digits on image-cnn reached 5.21, which 5 cut to 5 (a 4 % scaling of one
# class mean: the cut scales to the bound, so an honest mean just above it barely changes). A liar's room
# grows with the factor (one liar of 4 on MNIST, FedLog-C: 0.861 at 5, 0.825 at 10; honest 0.867, uncut
# 0.164; means in another class's direction at 4.9x: 0.369), so 5 stays the default and the key raises it.
CLASS_MEAN_NORM_FACTOR = 5.0


@dataclass(frozen=True)
class MeansCut:
    """What :func:`clip_class_means` did in one round: class means cut, class means it could bound,
    classes it could not (fewer than 3 clients in the round), and the largest ratio of a class mean's
    norm to its reference before the cut (NaN when none was bounded): honest runs show their margin here."""

    cut: int
    bounded: int
    unbounded: int
    largest_ratio: float


def reference_norm(stats: Sequence[np.ndarray]) -> float | None:
    """The round's fallback reference: the median over clients of each client's median class-mean norm
    (one vote per client, however many classes it claims), or None with fewer than 3 clients holding data."""
    votes = [float(np.median(np.linalg.norm(class_means(t)[t[:, 0] > 0, 1:], axis=1))) for t in stats if np.any(t[:, 0] > 0)]
    return float(np.median(votes)) if len(votes) >= MIN_MEANS_TO_CLIP else None


def clip_class_means(stats: Sequence[np.ndarray], factor: float = CLASS_MEAN_NORM_FACTOR) -> tuple[list[np.ndarray], MeansCut]:
    """The clients' statistics T (classes × m: [count, feature sums]) with each class mean Σf/n cut to
    ``factor`` × a reference norm by scaling its sums (counts unchanged). The reference of a class is the
    median of its holders' mean norms where 3 or more clients hold it, else :func:`reference_norm`.
    Checks alone allow any mean in [0, b] with b = max-feature-value, far above honest scale: one client of
    four moved MNIST's head from 0.833 to 0.149 accuracy so. With an honest majority of a class's holders
    (or of the round's clients) the reference is an honest norm, and one client's sum of a class is at
    most its count × factor × that: it can still claim its whole count under one class, and steer the
    direction of its means."""
    out = [np.asarray(t, np.float64).copy() for t in stats]
    fallback = reference_norm(out)
    cut = bounded = unbounded = 0
    ratios: list[float] = []
    for y in range(out[0].shape[0]) if out else ():
        holders = [t for t in out if t[y, 0] > 0]
        means = [t[y, 1:] / t[y, 0] for t in holders]
        norms = [float(np.linalg.norm(v)) for v in means]
        ref = float(np.median(norms)) if len(holders) >= MIN_MEANS_TO_CLIP else fallback
        if ref is None:
            unbounded += len(holders) > 0
            continue
        kept, n_cut = cut_to_norm(means, factor * ref)
        for t, v in zip(holders, kept):
            t[y, 1:] = v * t[y, 0]
        cut, bounded = cut + n_cut, bounded + len(holders)
        ratios += [n / ref if ref > 0 else (math.inf if n > 0 else 0.0) for n in norms]
    return out, MeansCut(cut, bounded, unbounded, max(ratios, default=math.nan))


FLOAT16_EXACT_COUNT = 2048  # float16 holds every whole number up to 2^11


def mean_rows(stats: np.ndarray) -> np.ndarray:
    """T's rows as [n_c, Σf/n_c] (the class count, then the feature means): bounded like the
    features where sums are not, so they fit float16 (zero rows stay zero)."""
    rows = class_means(stats)
    rows[:, 0] = stats[:, 0]
    return rows


def sum_rows(rows: np.ndarray) -> np.ndarray:
    """Inverse of :func:`mean_rows`: [n_c, n_c · means] in float64."""
    rows = rows.astype(np.float64)
    return np.hstack([rows[:, :1], rows[:, :1] * rows[:, 1:]])


def uplink_array(stats: np.ndarray, sparse: bool, dtype: str) -> np.ndarray:
    """A client's statistics as sent: dense (classes × m) or its present rows with their
    class indices; under ``dtype`` float16 as [count, means] rows, in float32 instead when a
    count or class index is above 2048 (not exact in float16) or a mean beyond float16's range."""
    rows = mean_rows(stats) if dtype == "float16" else stats
    rows = present_rows(rows) if sparse else rows
    exact = max(stats[:, 0].max(initial=0.0), len(stats) - 1) <= FLOAT16_EXACT_COUNT  # counts and class indices
    if dtype == "float16" and exact:
        half = rows.astype(np.float16)
        if np.all(np.isfinite(half)):
            return half
    return rows.astype(np.float32)


def present_rows(stats: np.ndarray) -> np.ndarray:
    """The sparse uplink of T: one row [class index, T_c] for each class a client holds
    (class count > 0), in one array (a second array would cost more bytes than the indices).
    Lossless: every other row of T is zero."""
    classes = np.flatnonzero(stats[:, 0] > 0)
    return np.hstack([classes[:, None].astype(stats.dtype), stats[classes]])


def dense_statistics(rows: np.ndarray, num_classes: int) -> tuple[np.ndarray | None, str | None]:
    """T (num_classes × m, float64) rebuilt from sparse rows, or None and why they cannot be
    a client's (a class index not a whole number in range, or repeated; a row without examples)."""
    index, values = rows[:, 0], rows[:, 1:]
    if not np.all(np.isfinite(index)) or np.any(index != np.round(index)) or np.any((index < 0) | (index >= num_classes)):
        return None, f"a class index is not a whole number in 0..{num_classes - 1}"
    classes = index.astype(np.int64)
    if len(np.unique(classes)) != len(classes):
        return None, "a class index is repeated"
    if np.any(~(values[:, 0] > 0)):
        return None, "a sent row has no examples (class count <= 0 or NaN); only classes a client holds are sent"
    dense = np.zeros((num_classes, values.shape[1]), np.float64)
    dense[classes] = values
    return dense, None


@dataclass(frozen=True)
class StatsCheck:
    """What a valid reply looks like: shape, and the bounds the features obey."""

    num_classes: int
    m: int
    clip: float = 0.0  # b, the bound on |feature| (the clip, or max-feature-value); 0: unbounded
    noise_sigma: float = 0.0  # local-DP noise on every entry (loosens the bounds)
    count_known: bool = True  # False under local DP: the count is the noised count row itself
    precision: float = 0.0  # relative rounding of the sent values (float16 means in the normal range: 2^-11), allowed past the bound
    nonnegative: bool = False  # every body's features are >= 0 (a ReLU): no feature sum can be negative

    def problem(self, stats: np.ndarray, count: float, max_count: float = math.inf) -> str | None:
        """Why a (stats, count) reply cannot be real, or None when it can. ``max_count`` is
        the most examples the sender can hold; under local DP, where no count is sent, it
        bounds the noised count row (each class, and their total, within 8σ of it)."""
        if stats.shape != (self.num_classes, self.m):
            return f"statistics have shape {stats.shape}, expected {(self.num_classes, self.m)}"
        if not np.all(np.isfinite(stats)):
            return "statistics contain NaN or Inf"
        if self.count_known and (not math.isfinite(count) or count < 0 or count != round(count)):
            return f"count is {count}, expected a whole number >= 0"
        slack = 8.0 * self.noise_sigma  # far beyond the noise: a reply past it is not noise
        per_class = stats[:, 0]  # the constant feature: the class counts
        if np.any(per_class < -slack - 1e-6):
            return "a class count (first feature sum) is negative"
        if self.noise_sigma == 0:
            # without noise on the reply a class count is a count of examples: a fraction of one
            # would let a tiny count carry sums that set the class mean to anything (sums / count)
            if np.any(per_class != np.round(per_class)):
                return "a class count (first feature sum) is not a whole number of examples"
            if np.any((per_class == 0) & np.any(stats[:, 1:] != 0, axis=1)):
                return "a class with no examples has non-zero feature sums"
        if self.count_known and abs(per_class.sum() - count) > slack * math.sqrt(self.num_classes) + 1e-4 * max(count, 1.0):
            return f"class counts sum to {per_class.sum():.6g}, not the reported count {count:g}"
        if not self.count_known:  # the noised count row is all there is: bound it by what the client can hold
            if np.any(per_class > max_count + slack):
                return f"a class count ({per_class.max():.6g}) exceeds the {max_count:g} examples the sender (one client, or those in a secure sum) can hold plus 8 noise std ({slack:.4g})"
            total, spread = per_class.sum(), slack * math.sqrt(self.num_classes)  # the total's noise has std σ√C
            if total > max_count + spread:
                return (
                    f"class counts sum to {total:.6g}, beyond the {max_count:g} examples the sender (one client, or those in a secure sum) can hold "
                    f"plus 8 noise std of the sum ({spread:.4g})"
                )
            if total < -spread:  # each class may dip to -8σ by noise, but not all of them at once
                return f"class counts sum to {total:.6g}, below 0 by more than 8 noise std of the sum ({spread:.4g})"
        # under local DP both sides of a bound carry noise, so the margin covers the feature
        # noise and b times the count's: std σ·sqrt(1 + b²)
        margin = slack * math.sqrt(1.0 + self.clip**2) + 1e-4 * (1.0 + per_class.max(initial=0.0))
        if self.nonnegative and np.any(stats[:, 1:] < -margin):
            return "a feature sum is negative, but this run's bodies output features >= 0 (a ReLU): no data gives such a sum"
        if self.clip > 0:  # |feature sum| <= b * count
            bound = self.clip * (1.0 + self.precision) * np.maximum(per_class, 0.0)[:, None] + margin
            if np.any(np.abs(stats[:, 1:]) > bound):
                return f"a feature sum exceeds clip bound b={self.clip:g} times its class count (b: fedlog-clip, or max-feature-value when unclipped)"
        return None
