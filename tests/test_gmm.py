"""core/gmm.py against scikit-learn's GaussianMixture (the oracle) on synthetic clusters of
known structure: log-likelihood, recovery of the clusters, float32 convergence and the
k-means start."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from headway.core.gmm import _component_mask, _converged, _kmeans, fit_gmm, predict

sklearn_mixture = pytest.importorskip("sklearn.mixture")
from sklearn.metrics import adjusted_rand_score  # noqa: E402


def clusters(seed: int = 0, k: int = 10, d: int = 512, n: int = 5000) -> tuple[np.ndarray, np.ndarray]:
    """K float32 Gaussian clusters, means N(0, 1) per dimension, diagonal noise of standard
    deviation 0.3–0.8 (the benchmark's synthetic case), uniform labels."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 1.0, (k, d))
    std = rng.uniform(0.3, 0.8, (k, d))
    y = rng.integers(0, k, n)
    return (means[y] + rng.normal(size=(n, d)) * std[y]).astype(np.float32), y


@pytest.mark.parametrize(("covariance", "d"), [("diag", 512), ("spherical", 512), ("full", 32)])
def test_log_likelihood_at_least_scikit_learns_and_all_ten_clusters_found(covariance, d):
    x, y = clusters(d=d, n=5000 if d > 32 else 2000)
    ref = sklearn_mixture.GaussianMixture(10, covariance_type=covariance, tol=1e-3, random_state=0, reg_covar=1e-6).fit(x)
    fit = fit_gmm([torch.from_numpy(x)], 10, covariance)
    ours, theirs = float(fit.log_likelihood[0]), float(ref.score(x))
    assert ours >= theirs - 1e-3 * abs(theirs)
    assert fit.converged.all() and fit.mixture.means.dtype == torch.float32  # fitted in the features' dtype
    assert adjusted_rand_score(y, predict(fit.mixture, [torch.from_numpy(x)])[0].numpy()) >= 0.99


def test_float32_fit_converges_where_rounding_exceeds_the_tolerance():
    """A tolerance far below float32's rounding of the mean log-likelihood: the fit must
    still stop (not run to max_iter on noise), and not before float64's optimum."""
    x, _ = clusters(d=256, n=3000, seed=1)
    x = x * np.geomspace(0.01, 100, 256).astype(np.float32) + 50.0  # scales far apart, an offset
    f32 = fit_gmm([torch.from_numpy(x)], 10, "diag", tol=1e-7, max_iter=500, restarts=1)  # one start: the test is the stop
    f64 = fit_gmm([torch.from_numpy(x).double()], 10, "diag", tol=1e-7, max_iter=500, restarts=1)
    assert f32.converged.all() and f32.iterations < 500
    assert float(f32.log_likelihood[0]) == pytest.approx(float(f64.log_likelihood[0]), abs=1e-2)


def test_float32_rounding_noise_ends_the_fit_instead_of_prolonging_it():
    """In float32 a mean log-likelihood that went down by more than tol is rounding at the
    optimum (EM never lowers it): converged. In float64, scikit-learn's |change| < tol."""
    prev = torch.tensor([-1405.0, -1405.0, -1405.0], dtype=torch.float64)
    ll = prev + torch.tensor([-3e-3, 5e-4, 2e-3], dtype=torch.float64)
    assert _converged(ll, prev, 1e-3, torch.float32).tolist() == [True, True, False]
    assert _converged(ll, prev, 1e-3, torch.float64).tolist() == [False, True, False]


def test_kmeans_start_leaves_no_centre_on_an_outlier():
    x, _ = clusters(d=64, n=2000, seed=2)
    x[0] = 1e3  # one point far from every cluster: k-means++ seeding all but surely takes it
    xt = torch.from_numpy(x - x.mean(0))[None]
    mask = torch.ones(1, len(x), dtype=torch.bool)
    cmask = _component_mask(torch.tensor([10]), 10)
    seeds_only = _kmeans(xt, mask, cmask, torch.Generator().manual_seed(0), lloyd=False)[0]
    assert torch.bincount(seeds_only, minlength=10).min() == 1  # the trap is set
    labels = _kmeans(xt, mask, cmask, torch.Generator().manual_seed(0), lloyd=True)[0]
    assert torch.bincount(labels, minlength=10).min() >= 2


def test_same_seed_same_fit():
    x, _ = clusters(d=32, n=1000, seed=3)
    a = fit_gmm([torch.from_numpy(x)], 5, "diag", seed=7)
    b = fit_gmm([torch.from_numpy(x)], 5, "diag", seed=7)
    assert torch.equal(a.mixture.means, b.mixture.means) and a.iterations == b.iterations


@pytest.mark.parametrize("covariance", ["diag", "spherical", "full"])
def test_chunked_passes_fit_what_one_pass_over_all_rows_fits(monkeypatch, covariance):
    """EM and Lloyd's steps read the points in cache-sized chunks: with chunks of 64 rows
    (a ragged last one, two padded groups) the fit equals the one-chunk fit up to float64
    rounding, so no row is skipped, counted twice or mixed with padding."""
    import headway.core.gmm as gmm

    a, _ = clusters(d=24, n=1000, seed=4)
    b, _ = clusters(d=24, n=333, seed=5)
    groups = [torch.from_numpy(a).double(), torch.from_numpy(b).double()]
    monkeypatch.setattr(gmm, "CHUNK_BYTES", 1 << 40)
    whole = fit_gmm(groups, 4, covariance, tol=1e-9, max_iter=30, seed=1)
    monkeypatch.setattr(gmm, "CHUNK_BYTES", 1)
    assert len(gmm._row_chunks(torch.zeros(2, 1000, 24))) == 16  # 64 rows each, 40 in the last
    chunked = fit_gmm(groups, 4, covariance, tol=1e-9, max_iter=30, seed=1)
    assert chunked.iterations == whole.iterations
    np.testing.assert_allclose(chunked.log_likelihood, whole.log_likelihood, rtol=1e-12)
    for name in ("weights", "means", "covariances"):
        np.testing.assert_allclose(getattr(chunked.mixture, name).numpy(), getattr(whole.mixture, name).numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("covariance", ["diag", "spherical", "full"])
def test_em_pass_scores_and_sums_a_padded_group_as_that_group_alone(covariance):
    """One EM pass over a batch of two groups of unequal size (the shorter padded) gives
    each group the mean log-likelihood and M-step sums that a pass over that group alone
    gives under the same mixture: padding rows neither score nor pull a component."""
    import headway.core.gmm as gmm

    a, _ = clusters(d=12, n=300, seed=7)
    b, _ = clusters(d=12, n=111, seed=8)
    groups = [torch.from_numpy(a).double(), torch.from_numpy(b).double()]
    fit = fit_gmm(groups, 3, covariance, max_iter=3, seed=2)
    x, mask = gmm.pad_groups(groups)
    pts, norms = gmm._em_points(x, covariance)
    ll, sums, _ = gmm._em_pass(pts, mask, fit.mixture, True, norms)
    for i, g in enumerate(groups):
        m = fit.mixture
        one = gmm.Mixture(m.weights[i : i + 1], m.means[i : i + 1], m.covariances[i : i + 1], covariance)
        p1, n1 = gmm._em_points(g[None], covariance)
        ll1, sums1, _ = gmm._em_pass(p1, torch.ones(1, len(g), dtype=torch.bool), one, True, n1)
        assert float(ll[i]) == pytest.approx(float(ll1[0]), rel=1e-12)
        for name in ("mass", "first", "second"):
            np.testing.assert_allclose(getattr(sums, name)[i].numpy(), getattr(sums1, name)[0].numpy(), rtol=1e-10, atol=1e-9)


def test_one_component_is_the_sample_moments_after_one_pass():
    """K = 1 is EM's fixed point from any start: one E-step, no second M-step, and the
    mixture is the sample mean and (biased) covariance plus reg_covar."""
    x, _ = clusters(d=16, n=500, seed=6)
    xd = x.astype(np.float64)
    for covariance, want in (
        ("full", np.cov(xd, rowvar=False, bias=True) + 1e-6 * np.eye(16)),
        ("diag", xd.var(0) + 1e-6),
        ("spherical", xd.var(0).mean() + 1e-6),
    ):
        fit = fit_gmm([torch.from_numpy(x)], 1, covariance)
        assert fit.iterations == 1 and fit.converged.all()
        np.testing.assert_allclose(fit.mixture.means[0, 0].numpy(), xd.mean(0), atol=1e-5)
        np.testing.assert_allclose(fit.mixture.covariances[0, 0].numpy(), want, rtol=1e-4, atol=1e-6)
        ref = sklearn_mixture.GaussianMixture(1, covariance_type=covariance, reg_covar=1e-6).fit(x)
        assert float(fit.log_likelihood[0]) == pytest.approx(float(ref.score(x)), abs=1e-3)


def test_lloyd_pass_sums_only_the_points_of_weight_one(monkeypatch):
    """A Lloyd pass's centre sums (a scatter into one bin per component, plus a spare bin per
    group for points of weight 0) equal Σ over each label's weight-1 points, group by group,
    chunk by chunk: padding and outliers pull no centre, and no group's points reach another's."""
    import headway.core.gmm as gmm

    rng = np.random.default_rng(8)
    x = torch.from_numpy(rng.normal(size=(2, 300, 12))).double()
    centres = torch.from_numpy(rng.normal(size=(2, 5, 12))).double()
    cmask = _component_mask(torch.tensor([5, 3]), 5)
    weight = torch.from_numpy((rng.random((2, 300)) > 0.3).astype(np.float64))
    monkeypatch.setattr(gmm, "CHUNK_BYTES", 1)  # 64 rows a chunk, 44 in the last
    label, d2, sums, size = gmm._lloyd_pass(x, centres, cmask, (x * x).sum(-1), weight)
    dist = torch.cdist(x, centres) ** 2
    dist[~cmask[:, None, :].expand_as(dist)] = float("inf")
    assert torch.equal(label, dist.argmin(-1)) and int(label[1].max()) < 3  # unused components get no point
    np.testing.assert_allclose(d2.numpy(), dist.min(-1).values.numpy(), rtol=1e-9, atol=1e-9)
    onehot = torch.nn.functional.one_hot(label, 5).double() * weight[..., None]
    np.testing.assert_allclose(sums.numpy(), (onehot.transpose(1, 2) @ x).numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(size.numpy(), onehot.sum(1).numpy())


def bridged(seed: int = 0, k: int = 10, d: int = 256, n: int = 2000, share: float = 0.1) -> np.ndarray:
    """K well-separated float32 clusters (unit noise) and a share of points between two of
    them: the clusters' points settle (one-hot responsibilities), the bridge points do not."""
    rng = np.random.default_rng(seed)
    means = rng.normal(0.0, 1.0, (k, d))
    y = rng.integers(0, k, n)
    x = means[y] + rng.normal(size=(n, d))
    b = int(share * n)
    other = (y[:b] + rng.integers(1, k, b)) % k
    t = rng.uniform(0.3, 0.7, (b, 1))
    x[:b] = t * means[y[:b]] + (1 - t) * means[other] + rng.normal(size=(b, d))
    return x[rng.permutation(n)].astype(np.float32)


def test_sparse_passes_fit_as_well_as_plain_em_with_fewer_passes_over_all_points():
    """Sparse EM (passes over the unsettled rows, the settled rows' sums frozen) ends at a
    log-likelihood at least plain EM's, run to a tight tolerance, in fewer full passes."""

    x = torch.from_numpy(bridged(seed=3))  # from one start: the likeliest of three is converged within two passes
    sparse = fit_gmm([x], 10, "diag", seed=1, tol=1e-5, max_iter=500, restarts=1)
    plain = fit_gmm([x], 10, "diag", seed=1, tol=1e-5, max_iter=500, sparse_passes=0, restarts=1)
    assert plain.iterations == plain.passes and sparse.iterations > sparse.passes  # partial passes were taken
    assert sparse.passes < plain.passes
    assert float(sparse.log_likelihood[0]) >= float(plain.log_likelihood[0]) - 1e-5 * abs(float(plain.log_likelihood[0]))
    assert sparse.converged.all()


def test_a_pass_over_the_gathered_unsettled_rows_sums_what_those_rows_sum_in_place():
    """The unsettled rows of two groups (unequal counts), gathered and padded by _rows_of,
    score and sum as they do in place in the whole batch: no row lost, swapped between
    groups or mixed with padding."""
    import headway.core.gmm as gmm

    groups = [torch.from_numpy(bridged(seed=3, n=400)), torch.from_numpy(bridged(seed=4, n=250, share=0.3))]
    fit = fit_gmm(groups, 10, "diag", max_iter=2, seed=0)
    x, mask = gmm.pad_groups(groups)
    pts, _ = gmm._em_points(x, "diag")
    _, _, unsettled = gmm._em_pass(pts, mask, fit.mixture, False, None)
    counts = unsettled.sum(1)
    assert int(counts[0]) != int(counts[1]) and 0 < int(counts.max()) < 0.3 * x.shape[1]  # some rows of each group settled
    assert not bool((unsettled & ~mask).any())
    sub, _, sub_mask = gmm._rows_of(pts, None, unsettled)
    assert torch.equal(sub_mask.sum(1), counts)
    ll_in_place, in_place, _ = gmm._em_pass(pts, unsettled, fit.mixture, True, None)
    ll_gathered, gathered, _ = gmm._em_pass(sub, sub_mask, fit.mixture, True, None)
    np.testing.assert_allclose(ll_gathered.numpy(), ll_in_place.numpy(), rtol=1e-5)
    for name in ("mass", "first", "second"):
        np.testing.assert_allclose(getattr(gathered, name).numpy(), getattr(in_place, name).numpy(), rtol=1e-4, atol=1e-3)


def test_sparse_em_on_a_batch_keeps_each_groups_components_budget_and_reported_likelihood():
    """A batch of three groups (one with 3 of the 10 components; they converge at different
    passes): sparse EM ends each group as well as plain EM does, leaves the unused
    components at weight 0, takes at most max_iter M-steps, and reports the log-likelihood
    of the mixture it returns, also when max_iter ends it inside the sparse passes. (From one
    start: the likeliest of three needs no sparse passes here.)"""
    import headway.core.gmm as gmm

    groups = [torch.from_numpy(bridged(seed=s, n=n)) for s, n in ((3, 800), (4, 500), (5, 700))]
    ks = [10, 3, 10]
    x, mask = gmm.pad_groups(groups)
    pts, _ = gmm._em_points(x, "diag")
    sparse = fit_gmm(groups, 10, "diag", k_per_group=ks, seed=3, tol=1e-5, max_iter=500, restarts=1)
    assert sparse.iterations > sparse.passes and sparse.converged.all()
    assert torch.equal(sparse.mixture.weights[1, 3:], torch.zeros(7))
    for max_iter in (*range(1, 9), 500):
        fit = fit_gmm(groups, 10, "diag", k_per_group=ks, seed=3, tol=1e-5, max_iter=max_iter, restarts=1)
        assert fit.iterations <= max_iter
        rescored, _, _ = gmm._em_pass(pts, mask, fit.mixture, False, None)
        np.testing.assert_allclose(rescored.numpy(), fit.log_likelihood, rtol=1e-6)
    plain = fit_gmm(groups, 10, "diag", k_per_group=ks, seed=3, tol=1e-5, max_iter=500, sparse_passes=0, restarts=1)
    assert (sparse.log_likelihood >= plain.log_likelihood - 1e-5 * np.abs(plain.log_likelihood)).all()


def test_a_negative_sparse_passes_is_refused_with_what_to_use():
    with pytest.raises(ValueError, match=r"sparse_passes must be >= 0 \(0: plain EM\)"):
        fit_gmm([torch.zeros(10, 2)], 2, "diag", sparse_passes=-1)


@pytest.mark.parametrize("seed", [0, 1, 3])
def test_restarts_escape_the_merged_clusters_one_kmeans_start_ends_in(seed):
    """Ten separated clusters, each dimension scaled by 0.5–1.5: from one k-means start
    (the generator's seed 0) EM merges two clusters and splits another; with the default
    restarts the likeliest start recovers every cluster, at least scikit-learn's optimum."""
    x, y = clusters(d=64, n=1000, seed=seed)
    x = x * np.random.default_rng(10_000 + seed).uniform(0.5, 1.5, 64).astype(np.float32)
    one = fit_gmm([torch.from_numpy(x)], 10, "diag", seed=0, restarts=1)
    fit = fit_gmm([torch.from_numpy(x)], 10, "diag", seed=0)
    ref = float(sklearn_mixture.GaussianMixture(10, covariance_type="diag", random_state=0, reg_covar=1e-6).fit(x).score(x))
    assert float(one.log_likelihood[0]) < ref - 0.05 * abs(ref)  # the trap is set
    assert float(fit.log_likelihood[0]) >= ref - 1e-3 * abs(ref)
    assert adjusted_rand_score(y, predict(fit.mixture, [torch.from_numpy(x)])[0].numpy()) >= 0.99


def test_each_group_keeps_the_likeliest_of_its_restarts():
    """Three restarts fit one batch holding each group three times: each group gets the
    fit, of its three, with the highest log-likelihood, and (as scikit-learn's n_init) never
    less than a single start's."""
    groups = [torch.from_numpy(clusters(d=16, n=n, seed=s)[0]) for s, n in ((11, 300), (12, 200), (13, 250))]
    copies = fit_gmm(groups * 3, 6, "diag", seed=0, restarts=1)
    ll = copies.log_likelihood.reshape(3, 3)
    assert len(set(ll.argmax(0).tolist())) > 1  # the groups' best fits come from different copies
    fit = fit_gmm(groups, 6, "diag", seed=0, restarts=3)
    np.testing.assert_array_equal(fit.log_likelihood, ll.max(0))
    best = torch.as_tensor(ll.argmax(0) * 3 + np.arange(3))
    assert torch.equal(fit.mixture.means, copies.mixture.means[best])
    assert torch.equal(fit.mixture.covariances, copies.mixture.covariances[best])


def test_fewer_than_one_restart_is_refused_with_what_to_use():
    with pytest.raises(ValueError, match="restarts must be >= 1"):
        fit_gmm([torch.zeros(4, 2)], 2, restarts=0)
