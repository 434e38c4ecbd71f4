"""fedlog-c-downlink=stats: once there is a sum the server sends Φ (float32) alone, each client
solves η from it (n: its count column) with the run's prior, and that η is the server's bit for bit;
what the server sends wrong is a clear client error; half the bytes down of η and Φ."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from headway.client.env import client_env
from headway.client.registry import PROCEDURES
from headway.core.config import ConfigError, resolve
from headway.core.fedlog import head_from_downlink

from tests.fakes import FakeGrid, engine_for, make_strategy, reply


def _stats(pid: int) -> np.ndarray:
    """A client's dense T: classes pid and pid+1, features in [0, 2]."""
    stats = np.zeros((10, 51), np.float32)
    for c in (pid, pid + 1):
        stats[c, 0] = 5.0 + c
        stats[c, 1:] = np.linspace(0.1, 2.0, 50) * (c + 1) / 3.0 * (1.0 + 0.37 * pid)  # sums of two clients need more than float32's bits
    return stats


def _round(downlink: str, **cfg):
    """One training round of three fake clients under ``fedlog-c-downlink=downlink``: the strategy and its step."""
    s = make_strategy(
        "fedlog", **{"fedlog-alpha": 0.01, "fedlog-c-downlink": downlink, "fedlog-init": "random", "fedlog-prior-nu": 0.5, **cfg}
    )
    engine = engine_for(s, FakeGrid(3, lambda pid, msg: reply({"stats": _stats(pid)}, int(_stats(pid)[:, 0].sum()), pid, loss=0.5)))
    return s, s.train_round(1, s.initial_state(), engine)


def test_clients_solve_the_servers_head_bit_for_bit_from_fewer_bytes(task_identity):
    s, step = _round("stats", **{"fedlog-prior-chi": 0.25})
    sent = step.arrays
    assert set(sent) == {"stats-sum"}  # no η
    stats = sent["stats-sum"].numpy()
    assert stats.dtype == np.float32 and stats[:, 0].sum() == sum(_stats(p)[:, 0].sum() for p in range(3))  # n, as the replies counted
    eta = head_from_downlink(stats, (10, 51), chi=0.25, nu=0.5)
    np.testing.assert_array_equal(eta, step.method.eta)  # bit for bit: both solve the same float32 Φ
    _, both = _round("eta-and-stats", **{"fedlog-prior-chi": 0.25})
    assert set(both.arrays) == {"eta", "stats-sum"}
    np.testing.assert_allclose(eta, both.method.eta, rtol=1e-6, atol=1e-9)  # float32 Φ against float64 Φ
    down = sum(a.numpy().nbytes for a in sent.values())
    assert down == 10 * 51 * 4 and sum(a.numpy().nbytes for a in both.arrays.values()) == 2 * 10 * 51 * 4
    evaluated = s.evaluate_arrays(s.initial_state().advance(step))  # clients score themselves with the η they solve
    assert set(evaluated) == {"stats-sum"}


def test_the_head_follows_the_count_column_not_a_claimed_count(task_identity):
    """A reply may claim a count a little off its class counts (within StatsCheck's 1e-4 tolerance): the
    server still solves with the n a client can read from Φ, so their η agree bit for bit."""

    def big(pid: int) -> np.ndarray:
        scale = 850.0 if pid == 1 else 600.0  # partition 1: 11,050 examples, so 1e-4 of its count exceeds one example
        return _stats(pid) * np.array([scale] + [1.0] * 50, np.float32)

    s = make_strategy("fedlog", **{"fedlog-alpha": 0.01, "fedlog-c-downlink": "stats", "fedlog-init": "random", "train-fraction": 1.0})
    claimed = lambda pid: int(big(pid)[:, 0].sum()) + (1 if pid == 1 else 0)  # noqa: E731
    engine = engine_for(s, FakeGrid(3, lambda pid, msg: reply({"stats": big(pid)}, claimed(pid), pid, loss=0.5)))
    step = s.train_round(1, s.initial_state(), engine)
    assert engine.meter.failures == []
    np.testing.assert_array_equal(head_from_downlink(step.arrays["stats-sum"].numpy(), (10, 51), chi=0.0, nu=1.0), step.method.eta)


def test_before_the_first_sum_the_server_sends_eta():
    s = make_strategy("fedlog", **{"fedlog-alpha": 0.01, "fedlog-c-downlink": "stats"})
    assert set(s.initial_arrays()) == {"eta"} and set(s.evaluate_arrays(s.initial_state())) == {"eta"}


@pytest.mark.parametrize(
    "stats, nu, reason",
    [
        (None, 1.0, "neither"),
        (np.ones((10, 50)), 1.0, "shape"),
        (np.full((10, 51), np.nan), 1.0, "not finite"),
        (np.zeros((10, 51)), 0.0, "no examples"),
    ],
)
def test_a_malformed_downlink_is_a_clear_client_error(stats, nu, reason):
    with pytest.raises(ValueError, match=reason):
        head_from_downlink(stats, (10, 51), chi=0.0, nu=nu)


def test_a_client_trains_and_scores_on_the_statistics_alone(data_dir):
    env = client_env(
        {
            "algorithm": "fedlog",
            "data-dir": data_dir,
            "train-fraction": 0.01,
            "local-epochs": 1,
            "fedlog-alpha": 0.01,
            "fedlog-c-downlink": "stats",
        },
        {"partition-id": 0, "num-partitions": 50},
    )
    stats = np.abs(np.random.default_rng(0).normal(0, 1, size=(10, 51))).astype(np.float32)
    stats[:, 0] = 20.0
    arrays = {"stats-sum": Array(stats)}
    proc = PROCEDURES["fedlog"]
    content = RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord({"server-round": 1, "phase": "train"})})
    out = proc.train(env, content, RecordDict())
    assert np.isfinite(out.metric_records["metrics"]["loss"])
    scored = proc.evaluate(env, RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord({"server-round": 1})}), RecordDict())
    assert float(scored.metric_records["metrics"]["num-examples"]) > 0  # type: ignore[arg-type]
    broken = RecordDict(
        {"arrays": ArrayRecord({"stats-sum": Array(stats[:, :50])}), "config": ConfigRecord({"server-round": 1, "phase": "train"})}
    )
    with pytest.raises(ValueError, match="shape"):
        proc.train(env, broken, RecordDict())


def test_the_stats_downlink_is_refused_with_a_float16_head():
    with pytest.raises(ConfigError, match="fedlog-c-downlink"):
        resolve({"fedlog-c-downlink": "stats", "fedlog-wire-dtype": "float16"})
