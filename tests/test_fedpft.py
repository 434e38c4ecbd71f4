"""FedPFT: our batched EM against known mixtures and scikit-learn, the float16 payload and
its size (Eqs. 9–11), the server's checks of hostile payloads, DP-FedPFT's noise and PSD
projection, the extractor registry and its cache, and runs through Flower's simulation."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict
from headway.core import protocol as P
from headway.core.config import ConfigError, resolve, resolve_settings
from headway.core.extractors import (
    ExtractorUnavailable,
    cached_extract,
    extract,
    feature_range,
    load_extractor,
)
from headway.core.fedpft import (
    ClassMixture,
    PayloadCheck,
    components_for,
    dp_sigma,
    encode,
    fit_class_mixtures,
    privatize,
)
from headway.core.gmm import (
    fit_gmm,
    pack_symmetric,
    parameter_count,
    project_psd,
    unpack_symmetric,
)
from headway.core.settings import Settings

from tests.fakes import FakeGrid, make_strategy, reply
from tests.oracles import payload_values

sklearn = pytest.importorskip("sklearn.mixture")


def blobs(seed: int = 0, d: int = 6, n: int = 600) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Three well-separated Gaussians with weights 0.5, 0.3, 0.2 and known diagonal variances."""
    rng = np.random.default_rng(seed)
    means = np.array([np.full(d, -6.0), np.zeros(d), np.full(d, 6.0)]) + rng.normal(0, 0.5, (3, d))
    var = np.array([0.5, 1.0, 2.0])[:, None] * np.ones(d)
    sizes = [int(n * 0.5), int(n * 0.3), n - int(n * 0.5) - int(n * 0.3)]
    x = np.concatenate([rng.normal(means[k], np.sqrt(var[k]), (sizes[k], d)) for k in range(3)]).astype(np.float32)
    return x, means, var


def test_em_recovers_known_mixture_parameters():
    x, means, var = blobs()
    fit = fit_gmm([torch.tensor(x)], 3, "diag", tol=1e-6, max_iter=300)
    m = fit.mixture
    order = np.argsort(m.means[0, :, 0].numpy())
    assert np.allclose(m.weights[0].numpy()[order], [0.5, 0.3, 0.2], atol=0.01)
    assert np.abs(m.means[0].numpy()[order] - means).max() < 0.25
    assert np.abs(m.covariances[0].numpy()[order] / var - 1).max() < 0.35
    assert fit.converged.all()


@pytest.mark.parametrize("covariance", ["full", "diag", "spherical"])
def test_em_matches_scikit_learn_log_likelihood(covariance):
    x, _, _ = blobs(seed=1)
    ours = fit_gmm([torch.tensor(x)], 3, covariance, tol=1e-6, max_iter=500)
    ref = sklearn.GaussianMixture(3, covariance_type=covariance, tol=1e-6, max_iter=500, random_state=0, reg_covar=1e-6).fit(x)
    assert ours.log_likelihood[0] == pytest.approx(ref.score(x), abs=1e-3)


def test_batched_groups_fit_as_if_alone_and_unused_components_get_no_weight():
    """Two groups of different sizes in one batch (padded) fit what each fits alone; a group
    limited to one component puts all its weight on it."""
    a, _, _ = blobs(seed=2, n=600)
    b, _, _ = blobs(seed=3, n=240)
    both = fit_gmm([torch.tensor(a), torch.tensor(b), torch.tensor(b)], 3, "diag", k_per_group=[3, 3, 1], tol=1e-6, max_iter=300)
    alone_a = fit_gmm([torch.tensor(a)], 3, "diag", tol=1e-6, max_iter=300)
    alone_b = fit_gmm([torch.tensor(b)], 3, "diag", tol=1e-6, max_iter=300)
    assert both.log_likelihood[0] == pytest.approx(alone_a.log_likelihood[0], abs=1e-4)
    assert both.log_likelihood[1] == pytest.approx(alone_b.log_likelihood[0], abs=1e-4)
    w = both.mixture.weights[2].numpy()
    assert w.max() == pytest.approx(1.0) and np.sort(w)[:2].sum() == 0
    one = fit_gmm([torch.tensor(b)], 1, "diag")  # K = 1 is the sample mean and variance
    assert np.allclose(one.mixture.means[0, 0].numpy(), b.mean(0), atol=1e-4)
    assert np.allclose(one.mixture.covariances[0, 0].numpy(), b.var(0) + 1e-6, rtol=1e-4)


