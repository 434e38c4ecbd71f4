"""Gaussian mixtures fitted by EM, batched over groups (FedPFT fits one mixture per class,
all classes of a client at once), in PyTorch so the same code runs on CPU and CUDA.

A batch is ``B`` groups of up to ``N`` points in ``d`` dimensions, padded, with a mask of
which points are real; each group may use fewer than ``K`` components (``k_per_group``).
Covariance families follow scikit-learn's names: ``full`` (K·d·d), ``diag`` (K·d) and
``spherical`` (K). EM runs in the features' dtype (``dtype``; float32 features fit in
float32, as scikit-learn fits them): points are centred per group (the centre accumulated in
float64), the E-step's expansion (x−μ)²/σ² = x²/σ² − 2xμ/σ² + μ²/σ² is one batched product
(two for diag, fused into one over [x², x]), and what rounding would spoil is float64: the
log-determinants, each group's mean log-likelihood, full covariances and their Cholesky
factors (float32 ones stop being factorizable with fewer points than dimensions). float32
rounding moves the mean log-likelihood by about 1e-4–1e-3 nats, the size of the default
tolerance, so there a change below ``tol`` or negative ends the fit (:func:`_converged`).
The start is scikit-learn's: greedy k-means++ seeds and Lloyd's steps to convergence, with
no centre left holding a single point.

scikit-learn's ``GaussianMixture`` is the oracle in the tests and the baseline in the
benchmark; it is not a runtime dependency.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

COVARIANCES = ("full", "diag", "spherical")
INITS = ("kmeans", "k-means++", "random")  # k-means++ seeds then Lloyd's steps; the seeds alone; random responsibilities
LLOYD_MAX_ITER = 300  # Lloyd steps at most (scikit-learn's); they stop when no label changes or as LLOYD_TOL says
LLOYD_TOL = 1e-4
LOG_2PI = math.log(2.0 * math.pi)


@dataclass
class Mixture:
    """B mixtures of up to K components: weights (B,K), means (B,K,d), covariances
    (B,K,d,d) full, (B,K,d) diag or (B,K) spherical. Unused components have weight 0."""

    weights: torch.Tensor
    means: torch.Tensor
    covariances: torch.Tensor
    covariance: str

    @property
    def dim(self) -> int:
        return int(self.means.shape[-1])


@dataclass
class FitResult:
    """A fitted batch: the mixtures, each group's mean log-likelihood per point, the EM
    iterations run and whether each group met the tolerance."""

    mixture: Mixture
    log_likelihood: np.ndarray  # (B,)
    iterations: int
    converged: np.ndarray  # (B,) bool


def pad_groups(groups: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack groups of points (n_b, d) into (B, N, d) with a (B, N) mask of real points."""
    if not groups:
        raise ValueError("no groups to fit")
    if len(groups) == 1:
        return groups[0][None], torch.ones((1, len(groups[0])), dtype=torch.bool, device=groups[0].device)
    d = groups[0].shape[1]
    n_max = max(len(g) for g in groups)
    x = groups[0].new_zeros((len(groups), n_max, d))
    mask = torch.zeros((len(groups), n_max), dtype=torch.bool, device=groups[0].device)
    for b, g in enumerate(groups):
        x[b, : len(g)] = g
        mask[b, : len(g)] = True
    return x, mask


def _component_mask(k_per_group: torch.Tensor, k: int) -> torch.Tensor:
    return torch.arange(k, device=k_per_group.device)[None, :] < k_per_group[:, None]


