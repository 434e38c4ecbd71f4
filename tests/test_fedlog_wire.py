"""What FedLog puts on the wire. The sparse uplink (fedlog-uplink=sparse: only the rows of
the classes a client holds, each after its class index): lossless against the dense
statistic, the same head on the server, fewer bytes, hostile index tables rejected. The
float16 downlink (fedlog-wire-dtype=float16): η and FedLog-C's class means within half
precision, never overflowing to inf."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from client.env import client_env
from client.registry import PROCEDURES
from core.config import ConfigError, resolve
from core.fedlog import dense_statistics, present_rows
from tests.fakes import FakeGrid, engine_for, make_strategy, reply


def _stats(pid: int) -> np.ndarray:
    """A client's dense T: classes pid and pid+1 present, the rest zero."""
    stats = np.zeros((10, 51), np.float32)
    for c in (pid, pid + 1):
        stats[c, 0] = 5.0 + c
        stats[c, 1:] = np.linspace(0.1, 2.0, 50) * (c + 1)
    return stats


def test_present_rows_round_trip_exactly():
    stats = _stats(3)
    rows = present_rows(stats)
    assert rows.shape == (2, 52) and rows[:, 0].tolist() == [3, 4]
    dense, problem = dense_statistics(rows.astype(np.float64), 10)
    assert problem is None and np.array_equal(dense, stats.astype(np.float64))
    empty, problem = dense_statistics(present_rows(np.zeros((10, 51))), 10)  # a client with no data
    assert problem is None and not empty.any()


def _head_after_one_round(uplink: str, answer) -> tuple[np.ndarray, list[str], int]:
    s = make_strategy("fedlog", **{"fedlog-uplink": uplink, "fedlog-init": "random"})
    engine = engine_for(s, FakeGrid(3, answer))
    step = s.train_round(1, s.initial_arrays(), engine)
    up = engine.meter.phase("train")[1]
    return step.arrays["eta"].numpy(), engine.meter.failures, up


def sparse_reply(pid: int, classes=None, counts=None):
    rows = present_rows(_stats(pid))
    if classes is not None:
        rows[:, 0] = classes
    if counts is not None:
        rows[:, 1] = counts
    return reply({"stats-rows": rows.astype(np.float32)}, int(_stats(pid)[:, 0].sum()), pid, loss=0.5)


def test_the_server_solves_the_same_head_from_sparse_rows_with_fewer_bytes(task_identity):
    dense_eta, dense_fail, dense_up = _head_after_one_round("dense", lambda pid, msg: reply({"stats": _stats(pid)}, int(_stats(pid)[:, 0].sum()), pid, loss=0.5))
    sparse_eta, sparse_fail, sparse_up = _head_after_one_round("sparse", lambda pid, msg: sparse_reply(pid))
    assert dense_fail == sparse_fail == []
    np.testing.assert_array_equal(sparse_eta, dense_eta)  # the sum and the solve see exactly the same T
    # each reply: 8 of 10 rows less, 2 index entries more (within a few bytes of framing)
    assert dense_up - sparse_up >= 3 * (8 * 51 * 4 - 2 * 4 - 16), (sparse_up, dense_up)


@pytest.mark.parametrize("bad, reason", [
    (lambda pid: sparse_reply(pid, classes=[pid, 10]), "whole number in 0..9"),
    (lambda pid: sparse_reply(pid, classes=[pid, 0.5]), "whole number in 0..9"),
    (lambda pid: sparse_reply(pid, classes=[pid, pid]), "repeated"),
    (lambda pid: sparse_reply(pid, counts=[3.0, 0.0]), "no examples"),
    (lambda pid: reply({"stats-rows": present_rows(_stats(pid))[:, 1:].astype(np.float32)}, 11, pid), "shape"),  # no index column
    (lambda pid: reply({"stats-rows": np.ones((11, 52), np.float32)}, 11, pid), "rows"),  # more rows than classes
    (lambda pid: reply({"stats": _stats(pid)}, 11, pid), "stats"),  # dense, where sparse was asked for
])
def test_bad_sparse_replies_are_rejected_and_the_round_goes_on(task_identity, bad, reason):
    eta, failures, _ = _head_after_one_round("sparse", lambda pid, msg: bad(pid) if pid == 2 else sparse_reply(pid))
    assert len(failures) == 1 and "partition 2" in failures[0] and reason in failures[0], failures
    assert np.all(np.isfinite(eta))


