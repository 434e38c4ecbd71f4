"""Gaussian mixtures fitted by EM, batched over groups (FedPFT fits one mixture per class,
all classes of a client at once), in PyTorch so the same code runs on CPU and CUDA.

A batch is ``B`` groups of up to ``N`` points in ``d`` dimensions, padded, with a mask of
which points are real; each group may use fewer than ``K`` components (``k_per_group``).
Covariance families follow scikit-learn's names: ``full`` (K·d·d), ``diag`` (K·d) and
``spherical`` (K). EM runs in the features' dtype (``dtype``; float32 features fit in
float32, as scikit-learn fits them), on points centred per group (the centre accumulated in
float64). Each iteration is one pass over the points in chunks small enough to stay in the
CPU's cache (:func:`_em_pass`): a chunk's E-step, (x−μ)²/σ² expanded as x²/σ² − 2xμ/σ² +
μ²/σ² (diag: one product of [x | x²], built once a fit, with [−2μ/σ² | 1/σ²]), and its share
of the next M-step's sums, so the points are read from memory once an iteration, not once a
product. What rounding would spoil is float64:
the M-step's sums and moments, the log-determinants, each group's mean log-likelihood, and
full covariances (float32 ones stop being factorizable with fewer points than dimensions).
float32 rounding moves the mean log-likelihood by about 1e-4–1e-3 nats, the size of the
default tolerance, so there a change below ``tol`` or negative ends the fit (:func:`_converged`).
A start is scikit-learn's: greedy k-means++ seeds and Lloyd's steps to convergence, with
no centre left holding a single point. One start too often ends where two clusters share a
component and another is split (10 separated clusters in 512 dims: −11 % log-likelihood in
some seeds), so by default each group is fitted from ``RESTARTS`` starts, all in one batch,
and keeps its likeliest fit (scikit-learn's ``n_init``).

EM is sparse EM (Neal & Hinton 1998): after each pass over all points, the rows whose
responsibilities are exactly one-hot in the fit's dtype (most rows of well-separated real
features in float32, whose second-best component is more than ~103 nats behind) keep them and their
sums frozen, and a few iterations score only the other rows; each step still raises EM's
free energy, and convergence is tested on full passes alone, over several iterations.

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
        """The feature dimension d, read from the means so every covariance kind answers alike."""
        return int(self.means.shape[-1])


@dataclass
class FitResult:
    """A fitted batch: the mixtures, each group's mean log-likelihood per point, the EM
    iterations run, whether each group met the tolerance, and the passes over all points."""

    mixture: Mixture
    log_likelihood: np.ndarray  # (B,)
    iterations: int  # M-steps taken (the last full pass's E-step, which found convergence, counts as one)
    converged: np.ndarray  # (B,) bool
    passes: int  # of them, E-steps over all points (the rest scored only the unsettled rows)


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
    return (a_sq[..., :, None] + b_sq[..., None, :]).sub_(torch.matmul(a, b.transpose(-1, -2)), alpha=2.0).clamp_min(0)


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


CHUNK_BYTES = 8 << 20  # rows per CPU pass: about 8 MiB of points, small enough to stay in cache between products (_row_chunks)


def _row_chunks(x: torch.Tensor) -> list[slice]:
    """The row ranges of one pass over x (B,N,d): on the CPU about CHUNK_BYTES each, so a
    chunk read for one product is still in cache for the next (one read of x from memory
    a pass, not one a product); on an accelerator all rows at once (fewer, larger kernels)."""
    b, n, d = x.shape
    if x.device.type != "cpu":
        return [slice(0, n)]
    rows = max(64, CHUNK_BYTES // max(1, b * d * x.element_size()))
    return [slice(i, min(i + rows, n)) for i in range(0, n, rows)]


def _assign(x: torch.Tensor, centres: torch.Tensor, cmask: torch.Tensor, x_sq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each point's nearest centre (B,N) and its squared distance (B,N)."""
    # the product as (K,d)·(d,N), the orientation MKL runs fastest (see _log_density)
    dist = _sqdist(centres, x, b_sq=x_sq).masked_fill_(~cmask[:, :, None], float("inf"))  # (B,K,N)
    d2, label = dist.min(1)
    return label, d2


