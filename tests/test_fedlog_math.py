import numpy as np
import pytest
from headway.core.fedlog import (
    StatsCheck,
    add_noise,
    class_means,
    dp_sigma,
    solve_head,
    stationarity_residual,
    sufficient_statistics,
)
from scipy.optimize import minimize

from tests.oracles import log_posterior


def _features(rng, n, m, classes):
    phi = np.concatenate([np.ones((n, 1)), rng.gamma(2.0, 0.5, size=(n, m - 1))], axis=1)
    y = rng.integers(0, classes, size=n)
    return phi, y


@pytest.mark.parametrize(
    "classes,m,n,nu,chi", [(10, 51, 3000, 1.0, 0.0), (2, 3, 80, 1.0, 0.0), (100, 101, 20000, 0.5, 0.1), (5, 8, 10, 3.0, 0.0)]
)
def test_solve_head_is_stationary(classes, m, n, nu, chi):
    rng = np.random.default_rng(classes)
    phi, y = _features(rng, n, m, classes)
    stats = sufficient_statistics(phi, y, classes)
    eta = solve_head(stats, n, chi=chi, nu=nu)
    # η_y = 2 (χ+Φ)_y / ((ν+n) p_y) with p = softmax(‖η_y‖²/4), to 1e-6 relative
    q = np.sum(eta**2, axis=1) / 4
    p = np.exp(q - q.max()) / np.exp(q - q.max()).sum()
    target = 2 * (chi + stats) / ((nu + n) * p[:, None])
    assert np.allclose(eta, target, rtol=1e-6, atol=0)
    assert stationarity_residual(eta, stats, n, chi, nu) < 1e-9


def test_solve_head_is_the_maximizer_a_generic_optimizer_finds():
    rng = np.random.default_rng(1)
    phi, y = _features(rng, 400, 6, 4)
    stats = sufficient_statistics(phi, y, 4)
    eta = solve_head(stats, 400)
    neg = lambda v: -log_posterior(v.reshape(4, 6), stats, 400)  # noqa: E731
    res = minimize(neg, np.zeros(24), method="L-BFGS-B", options={"ftol": 1e-15, "gtol": 1e-10, "maxiter": 10000})
    assert log_posterior(eta, stats, 400) >= -res.fun - 1e-9
    assert np.allclose(eta, res.x.reshape(4, 6), atol=1e-4)
    for _ in range(20):  # and every nearby point is worse
        assert log_posterior(eta + 1e-3 * rng.standard_normal(eta.shape), stats, 400) < log_posterior(eta, stats, 400)


def test_head_equals_central_map_from_pooled_features_and_splitting_changes_nothing():
    """Sufficiency: the head solved from two clients' summed statistics is the MAP a central
    server finds from the pooled examples themselves, by a generic optimizer on the per-example
    objective Σ_i η_{y_i}·φ_i − (ν + n)·log Σ_y exp(‖η_y‖²/4) (ν = 1), with no statistics involved."""
    rng = np.random.default_rng(2)
    n, m, classes = 500, 11, 10
    phi, y = _features(rng, n, m, classes)
    onehot = np.eye(classes)[y]

    def negative_and_gradient(v):
        eta = v.reshape(classes, m)
        q = np.sum(eta**2, axis=1) / 4
        log_z = np.log(np.sum(np.exp(q - q.max()))) + q.max()
        value = np.sum(eta[y] * phi) - (1 + n) * log_z
        grad = onehot.T @ phi - (1 + n) * np.exp(q - log_z)[:, None] * eta / 2
        return -value, -grad.ravel()

    opts = {"ftol": 1e-15, "gtol": 1e-11, "maxiter": 20000}
    central = minimize(negative_and_gradient, np.zeros(classes * m), jac=True, method="L-BFGS-B", options=opts).x.reshape(classes, m)
    cut = 137  # one data set split over two clients
    parts = [sufficient_statistics(phi[:cut], y[:cut], classes), sufficient_statistics(phi[cut:], y[cut:], classes)]
    assert np.allclose(parts[0] + parts[1], onehot.T @ phi, rtol=0, atol=1e-9)
    federated = solve_head(parts[0] + parts[1], cut + (n - cut))
    assert np.allclose(federated, central, rtol=0, atol=1e-6), np.max(np.abs(federated - central))


