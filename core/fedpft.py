"""FedPFT's maths without Flower (Beitollahi et al., §4): per-class Gaussian mixtures of a
client's features as a float16 payload, the server's checks of that payload, synthetic
features drawn from it, the linear head trained on them, and DP-FedPFT (Theorem 4.1).

The payload of one client (array names in :mod:`headway.core.protocol`):

- ``gmm-classes`` int32 (m, 3): for each class sent, its label, its number of examples
  and its number of components K_c (rows are the classes' mixtures, in this order);
- ``gmm-weights`` float16 (R,), ``gmm-means`` float16 (R, d) and ``gmm-covariances``
  float16 (R,) spherical, (R, d) diag or (R, d(d+1)/2) full (the upper triangle), where
  R = Σ K_c counts the components of all classes, stacked class after class.

So the float16 values are exactly Eqs. 9–11 summed over the classes sent (with K_c for
K), and the class table adds 12 bytes a class.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from headway.core import privacy
from headway.core import protocol as P
from headway.core.extractors import configured_features
from headway.core.gmm import (
    RESTARTS,
    Mixture,
    fit_gmm,
    pack_symmetric,
    packed_dim,
    project_psd,
    sample,
    unpack_symmetric,
)
from headway.core.settings import Settings

FLOAT16_TINY = float(np.finfo(np.float16).tiny)  # 2^-14: smallest normal float16; variances are floored here before sending
WEIGHT_SUM_TOLERANCE = 1e-2  # float16 weights of a class must sum to 1 within this
PSD_TOLERANCE = 1e-2  # a full covariance's most negative eigenvalue may be this fraction of its largest (float16 rounding)


@dataclass
class ClassMixture:
    """One class's mixture as numpy arrays (float64), with the examples it summarizes."""

    label: int
    count: int
    weights: np.ndarray  # (k,)
    means: np.ndarray  # (k, d)
    covariances: np.ndarray  # (k,), (k, d) or (k, d, d)
    covariance: str

    def as_mixture(self, dtype: torch.dtype = torch.float32) -> Mixture:
        """This class's parameters as a one-group batched :class:`Mixture`, the shape the sampler and EM take."""
        t = lambda a: torch.as_tensor(a, dtype=dtype)[None]  # noqa: E731
        return Mixture(t(self.weights), t(self.means), t(self.covariances), self.covariance)