def _lloyd_pass(
    x: torch.Tensor, centres: torch.Tensor, cmask: torch.Tensor, x_sq: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One pass of Lloyd's algorithm, chunk by chunk: each point's nearest centre (B,N) and
    squared distance (B,N), and by those labels the sums of the points of weight 1 (B,K,d)
    and their counts (B,K) that the next centres are made of (``weight``: 0 or 1 a point)."""
    k = centres.shape[1]
    label = torch.empty(x.shape[:2], dtype=torch.long, device=x.device)
    d2 = torch.empty(x.shape[:2], dtype=x.dtype, device=x.device)
    sums = torch.zeros_like(centres)
    for rows in _row_chunks(x):
        lab, dist = _assign(x[:, rows], centres, cmask, x_sq[:, rows])
        label[:, rows], d2[:, rows] = lab, dist
        sums += _rows_by_label(x[:, rows], torch.where(weight[:, rows] > 0, lab, k), k)
    size = torch.zeros(centres.shape[:2], dtype=x.dtype, device=x.device).scatter_add_(1, label, weight)
    return label, d2, sums, size


def _rows_by_label(rows: torch.Tensor, label: torch.Tensor, k: int) -> torch.Tensor:
    """The sums of a chunk's rows (B,r,d) by label (B,r) in 0..k, label k dropped: (B,k,d).
    On the CPU a scatter, which reads the rows once (a one-hot (K,r)·(r,d) product also multiplies
    by K−1 zeros per row); on an accelerator that product, deterministic where a scatter's atomic adds are not."""
    b, _, d = rows.shape
    if rows.device.type != "cpu":
        onehot = torch.nn.functional.one_hot(label, k + 1)[..., :k].to(rows.dtype)
        return torch.matmul(onehot.transpose(1, 2), rows)
    out = torch.zeros((b * (k + 1), d), dtype=rows.dtype, device=rows.device)  # one spare bin a group for label k
    offset = torch.arange(b, device=rows.device)[:, None] * (k + 1)
    out.index_add_(0, (offset + label).reshape(-1), rows.reshape(-1, d))
    return out.view(b, k + 1, d)[:, :k]


def _kmeans(x: torch.Tensor, mask: torch.Tensor, cmask: torch.Tensor, gen: torch.Generator, lloyd: bool) -> torch.Tensor:
    """k-means labels (B,N): greedy k-means++ seeds, then (``lloyd``) Lloyd's steps until no
    label changes or the centres stop moving (scikit-learn's tolerance); each step is one
    pass over the points (:func:`_lloyd_pass`). A centre left holding a single point
    (k-means++ likes outliers) is moved to a point drawn uniformly from the cluster of
    largest squared error, which splits what it had merged, its points stop pulling any
    centre (they keep a label), and Lloyd's steps resume; at most K such moves a group."""
    k = cmask.shape[1]
    b, n, _ = x.shape
    rows = torch.arange(b, device=x.device)
    fmask = mask.to(x.dtype)
    x_sq = (x * x).sum(-1)
    centres = _kmeans_pp(x, mask, k, gen, x_sq)
    if not lloyd:
        return _assign(x, centres, cmask, x_sq)[0]
    ks = cmask.sum(1)
    can_move = mask.sum(1) >= 2 * ks  # only where every component can hold two points
    moves = torch.zeros(b, dtype=torch.long, device=x.device)
    outlier = torch.zeros_like(mask)
    # scikit-learn's stop: the centres moved less (summed squares) than 1e-4 × the mean variance
    tol = LLOYD_TOL * (x_sq.double() * fmask).sum(1) / (mask.sum(1) * x.shape[-1])  # x is centred
    label, d2, sums, size = _lloyd_pass(x, centres, cmask, x_sq, fmask)
    for _ in range(LLOYD_MAX_ITER):
        moved = torch.where((size > 0)[..., None], sums / size.clamp_min(1)[..., None], centres)
        shift = ((moved - centres) ** 2).double().sum((1, 2))  # (B,)
        centres = moved
        lone = (size < 2) & cmask & (can_move & (moves < k))[:, None]
        if bool(lone.any()):
            sse = torch.zeros_like(size).scatter_add_(1, label, d2 * fmask * ~outlier).masked_fill(~cmask, -1.0)  # (B,K)
            widest = sse.argmax(1)
            pick = torch.multinomial(((label == widest[:, None]).to(x.dtype) * ~outlier + 1e-30) * fmask, 1, generator=gen).squeeze(1)
            first = lone.to(torch.int8).argmax(1)  # one move per group per step
            moving = lone.any(1)
            outlier |= moving[:, None] & (label == first[:, None])  # its points no longer pull a centre
            centres[rows[moving], first[moving]] = x[rows[moving], pick[moving]]
            moves = moves + moving.long()
        new, d2, sums, size = _lloyd_pass(x, centres, cmask, x_sq, fmask * ~outlier)
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


@dataclass
class _Sums:
    """What an M-step needs, summed over points in float64: the responsibilities (B,K),
    Σ r·x (B,K,d) and the second moments Σ r·x² (B,K,d) diag, Σ r·‖x‖² (B,K) spherical,
    Σ r·x xᵀ (B,K,d,d) full."""

    mass: torch.Tensor
    first: torch.Tensor
    second: torch.Tensor

    def __iadd__(self, other: _Sums) -> _Sums:
        self.mass += other.mass
        self.first += other.first
        self.second += other.second
        return self

    def plus(self, other: _Sums) -> _Sums:
        """The sums over both sets of points."""
        return _Sums(self.mass + other.mass, self.first + other.first, self.second + other.second)

    def minus(self, other: _Sums) -> _Sums:
        """The sums over these points less a subset of them; the mass stays ≥ 0 (rounding
        of two differently shaped products must not leave a component a negative weight)."""
        return _Sums((self.mass - other.mass).clamp_min(0), self.first - other.first, self.second - other.second)


def _em_points(x: torch.Tensor, covariance: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The points as the E- and M-steps read them, built once a fit: diag [x | x²] (B,N,2d),
    so that each step is one product over both halves (one pass over the points instead of two
    products and a square per chunk, for twice the points' memory); spherical x and its
    norms ‖x‖² (B,N), in float64 then rounded; full x."""
    if covariance == "diag":
        both = torch.empty((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype, device=x.device)
        d = x.shape[-1]
        both[..., :d] = x
        torch.mul(x, x, out=both[..., d:])
        return both, None
    if covariance == "spherical":
        return x, (x.double() ** 2).sum(-1).to(x.dtype)
    return x, None


def _sums(pts: torch.Tensor, rt: torch.Tensor, sq: torch.Tensor | None, covariance: str) -> _Sums:
    """The M-step's sums over one chunk of points (:func:`_em_points`, B,r,·) with
    responsibilities ``rt`` (B,K,r); ``sq``: the chunk's norms (spherical)."""
    mass = rt.sum(2, dtype=torch.float64)
    if covariance == "diag":
        both = torch.matmul(rt, pts).double()  # Σ r·[x | x²]
        d = pts.shape[-1] // 2
        return _Sums(mass, both[..., :d], both[..., d:])
    first = torch.matmul(rt, pts).double()
    if covariance == "spherical":
        assert sq is not None
        second = torch.matmul(rt.double(), sq.double()[..., None])[..., 0]
    else:  # one component at a time: (B,r,d) at most in memory, products in float64
        xd = pts.double()
        second = torch.stack([torch.matmul((xd * rt[:, j, :, None].double()).transpose(1, 2), xd) for j in range(rt.shape[1])], 1)
    return _Sums(mass, first, second)


def _m_step(sums: _Sums, n_points: torch.Tensor, cmask: torch.Tensor, covariance: str, reg: float, dtype: torch.dtype) -> Mixture:
    """Weights, means and covariances from the sums, in float64: covariances as E[x²] − μ²
    (E[x xᵀ] − μμᵀ full, kept float64 so that they stay factorizable when points are fewer
    than dimensions); the rest in the fit's dtype."""
    nk = sums.mass + 10 * torch.finfo(dtype).eps  # (B,K)
    means = sums.first / nk[..., None]  # (B,K,d)
    d = means.shape[-1]
    if covariance == "diag":
        cov = (sums.second / nk[..., None] - means**2).clamp_min(0).to(dtype) + reg
    elif covariance == "spherical":
        cov = ((sums.second / nk - (means**2).sum(-1)) / d).clamp_min(0).to(dtype) + reg
    else:
        cov = sums.second / nk[..., None, None] - means[..., :, None] * means[..., None, :]
        cov = (cov + cov.transpose(-1, -2)) / 2 + reg * torch.eye(d, device=cov.device, dtype=torch.float64)
    weights = nk / n_points[:, None]
    weights = weights * cmask.to(weights.dtype)
    weights = (weights / weights.sum(1, keepdim=True)).to(dtype)
    return Mixture(weights, means.to(dtype), cov, covariance)


@dataclass
class _Precisions:
    """A mixture prepared for scoring points: log w − ½(d log 2π + log|Σ|) (B,K), the
    Mahalanobis distance's constant term (μ²/σ² diag, ‖μ‖² spherical; B,K) and what
    multiplies the points: [−2μ/σ² | 1/σ²] (B,K,2d) and μ diag, 1/σ² (B,K) and μ
    spherical, (L⁻¹)ᵀ (B,K,d,d) and μ full."""

    const: torch.Tensor
    quad: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor


def _precisions(m: Mixture) -> _Precisions:
    """Once per E-step: log weights, log-determinants (float64) and the Mahalanobis
    factors of :func:`_log_density`."""
    d = m.dim
    logw = torch.log(m.weights.double().clamp_min(0))  # -inf for unused components
    dtype = m.means.dtype
    if m.covariance == "full":
        chol = torch.linalg.cholesky(m.covariances.double())  # (B,K,d,d)
        eye = torch.eye(d, device=chol.device, dtype=torch.float64).expand_as(chol)
        prec_chol_t = torch.linalg.solve_triangular(chol, eye, upper=False).transpose(-1, -2).to(dtype)  # (L⁻¹)ᵀ
        logdet = 2.0 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
        const = (logw - 0.5 * (d * LOG_2PI + logdet)).to(dtype)
        return _Precisions(const, torch.zeros_like(const), prec_chol_t, m.means)
    if m.covariance == "diag":
        prec = 1.0 / m.covariances  # (B,K,d)
        const = (logw - 0.5 * (d * LOG_2PI + torch.log(m.covariances.double()).sum(-1))).to(dtype)
        return _Precisions(const, (m.means**2 * prec).sum(-1), torch.cat([-2.0 * m.means * prec, prec], -1), m.means)
    var = m.covariances  # (B,K)
    const = (logw - 0.5 * (d * LOG_2PI + d * torch.log(var.double()))).to(dtype)
    return _Precisions(const, (m.means**2).sum(-1), 1.0 / var, m.means)


def _log_density(pts: torch.Tensor, sq: torch.Tensor | None, p: _Precisions, covariance: str) -> torch.Tensor:
    """log w_k + log N(x_n | μ_k, Σ_k) for every component and point of a chunk
    (:func:`_em_points`): (B,K,r), points along the contiguous axis. Diagonal:
    [x | x²]·[−2μ/σ² | 1/σ²] + μ²/σ², one batched product; spherical:
    (‖x‖² − 2 x·μ + ‖μ‖²)/σ², one; full: ‖(x − μ)ᵀ(L⁻¹)ᵀ‖² per component."""
    if covariance == "diag":
        # the product as (K,2d)·(2d,r): the points are the contiguous axis, the orientation MKL runs fastest on the CPU
        maha = torch.matmul(p.a, pts.transpose(1, 2)).add_(p.quad[..., None])
    elif covariance == "spherical":
        assert sq is not None
        maha = (sq[:, None, :] + p.quad[..., None]).sub_(torch.matmul(p.b, pts.transpose(1, 2)), alpha=2.0).mul_(p.a[..., None])
    else:
        maha = torch.stack([torch.matmul(pts - p.b[:, j, None, :], p.a[:, j]).square().sum(-1) for j in range(p.a.shape[1])], 1)
    return maha.clamp_min_(0).mul_(-0.5).add_(p.const[..., None])


def _em_pass(
    pts: torch.Tensor, mask: torch.Tensor, m: Mixture, sums: bool, norms: torch.Tensor | None
) -> tuple[torch.Tensor, _Sums | None, torch.Tensor]:
    """One EM iteration as one pass over the points (:func:`_em_points`), chunk by chunk:
    the E-step under mixture m (responsibilities, log-sum-exp per point) and, with
    ``sums``, the next M-step's sums from those responsibilities while the chunk is still in
    cache. ``norms``: the points' ‖x‖² (B,N) for spherical. Returns each group's mean
    log-likelihood (B,), accumulated in float64, the sums, and which real rows (B,N) are
    unsettled: more than one component has a responsibility that is not exactly 0."""
    p = _precisions(m)
    ll = torch.zeros(pts.shape[0], dtype=torch.float64, device=pts.device)
    unsettled = torch.zeros(mask.shape, dtype=torch.bool, device=pts.device)
    total: _Sums | None = None
    for rows in _row_chunks(pts):
        xc, mc = pts[:, rows], mask[:, rows]
        sq = norms[:, rows] if norms is not None else None
        joint = _log_density(xc, sq, p, m.covariance)  # (B,K,r)
        # log-sum-exp over the components by hand: the one exp also gives the responsibilities
        top = joint.amax(1).clamp_min_(torch.finfo(joint.dtype).min)  # (B,r); finite, so a row of -inf scores -inf, not NaN
        scaled = joint.sub_(top[:, None]).exp_()
        unsettled[:, rows] = (scaled > 0).sum(1).gt_(1).logical_and_(mc)
        denom = scaled.sum(1)
        ll += ((top + denom.log()).double() * mc).sum(1)
        if sums:
            resp = scaled.mul_((mc.to(pts.dtype) / denom)[:, None])  # (B,K,r)
            part = _sums(xc, resp, sq, m.covariance)
            if total is None:
                total = part
            else:
                total += part
    return ll / mask.sum(1), total, unsettled


SPARSE_PASSES = 3  # fit_gmm's default: passes over the unsettled rows alone after each full pass (0: plain EM)
RESTARTS = 3  # fit_gmm's default: fits from this many starts, each group keeping its likeliest; 1: one start, scikit-learn's n_init=1
SPARSE_MAX_SHARE = 0.25  # ... taken only while the most unsettled rows of a group are at most this share of
# the batch's padded length (what a gathered pass costs against a full one)


def _rows_of(pts: torch.Tensor, norms: torch.Tensor | None, which: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The rows ``which`` (B,N) of each group, gathered to the front and padded: points
    (B,S,·), their norms and a (B,S) mask, S the largest count in a group."""
    count = which.sum(1)
    s = int(count.max())
    order = torch.sort((~which).to(torch.int8), dim=1, stable=True).indices[:, :s]  # the chosen rows first, in order
    rows = torch.arange(pts.shape[0], device=pts.device)[:, None]
    sub_mask = torch.arange(s, device=pts.device)[None, :] < count[:, None]
    return pts[rows, order], (norms[rows, order] if norms is not None else None), sub_mask


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
    sparse_passes: int = SPARSE_PASSES,
    restarts: int = RESTARTS,
) -> FitResult:
    """Fit one mixture per group by EM (see the module docstring).

    ``tol`` bounds the change of a group's mean log-likelihood per point between two
    passes over all points (scikit-learn's criterion, between iterations, where no sparse
    iterations run; with them, the passes are up to 1 + ``sparse_passes`` iterations
    apart, which is the stricter test); ``reg_covar`` is added to every variance.
    ``sparse_passes``: iterations over the unsettled rows alone after each full pass (0:
    plain EM).
    ``restarts``: fits from that many starts (scikit-learn's ``n_init``), run as one batch
    that holds each group ``restarts`` times (its starts drawn together from the seed's
    generator); each group keeps the fit of highest log-likelihood (:func:`_likeliest`).
    ``dtype``: the arithmetic, by default the features' own (float32 stays float32, as in
    scikit-learn). Groups stop updating once converged; the loop ends when all have, or after
    ``max_iter`` M-steps (those after a pass over the unsettled rows alone count too). A
    one-component group is its sample mean and covariance, EM's fixed point from any start:
    it converges at its first E-step.
    """
    if covariance not in COVARIANCES:
        raise ValueError(f"covariance {covariance!r} is not one of {COVARIANCES}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if restarts < 1:
        raise ValueError(f"restarts must be >= 1 (1: a single start, as scikit-learn's n_init=1), got {restarts}")
    if sparse_passes < 0:
        raise ValueError(f"sparse_passes must be >= 0 (0: plain EM), got {sparse_passes}")
    device = torch.device(device)
    tensors = [torch.as_tensor(g) for g in groups]
    if dtype is None:
        dtype = tensors[0].dtype if tensors and tensors[0].dtype in (torch.float32, torch.float64) else torch.float32
    if any(len(g) == 0 for g in tensors):
        raise ValueError("every group needs at least one point")
    ks = torch.tensor([k] * len(tensors) if k_per_group is None else list(k_per_group), device=device)
    if bool((ks < 1).any()) or bool((ks > k).any()):
        raise ValueError(f"k_per_group must be in 1..{k}")
    if restarts > 1 and bool((ks > 1).any()):
        # every group fitted from `restarts` starts at once: the batch holds the groups `restarts` times over
        batch = fit_gmm(
            tensors * restarts, k, covariance, ks.tolist() * restarts, reg_covar, tol, max_iter, init, seed, device, dtype, sparse_passes, 1
        )
        return _likeliest(batch, len(tensors), restarts)
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
    pts, norms = _em_points(x, covariance)
    del x
    first: _Sums | None = None
    for rows in _row_chunks(pts):  # the first M-step's sums, from the start's responsibilities
        sq = norms[:, rows] if norms is not None else None
        part = _sums(pts[:, rows], resp[:, rows].transpose(1, 2), sq, covariance)
        if first is None:
            first = part
        else:
            first += part
    assert first is not None
    del resp
    mix = _m_step(first, n_points, cmask, covariance, reg_covar, dtype)
    prev = torch.full((len(tensors),), -math.inf, dtype=torch.float64, device=device)
    done = torch.zeros(len(tensors), dtype=torch.bool, device=device)
    single = ks == 1  # already at their fixed point
    it = passes = 0
    ll = prev
    while it < max_iter:
        ll, sums, unsettled = _em_pass(pts, mask, mix, not bool((done | single).all()), norms)
        it, passes = it + 1, passes + 1
        done = done | _converged(ll, prev, tol, dtype) | single
        prev = torch.where(done, prev, ll)
        if bool(done.all()):
            break
        assert sums is not None
        step = _m_step(sums, n_points, cmask, covariance, reg_covar, dtype)
        unsettled &= ~done[:, None]
        sparse = sparse_passes > 0 and it < max_iter and bool(unsettled.any())
        if sparse and int(unsettled.sum(1).max()) <= SPARSE_MAX_SHARE * pts.shape[1]:
            # sparse EM (Neal & Hinton 1998): the settled rows keep their one-hot
            # responsibilities and frozen sums; only the unsettled rows are scored again.
            # (A group with no unsettled rows takes M-steps equal to `step`; the mean
            # log-likelihoods of these passes, NaN for such a group, are not used.)
            sub, sub_norms, sub_mask = _rows_of(pts, norms, unsettled)
            _, theirs, _ = _em_pass(sub, sub_mask, mix, True, sub_norms)
            assert theirs is not None
            frozen = sums.minus(theirs)
            mix = _unless_done(mix, step, done)
            for _ in range(min(sparse_passes, max_iter - it)):
                _, theirs, _ = _em_pass(sub, sub_mask, mix, True, sub_norms)
                assert theirs is not None
                mix = _unless_done(mix, _m_step(frozen.plus(theirs), n_points, cmask, covariance, reg_covar, dtype), done)
                it += 1
        else:
            mix = _unless_done(mix, step, done)
    if not bool(done.all()):  # max_iter ran out after an M-step: score the last mixture
        ll, _, _ = _em_pass(pts, mask, mix, False, norms)  # (else the last pass scored every group's final, frozen mixture)
    # full covariances stay float64: rounded to float32 a nearly singular one stops being factorizable
    out = Mixture(mix.weights, mix.means + centre[:, None, :].to(dtype), mix.covariances, covariance)
    return FitResult(out, ll.cpu().numpy(), it, done.cpu().numpy(), passes)


def _likeliest(batch: FitResult, b: int, restarts: int) -> FitResult:
    """Of a fit of ``restarts`` copies of ``b`` groups (copy-major), each group's likeliest
    fit: its mixture, log-likelihood and convergence (iterations and passes: the batch's)."""
    ll = np.nan_to_num(batch.log_likelihood.reshape(restarts, b), nan=-np.inf)
    pick = torch.as_tensor(ll.argmax(0) * b + np.arange(b), device=batch.mixture.means.device)
    m = batch.mixture
    out = Mixture(m.weights[pick], m.means[pick], m.covariances[pick], m.covariance)
    rows = pick.cpu().numpy()
    return FitResult(out, batch.log_likelihood[rows], batch.iterations, batch.converged[rows], batch.passes)


def _unless_done(old: Mixture, new: Mixture, done: torch.Tensor) -> Mixture:
    """``new`` for the groups still fitting, ``old`` for those that have converged (B,)."""

    def pick(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.where(done.view(-1, *([1] * (a.dim() - 1))), a, b)

    return Mixture(pick(old.weights, new.weights), pick(old.means, new.means), pick(old.covariances, new.covariances), old.covariance)


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
        out.append(_log_density(*_em_points(x, m.covariance), _precisions(m), m.covariance)[0].argmax(0))
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
    """The number of values in the packed upper triangle of a symmetric d×d matrix."""
    return d * (d + 1) // 2


def project_psd(cov: np.ndarray, floor: float) -> np.ndarray:
    """The nearest symmetric matrices (Frobenius) with eigenvalues ≥ ``floor``: symmetrize,
    then clip the eigenvalues (Theorem 4.1's projection onto the PSD cone, kept
    strictly positive so the server can sample)."""
    sym = (cov + np.swapaxes(cov, -1, -2)) / 2.0
    vals, vecs = np.linalg.eigh(sym)
    vals = np.maximum(vals, floor)
    return (vecs * vals[..., None, :]) @ np.swapaxes(vecs, -1, -2)