def _sqdist(a: torch.Tensor, b: torch.Tensor, a_sq: torch.Tensor | None = None, b_sq: torch.Tensor | None = None) -> torch.Tensor:
    """Squared distances (B,n,m) as ‖a‖² − 2ab + ‖b‖², one batched product (torch.cdist
    is several times slower here); ``a_sq``/``b_sq``: the norms when the caller has them."""
    a_sq = (a * a).sum(-1) if a_sq is None else a_sq
    b_sq = (b * b).sum(-1) if b_sq is None else b_sq
    # the factor 2 scales the product, never the (B,n,d) operand (that was a copy of x per call)
    return torch.baddbmm(a_sq[..., :, None] + b_sq[..., None, :], a, b.transpose(-1, -2), alpha=-2.0).clamp_min(0)


def _kmeans_pp(x: torch.Tensor, mask: torch.Tensor, k: int, gen: torch.Generator, x_sq: torch.Tensor) -> torch.Tensor:
    """Greedy k-means++ seeds (B,K,d), as scikit-learn draws them: the first uniformly
    among each group's points; for each next one, 2 + ⌊ln K⌋ candidates drawn with
    probability ∝ squared distance to the nearest seed so far, keeping the candidate
    that lowers the total squared distance most."""
    b = x.shape[0]
    rows = torch.arange(b, device=x.device)
    w = mask.to(x.dtype)
    trials = 2 + int(math.log(k))
    idx = torch.multinomial(w, 1, generator=gen).squeeze(1)
    seeds = [x[rows, idx]]
    nearest = _sqdist(x, seeds[0][:, None, :], x_sq)[..., 0] * w
    for _ in range(1, k):
        p = nearest.double().clamp_min(0)
        empty = p.sum(1) <= 0  # all points identical: pick uniformly
        p = torch.where(empty[:, None], w.double(), p)
        cand = torch.multinomial(p, trials, replacement=True, generator=gen)  # (B,T)
        pts = x[rows[:, None], cand]  # (B,T,d)
        dist = torch.minimum(nearest[:, None, :], _sqdist(pts, x, b_sq=x_sq) * w[:, None, :])  # (B,T,N)
        best = dist.double().sum(-1).argmin(1)
        seeds.append(pts[rows, best])
        nearest = dist[rows, best]
    return torch.stack(seeds, 1)