def components_for(count: int, k: int) -> int:
    """K_c: the components a class of ``count`` examples gets, at most K and at least
    two examples per component (K is reduced for small classes, never below 1)."""
    return max(1, min(k, count // 2))


def fit_class_mixtures(
    features: torch.Tensor,
    labels: np.ndarray,
    k: int,
    covariance: str,
    min_examples: int,
    reg_covar: float,
    tol: float,
    max_iter: int,
    init: str,
    seed: int,
    device: torch.device | str = "cpu",
    restarts: int = RESTARTS,
) -> tuple[list[ClassMixture], np.ndarray]:
    """One mixture per class holding at least ``min_examples`` examples, all classes in
    one batched EM, each from ``restarts`` starts (the likeliest kept: ``fedpft-em-restarts``);
    returns them and each fitted class's mean log-likelihood."""
    labels = np.asarray(labels)
    classes = [int(c) for c in np.unique(labels) if int(np.sum(labels == c)) >= min_examples]
    if not classes:
        return [], np.zeros(0)
    groups = [features[torch.as_tensor(labels == c)] for c in classes]
    ks = [components_for(len(g), k) for g in groups]
    fit = fit_gmm(
        groups,
        max(ks),
        covariance,
        k_per_group=ks,
        reg_covar=reg_covar,
        tol=tol,
        max_iter=max_iter,
        init=init,
        seed=seed,
        device=device,
        restarts=restarts,
    )
    mix = fit.mixture
    out = []
    for b, (c, kc) in enumerate(zip(classes, ks)):
        out.append(
            ClassMixture(
                c,
                len(groups[b]),
                mix.weights[b, :kc].double().cpu().numpy(),
                mix.means[b, :kc].double().cpu().numpy(),
                mix.covariances[b, :kc].double().cpu().numpy(),
                covariance,
            )
        )
    return out, fit.log_likelihood


def features(cfg: Settings, dataset: str, x: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """FedPFT's features of inputs ``x``: the configured extractor's (cached on disk), on
    the unit sphere under DP. Clients and the server compute them the same way."""
    f = configured_features(cfg, dataset, x, device)
    return normalize(f) if cfg.fedpft.dp == "on" else f


# ----- the wire ---------------------------------------------------------------------
def encode(mixtures: list[ClassMixture], dim: int, covariance: str) -> dict[str, np.ndarray]:
    """The float16 payload of ``mixtures`` (see the module docstring)."""
    table = np.array([[m.label, m.count, len(m.weights)] for m in mixtures], dtype=np.int32).reshape(-1, 3)
    if mixtures:
        weights = np.concatenate([m.weights for m in mixtures])
        means = np.concatenate([m.means for m in mixtures])
        covs = np.concatenate([m.covariances for m in mixtures])
    else:
        weights, means = np.zeros(0), np.zeros((0, dim))
        covs = np.zeros((0,) + covariance_shape(dim, covariance))
    if covariance == "full":
        covs = pack_symmetric(covs)
    else:
        covs = np.maximum(covs, FLOAT16_TINY)  # a variance must stay > 0 in float16
    return {
        P.GMM_CLASSES: table,
        P.GMM_WEIGHTS: weights.astype(np.float16),
        P.GMM_MEANS: means.astype(np.float16),
        P.GMM_COVARIANCES: covs.astype(np.float16),
    }


def covariance_shape(dim: int, covariance: str, packed: bool = False) -> tuple[int, ...]:
    """Shape of one component's covariance: () spherical, (d,) diag, (d, d) full or
    (d(d+1)/2,) full as sent."""
    if covariance == "spherical":
        return ()
    if covariance == "diag":
        return (dim,)
    return (packed_dim(dim),) if packed else (dim, dim)


class PayloadCheck:
    """The server's checks of one decoded GMM payload (every reply is untrusted)."""

    def __init__(
        self,
        num_classes: int,
        dim: int,
        k: int,
        covariance: str,
        max_value: float,
        min_examples: int = 1,
        value_range: tuple[float, float] | None = None,
    ):
        self.num_classes, self.dim, self.k, self.covariance, self.max_value = num_classes, dim, k, covariance, max_value
        self.min_examples = min_examples
        self.value_range = value_range  # where every feature lies (the extractor's range): means must lie there too

    def structure(self, arrays: dict[str, np.ndarray]) -> str | None:
        """Names, dtypes, shapes and finiteness (what the server's reply decoding already
        ensures; a client re-checking relayed mixtures needs it here)."""
        missing = [k for k in (P.GMM_CLASSES, P.GMM_WEIGHTS, P.GMM_MEANS, P.GMM_COVARIANCES) if k not in arrays]
        if missing:
            return f"missing arrays {missing}"
        table, w, mu, cov = (arrays[k] for k in (P.GMM_CLASSES, P.GMM_WEIGHTS, P.GMM_MEANS, P.GMM_COVARIANCES))
        if not np.issubdtype(table.dtype, np.integer) or table.ndim != 2 or table.shape[1] != 3 or len(table) > self.num_classes:
            return f"class table of shape {table.shape} and dtype {table.dtype}, expected integers (m <= {self.num_classes}, 3)"
        r = len(w)
        want = {
            P.GMM_WEIGHTS: (r,),
            P.GMM_MEANS: (r, self.dim),
            P.GMM_COVARIANCES: (r, *covariance_shape(self.dim, self.covariance, packed=True)),
        }
        for name, shape in want.items():
            a = arrays[name]
            if a.shape != shape or not np.issubdtype(a.dtype, np.floating):
                return f"array {name!r} is {a.dtype} {a.shape}, expected floats {shape}"
            if not np.all(np.isfinite(a)):
                return f"array {name!r} contains NaN or Inf"
        if r > self.num_classes * self.k:
            return f"{r} components, more than {self.num_classes} classes × K={self.k}"
        return None

    def decode(self, arrays: dict[str, np.ndarray], max_examples: int | None) -> tuple[list[ClassMixture] | None, str | None]:
        """(mixtures, None) when the payload is sound, else (None, the reason)."""
        if problem := self.structure(arrays):
            return None, problem
        table = arrays[P.GMM_CLASSES].astype(np.int64)
        weights = arrays[P.GMM_WEIGHTS].astype(np.float64)
        means = arrays[P.GMM_MEANS].astype(np.float64)
        covs = arrays[P.GMM_COVARIANCES].astype(np.float64)
        labels, counts, ks = table[:, 0], table[:, 1], table[:, 2]
        if np.any((labels < 0) | (labels >= self.num_classes)):
            return None, f"class labels {sorted(set(labels.tolist()))[:5]} outside 0..{self.num_classes - 1}"
        if len(set(labels.tolist())) != len(labels):
            return None, "a class is sent twice"
        if np.any(counts < 1):
            return None, "a class count below 1"
        if max_examples is not None and int(counts.sum()) > max_examples:
            return None, f"class counts sum to {int(counts.sum())}, more than the {max_examples} examples this client holds"
        if np.any(counts < self.min_examples):
            return None, f"a class of {int(counts.min())} examples, fewer than fedpft-min-class-examples={self.min_examples}"
        if np.any((ks < 1) | (ks > [components_for(int(n), self.k) for n in counts])):
            return None, f"components per class must be in 1..min(K={self.k}, examples // 2)"
        if int(ks.sum()) != len(weights):
            return None, f"the class table names {int(ks.sum())} components, the arrays hold {len(weights)}"
        if np.any(weights < 0) or np.any(weights > 1):
            return None, "mixture weights outside [0, 1]"
        if np.any(np.abs(means) > self.max_value):
            return None, f"a mean entry beyond ±{self.max_value:g} (max-feature-value)"
        if self.value_range is not None:
            lo, hi = self.value_range
            tol = 1e-3 + 2.0**-10 * max(abs(lo), abs(hi) if math.isfinite(hi) else 0.0, 1.0)  # float16 rounding of the sent means
            if np.any(means < lo - tol) or np.any(means > hi + tol):
                return None, f"a mean entry outside [{lo:.4g}, {hi:.4g}], the range of the extractor's features: no data gives such a mean"
        if self.covariance != "full" and np.any(covs <= 0):
            return None, "a variance <= 0"
        if np.any(np.abs(covs) > self.max_value**2):
            return None, f"a covariance entry beyond {self.max_value**2:g} (max-feature-value²)"
        out, start = [], 0
        for label, count, kc in zip(labels, counts, ks):
            sl = slice(start, start + int(kc))
            start += int(kc)
            if abs(weights[sl].sum() - 1.0) > WEIGHT_SUM_TOLERANCE:
                return None, f"class {int(label)}: mixture weights sum to {weights[sl].sum():.4f}, not 1"
            cov = covs[sl]
            if self.covariance == "full":
                cov, problem = self._full(cov)
                if problem:
                    return None, f"class {int(label)}: {problem}"
            out.append(ClassMixture(int(label), int(count), weights[sl] / weights[sl].sum(), means[sl], cov, self.covariance))
        return out, None

    def _full(self, packed: np.ndarray) -> tuple[np.ndarray, str | None]:
        """Unpack full covariances; reject the non-PSD ones (beyond float16 rounding) and
        lift the rounding's small negative eigenvalues to a positive floor."""
        cov = unpack_symmetric(packed, self.dim)
        diag = np.diagonal(cov, axis1=-2, axis2=-1)
        if np.any(diag <= 0):
            return cov, "a covariance with a diagonal entry <= 0"
        bound = np.sqrt(diag[..., :, None] * diag[..., None, :]) * (1 + WEIGHT_SUM_TOLERANCE) + FLOAT16_TINY
        if np.any(np.abs(cov) > bound):
            return cov, "a covariance entry larger than its variances allow (|Σ_ij|² > Σ_ii Σ_jj): not PSD"
        try:
            np.linalg.cholesky(cov)
            return cov, None
        except np.linalg.LinAlgError:
            pass
        vals = np.linalg.eigvalsh(cov)
        if np.any(vals[..., 0] < -PSD_TOLERANCE * vals[..., -1]):
            return cov, f"a covariance is not PSD (eigenvalue {vals[..., 0].min():.3g} against largest {vals[..., -1].max():.3g})"
        floor = max(FLOAT16_TINY, 1e-6 * float(vals[..., -1].max()))  # relative: a floor far below float64's reach of λmax is no floor
        cov = project_psd(cov, floor)
        try:
            np.linalg.cholesky(cov)  # exactly the factorization sampling will make
        except np.linalg.LinAlgError:
            return cov, "a covariance that stays singular after projection onto the PSD cone"
        return cov, None


# ----- synthetic features and the head ------------------------------------------------
def capped_counts(mixtures: list[ClassMixture], cap: int) -> list[int]:
    """How many synthetic features to draw per mixture: |F_{i,c}|, all scaled down
    proportionally (at least one each) when their sum exceeds ``cap``, so that claimed
    counts cannot make a server or a chain client draw and train on unbounded data."""
    counts = [m.count for m in mixtures]
    total = sum(counts)
    if total <= cap:
        return counts
    return [max(1, int(c * cap / total)) for c in counts]


def synthesize(
    mixtures: list[ClassMixture], generator: torch.Generator, counts: list[int] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """|F_{i,c}| (or ``counts``) synthetic features from every class mixture (Alg. 1 line
    14), with labels. Mixtures are sampled in float64, as :class:`PayloadCheck` factorized them."""
    xs, ys = [], []
    for j, m in enumerate(mixtures):
        n = m.count if counts is None else counts[j]
        xs.append(sample(m.as_mixture(torch.float64), [n], generator)[0].float())  # float64: the factorization the check made
        ys.append(torch.full((n,), m.label, dtype=torch.long))
    if not xs:
        return torch.zeros((0, 0)), torch.zeros(0, dtype=torch.long)
    return torch.cat(xs), torch.cat(ys)


def initial_head(dim: int, num_classes: int, generator: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A seeded linear head: weights uniform in ±1/sqrt(d) (torch's default range), bias 0."""
    bound = 1.0 / math.sqrt(dim)
    return torch.empty(num_classes, dim).uniform_(-bound, bound, generator=generator).numpy(), np.zeros(num_classes, np.float32)


def train_head(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    optimizer: str = "adamw",
    lr: float = 1e-4,
    epochs: int = 50,
    batch_size: int = 32,
    seed: int = 0,
    device: torch.device | str = "cpu",
    init: tuple[np.ndarray, np.ndarray] | None = None,
    extra_loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A linear head (weight (C, d), bias (C,)) trained by cross-entropy on (x, y)
    (Alg. 1 line 17; the paper: Adam 1e-4; the authors' Flower baseline: AdamW 1e-4,
    50 epochs, batch 32). ``init``: start from this head instead of :func:`initial_head`
    (FedAvg's local step); ``extra_loss(logits, batch indices)`` is added to the loss
    (a distillation term)."""
    gen = torch.Generator().manual_seed(int(seed))
    head = torch.nn.Linear(x.shape[1], num_classes)
    if init is None:  # drawn from ``gen`` itself, before the batch orders
        init = initial_head(x.shape[1], num_classes, gen)
    with torch.no_grad():
        head.weight.copy_(torch.as_tensor(init[0]))
        head.bias.copy_(torch.as_tensor(init[1]))
    head = head.to(device)
    opt = (torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam)(head.parameters(), lr=lr)
    x, y = x.to(device, torch.float32), y.to(device)
    n = len(y)
    for _ in range(epochs):
        order = torch.randperm(n, generator=gen).to(device)
        for i in range(0, n, batch_size):
            idx = order[i : i + batch_size]
            opt.zero_grad(set_to_none=True)
            logits = head(x[idx])
            loss = torch.nn.functional.cross_entropy(logits, y[idx])
            if extra_loss is not None:
                loss = loss + extra_loss(logits, idx)
            loss.backward()
            opt.step()
    return head.weight.detach().cpu().numpy(), head.bias.detach().cpu().numpy()


def head_logits(x: torch.Tensor, weight: np.ndarray, bias: np.ndarray) -> torch.Tensor:
    """The head's logits for features ``x``, with the weights as numpy arrays, so a head sent as a payload scores without building a module."""
    return x @ torch.as_tensor(weight, dtype=x.dtype, device=x.device).T + torch.as_tensor(bias, dtype=x.dtype, device=x.device)


# ----- DP-FedPFT (Theorem 4.1) -------------------------------------------------------------
# its calibration is core/privacy.py's (the accounting reads it too); FedPFT's names for it stay
dp_sigma = privacy.fedpft_sigma
dp_delta = privacy.fedpft_delta


def normalize(features: torch.Tensor) -> torch.Tensor:
    """f / ‖f‖₂: every feature on the unit sphere, so ‖f‖₂ ≤ 1 as Theorem 4.1 needs; the
    scale is fixed, never fitted to the data (a data-dependent scale would leak)."""
    return features / features.norm(dim=1, keepdim=True).clamp_min(1e-12)


def privatize(
    features: torch.Tensor, label: int, covariance: str, epsilon: float, delta: float, rng: np.random.Generator
) -> tuple[ClassMixture, float, float]:
    """One class's Gaussian (K = 1) released under (ε, δ)-DP: the sample mean and
    covariance plus N(0, σ²) on every entry sent, then projected onto the PSD cone (kept
    above float16's smallest normal). Diag and spherical releases are the full
    covariance's diagonal and its mean: their ℓ2 sensitivity is at most the full one's,
    so the same σ covers them. Returns the mixture, σ and δ used."""
    f = features.double().cpu().numpy()
    n, d = f.shape
    delta = dp_delta(n, delta)
    sigma = dp_sigma(n, epsilon, delta)
    mean = f.mean(0) + rng.normal(0.0, sigma, d)
    centred = f - f.mean(0)
    if covariance == "full":
        cov = centred.T @ centred / n
        noise = np.triu(rng.normal(0.0, sigma, (d, d)))
        noise = noise + np.triu(noise, 1).T  # one draw per entry sent (the upper triangle)
        cov = project_psd(cov + noise, FLOAT16_TINY)[None]
    elif covariance == "diag":
        cov = np.maximum((centred**2).mean(0) + rng.normal(0.0, sigma, d), FLOAT16_TINY)[None]
    else:
        cov = np.maximum(np.array([(centred**2).mean() + rng.normal(0.0, sigma)]), FLOAT16_TINY)
    return ClassMixture(label, n, np.ones(1), mean[None], cov, covariance), sigma, delta
