"""FedLog under secure-aggregation=secagg+ through Flower's simulation engine (Ray) on real
MNIST: the same accuracy as the plain run, every SecAgg+ stage metered, and a client lost
after sharing its keys. In the system suite (make test-system): three simulations."""

from __future__ import annotations

import json

import pytest
from headway.core.config import resolve_settings
from headway.simulation import simulate

pytestmark = [pytest.mark.integration, pytest.mark.system]

BASE = {
    "algorithm": "fedlog",
    "dataset": "mnist",
    "num-clients": 5,
    "num-server-rounds": 3,
    "partition": "pathological",
    "train-fraction": 0.02,
    "local-epochs": 1,
    "batch-size": 10,
    "fedlog-clip": 4.0,
    "seed": 0,
    "sample-timeout": 30.0,
}
STAGES = ("secagg_setup", "secagg_share", "secagg_unmask")  # the training stage is the round's bytes_up, as always


def run(tmp_path, data_dir, name, **keys):
    out = tmp_path / name
    summary = simulate(resolve_settings({**BASE, "data-dir": data_dir, **keys}), out)
    return summary, [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]


def test_secagg_gives_the_plain_accuracy_and_survives_a_client_lost_after_sharing_keys(tmp_path, data_dir):
    _, plain = run(tmp_path, data_dir, "plain")
    summary, secure = run(tmp_path, data_dir, "secagg", **{"secure-aggregation": "secagg+"})
    assert summary["status"] == "complete"
    for p, s in zip(plain, secure, strict=True):
        assert s["accuracy"] == pytest.approx(p["accuracy"], abs=1e-3)  # the same head up to fixed-point rounding
        assert s["clients"] == 5 and s["failures"] == 0
        for stage in STAGES:
            assert s[f"{stage}_bytes_up"] > 0 and s[f"{stage}_bytes_down"] > 0, stage
    assert secure[0]["bytes_up"] > plain[0]["bytes_up"]  # keys, shares and a uint64 vector cost more than a float32 T

    summary, lost = run(
        tmp_path, data_dir, "lost", **{"secure-aggregation": "secagg+", "fault-clients": "2", "fault-mode": "drop-after-keys"}
    )
    assert summary["status"] == "complete"
    assert len(lost) == 3 and all(r["clients"] == 4 and r["aggregated"] for r in lost)
    assert lost[-1]["accuracy"] > 0.5


def test_fedavg_under_secagg_gives_the_plain_model_accuracy(tmp_path, data_dir):
    keys = {"algorithm": "fedavg", "num-server-rounds": 2, "local-epochs": 1, "fedlog-clip": 0.0}  # BASE's clip is FedLog's
    _, plain = run(tmp_path, data_dir, "fedavg-plain", **keys)
    summary, secure = run(tmp_path, data_dir, "fedavg-secagg", **keys, **{"secure-aggregation": "secagg+"})
    assert summary["status"] == "complete"
    for p, s in zip(plain, secure, strict=True):
        assert s["clients"] == 5 and s["failures"] == 0
        assert s["accuracy"] == pytest.approx(p["accuracy"], abs=2e-3)  # the same average up to fixed-point rounding
        assert s["secagg_setup_bytes_up"] > 0