def _assign(x: torch.Tensor, centres: torch.Tensor, cmask: torch.Tensor, x_sq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each point's nearest centre (B,N) and its squared distance (B,N)."""
    dist = _sqdist(x, centres, x_sq).masked_fill(~cmask[:, None, :], float("inf"))  # (B,N,K)
    d2, label = dist.min(-1)
    return label, d2


def _kmeans(x: torch.Tensor, mask: torch.Tensor, cmask: torch.Tensor, gen: torch.Generator, lloyd: bool) -> torch.Tensor:
    """k-means labels (B,N): greedy k-means++ seeds, then (``lloyd``) Lloyd's steps until no
    label changes or the centres stop moving (scikit-learn's tolerance). A centre left holding a single point (k-means++ likes outliers) is
    moved to a point drawn uniformly from the cluster of largest squared error, which
    splits what it had merged, its points stop pulling any centre (they keep a label), and
    Lloyd's steps resume; at most K such moves a group."""
    k = cmask.shape[1]
    b, n, _ = x.shape
    rows = torch.arange(b, device=x.device)
    fmask = mask.to(x.dtype)
    x_sq = (x * x).sum(-1)
    centres = _kmeans_pp(x, mask, k, gen, x_sq)
    label, d2 = _assign(x, centres, cmask, x_sq)
    if not lloyd:
        return label
    ks = cmask.sum(1)
    can_move = mask.sum(1) >= 2 * ks  # only where every component can hold two points
    moves = torch.zeros(b, dtype=torch.long, device=x.device)
    outlier = torch.zeros_like(mask)
    # scikit-learn's stop: the centres moved less (summed squares) than 1e-4 × the mean variance
    tol = LLOYD_TOL * (x_sq.double() * fmask).sum(1) / (mask.sum(1) * x.shape[-1])  # x is centred
    for _ in range(LLOYD_MAX_ITER):
        onehot = torch.nn.functional.one_hot(label, k).to(x.dtype) * (fmask * ~outlier)[..., None]
        size = onehot.sum(1)  # (B,K)
        moved = torch.where((size > 0)[..., None], onehot.transpose(1, 2) @ x / size.clamp_min(1)[..., None], centres)
        shift = ((moved - centres) ** 2).double().sum((1, 2))  # (B,)
        centres = moved
        lone = (size < 2) & cmask & (can_move & (moves < k))[:, None]
        if bool(lone.any()):
            sse = (onehot * d2[..., None]).sum(1).masked_fill(~cmask, -1.0)  # (B,K)
            widest = sse.argmax(1)
            pick = torch.multinomial(((label == widest[:, None]).to(x.dtype) * ~outlier + 1e-30) * fmask, 1, generator=gen).squeeze(1)
            first = lone.to(torch.int8).argmax(1)  # one move per group per step
            moving = lone.any(1)
            outlier |= moving[:, None] & (label == first[:, None])  # its points no longer pull a centre
            centres[rows[moving], first[moving]] = x[rows[moving], pick[moving]]
            moves = moves + moving.long()
        new, d2 = _assign(x, centres, cmask, x_sq)
        settled = ((new == label) | ~mask).all(1) | (shift <= tol)  # padding rows' labels do not count
        label = new
        if not bool(lone.any()) and bool(settled.all()):
            break
    return label


def _initial_resp(x: torch.Tensor, mask: torch.Tensor, cmask: torch.Tensor, init: str, gen: torch.Generator) -> torch.Tensor:
    b, n, _ = x.shape
    k = cmask.shape[1]
    if init == "random":
        resp = torch.rand((b, n, k), generator=gen, device=x.device, dtype=x.dtype)
    elif init in ("kmeans", "k-means++"):
        resp = torch.nn.functional.one_hot(_kmeans(x, mask, cmask, gen, lloyd=init == "kmeans"), k).to(x.dtype)
    else:
        raise ValueError(f"unknown init {init!r}; use one of {INITS}")
    resp = resp * cmask[:, None, :].to(x.dtype)
    resp = resp / resp.sum(-1, keepdim=True).clamp_min(1e-30)
    return resp * mask[..., None].to(x.dtype)


def _m_step(
    x: torch.Tensor,
    resp: torch.Tensor,
    n_points: torch.Tensor,
    cmask: torch.Tensor,
    covariance: str,
    reg: float,
    x2: torch.Tensor | None,
) -> Mixture:
    """Weights, means and covariances from responsibilities. Diagonal and spherical use
    E[x²] − μ² (one product for diag, none beyond the means' for spherical, whose
    ``x2`` is ‖x‖² (B,N)); full covariances accumulate in float64, so that they stay
    factorizable when points are fewer than dimensions."""
    nk = resp.double().sum(1) + 10 * torch.finfo(resp.dtype).eps  # (B,K)
    nk_x = nk.to(x.dtype)
    d = x.shape[-1]
    if covariance == "diag":  # x2 is [x², x] (B,N,2d): one product gives E[x²] and the means
        assert x2 is not None
        sums = resp.transpose(1, 2) @ x2 / nk_x[..., None]
        means = sums[..., d:]
        cov = (sums[..., :d] - means**2).clamp_min(0) + reg  # (B,K,d)
    else:
        means = resp.transpose(1, 2) @ x / nk_x[..., None]  # (B,K,d)
    if covariance == "full":
        covs = []
        eye = torch.eye(x.shape[-1], device=x.device, dtype=torch.float64)
        for j in range(resp.shape[-1]):  # one component at a time: (B,N,d) at most in memory
            diff = (x - means[:, j, None, :]).double()
            covs.append((diff * resp[..., j, None].double()).transpose(1, 2) @ diff / nk[:, j, None, None] + reg * eye)
        cov = torch.stack(covs, 1)
    elif covariance == "spherical":
        assert x2 is not None
        avg_sq = (resp.double().transpose(1, 2) @ x2.double()[..., None])[..., 0] / nk  # (B,K): E‖x‖²
        cov = ((avg_sq - (means.double() ** 2).sum(-1)) / d).clamp_min(0).to(x.dtype) + reg
    weights = nk / n_points[:, None]
    weights = weights * cmask.to(weights.dtype)
    weights = (weights / weights.sum(1, keepdim=True)).to(x.dtype)
    return Mixture(weights, means, cov, covariance)


def _log_gauss(x: torch.Tensor, m: Mixture, x2: torch.Tensor | None) -> torch.Tensor:
    """log N(x_n | μ_k, Σ_k) for every point and component: (B,N,K), in x's dtype with the
    log-determinants in float64. Diagonal: Σ x²/σ² − 2 Σ xμ/σ² + Σ μ²/σ², two batched
    products; spherical: (‖x‖² − 2 x·μ + ‖μ‖²)/σ², one; full: ‖L⁻¹(x − μ)‖² per component."""
    d = x.shape[-1]
    if m.covariance == "full":
        chol = torch.linalg.cholesky(m.covariances.double())  # (B,K,d,d)
        eye = torch.eye(d, device=x.device, dtype=torch.float64).expand_as(chol)
        prec_chol_t = torch.linalg.solve_triangular(chol, eye, upper=False).transpose(-1, -2).to(x.dtype)  # (L⁻¹)ᵀ
        maha = torch.stack(
            [((x - m.means[:, j, None, :]) @ prec_chol_t[:, j]).square().sum(-1) for j in range(chol.shape[1])], -1
        )  # (B,N,K), one component at a time: (B,N,d) at most in memory
        logdet = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)  # (B,K)
    elif m.covariance == "diag":
        assert x2 is not None
        prec = 1.0 / m.covariances  # (B,K,d)
        const = (m.means**2 * prec).sum(-1)  # (B,K)
        w = torch.cat([prec, -2.0 * m.means * prec], -1)  # (B,K,2d) against x2 = [x², x]
        maha = torch.baddbmm(const[:, None, :], x2, w.transpose(1, 2))
        logdet = torch.log(m.covariances.double()).sum(-1)
    else:
        assert x2 is not None
        var = m.covariances  # (B,K)
        mu_sq = (m.means**2).sum(-1)  # (B,K)
        maha = torch.baddbmm((x2[..., None] + mu_sq[:, None, :]), x, m.means.transpose(1, 2), alpha=-2.0) / var[:, None, :]
        logdet = d * torch.log(var.double())
    return -0.5 * ((d * LOG_2PI + logdet).to(x.dtype)[:, None, :] + maha.clamp_min(0))