def test_statistics_are_per_class_feature_sums_with_counts_first():
    phi = np.array([[1.0, 2.0], [1.0, 3.0], [1.0, -1.0]])
    stats = sufficient_statistics(phi, np.array([0, 0, 2]), 3)
    assert stats.tolist() == [[2.0, 5.0], [0.0, 0.0], [1.0, -1.0]]
    assert class_means(stats).tolist() == [[1.0, 2.5], [0.0, 0.0], [1.0, -1.0]]


def test_empty_classes_get_zero_rows_and_bad_inputs_fail():
    stats = np.array([[3.0, 1.5], [0.0, 0.0]])
    eta = solve_head(stats, 3)
    assert np.all(eta[1] == 0) and np.all(np.isfinite(eta))
    with pytest.raises(ValueError, match="NaN"):
        solve_head(np.array([[np.nan, 1.0]]), 1)
    with pytest.raises(ValueError, match="> 0"):
        solve_head(stats, 0, nu=0.0)


def test_dp_sigma_is_theorem_7s_calibration_and_noise_has_that_scale():
    # Theorem 7 (fedlog-extended): σ = sqrt(8k(1 + (m−1)·b²)·ln(e + ε/δ)) / ε, worked by hand:
    # ε=1, δ=0.01, m=101, b=2, k=100: 8·100·(1 + 100·4) = 320 800; ln(e + 100) = ln 102.718 28 = 4.631 99;
    #   320 800 · 4.631 99 = 1 485 942; sqrt = 1218.992; / ε = 1218.992
    assert dp_sigma(1.0, 0.01, m=101, clip=2.0, rounds=100) == pytest.approx(1218.992, rel=1e-6)
    # ε=2, δ=1e-5, m=51, b=1, k=10: 8·10·(1 + 50·1) = 4080; ln(e + 2·10⁵) = 12.206 09;
    #   4080 · 12.206 09 = 49 800.8; sqrt = 223.161; / ε = 111.580
    assert dp_sigma(2.0, 1e-5, m=51, clip=1.0, rounds=10) == pytest.approx(111.580, rel=1e-5)
    rng = np.random.default_rng(0)
    base = np.zeros((200, 250))
    noise = add_noise(base, 3.7, rng) - base
    assert abs(noise.std() / 3.7 - 1) < 0.05 and abs(noise.mean()) < 0.05
    assert add_noise(base, 0.0, rng) is base  # mode off adds nothing


def _why(check: StatsCheck, stats: np.ndarray, count: float) -> str:
    """The problem ``check`` finds in a reply that must have one."""
    problem = check.problem(stats, count)
    assert problem is not None, "an impossible reply passed the check"
    return problem


def test_stats_check_catches_impossible_replies():
    check = StatsCheck(num_classes=2, m=3, clip=2.0)
    good = np.array([[4.0, 3.0, -8.0], [6.0, 12.0, 0.5]])
    assert check.problem(good, 10) is None
    assert "shape" in _why(check, good[:, :2], 10)
    bad = good.copy()
    bad[0, 1] = np.nan
    assert "NaN" in _why(check, bad, 10)
    assert "count" in _why(check, good, -1)
    assert "sum to" in _why(check, good, 11)
    over = good.copy()
    over[1, 1] = 12.5  # > b * class count = 2 * 6
    assert "clip bound" in _why(check, over, 10)
    assert StatsCheck(2, 3, 2.0, noise_sigma=1.0).problem(good + 0.5, 10) is None  # local DP noise is tolerated


def test_stats_check_accepts_every_honest_local_dp_reply_at_the_clip_bound():
    """Saturated features (every sum at ±b × count) plus local-DP noise on the sums *and*
    the counts: no honest reply may be dropped, while an over-bound one still is."""
    classes, m, b, sigma, count = 10, 101, 2.0, 5.0, 50.0
    honest = np.full((classes, m), b * count)
    honest[:, 0] = count
    honest[::2, 1:] *= -1
    check = StatsCheck(classes, m, b, noise_sigma=sigma)
    rng = np.random.default_rng(0)
    problems = [check.problem(add_noise(honest, sigma, rng), classes * count) for _ in range(300)]
    assert problems.count(None) == len(problems), {p for p in problems if p}
    over = honest.copy()
    over[3, 7] = 3 * b * count  # 200 over the bound, beyond the margin of 8σ·sqrt(1 + b²) ≈ 89
    assert "clip bound" in _why(check, add_noise(over, sigma, rng), classes * count)
