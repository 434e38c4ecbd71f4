"""FedProf: profiles, the KL divergence, scores, both aggregation rules, the data-quality
scenarios, and the strategy on a fake grid (selection by score, malformed profiles)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict
from headway.core.config import ConfigError, check_against_spec, resolve, resolve_settings
from headway.core.data import SPECS
from headway.core.noise import corrupt, noise_assignment, parse_client_noise
from headway.core.profiles import (
    divergence,
    full_aggregate,
    gaussian_kl,
    model_profile,
    partial_aggregate,
    profile_problem,
    representation_profile,
    score,
)
from headway.strategies.fedprof import SECRET_ENV

from tests.fakes import FakeGrid, make_strategy, reply
from tests.fedprof_baseline import Baseline, run

# ----------------------------------------------------------------- the maths


def test_profile_is_per_unit_mean_and_variance_and_fuses_channels():
    dense = np.array([[1.0, 2.0], [3.0, 6.0]])
    assert np.allclose(representation_profile(dense), [[2.0, 1.0], [4.0, 4.0]])
    conv = np.arange(2 * 2 * 2 * 2, dtype=float).reshape(2, 2, 2, 2)  # n=2, 2 channels of 2×2
    sums = conv.reshape(2, 2, 4).sum(axis=2)  # channel outputs summed over positions: [[6, 22], [38, 54]]
    assert np.allclose(representation_profile(conv), np.stack([sums.mean(0), sums.var(0)], axis=1))
    assert np.allclose(representation_profile(conv), [[22.0, 256.0], [38.0, 256.0]])


def test_kl_matches_the_closed_form_and_a_monte_carlo_estimate():
    mu_p, var_p, mu_q, var_q = 0.3, 0.5, -0.2, 2.0
    closed = np.log(np.sqrt(var_q) / np.sqrt(var_p)) + (var_p + (mu_p - mu_q) ** 2) / (2 * var_q) - 0.5
    assert gaussian_kl(np.array(mu_p), np.array(var_p), np.array(mu_q), np.array(var_q)) == pytest.approx(closed, rel=1e-12)
    rng = np.random.default_rng(0)
    x = rng.normal(mu_p, np.sqrt(var_p), size=400_000)
    logp = -0.5 * np.log(2 * np.pi * var_p) - (x - mu_p) ** 2 / (2 * var_p)
    logq = -0.5 * np.log(2 * np.pi * var_q) - (x - mu_q) ** 2 / (2 * var_q)
    assert np.mean(logp - logq) == pytest.approx(closed, abs=5e-3)


def test_divergence_is_zero_for_identical_profiles_and_grows_with_the_shift():
    base = np.array([[0.0, 1.0], [2.0, 0.5], [1.0, 0.0]])  # a dead unit: variance 0 is floored
    assert divergence(base, base) == pytest.approx(0.0, abs=1e-12)
    near, far = base.copy(), base.copy()
    near[0, 0], far[0, 0] = 0.5, 2.0
    assert 0 < divergence(near, base) < divergence(far, base)
    assert divergence(far, base) == pytest.approx(np.mean([2.0, 0.0, 0.0]))  # (Δμ)²/(2σ²) = 2 on unit 0
    assert score(0.0, 10.0) == 1.0 and score(0.1, 10.0) == pytest.approx(np.exp(-1.0))


def _why(profile: np.ndarray, n: int) -> str:
    """The problem profile_problem finds in a profile that must have one."""
    problem = profile_problem(profile, n)
    assert problem is not None, "an impossible profile passed the check"
    return problem


def test_profile_problems_are_named():
    assert profile_problem(np.zeros((3, 2)), 3) is None
    assert "shape" in _why(np.zeros((4, 2)), 3)
    assert "NaN" in _why(np.array([[np.nan, 1.0]]), 1)
    assert "negative variance" in _why(np.array([[0.0, -1.0]]), 1)


def test_model_profile_hooks_the_named_layer():
    layer = torch.nn.Linear(3, 2, bias=False)
    model = torch.nn.Sequential(layer)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]]))
    x = torch.tensor([[1.0, 1.0, 0.0], [3.0, 2.0, 0.0]])
    assert np.allclose(model_profile(model, "0", x), [[2.0, 1.0], [3.0, 1.0]])
    with pytest.raises(ValueError, match="not a module"):
        model_profile(model, "nope", x)


def test_full_aggregation_keeps_the_unselected_share_on_the_previous_model():
    prev = {"w": np.array([1.0, 1.0], np.float32)}
    models = [{"w": np.array([3.0, 5.0], np.float32)}, {"w": np.array([0.0, 0.0], np.float32)}]
    # sizes 20 and 30 of 100 in all: 0.2·[3,5] + 0.3·[0,0] + 0.5·[1,1] = [1.1, 1.5]
    out = full_aggregate(prev, models, [20, 30], 100)
    assert np.allclose(out["w"], [1.1, 1.5]) and out["w"].dtype == np.float32


def test_partial_aggregation_is_scheme_two():
    like = {"w": np.zeros(2, np.float32)}
    models = [{"w": np.array([3.0, 5.0])}, {"w": np.array([1.0, 1.0])}]
    # N=4 clients, K=2 selected; ρ = n/n_total: 25/100 each -> weights ρ·N/K = 0.5: the plain mean
    assert np.allclose(partial_aggregate(models, [25, 25], 100, 4, like)["w"], [2.0, 3.0])
    # unequal sizes: 10 and 40 of 100 -> weights 0.2 and 0.8
    assert np.allclose(partial_aggregate(models, [10, 40], 100, 4, like)["w"], [0.2 * 3 + 0.8 * 1, 0.2 * 5 + 0.8 * 1])
    # weights 0.2 and 0.6 need not sum to 1 (unbiased only in expectation): no renormalizing
    assert np.allclose(partial_aggregate(models, [10, 30], 100, 4, like)["w"], [0.2 * 3 + 0.6 * 1, 0.2 * 5 + 0.6 * 1])


@pytest.mark.slow
def test_full_cache_aggregation_counts_each_client_with_its_last_local_model(task_identity, data_dir, monkeypatch):
    """Hand computation over five rounds, 4 clients of sizes 10/20/30/40, K = 1 drawn uniformly:
    the model sent in round r+1 is Σ_k ρ_k θ_k^last, a client never trained counting with θ_0."""
    strategy = make_strategy(
        "fedprof",
        **{
            "fedprof-val-size": 200,
            "data-dir": data_dir,
            "fraction-train": 0.25,
            "fedprof-alpha": 0.0,
            "fedprof-aggregation": "full-cache",
            "num-server-rounds": 5,
            "num-clients": 4,
        },
    )
    initial = strategy.initial_arrays()
    monkeypatch.setenv(SECRET_ENV, "test-secret")  # the fake clients rebuild the baseline from the same D^V
    baseline = Baseline(strategy)
    sizes = {0: 10, 1: 20, 2: 30, 3: 40}
    sent: dict[int, dict[int, dict[str, np.ndarray]]] = {}  # round -> partition -> the model it was sent

    def answer(pid, msg):
        cfg = msg.content.config_records["config"]
        profile = baseline(msg).astype(np.float32)
        if cfg.get("phase") == "profile":
            return reply({"profile": profile}, sizes[pid], pid)
        if msg.metadata.message_type == "evaluate":
            return RecordDict({"metrics": MetricRecord({"num-examples": 10, "correct": 5, "partition-id": pid})})
        model = {k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}
        sent.setdefault(cfg["server-round"], {})[pid] = model
        return reply({**{k: v + np.float32(0.01 * (pid + 1)) for k, v in model.items()}, "profile": profile}, sizes[pid], pid)

    strategy.start(grid=FakeGrid(4, answer), initial_arrays=initial, num_rounds=5)
    theta0 = {k: v.numpy() for k, v in initial.items()}
    last = {}  # partition -> its last local model
    untrained_after = []
    for r in range(1, 5):
        assert len(sent[r]) == 1
        last.update({pid: {k: v + np.float32(0.01 * (pid + 1)) for k, v in m.items()} for pid, m in sent[r].items()})
        want = {k: sum(sizes[p] / 100 * (last[p][k] if p in last else theta0[k]) for p in sizes) for k in theta0}
        got = next(iter(sent[r + 1].values()))
        assert all(np.allclose(got[k], want[k], atol=1e-6) for k in want), f"round {r + 1}"
        untrained_after.append(len(sizes) - len(last))
    assert untrained_after[1] > 0 and len(sent) == 5  # θ_0 still counted after round 2: the cache, not the last global


# ----------------------------------------------------------------- data-quality scenarios


def test_noise_assignment_is_seeded_and_disjoint():
    a = noise_assignment("irrelevant:0.15,blur:0.2,salt-pepper:0.25", 100, seed=0)
    assert sorted(a.values()).count("irrelevant") == 15 and list(a.values()).count("blur") == 20 and len(a) == 60
    assert a == noise_assignment("irrelevant:0.15,blur:0.2,salt-pepper:0.25", 100, seed=0)
    assert a != noise_assignment("irrelevant:0.15,blur:0.2,salt-pepper:0.25", 100, seed=1)
    with pytest.raises(ValueError, match="kind"):
        parse_client_noise("fog:0.1")
    with pytest.raises(ConfigError, match="client-noise"):
        resolve({"client-noise": "blur:0.7,irrelevant:0.5"})
    with pytest.raises(ConfigError, match="tabular"):
        check_against_spec(resolve_settings({"dataset": "mnist", "client-noise": "noisy:0.5"}), SPECS["mnist"])


def test_each_image_kind_changes_the_images_as_specified():
    rng = np.random.default_rng(0)
    x = np.zeros((4, 1, 28, 28), np.uint8)
    x[:, :, 10:18, 10:18] = 200
    grey = np.full((50, 3, 32, 32), 100, np.uint8)
    sp = corrupt(grey, "salt-pepper", np.random.default_rng(1))
    hit = sp != grey
    assert abs(hit.mean() - 0.3) < 0.01 and set(np.unique(sp[hit])) == {0, 255}  # density 0.3, salt and pepper
    assert (hit.all(axis=1) | ~hit.any(axis=1)).all()  # a hit pixel is hit in every channel
    blurred = corrupt(x, "blur", rng)
    assert (
        blurred[0, 0, 14, 14] > 150 and 0 < blurred[0, 0, 9, 14] < 100 and blurred.sum() == pytest.approx(x.sum(), rel=0.02)
    )  # edges smeared, mass kept
    irrelevant = corrupt(x, "irrelevant", rng)
    assert irrelevant.shape == x.shape and irrelevant.dtype == np.uint8 and irrelevant.std() > 20
    assert not np.array_equal(irrelevant[0], irrelevant[1])  # one pattern per image
    tab = np.zeros((5, 3), np.float32)
    assert np.abs(corrupt(tab, "polluted", rng)).max() > 1 and corrupt(tab, "noisy", rng).std() > 0.3
    with pytest.raises(ValueError, match="images"):
        corrupt(tab, "blur", rng)


def test_client_noise_corrupts_the_chosen_clients_training_data_only(data_dir):
    from headway.client.env import client_env

    cfg = resolve({"num-clients": 4, "client-noise": "irrelevant:0.5", "data-dir": data_dir, "train-fraction": 0.01})
    clean = resolve({**{k: cfg[k] for k in ("num-clients", "data-dir", "train-fraction")}})
    noisy = set(noise_assignment(cfg["client-noise"], 4, cfg["seed"]))
    for pid in range(4):
        env, ref = client_env(cfg, {"partition-id": pid}), client_env(clean, {"partition-id": pid})
        assert torch.equal(env.x_test, ref.x_test) and torch.equal(env.y_train, ref.y_train)
        assert torch.equal(env.x_train, ref.x_train) == (pid not in noisy)


# ----------------------------------------------------------------- the strategy


@pytest.mark.slow
def test_selection_favours_matching_profiles_and_malformed_profiles_are_counted(task_identity, data_dir, monkeypatch):
    """Client 2's profile is far from the baseline: it is picked far less often; client 1
    sends a profile with a negative variance from round 2 on: rejected, counted, the run goes
    on, and client 1 (no valid profile now) scores 0 and is no longer drawn; it is asked for
    a profile again after 1, 2, 4, … rounds, each refusal counted."""
    strategy = make_strategy("fedprof", **{"fedprof-val-size": 200, "data-dir": data_dir, "fraction-train": 0.34, "num-server-rounds": 30})
    monkeypatch.setenv(SECRET_ENV, "test-secret")  # the fake clients rebuild the baseline from the same D^V
    baseline = Baseline(strategy)

    def answer(pid, msg):
        cfg = msg.content.config_records["config"]
        base = baseline(msg).astype(np.float32)
        profile = base.copy()
        if pid == 2:
            profile[:, 0] += 5 * np.sqrt(base[:, 1]) + 1.0  # a distribution far from the baseline's
        if pid == 1 and cfg.get("server-round", 0) >= 2:
            profile[0, 1] = -1.0
        if msg.metadata.message_type == "evaluate":
            return RecordDict({"metrics": MetricRecord({"num-examples": 10, "correct": 5, "partition-id": pid})})
        if cfg.get("phase") == "profile":
            return reply({"profile": profile}, 20, pid)
        return reply({**{k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}, "profile": profile}, 20, pid)

    grid = FakeGrid(3, answer)
    records: list[dict] = []
    engine, state = run(strategy, grid, 30, records.append)
    picks = state.method.selections
    assert picks.get(2, 0) <= 3 and picks[0] >= 20  # λ_2 = e^{-α·div} ≈ 0
    reasons = [(r["round"], f) for r in records for f in r.get("failure_reasons", []) if "min-replies" not in f]
    assert all("negative variance" in f and "partition 1" in f for _, f in reasons), reasons
    refused_training = [rnd for rnd, f in reasons if f.startswith("train")]
    assert len(refused_training) == 1  # selected once with an invalid profile, then never drawn again
    assert (
        picks[1] == sum(1 for r in records if 1 in r["selected"])
        and max(r["round"] for r in records if 1 in r["selected"]) == refused_training[0]
    )
    retries = [rnd for rnd, f in reasons if f.startswith("profile")]
    first = refused_training[0]
    assert retries == [first + 1, first + 3, first + 7, first + 15][: len(retries)] and len(retries) >= 3
    assert len(records) == 30  # the run went on
    assert sum(r["clients"] for r in records) + len(refused_training) == 30  # one pick a round: a good reply, or a counted rejection
    summary = strategy.summary_extra(engine, state)
    assert summary["fedprof_last_divergence"]["2"] > 1.0 > summary["fedprof_last_divergence"]["0"]
