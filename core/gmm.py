"""Gaussian mixtures fitted by EM, batched over groups (FedPFT fits one mixture per class,
all classes of a client at once), in PyTorch so the same code runs on CPU and CUDA.

A batch is ``B`` groups of up to ``N`` points in ``d`` dimensions, padded, with a mask of
which points are real; each group may use fewer than ``K`` components (``k_per_group``).
Covariance families follow scikit-learn's names: ``full`` (K·d·d), ``diag`` (K·d) and
``spherical`` (K). Points are centred per group and the E- and M-steps run in float64 by
default (``dtype``), as scikit-learn's do: their batched products expand (x−μ)²/σ² and
E[x²]−μ², which cancel digits, and in float32 that error (up to nats per point on 1280-d
features) exceeds the tolerance that decides convergence and can make a full covariance
fail its Cholesky factorization.

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
KMEANS_ITERATIONS = 20
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


def _kmeans_pp(x: torch.Tensor, mask: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """Greedy k-means++ seeds (B,K,d), as scikit-learn draws them: the first uniformly
    among each group's points; for each next one, 2 + ⌊ln K⌋ candidates drawn with
    probability ∝ squared distance to the nearest seed so far, keeping the candidate
    that lowers the total squared distance most."""
    b = x.shape[0]
    rows = torch.arange(b, device=x.device)
    w = mask.to(x.dtype)
    trials = 2 + int(math.log(k))
    x_sq = (x * x).sum(-1)
    idx = torch.multinomial(w, 1, generator=gen).squeeze(1)
    seeds = [x[rows, idx]]
    nearest = _sqdist(x, seeds[0][:, None, :], x_sq)[..., 0] * w
    for _ in range(1, k):
        p = nearest.clamp_min(0)
        empty = p.sum(1) <= 0  # all points identical: pick uniformly
        p = torch.where(empty[:, None], w, p)
        cand = torch.multinomial(p, trials, replacement=True, generator=gen)  # (B,T)
        pts = x[rows[:, None], cand]  # (B,T,d)
        dist = torch.minimum(nearest[:, None, :], _sqdist(pts, x, b_sq=x_sq) * w[:, None, :])  # (B,T,N)
        best = dist.sum(-1).argmin(1)
        seeds.append(pts[rows, best])
        nearest = dist[rows, best]
    return torch.stack(seeds, 1)


def _sqdist(a: torch.Tensor, b: torch.Tensor, a_sq: torch.Tensor | None = None, b_sq: torch.Tensor | None = None) -> torch.Tensor:
    """Squared distances (B,n,m) as ‖a‖² − 2ab + ‖b‖², one batched product (torch.cdist
    is several times slower here); ``a_sq``/``b_sq``: the norms when the caller has them."""
    a_sq = (a * a).sum(-1) if a_sq is None else a_sq
    b_sq = (b * b).sum(-1) if b_sq is None else b_sq
    return (a_sq[..., :, None] - 2.0 * a @ b.transpose(-1, -2) + b_sq[..., None, :]).clamp_min(0)


def _nearest(x: torch.Tensor, centres: torch.Tensor, cmask: torch.Tensor, x_sq: torch.Tensor | None = None) -> torch.Tensor:
    dist = _sqdist(x, centres, x_sq)  # (B,N,K)
    return dist.masked_fill(~cmask[:, None, :], float("inf")).argmin(-1)


def _initial_resp(x: torch.Tensor, mask: torch.Tensor, cmask: torch.Tensor, init: str, gen: torch.Generator) -> torch.Tensor:
    b, n, _ = x.shape
    k = cmask.shape[1]
    if init == "random":
        resp = torch.rand((b, n, k), generator=gen, device=x.device, dtype=x.dtype)
    elif init in ("kmeans", "k-means++"):
        centres = _kmeans_pp(x, mask, k, gen)
        x_sq = (x * x).sum(-1)
        label = _nearest(x, centres, cmask, x_sq)
        for _ in range(KMEANS_ITERATIONS if init == "kmeans" else 0):  # Lloyd's steps
            onehot = torch.nn.functional.one_hot(label, k).to(x.dtype) * mask[..., None].to(x.dtype)
            size = onehot.sum(1)  # (B,K)
            moved = onehot.transpose(1, 2) @ x / size.clamp_min(1)[..., None]
            centres = torch.where((size > 0)[..., None], moved, centres)  # an emptied centre stays put
            new = _nearest(x, centres, cmask, x_sq)
            if bool((new == label).all()):
                break
            label = new
        resp = torch.nn.functional.one_hot(label, k).to(x.dtype)
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
    x2: torch.Tensor | None = None,
) -> Mixture:
    nk = resp.sum(1) + 10 * torch.finfo(resp.dtype).eps  # (B,K)
    means = resp.transpose(1, 2) @ x / nk[..., None]  # (B,K,d)
    if covariance == "full":
        covs = []
        for j in range(resp.shape[-1]):  # one component at a time: (B,N,d) at most in memory
            diff = x - means[:, j, None, :]
            covs.append((diff * resp[..., j, None]).transpose(1, 2) @ diff / nk[:, j, None, None])
        cov = torch.stack(covs, 1) + reg * torch.eye(x.shape[-1], device=x.device, dtype=x.dtype)
    else:
        avg_x2 = resp.transpose(1, 2) @ (x * x if x2 is None else x2) / nk[..., None]
        cov = (avg_x2 - means**2).clamp_min(0) + reg  # (B,K,d)
        if covariance == "spherical":
            cov = cov.mean(-1)
    weights = nk / n_points[:, None]
    weights = weights * cmask.to(weights.dtype)
    weights = weights / weights.sum(1, keepdim=True)
    return Mixture(weights, means, cov, covariance)


def _log_gauss(x: torch.Tensor, m: Mixture, x2: torch.Tensor | None = None) -> torch.Tensor:
    """log N(x_n | μ_k, Σ_k) for every point and component: (B,N,K), float64."""
    d = x.shape[-1]
    if m.covariance == "full":
        chol = torch.linalg.cholesky(m.covariances.double())  # (B,K,d,d)
        maha = torch.stack(
            [  # one component at a time: (B,d,N) at most in memory
                (torch.linalg.solve_triangular(chol[:, j], (x - m.means[:, j, None, :]).double().transpose(1, 2), upper=False) ** 2).sum(1)
                for j in range(chol.shape[1])
            ],
            -1,
        )  # (B,N,K)
        logdet = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)  # (B,K)
        return -0.5 * (d * LOG_2PI + logdet[:, None, :] + maha)
    var = m.covariances if m.covariance == "diag" else m.covariances[..., None].expand_as(m.means)
    prec = 1.0 / var  # (B,K,d)
    # Σ (x−μ)²/σ² = Σ x²/σ² − 2 Σ x μ/σ² + Σ μ²/σ², as batched products
    maha = (
        (x * x if x2 is None else x2) @ prec.transpose(1, 2)
        - 2.0 * x @ (m.means * prec).transpose(1, 2)
        + (m.means**2 * prec).sum(-1)[:, None, :]
    )
    logdet = torch.log(var.double()).sum(-1)
    return -0.5 * (d * LOG_2PI + logdet[:, None, :] + maha.double().clamp_min(0))


def _e_step(x: torch.Tensor, mask: torch.Tensor, m: Mixture, x2: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Responsibilities (B,N,K) and each group's mean log-likelihood (B,), log-sum-exp."""
    logw = torch.log(m.weights.double().clamp_min(0))  # -inf for unused components
    joint = _log_gauss(x, m, x2) + logw[:, None, :]
    norm = torch.logsumexp(joint, dim=-1)  # (B,N)
    fmask = mask.double()
    ll = (norm * fmask).sum(1) / fmask.sum(1)
    resp = torch.exp(joint - norm[..., None]).to(x.dtype) * mask[..., None].to(x.dtype)
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
    dtype: torch.dtype = torch.float64,
) -> FitResult:
    """Fit one mixture per group by EM (see the module docstring).

    ``tol`` bounds the change of a group's mean log-likelihood per point between
    iterations (scikit-learn's criterion); ``reg_covar`` is added to every variance.
    Groups stop updating once converged; the loop ends when all have, or at ``max_iter``.
    """
    if covariance not in COVARIANCES:
        raise ValueError(f"covariance {covariance!r} is not one of {COVARIANCES}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    device = torch.device(device)
    groups = [torch.as_tensor(g).to(device=device, dtype=dtype) for g in groups]
    if any(len(g) == 0 for g in groups):
        raise ValueError("every group needs at least one point")
    ks = torch.tensor([k] * len(groups) if k_per_group is None else list(k_per_group), device=device)
    if bool((ks < 1).any()) or bool((ks > k).any()):
        raise ValueError(f"k_per_group must be in 1..{k}")
    x, mask = pad_groups(groups)
    n_points = mask.sum(1).to(x.dtype)
    # centre each group: float32 products stay accurate; the shift is added back at the end
    centre = (x * mask[..., None]).sum(1) / n_points[:, None]
    x = (x - centre[:, None, :]) * mask[..., None]
    cmask = _component_mask(ks, k)
    gen = torch.Generator(device=device).manual_seed(int(seed))
    resp = _initial_resp(x, mask, cmask, init, gen)
    x2 = None if covariance == "full" else x * x  # once: every E- and M-step uses it
    mix = _m_step(x, resp, n_points, cmask, covariance, reg_covar, x2)
    prev = torch.full((len(groups),), -math.inf, dtype=torch.float64, device=device)
    done = torch.zeros(len(groups), dtype=torch.bool, device=device)
    it = 0
    for it in range(1, max_iter + 1):  # noqa: B007 (the count of iterations run is returned)
        resp, ll = _e_step(x, mask, mix, x2)
        done = done | ((ll - prev).abs() < tol)
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
    _, ll = _e_step(x, mask, mix, x2)
    out = Mixture(mix.weights, mix.means + centre[:, None, :], mix.covariances, covariance)
    return FitResult(out, ll.cpu().numpy(), it, done.cpu().numpy())


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