def _e_step(x: torch.Tensor, mask: torch.Tensor, m: Mixture, x2: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Responsibilities (B,N,K) and each group's mean log-likelihood (B,), log-sum-exp per
    point in x's dtype, the mean over points accumulated in float64."""
    logw = torch.log(m.weights.clamp_min(0))  # -inf for unused components
    joint = _log_gauss(x, m, x2) + logw[:, None, :]
    norm = torch.logsumexp(joint, dim=-1)  # (B,N)
    fmask = mask.double()
    ll = (norm.double() * fmask).sum(1) / fmask.sum(1)
    resp = torch.exp(joint - norm[..., None]) * mask[..., None].to(x.dtype)
    return resp, ll


def fit_gmm(
    groups: list[torch.Tensor],
    k: int,
    covariance: str = "diag",
    k_per_group: list[int] | None = None,
    reg_covar: float = 1e-6,
    tol: float = 1e-3,
    max_iter: int = 100,
    init: str = "kmeans",
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> FitResult:
    """Fit one mixture per group by EM (see the module docstring).

    ``tol`` bounds the change of a group's mean log-likelihood per point between
    iterations (scikit-learn's criterion); ``reg_covar`` is added to every variance.
    ``dtype``: the arithmetic, by default the features' own (float32 stays float32, as in
    scikit-learn). Groups stop updating once converged; the loop ends when all have, or at
    ``max_iter``.
    """
    if covariance not in COVARIANCES:
        raise ValueError(f"covariance {covariance!r} is not one of {COVARIANCES}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    device = torch.device(device)
    tensors = [torch.as_tensor(g) for g in groups]
    if dtype is None:
        dtype = tensors[0].dtype if tensors and tensors[0].dtype in (torch.float32, torch.float64) else torch.float32
    if any(len(g) == 0 for g in tensors):
        raise ValueError("every group needs at least one point")
    ks = torch.tensor([k] * len(tensors) if k_per_group is None else list(k_per_group), device=device)
    if bool((ks < 1).any()) or bool((ks > k).any()):
        raise ValueError(f"k_per_group must be in 1..{k}")
    x, mask = pad_groups([g.to(device=device, dtype=dtype) for g in tensors])
    n_points = mask.sum(1).double()
    # centre each group (the mean accumulated in float64): the products stay accurate
    centre = x.sum(1, dtype=torch.float64) / n_points[:, None]
    x = x - centre[:, None, :].to(dtype)
    if len(tensors) > 1:
        x = x * mask[..., None]
    cmask = _component_mask(ks, k)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    resp = _initial_resp(x, mask, cmask, init, gen)
    x2 = None  # what the E- and M-steps reuse: [x², x] (B,N,2d) for diag, ‖x‖² (B,N) for spherical
    if covariance == "diag":
        x2 = torch.cat([x * x, x], -1)
        x = x2[..., x.shape[-1] :]
    elif covariance == "spherical":
        x2 = (x.double() ** 2).sum(-1).to(dtype)
    mix = _m_step(x, resp, n_points, cmask, covariance, reg_covar, x2)
    prev = torch.full((len(tensors),), -math.inf, dtype=torch.float64, device=device)
    done = torch.zeros(len(tensors), dtype=torch.bool, device=device)
    it = 0
    ll = prev
    for it in range(1, max_iter + 1):  # noqa: B007 (the count of iterations run is returned)
        resp, ll = _e_step(x, mask, mix, x2)
        done = done | _converged(ll, prev, tol, x.dtype)
        prev = torch.where(done, prev, ll)
        if bool(done.all()):
            break
        new = _m_step(x, resp, n_points, cmask, covariance, reg_covar, x2)
        keep = done.view(-1, *([1] * (new.means.dim() - 1)))
        mix = Mixture(
            torch.where(done[:, None], mix.weights, new.weights),
            torch.where(keep, mix.means, new.means),
            torch.where(done.view(-1, *([1] * (new.covariances.dim() - 1))), mix.covariances, new.covariances),
            covariance,
        )
    if not bool(done.all()):  # max_iter ran out after an M-step: score the last mixture
        _, ll = _e_step(x, mask, mix, x2)  # (else the last E-step scored every group's final, frozen mixture)
    # full covariances stay float64: rounded to float32 a nearly singular one stops being factorizable
    out = Mixture(mix.weights, mix.means + centre[:, None, :].to(dtype), mix.covariances, covariance)
    return FitResult(out, ll.cpu().numpy(), it, done.cpu().numpy())


def _converged(ll: torch.Tensor, prev: torch.Tensor, tol: float, dtype: torch.dtype) -> torch.Tensor:
    """scikit-learn's test, |Δ| < tol, where the arithmetic is float64; in a shorter dtype
    rounding moves the mean log-likelihood by more than tol, so a change that is below tol
    or negative (EM never lowers it in exact arithmetic) ends the fit there."""
    change = ll - prev
    return change < tol if dtype != torch.float64 else change.abs() < tol


def predict(mixture: Mixture, groups: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each point's most probable component (n_b,), group b under mixture b of the batch."""
    out = []
    for b, g in enumerate(groups):
        w = mixture.weights[b : b + 1]
        c = (w[..., None] * mixture.means[b : b + 1]).sum(1, keepdim=True)  # centre both, as the fit does
        x = (torch.as_tensor(g).to(mixture.means) - c[0])[None]
        m = Mixture(w, mixture.means[b : b + 1] - c, mixture.covariances[b : b + 1], mixture.covariance)
        x2 = torch.cat([x * x, x], -1) if m.covariance == "diag" else (x * x).sum(-1) if m.covariance == "spherical" else None
        joint = _log_gauss(x, m, x2) + torch.log(w.clamp_min(0))[:, None, :]  # diag reads only x2 = [x², x]
        out.append(joint[0].argmax(-1))
    return out


def sample(mixture: Mixture, counts: list[int], generator: torch.Generator) -> list[torch.Tensor]:
    """``counts[b]`` points drawn from mixture b of the batch (components by weight)."""
    out = []
    d = mixture.dim
    for b, n in enumerate(counts):
        if n <= 0:
            out.append(mixture.means.new_zeros((0, d)))
            continue
        comp = torch.multinomial(mixture.weights[b].float().clamp_min(0), n, replacement=True, generator=generator)
        z = torch.randn((n, d), generator=generator, device=mixture.means.device, dtype=mixture.means.dtype)
        mu = mixture.means[b, comp]
        cov = mixture.covariances[b]
        if mixture.covariance == "full":
            chol = torch.linalg.cholesky(cov.double()).to(mu.dtype)  # (K,d,d)
            x = mu.clone()
            for j in torch.unique(comp).tolist():  # one factor per component, never one per point
                rows = comp == j
                x[rows] += z[rows] @ chol[j].T
            out.append(x)
        elif mixture.covariance == "diag":
            out.append(mu + z * cov[comp].sqrt())
        else:
            out.append(mu + z * cov[comp].sqrt()[:, None])
    return out


def parameter_count(d: int, k: int, covariance: str) -> int:
    """Values one K-component mixture in d dimensions sends (FedPFT Eqs. 9–11, per class):
    weights, means and the covariance's free entries (a full covariance as its upper triangle)."""
    per = {"full": 2 * d + (d * d - d) // 2 + 1, "diag": 2 * d + 1, "spherical": d + 2}
    if covariance not in per:
        raise ValueError(f"covariance {covariance!r} is not one of {COVARIANCES}")
    return per[covariance] * k


def pack_symmetric(m: np.ndarray) -> np.ndarray:
    """The upper triangle (with the diagonal) of symmetric matrices (..., d, d) as (..., d(d+1)/2)."""
    d = m.shape[-1]
    iu = np.triu_indices(d)
    return m[..., iu[0], iu[1]]


def unpack_symmetric(v: np.ndarray, d: int) -> np.ndarray:
    """Inverse of :func:`pack_symmetric`."""
    iu = np.triu_indices(d)
    out = np.zeros(v.shape[:-1] + (d, d), dtype=v.dtype)
    out[..., iu[0], iu[1]] = v
    out[..., iu[1], iu[0]] = v
    return out


def packed_dim(d: int) -> int:
    return d * (d + 1) // 2


def project_psd(cov: np.ndarray, floor: float) -> np.ndarray:
    """The nearest symmetric matrices (Frobenius) with eigenvalues ≥ ``floor``: symmetrize,
    then clip the eigenvalues (Theorem 4.1's projection onto the PSD cone, kept
    strictly positive so the server can sample)."""
    sym = (cov + np.swapaxes(cov, -1, -2)) / 2.0
    vals, vecs = np.linalg.eigh(sym)
    vals = np.maximum(vals, floor)
    return (vecs * vals[..., None, :]) @ np.swapaxes(vecs, -1, -2)