def test_a_client_sends_only_the_rows_of_its_classes(data_dir):
    env = client_env({"algorithm": "fedlog", "data-dir": data_dir, "fedlog-uplink": "sparse", "train-fraction": 0.01, "local-epochs": 1},
                     {"partition-id": 0, "num-partitions": 50})
    content = RecordDict({"arrays": ArrayRecord({"eta": Array(np.zeros((10, 51), np.float32))}), "config": ConfigRecord({"server-round": 1, "phase": "train"})})
    out = PROCEDURES["fedlog"].train(env, content, RecordDict())["arrays"]
    held = sorted(set(env.y_train.tolist()))
    rows = out["stats-rows"].numpy()
    assert set(out) == {"stats-rows"} and rows.shape == (len(held), 52) and rows[:, 0].tolist() == held


def test_sparse_uplink_is_refused_under_local_dp():
    with pytest.raises(ConfigError, match="fedlog-uplink"):
        resolve({"fedlog-uplink": "sparse", "fedlog-dp": "local", "fedlog-clip": 1.0})


def test_float16_head_and_class_means_down_within_half_precision(task_identity):
    """fedlog-wire-dtype=float16: η and FedLog-C's Φ go down in float16 (Φ as its class means,
    which cannot overflow), within float16's rounding; float32 where float16 would overflow."""
    from core.fedlog import class_means

    s = make_strategy("fedlog", **{"fedlog-wire-dtype": "float16", "fedlog-alpha": 0.1})
    rng = np.random.default_rng(0)
    s.eta = rng.normal(0, 3, size=(10, 51))
    s.phi_sum = np.abs(rng.normal(0, 1, size=(10, 51))) * 5000  # sums far beyond float16's 65504
    s.phi_sum[:, 0] = rng.integers(50, 9000, size=10)
    sent = s.head_record()
    eta16, phi16 = sent["eta"].numpy(), sent["stats-sum"].numpy()
    assert eta16.dtype == np.float16 and phi16.dtype == np.float16
    assert np.all(np.abs(eta16.astype(np.float64) - s.eta) <= 2.0**-11 * np.abs(s.eta) + 2.0**-24)
    np.testing.assert_allclose(class_means(phi16), class_means(s.phi_sum), rtol=2.0**-10)  # what the client computes
    assert np.array_equal(phi16[:, 0] > 0, s.phi_sum[:, 0] > 0)
    s.eta[0, 0] = 1e6  # beyond float16: this array goes as float32 rather than inf
    assert s.head_record()["eta"].numpy().dtype == np.float32
    assert make_strategy("fedlog").head_record()["eta"].numpy().dtype == np.float32  # the default


def test_a_client_trains_on_a_float16_head(data_dir):
    env = client_env({"algorithm": "fedlog", "data-dir": data_dir, "train-fraction": 0.01, "local-epochs": 1}, {"partition-id": 0, "num-partitions": 50})
    eta = np.random.default_rng(1).normal(0, 0.1, size=(10, 51)).astype(np.float16)
    content = RecordDict({"arrays": ArrayRecord({"eta": Array(eta)}), "config": ConfigRecord({"server-round": 1, "phase": "train"})})
    out = PROCEDURES["fedlog"].train(env, content, RecordDict())
    assert out["arrays"]["stats"].numpy().dtype == np.float32 and np.isfinite(out["metrics"]["loss"])
