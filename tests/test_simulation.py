"""End to end through Flower's simulation engine (Ray) on real MNIST slices."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from core.config import resolve
from core.data import load_dataset
from core.models import build_model
from core.partition import make_partition
from server.run import simulate
from strategies.exchange import payload_bytes

pytestmark = pytest.mark.integration

BASE = {"dataset": "mnist", "num-clients": 4, "num-server-rounds": 3, "partition": "pathological", "train-fraction": 0.02,
        "local-epochs": 2, "batch-size": 10, "lr": 0.001, "seed": 0, "sample-timeout": 30.0}


def run(tmp_path, data_dir, **overrides):
    cfg = resolve({**BASE, "data-dir": data_dir, **overrides})
    summary = simulate(cfg, tmp_path)
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    return cfg, summary, rounds


def train_sizes(cfg):
    part = make_partition(load_dataset(cfg["dataset"], cfg["data-dir"], cfg["seed"]), cfg)
    return [len(t) for t in part.train]


def reply_bytes(arrays: dict, n: int, pid: int) -> int:
    """Bytes of a training reply: the arrays plus num-examples, partition-id and loss."""
    metrics = MetricRecord({"num-examples": n, "partition-id": pid, "loss": 0.5})
    return payload_bytes(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}), "metrics": metrics}))


def test_fedavg_learns_and_reports_the_bytes_it_sends(tmp_path, data_dir):
    cfg, summary, rounds = run(tmp_path, data_dir, algorithm="fedavg")
    assert [r["round"] for r in rounds] == [1, 2, 3]
    accs = [r["accuracy"] for r in rounds]
    assert accs[-1] > 0.35 and accs[-1] > accs[0] + 0.1  # chance is 0.1; FedAvg is slow on 2-class clients
    assert summary["final_accuracy"] == accs[-1] and summary["failures"] == 0
    assert all(r["global_accuracy"] > 0 for r in rounds)  # the global model is scored too
    # bytes: what the messages carry, recomputed here from the model and the partition
    state = {k: v.numpy() for k, v in build_model("mnist-cnn", (1, 28, 28), 0, 10).state_dict().items()}
    down = payload_bytes(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in state.items()}), "config": ConfigRecord({"server-round": 1})}))
    up = sum(reply_bytes(state, n, pid) for pid, n in enumerate(train_sizes(cfg)))
    for r in rounds:
        assert r["bytes_down"] == 4 * down
        assert r["bytes_up"] == up
        assert r["clients"] == 4
    assert summary["total_bytes"] == sum(r["bytes_down"] + r["bytes_up"] for r in rounds)
    assert 4 * 21840 * 4 < rounds[0]["bytes_down"] < 4 * 21840 * 4 * 1.05  # 21 840 float32 parameters per client
    for name in ("config.json", "summary.json", "accuracy_vs_round.png", "accuracy_vs_bytes.png"):
        assert (tmp_path / name).exists(), name


def test_fedlog_with_two_body_architectures(tmp_path, data_dir):
    cfg, summary, rounds = run(tmp_path, data_dir, algorithm="fedlog", bodies="mnist-cnn,mlp", **{"feature-dim": 50})
    accs = [r["accuracy"] for r in rounds]
    assert min(accs) > 0.8  # chance 0.1; each client tests on its own two classes
    assert summary["m"] == 51 and summary["failures"] == 0
    assert all(r["solve_seconds"] < 1.0 for r in rounds)
    stats = {"stats": np.zeros((10, 51), np.float32)}
    per_client = [reply_bytes(stats, n, pid) for pid, n in enumerate(train_sizes(cfg))]
    assert all(10 * 51 * 4 < b < 10 * 51 * 4 + 300 for b in per_client)  # classes × m values plus the count
    for r in rounds[1:]:
        assert r["bytes_up"] == sum(per_client)
    assert rounds[0]["bytes_up"] == 2 * sum(per_client)  # round 1 also carries the statistics round of fedlog-init=stats
    assert summary["total_bytes"] < 100_000


@pytest.mark.parametrize("mode", ["nan", "wrong-shape"])
def test_fedlog_drops_bad_replies_and_goes_on(tmp_path, data_dir, mode):
    cfg, summary, rounds = run(tmp_path, data_dir, algorithm="fedlog", **{"fault-clients": "1", "fault-mode": mode, "num-server-rounds": 2})
    assert [r["failures"] for r in rounds] == [2, 1]  # round 1 includes the statistics round
    assert all(r["clients"] == 3 for r in rounds)
    assert all(r["accuracy"] is not None and math.isfinite(r["accuracy"]) and r["accuracy"] > 0.5 for r in rounds)
    reasons = " ".join(rounds[-1]["failure_reasons"])
    assert ("NaN" in reasons) if mode == "nan" else ("shape" in reasons)


def test_fedavg_survives_a_client_that_raises(tmp_path, data_dir):
    cfg, summary, rounds = run(tmp_path, data_dir, algorithm="fedavg", **{"fault-clients": "3", "fault-mode": "error", "num-server-rounds": 2})
    assert [r["failures"] for r in rounds] == [1, 1] and all(r["clients"] == 3 for r in rounds)
    assert rounds[-1]["accuracy"] > 0.3