def test_small_classes_get_fewer_components_and_tiny_ones_are_not_sent():
    assert [components_for(n, 10) for n in (2, 3, 7, 19, 20, 500)] == [1, 1, 3, 9, 10, 10]
    x, _, _ = blobs(n=200)
    labels = np.array([0] * 190 + [1] * 9 + [2] * 1)
    mixtures, _ = fit_class_mixtures(torch.tensor(x), labels, 10, "diag", 2, 1e-6, 1e-3, 100, "kmeans", 0)
    assert [(m.label, m.count, len(m.weights)) for m in mixtures] == [(0, 190, 10), (1, 9, 4)]  # class 2: one example, never sent


def _mixtures(covariance: str, d: int = 5) -> list[ClassMixture]:
    rng = np.random.default_rng(0)
    out = []
    for label, (count, k) in enumerate([(40, 2), (10, 1)]):
        w = rng.dirichlet(np.ones(k))
        means = rng.normal(0, 1, (k, d))
        if covariance == "full":
            a = rng.normal(0, 1, (k, d, d))
            cov = a @ np.swapaxes(a, 1, 2) / d + 0.1 * np.eye(d)
        elif covariance == "diag":
            cov = rng.uniform(0.1, 2, (k, d))
        else:
            cov = rng.uniform(0.1, 2, k)
        out.append(ClassMixture(label * 3, count, w, means, cov, covariance))
    return out


