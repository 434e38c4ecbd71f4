"""The settings FedProf's experiments need, usable by every method: dominant-class and
normal-size partitions, learning-rate decay, sparse client evaluation, the record of who
trained, participation by noise kind, the global model's progress, R², and the simulated
device costs of Eqs. 9-16."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict
from headway.core.config import ConfigError, check_against_spec, resolve, resolve_settings
from headway.core.costmodel import (
    P_F,
    P_TRANS,
    DeviceSpec,
    client_costs,
    draw_devices,
    round_cost,
)
from headway.core.data import SPECS, load_dataset
from headway.core.models import build_model
from headway.core.partition import client_sizes, make_partition
from headway.core.training import task_metrics
from headway.server.results import global_progress, participation_by_noise
from headway.strategies.fedprof import SECRET_ENV

from tests.fakes import FakeGrid, make_strategy, reply
from tests.fedprof_baseline import Baseline


def test_dominant_partition_gives_each_client_one_class_at_the_fraction(data_dir):
    ds = load_dataset("mnist", data_dir)
    cfg = resolve_settings(
        {"partition": "dominant", "dominant-class-fraction": 0.6, "num-clients": 20, "train-fraction": 0.2, "data-dir": data_dir}
    )
    part = make_partition(ds, cfg)
    tops = []
    for train in part.train:
        counts = np.bincount(ds.y_train[train], minlength=10)
        assert abs(counts.max() / counts.sum() - 0.6) < 0.05  # the dominant class (MNIST classes differ in size by up to 14 %)
        assert np.all(counts > 0)  # the rest spread over every other class
        tops.append(int(counts.argmax()))
    assert np.bincount(tops, minlength=10).tolist() == [2] * 10  # every class dominates equally many clients
    rows = np.concatenate(part.train)
    assert len(rows) == len(set(rows.tolist()))  # disjoint


def test_dominant_partition_needs_class_labels():
    cfg = resolve_settings({"partition": "dominant", "dataset": "uci-gas-turbine", "body": "mlp"})
    with pytest.raises(ConfigError, match="dominant"):
        check_against_spec(cfg, SPECS["uci-gas-turbine"])


def test_client_sizes_are_normal_seeded_and_fit_the_data():
    sizes = client_sizes(2000, 514.0, 101.0, 10**7, seed=3)
    assert sizes is not None and abs(sizes.mean() - 514) < 8 and abs(sizes.std() - 101) < 6
    again, other = client_sizes(2000, 514.0, 101.0, 10**7, seed=3), client_sizes(2000, 514.0, 101.0, 10**7, seed=4)
    assert again is not None and other is not None and np.array_equal(sizes, again) and not np.array_equal(sizes, other)
    squeezed = client_sizes(50, 514.0, 101.0, 20_000, seed=0)
    assert squeezed is not None and squeezed.sum() <= 20_000 and squeezed.min() >= 1
    assert client_sizes(50, 0.0, 0.0, 100, seed=0) is None


def test_iid_partition_takes_exactly_the_drawn_sizes(data_dir):
    ds = load_dataset("uci-gas-turbine", data_dir)
    cfg = resolve_settings(
        {
            "dataset": "uci-gas-turbine",
            "body": "mlp",
            "partition": "iid",
            "num-clients": 50,
            "train-fraction": 1.0,
            "client-size-mean": 514.0,
            "client-size-std": 101.0,
            "server-holdout": 3000,
            "data-dir": data_dir,
        }
    )
    part = make_partition(ds, cfg)
    expected = client_sizes(50, 514.0, 101.0, len(ds.y_train) - 3000, cfg.seed)
    assert expected is not None and [len(t) for t in part.train] == expected.tolist()
    assert len(part.validation) == 3000 and not set(part.validation.tolist()) & set(np.concatenate(part.train).tolist())


def test_size_keys_are_checked():
    with pytest.raises(ConfigError, match="client-size-mean"):
        resolve({"client-size-std": 10.0})
    with pytest.raises(ConfigError, match="iid or dominant"):
        resolve({"client-size-mean": 100.0, "partition": "pathological"})


def test_learning_rate_decays_per_round(data_dir):
    from headway.client.env import client_env

    env = client_env(
        resolve({"lr": 0.01, "lr-decay": 0.9, "num-clients": 2, "train-fraction": 0.01, "data-dir": data_dir}), {"partition-id": 0}
    )
    assert env.lr(1) == pytest.approx(0.01) and env.lr(3) == pytest.approx(0.01 * 0.81)
    with pytest.raises(ConfigError, match="lr-decay"):
        resolve({"lr-decay": 1.5})


def test_clients_evaluate_every_n_rounds_and_rounds_record_who_trained(task_identity, data_dir):
    strategy = make_strategy(
        "fedavg", **{"eval-every": 2, "num-clients": 4, "fraction-train": 0.5, "data-dir": data_dir, "global-eval": False}
    )

    def answer(pid, msg):
        if msg.metadata.message_type == "evaluate":
            return RecordDict({"metrics": MetricRecord({"num-examples": 10, "correct": 5, "partition-id": pid})})
        return reply({k: v.numpy() for k, v in msg.content["arrays"].items()}, 20, pid)

    grid = FakeGrid(4, answer)
    records: list[dict] = []
    strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=5, on_round=records.append)
    assert [r["accuracy"] is not None for r in records] == [False, True, False, True, True]  # rounds 2, 4 and the last
    trained: dict[int, set[int]] = {}
    for msg in grid.sent:
        if msg.metadata.message_type == "train":
            trained.setdefault(int(msg.metadata.group_id), set()).add(msg.metadata.dst_node_id - 101)
    assert [set(r["selected"]) for r in records] == [trained[r] for r in range(1, 6)]
    assert all(len(r["selected"]) == 2 for r in records)


def test_fedprof_rounds_record_the_scores_the_sampler_used(task_identity, data_dir, monkeypatch):
    strategy = make_strategy("fedprof", **{"fedprof-val-size": 200, "data-dir": data_dir, "num-clients": 4, "fraction-train": 0.5})
    monkeypatch.setenv(SECRET_ENV, "test-secret")  # the fake clients rebuild the baseline from the same D^V
    baseline = Baseline(strategy)

    def answer(pid, msg):
        base = baseline(msg).astype(np.float32)
        profile = base.copy()
        if pid == 3:
            profile[:, 0] += 5 * np.sqrt(base[:, 1]) + 1.0
        if msg.metadata.message_type == "evaluate":
            return RecordDict({"metrics": MetricRecord({"num-examples": 10, "correct": 5, "partition-id": pid})})
        if msg.content["config"].get("phase") == "profile":
            return reply({"profile": profile}, 20, pid)
        return reply({**{k: v.numpy() for k, v in msg.content["arrays"].items()}, "profile": profile}, 20, pid)

    records: list[dict] = []
    strategy.start(grid=FakeGrid(4, answer), initial_arrays=strategy.initial_arrays(), num_rounds=2, on_round=records.append)
    scores = records[0]["fedprof_scores"]
    assert sorted(scores) == ["0", "1", "2", "3"]
    assert scores["3"] < 1e-3 and scores["0"] > 0.9  # λ = exp(-α·div): the far profile scores ~0


def test_participation_by_noise_counts_rounds_per_kind():
    cfg = resolve_settings({"num-clients": 4, "client-noise": "blur:0.5"})
    from headway.core.noise import noise_assignment

    blurred = sorted(noise_assignment(cfg.client_noise, 4, cfg.seed))
    clean = sorted(set(range(4)) - set(blurred))
    rounds = [{"selected": [clean[0], blurred[0]]}, {"selected": [clean[0], clean[1]]}, {"selected": [clean[0]]}]
    assert participation_by_noise(rounds, cfg) == {"blur": 0.5, "clean": 2.0}  # (1+0)/2 and (3+1)/2


def test_global_progress_finds_the_first_round_at_target():
    rounds = [
        {"round": 1, "global_accuracy": 0.5, "cumulative_bytes": 10},
        {"round": 2, "global_accuracy": 0.91, "cumulative_bytes": 20},
        {"round": 3, "global_accuracy": 0.95, "cumulative_bytes": 30},
        {"round": 4, "global_accuracy": 0.93, "cumulative_bytes": 40},
    ]
    got = global_progress(rounds, 0.9)
    assert (
        got["global_round_to_target"],
        got["global_bytes_to_target"],
        got["global_best"],
        got["global_best_round"],
        got["global_final"],
    ) == (2, 20, 0.95, 3, 0.93)
    assert global_progress(rounds, 0.99)["global_round_to_target"] is None
    assert global_progress([{"round": 1, "global_r2": 0.7}], 0.5)["global_metric"] == "global_r2"
    assert global_progress([{"round": 1, "accuracy": 0.7}], 0.5) == {}


def test_r2_is_one_minus_residual_over_total_sum_of_squares():
    y = torch.tensor([[1.0, 0.0], [2.0, 2.0], [3.0, 4.0]])
    pred = torch.tensor([[1.5, 0.0], [2.0, 1.0], [2.5, 4.0]])
    ss_res, ss_tot = 0.25 + 0 + 0 + 1 + 0.25 + 0, (1 + 0 + 1) + (4 + 0 + 4)
    assert task_metrics("regression", pred, y)["r2"] == pytest.approx(1 - ss_res / ss_tot)
    assert task_metrics("regression", y, y)["r2"] == pytest.approx(1.0)


def test_cost_model_matches_a_hand_computation_of_eqs_9_to_16():
    spec = DeviceSpec((1.0, 0.0), (1.0, 0.0), 10.0, 8, 100, 2)
    speed, bw, sizes = np.array([1.0, 2.0]), np.array([1.0, 0.5]), np.array([1000, 500])
    model_bytes, profile_bytes = 125_000.0, 1_250.0  # 1 Mbit and 0.01 Mbit
    rate = bw * math.log2(11.0)  # SNR 10 dB = 10×
    t_comm = 3 * 1.0 / rate
    t_train = 2 * sizes * 8 * 100 / (speed * 1e9)
    t_gen, t_up = t_train / 2, 0.01 / (0.5 * rate)
    seconds, joules = client_costs(spec, speed, bw, sizes, model_bytes, profile_bytes, profile=True)
    assert seconds == pytest.approx(t_comm + t_train + t_gen + t_up)
    assert joules == pytest.approx(P_TRANS * (t_comm + t_up) + P_F * speed**3 * (t_train + t_gen))
    plain_s, _ = client_costs(spec, speed, bw, sizes, model_bytes, profile_bytes)
    assert plain_s == pytest.approx(t_comm + t_train)
    assert round_cost(seconds, joules) == pytest.approx((max(seconds), sum(joules)))
    dev = draw_devices(DeviceSpec((1.0, 0.2), (1.0, 0.3), 10.0, 8, 100, 2), 5000, seed=1)
    assert abs(dev.speed_ghz.mean() - 1.0) < 0.02 and dev.bandwidth_mhz.min() >= 0.1


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32)])
def test_lenet5_outputs_84_features(shape):
    model = build_model("lenet5", shape, 0, 10)
    assert model.body(torch.zeros(2, *shape)).shape == (2, 84)


def test_fedprof_benchmark_runs_full_cache_at_the_full_groups_length(monkeypatch, tmp_path):
    """--modes full-cache is the paper's full group: it gets the FULL round count, FedProx
    runs in the partial group only, and the report compares it with the full group's paper rows."""
    import benchmarks.fedprof as bench
    import benchmarks.fedprof_report as rep

    calls = []
    monkeypatch.setattr(bench, "simulate", lambda config, out, overrides, sets: calls.append((out.parent.name, out.name, overrides)))
    monkeypatch.setattr(bench, "results_root", lambda name, tag: tmp_path)
    monkeypatch.setattr(rep, "report", lambda root, task, paper_rounds: None)
    bench.main(["mnist", "--modes", "full-cache", "partial", "--seeds", "0", "--rounds", "120", "60", "--tag", "t"])
    runs = {(mode, name): o for mode, name, o in calls}
    assert set(runs) == {
        ("full-cache", "fedprof-s0"),
        ("full-cache", "fedavg-s0"),
        ("partial", "fedprof-s0"),
        ("partial", "fedavg-s0"),
        ("partial", "fedprox-s0"),
    }
    assert (
        runs[("full-cache", "fedavg-s0")]["num-server-rounds"] == 120
        and runs[("full-cache", "fedavg-s0")]["fedprof-aggregation"] == "full-cache"
    )
    assert runs[("partial", "fedprox-s0")]["num-server-rounds"] == 60
    assert bench.GROUP["full-cache"] == "full" and ("full", "fedavg") in rep.PAPER["mnist"]
