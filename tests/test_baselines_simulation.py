"""LG-FedAvg, FedPer, FedRep, FedProto and FedProx end to end through Flower's
simulation engine: 2 rounds, 3 clients on a real MNIST slice, with exact byte checks."""

from __future__ import annotations

import numpy as np
import pytest
from headway.core.layers import select, top_layers
from headway.core.models import build_model

from tests.test_simulation import down_bytes, near, reply_bytes, run, train_sizes

pytestmark = pytest.mark.integration

THREE = {"num-clients": 3, "num-server-rounds": 2}
MODEL = build_model("mnist-cnn", (1, 28, 28), 0, 10)
STATE = {k: v.numpy() for k, v in MODEL.state_dict().items()}


def check_bytes(cfg, rounds, shared: dict[str, np.ndarray]) -> None:
    """Every round: three copies of ``shared`` down, each client's ``shared`` plus metrics up."""
    up = sum(reply_bytes(shared, n, pid) for pid, n in enumerate(train_sizes(cfg)))
    for r in rounds:
        assert r["clients"] == 3 and r["failures"] == 0
        assert near(r["bytes_down"], 3 * down_bytes(shared, r["round"]), 3), (r["bytes_down"], 3 * down_bytes(shared, r["round"]))
        assert near(r["bytes_up"], up, 3), (r["bytes_up"], up)


@pytest.mark.parametrize(
    "algorithm, cfg, shared_layers",
    [
        ("lg-fedavg", {"lg-global-layers": 2, "lg-new-test": False}, top_layers(MODEL, 2)),
        ("fedper", {}, ["body.convs.0", "body.convs.1"]),
        ("fedrep", {"fedrep-head-epochs": 2}, ["body.convs.0", "body.convs.1", "body.fcs.0"]),
    ],
)
def test_layer_sharing_methods_learn_and_send_only_shared_layers(tmp_path, data_dir, algorithm, cfg, shared_layers):
    cfg, summary, rounds = run(tmp_path, data_dir, algorithm=algorithm, **THREE, **cfg)
    accs = [r["accuracy"] for r in rounds]
    assert accs[-1] > 0.8  # personal models on 2-class clients; a 10-class guess scores 0.1
    assert "global_accuracy" not in rounds[0]  # no single global model to score
    check_bytes(cfg, rounds, select(STATE, shared_layers))


def test_lg_fedavg_new_test_ensembles_every_local_model_once(tmp_path, data_dir):
    cfg, summary, rounds = run(tmp_path, data_dir, algorithm="lg-fedavg", **THREE)
    check_bytes(cfg, rounds, select(STATE, ["head"]))
    assert rounds[-1]["accuracy"] > 0.8
    assert "new_test_accuracy" not in rounds[0]
    last = rounds[-1]
    assert last["new_test_models"] == 3
    # 3 clients × 2 classes: an ensemble of 2-class experts covers 6 of 10 digits at best
    assert 0.15 < last["new_test_accuracy"] <= 0.65
    whole = {k: np.zeros_like(v) for k, v in STATE.items()}
    assert last["upload_bytes_up"] > 3 * sum(v.nbytes for v in whole.values())  # every client's whole model, once
    assert summary["total_bytes"] == sum(r["bytes_down"] + r["bytes_up"] for r in rounds)  # training traffic only


def test_fedproto_learns_and_sends_prototypes(tmp_path, data_dir):
    cfg, summary, rounds = run(tmp_path, data_dir, algorithm="fedproto", **THREE)
    assert rounds[-1]["accuracy"] > 0.8 and rounds[-1]["accuracy_prototype"] > 0.8
    payload = {"prototypes": np.zeros((10, 50), np.float32), "class-counts": np.zeros(10, np.float32)}
    up = sum(reply_bytes(payload, n, pid) for pid, n in enumerate(train_sizes(cfg)))
    assert all(near(r["bytes_up"], up, 3) for r in rounds), ([r["bytes_up"] for r in rounds], up)
    assert near(rounds[0]["bytes_down"], 3 * down_bytes({}), 3)  # round 1: no prototypes yet
    assert near(rounds[1]["bytes_down"], 3 * down_bytes(payload, 2), 3)
    assert summary["total_bytes"] < 50_000


def test_fedprox_learns_a_global_model(tmp_path, data_dir):
    cfg, summary, rounds = run(tmp_path, data_dir, algorithm="fedprox", **THREE, **{"fedprox-mu": 0.01})
    assert rounds[-1]["accuracy"] > 0.3 and rounds[-1]["global_accuracy"] > 0.2  # chance 0.1 (0.5 within a client)
    check_bytes(cfg, rounds, STATE)