@pytest.mark.parametrize("covariance", ["full", "diag", "spherical"])
def test_float16_payload_round_trips_and_its_size_is_eqs_9_to_11(covariance):
    d = 5
    mixtures = _mixtures(covariance, d)
    payload = encode(mixtures, d, covariance)
    assert payload[P.GMM_WEIGHTS].dtype == np.float16 and payload[P.GMM_CLASSES].dtype == np.int32
    # float16 values: Eq. 9 (full: 2d + (d²−d)/2 + 1), 10 (diag: 2d + 1), 11 (spherical: d + 2) per component
    per = {"full": 2 * d + (d * d - d) // 2 + 1, "diag": 2 * d + 1, "spherical": d + 2}[covariance]
    assert parameter_count(d, 1, covariance) == per
    values = sum(v.size for k, v in payload.items() if k != P.GMM_CLASSES)
    assert values == 3 * per  # 2 + 1 components
    assert sum(v.nbytes for v in payload.values()) == 2 * values + 12 * len(mixtures)
    back, problem = PayloadCheck(10, d, 2, covariance, 1e4).decode(payload, 50)
    assert problem is None and back is not None
    for got, want in zip(back, mixtures):
        assert (got.label, got.count) == (want.label, want.count)
        assert np.allclose(got.means, want.means, rtol=2e-3, atol=2e-3)
        assert np.allclose(got.covariances, want.covariances, rtol=2e-3, atol=2e-3)
        assert got.weights.sum() == pytest.approx(1.0)


def test_symmetric_packing_and_psd_projection():
    rng = np.random.default_rng(0)
    a = rng.normal(size=(3, 4, 4))
    s = a + np.swapaxes(a, 1, 2)
    assert np.array_equal(unpack_symmetric(pack_symmetric(s), 4), s)
    p = project_psd(s, 1e-3)
    assert np.linalg.eigvalsh(p).min() >= 1e-3 - 1e-9
    spd = a @ np.swapaxes(a, 1, 2) + np.eye(4)
    assert np.allclose(project_psd(spd, 1e-3), spd)  # already PSD above the floor: unchanged


def _bad(covariance: str, change) -> dict[str, np.ndarray]:
    payload = {k: v.copy() for k, v in encode(_mixtures(covariance), 5, covariance).items()}
    change(payload)
    return payload


@pytest.mark.parametrize(
    ("covariance", "change", "reason"),
    [
        ("diag", lambda p: p[P.GMM_WEIGHTS].__setitem__(0, 0.9), "weights sum"),
        ("diag", lambda p: p[P.GMM_COVARIANCES].__setitem__((0, 0), -1.0), "variance <= 0"),
        ("spherical", lambda p: p[P.GMM_COVARIANCES].__setitem__(1, 0.0), "variance <= 0"),
        ("diag", lambda p: p[P.GMM_CLASSES].__setitem__((0, 0), 10), "outside 0..9"),
        ("diag", lambda p: p[P.GMM_CLASSES].__setitem__((1, 0), 0), "sent twice"),
        ("diag", lambda p: p[P.GMM_CLASSES].__setitem__((0, 1), 10**6), "more than the 50 examples"),
        ("diag", lambda p: p[P.GMM_CLASSES].__setitem__((0, 2), 1), "names 2 components"),
        ("diag", lambda p: p[P.GMM_MEANS].__setitem__((0, 0), 6e4), "beyond"),
        ("full", lambda p: p[P.GMM_COVARIANCES].__setitem__((0, 1), 60.0), "not PSD"),
        ("full", lambda p: p[P.GMM_COVARIANCES].__setitem__((0, 0), -0.5), "diagonal entry <= 0"),
    ],
)
def test_hostile_payloads_are_rejected_with_a_reason(covariance, change, reason):
    problem = PayloadCheck(10, 5, 2, covariance, 1e4).decode(_bad(covariance, change), 50)[1]
    assert problem is not None and reason in problem, problem


def test_dp_noise_has_theorem_4_1_scale_and_releases_psd_covariances():
    # Theorem 4.1: every entry gets N(0, σ²), σ = 4/(n·ε)·sqrt(5·ln(4/δ)), worked by hand:
    # n=100, ε=1, δ=0.01: 4/100 = 0.04; ln 400 = 5.991 46; sqrt(5 · 5.991 46) = sqrt(29.957 32) = 5.473 33; σ = 0.218 933
    assert dp_sigma(100, 1.0, 0.01) == pytest.approx(0.218933, rel=1e-5)
    # n=50, ε=0.5, δ=0.001: 4/25 = 0.16; ln 4000 = 8.294 05; sqrt(41.470 25) = 6.439 74; σ = 1.030 358
    assert dp_sigma(50, 0.5, 1e-3) == pytest.approx(1.030358, rel=1e-5)
    d, n = 8, 200
    f = torch.nn.functional.normalize(torch.randn(n, d, dtype=torch.float64), dim=1)
    rng = np.random.default_rng(1)
    draws = [privatize(f, 0, "diag", 1.0, 0.0, rng) for _ in range(300)]
    sigma, delta = draws[0][1], draws[0][2]
    # δ = 1/n = 0.005 by default: 4/200 = 0.02; ln 800 = 6.684 61; sqrt(33.423 06) = 5.781 27; σ = 0.115 625
    assert delta == pytest.approx(1 / n) and sigma == pytest.approx(0.115625, rel=1e-5)
    noise = np.stack([m.means[0] for m, _, _ in draws]) - f.mean(0).numpy()
    assert noise.std() == pytest.approx(sigma, rel=0.1)
    full, _, _ = privatize(f, 0, "full", 1.0, 0.0, rng)
    assert np.linalg.eigvalsh(full.covariances[0]).min() > 0  # projected onto the PSD cone
    assert all(m.covariances.min() > 0 for m, _, _ in draws)


def test_client_dp_noise_comes_from_os_entropy(data_dir):
    """Two identical DP runs of one client release different means: the noise is not a
    function of the run config."""
    from headway.client.env import client_env
    from headway.client.procedures.fedpft import FedPFTClient

    cfg = resolve(
        {
            "algorithm": "fedpft",
            "num-server-rounds": 1,
            "fedpft-extractor": "identity",
            "fedpft-dp": "on",
            "num-clients": 20,
            "train-fraction": 0.02,
            "data-dir": data_dir,
            "partition": "iid",
        }
    )
    env = client_env(cfg, {"partition-id": 0})
    msg = RecordDict({P.CONFIG: ConfigRecord({P.ROUND: 1, P.PHASE: P.PHASE_TRAIN})})
    a = FedPFTClient().train(env, msg, RecordDict()).array_records[P.ARRAYS][P.GMM_MEANS].numpy()
    b = FedPFTClient().train(env, msg, RecordDict()).array_records[P.ARRAYS][P.GMM_MEANS].numpy()
    assert a.shape == b.shape and not np.array_equal(a, b)


def test_strategy_refuses_configs_that_cannot_work():
    with pytest.raises(ConfigError, match="num-server-rounds=1"):
        make_strategy("fedpft", **{"num-server-rounds": 5})
    with pytest.raises(ConfigError, match="fedpft-components=1"):
        make_strategy("fedpft", **{"num-server-rounds": 1, "fedpft-dp": "on", "fedpft-components": 3})
    with pytest.raises(ConfigError, match="identity"):
        make_strategy("fedpft", **{"num-server-rounds": 1, "dataset": "uci-adult"})


def test_frozen_feature_inputs_refuse_what_cannot_work_and_size_the_model_to_the_features():
    from headway.core.config import check_against_spec
    from headway.core.data import SPECS
    from headway.core.extractors import input_spec

    with pytest.raises(ConfigError, match="always works on its extractor's features"):
        resolve({"algorithm": "fedpft", "inputs": "features"})
    with pytest.raises(ConfigError, match="fedpft-extractor=identity"):
        check_against_spec(resolve_settings({"algorithm": "fedavg", "inputs": "features", "dataset": "uci-adult"}), SPECS["uci-adult"])
    assert input_spec(resolve_settings({"dataset": "cifar10", "inputs": "features"})).input_shape == (1280,)
    assert input_spec(resolve_settings({"dataset": "cifar10", "inputs": "features", "fedpft-extractor": "resnet18"})).input_shape == (512,)
    assert input_spec(resolve_settings({"dataset": "cifar10"})) == SPECS["cifar10"]
    s = make_strategy("fedavg", **{"dataset": "cifar10", "inputs": "features", "body": "linear"})
    assert {k: tuple(v.shape) for k, v in s.initial_arrays().items()} == {"head.weight": (10, 1280), "head.bias": (10,)}


def test_a_hostile_reply_is_counted_and_the_head_is_trained_from_the_valid_ones(task_identity, data_dir):
    strategy = make_strategy(
        "fedpft",
        **{
            "num-server-rounds": 1,
            "fedpft-extractor": "identity",
            "fedpft-covariance": "diag",
            "fedpft-components": 2,
            "fedpft-head-epochs": 3,
            "data-dir": data_dir,
            "global-eval": False,
        },
    )
    rng = np.random.default_rng(0)

    def payload(pid):
        mix = []
        for c in (pid, pid + 3):
            means = np.clip(rng.normal(0.4 * c, 0.3, (1, 784)), -0.4, 2.8)  # inside MNIST's normalized pixel range
            mix.append(ClassMixture(c, 20, np.ones(1), means, np.full((1, 784), 0.5), "diag"))
        return encode(mix, 784, "diag")

    def answer(pid, msg):
        if msg.metadata.message_type == "evaluate":
            return RecordDict({"metrics": MetricRecord({"num-examples": 10, "correct": 5, "partition-id": pid})})
        p = payload(pid)
        if pid == 1:
            p[P.GMM_WEIGHTS][:] = 0.2  # weights that do not sum to 1
        if pid == 2:
            p[P.GMM_MEANS][0, 0] = np.nan
        return reply(p, 40, pid)

    records: list[dict] = []
    from headway.strategies.round_loop import RoundLoop

    loop = RoundLoop(strategy, strategy.connect(FakeGrid(3, answer)), on_round=records.append)
    head = loop.run(strategy.initial_state(), 1).method
    rec = records[0]
    assert rec["clients"] == 1 and rec["failures"] == 2
    assert any("weights sum" in f for f in rec["failure_reasons"]) and any("NaN" in f for f in rec["failure_reasons"])
    assert rec["synthetic_examples"] == 40 and head.received == ((0, 20), (3, 20))
    assert head.head is not None and head.head[0].shape == (10, 784)


def test_efficientnet_lite0_loads_offline_and_gives_1280_features(data_dir):
    pytest.importorskip("efficientnet_lite_pytorch")
    from headway.core.data import load_dataset, to_tensors

    ds = load_dataset("mnist", data_dir, 0)
    x, _ = to_tensors(ds, ds.x_train[:3], ds.y_train[:3])  # grayscale: repeated to three channels
    f = extract(x, "mnist", "efficientnet-lite0", resolution=32)
    assert f.shape == (3, 1280) and torch.isfinite(f).all() and f.abs().sum() > 0
    bounds = feature_range("efficientnet-lite0", "mnist")  # the range the server holds mixture means to
    assert bounds is not None
    lo, hi = bounds
    assert f.min() >= lo and f.max() <= hi
    assert not load_extractor("efficientnet-lite0", "", 32, "cpu").training


def test_a_missing_weights_file_fails_with_one_clear_message(tmp_path):
    with pytest.raises(ExtractorUnavailable, match="no such file"):
        load_extractor("efficientnet-lite0", str(tmp_path / "missing.pth"), 32, "cpu")
    with pytest.raises(ExtractorUnavailable, match="fedpft-extractor-weights"):
        load_extractor("resnet18", "", 0, "cpu")  # no network here: the download fails


def test_features_are_cached_by_extractor_and_rows(tmp_path):
    calls = []

    def compute(x, dataset, name, weights, resolution, device):
        calls.append(len(x))
        return torch.full((len(x), 4), float(len(calls)))

    x = torch.randn(5, 1, 28, 28)
    a = cached_extract(x, "mnist", "efficientnet-lite0", directory=tmp_path, compute=compute)
    b = cached_extract(x, "mnist", "efficientnet-lite0", directory=tmp_path, compute=compute)
    assert calls == [5] and torch.equal(a, b)  # the second read came from disk
    cached_extract(x[:4], "mnist", "efficientnet-lite0", directory=tmp_path, compute=compute)
    cached_extract(x, "mnist", "efficientnet-lite0", resolution=64, directory=tmp_path, compute=compute)
    assert calls == [5, 4, 5]  # other rows, other resolution: computed anew


def test_payload_size_formula_counts_reduced_components():
    assert payload_values([100, 3], 10, 5, "diag") == (2 * 10 + 1) * (5 + 1)


# ----- through Flower's simulation engine ---------------------------------------------------
SIM = {
    "algorithm": "fedpft",
    "dataset": "mnist",
    "num-server-rounds": 1,
    "num-clients": 3,
    "train-fraction": 0.01,
    "seed": 0,
    "sample-timeout": 30.0,
    "fedpft-resolution": 32,
    "fedpft-head-epochs": 20,
    "fedpft-head-lr": 1e-3,
}


def _run(tmp_path, data_dir, **overrides):
    from headway.simulation import simulate

    # another method on FedPFT's features reads the extractor's keys, not FedPFT's head (core/methods.py: FEATURE_KEYS)
    own = overrides.get("algorithm", "fedpft") == "fedpft"
    base = {k: v for k, v in SIM.items() if own or not k.startswith("fedpft-head-")}
    cfg = resolve_settings({**base, "data-dir": data_dir, "fedpft-cache-dir": str(tmp_path / "cache"), **overrides})
    summary = simulate(cfg, tmp_path / "run")
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    return cfg, summary, rounds


def _expected_reply_bytes(cfg: Settings, pid: int) -> int:
    """Wire bytes of the reply partition ``pid`` sends, recomputed here (same features, same seeded EM)."""
    from flwr.app import ConfigRecord
    from headway.client.env import client_env
    from headway.client.procedures.fedpft import FedPFTClient

    from tests.test_simulation import reply_bytes

    env = client_env(cfg.to_config(), {"partition-id": pid})
    content = FedPFTClient().train(env, RecordDict({P.CONFIG: ConfigRecord({P.ROUND: 1, P.PHASE: P.PHASE_TRAIN})}), RecordDict())
    arrays = {k: v.numpy() for k, v in content.array_records[P.ARRAYS].items()}
    return reply_bytes(arrays, len(env.y_train), pid, loss=False)


@pytest.mark.integration
def test_centralized_run_trains_a_head_from_mixtures_and_reports_measured_bytes(tmp_path, data_dir):
    pytest.importorskip("efficientnet_lite_pytorch")
    cfg, summary, rounds = _run(tmp_path, data_dir, partition="dirichlet", **{"fedpft-covariance": "diag", "fedpft-components": 2})
    r = rounds[0]
    assert summary["status"] == "complete" and r["failures"] == 0 and r["clients"] == 3
    assert r["global_accuracy"] > 0.5 and r["accuracy"] > 0.5  # chance is 0.1
    from tests.test_simulation import near

    expected = sum(_expected_reply_bytes(cfg, pid) for pid in range(3))
    assert near(r["bytes_up"], expected, 3), (r["bytes_up"], expected)
    assert summary["feature_dim"] == 1280 and summary["classes_received"] >= 3
    assert summary["participants"] == {str(p): "efficientnet-lite0 (frozen) + linear head" for p in range(3)}  # not the unused body


@pytest.mark.integration
def test_chain_relays_mixtures_client_to_client(tmp_path, data_dir):
    pytest.importorskip("efficientnet_lite_pytorch")
    cfg, summary, rounds = _run(tmp_path, data_dir, partition="iid", **{"fedpft-topology": "chain"})
    r = rounds[0]
    assert r["chain_order"] == [0, 1, 2] and r["failures"] == 0
    # every hop is metered: three replies up, two relayed payloads (plus the empty first message) down
    assert r["chain_bytes_up"] > 0 and r["chain_bytes_down"] > 0
    assert all(0 <= r[f"accuracy_p{i}"] <= 1 for i in range(3))
    # the last client's head saw its own data plus two clients' samples: not worse than its local-only head by much
    assert r["accuracy_p2"] >= r["accuracy_local_p2"] - 0.05


@pytest.mark.integration
def test_fedavg_of_a_linear_head_on_frozen_features_is_a_flower_run_sharing_fedpfts_cache(tmp_path, data_dir):
    """inputs=features + body=linear: FedPFT's FedAvg-head baseline as a real run. Replies
    are the (C, d) head and its bias, clients and server read the same cached features as
    FedPFT would, and the head learns (chance is 0.1)."""
    pytest.importorskip("efficientnet_lite_pytorch")
    from headway.client.env import client_env
    from headway.core.fedpft import features

    cfg, summary, rounds = _run(
        tmp_path,
        data_dir,
        algorithm="fedavg",
        inputs="features",
        body="linear",
        partition="iid",
        **{"num-server-rounds": 2, "local-epochs": 5, "lr": 1e-3, "batch-size": 16, "optimizer": "adam"},
    )
    assert summary["status"] == "complete" and len(rounds) == 2 and all(r["failures"] == 0 and r["clients"] == 3 for r in rounds)
    head = 4 * (10 * 1280 + 10)  # float32 weight and bias: all a client sends and receives
    assert all(r["values_bytes_up"] == 3 * head and r["values_bytes_down"] == 3 * head for r in rounds)
    assert rounds[-1]["accuracy"] > 0.5 and rounds[-1]["global_accuracy"] > 0.5
    cache = tmp_path / "cache"
    entries = sorted(cache.iterdir())
    assert len(entries) == 3 * 2 + 1  # each client's train and test rows, and the server's test set
    env = client_env(cfg.to_config(), {"partition-id": 1})
    assert env.x_train.shape[1] == 1280 and env.data.input_shape == (1280,)
    raw_cfg = {
        **cfg.to_config(),
        "inputs": "raw",
        "fedpft-resolution": 0,
        "fedpft-cache-dir": "",
    }  # the extractor's keys at their defaults: raw inputs read none
    raw = client_env(raw_cfg, {"partition-id": 1})
    assert torch.equal(features(replace(cfg, algorithm="fedpft"), "mnist", raw.x_train), env.x_train)
    assert sorted(cache.iterdir()) == entries  # FedPFT's extraction of the same rows was a cache hit


@pytest.mark.parametrize("covariance", ["full", "diag", "spherical"])
def test_samples_follow_the_mixture(covariance):
    from headway.core.gmm import Mixture, sample

    d = 4
    a = torch.randn(2, d, d, generator=torch.Generator().manual_seed(0))
    full = a @ a.transpose(1, 2) + torch.eye(d)
    cov = {"full": full, "diag": torch.diagonal(full, dim1=1, dim2=2), "spherical": full.diagonal(dim1=1, dim2=2).mean(1)}[covariance]
    means = torch.stack([torch.zeros(d), torch.full((d,), 50.0)])
    mix = Mixture(torch.tensor([[0.25, 0.75]]), means[None], cov[None], covariance)
    x = sample(mix, [100_000], torch.Generator().manual_seed(1))[0].double()
    second = x[:, 0] > 25  # the components are far apart: each point's component is plain
    assert second.double().mean().item() == pytest.approx(0.75, abs=0.01)
    want = full[1] if covariance == "full" else torch.diag(cov[1]) if covariance == "diag" else cov[1] * torch.eye(d)
    want = want.double()
    assert torch.allclose(torch.cov(x[second].T), want, atol=0.15 * want.abs().max().item())
    assert torch.allclose(x[second].mean(0), means[1].double(), atol=0.05)


def test_a_singular_full_covariance_never_crashes_the_sampler():
    """A hostile 'covariance' with a huge, exactly singular block (found by review): either
    rejected, or lifted so that the factorization sampling makes succeeds."""
    from headway.core.fedpft import synthesize

    d = 6
    cov = np.eye(d) * 0.5
    cov[:2, :2] = 3e4
    payload = encode([ClassMixture(1, 30, np.ones(1), np.zeros((1, d)), cov[None], "full")], d, "full")
    mixtures, problem = PayloadCheck(10, d, 1, "full", 1e4).decode(payload, 30)
    if problem is None:
        assert mixtures is not None
        x, y = synthesize(mixtures, torch.Generator().manual_seed(0))
        assert x.shape == (30, d) and torch.isfinite(x).all()


def test_full_covariance_em_survives_fewer_points_than_dimensions():
    """40 points in 256 dimensions: the sample covariance is singular; the default
    reg_covar must still give factorizable covariances (float32 accumulation did not)."""
    x = torch.randn(40, 256, generator=torch.Generator().manual_seed(0)) * 5 + 3
    fit = fit_gmm([x], 1, "full")
    assert np.isfinite(fit.log_likelihood).all()
    torch.linalg.cholesky(fit.mixture.covariances[0].double())


def test_claimed_counts_are_capped_before_sampling():
    from headway.core.fedpft import capped_counts

    mixtures = [ClassMixture(c, n, np.ones(1), np.zeros((1, 3)), np.ones(1), "spherical") for c, n in ((0, 10**6), (1, 10**5), (2, 3))]
    counts = capped_counts(mixtures, 1000)
    assert sum(counts) <= 1000 + len(counts) and counts[0] / counts[1] == pytest.approx(10, rel=0.02) and counts[2] == 1
    assert capped_counts(mixtures[2:], 1000) == [3]  # under the cap: unchanged


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda p: p.__setitem__(P.GMM_MEANS, np.full_like(p[P.GMM_MEANS], np.nan)), "NaN"),
        (lambda p: p.__setitem__(P.GMM_MEANS, np.zeros((3, 7), np.float16)), "expected floats (3, 5)"),
        (lambda p: p.__setitem__(P.GMM_CLASSES, p[P.GMM_CLASSES].reshape(-1)), "class table of shape"),
        (lambda p: p[P.GMM_CLASSES].__setitem__((1, 1), 1), "fewer than fedpft-min-class-examples"),
        (lambda p: p[P.GMM_CLASSES].__setitem__((0, 1), 3), "examples // 2"),
    ],
)
def test_relayed_payloads_are_checked_without_the_servers_decoding(change, reason):
    """A chain client re-checks what it is relayed with PayloadCheck alone: structure and
    finiteness too, not only the bounds."""
    problem = PayloadCheck(10, 5, 2, "diag", 1e4, min_examples=2).decode(_bad("diag", change), None)[1]
    assert problem is not None and reason in problem, problem


def test_a_torchvision_extractor_loads_weights_from_a_local_file(tmp_path, data_dir):
    """fedpft-extractor-weights=PATH: a saved state dict stands in for the download; the
    classifier is cut off, so features are the pooled 512 of resnet18."""
    import torchvision
    from headway.core.data import load_dataset, to_tensors

    path = tmp_path / "resnet18.pth"
    torch.save(torchvision.models.resnet18(weights=None).state_dict(), path)
    ds = load_dataset("cifar10", data_dir, 0)
    x, _ = to_tensors(ds, ds.x_test[:2], ds.y_test[:2])
    f = extract(x, "cifar10", "resnet18", str(path), resolution=64)
    assert f.shape == (2, 512) and torch.isfinite(f).all()
