"""DP-FedLog's noise is private: drawn from OS entropy, so the run config (seed, partition
id, round) does not reproduce it, and under local DP a client releases nothing else."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from headway.client.env import client_env
from headway.client.procedures.fedlog import FedLogClient
from headway.core.config import resolve_settings
from headway.core.fedlog import noise_sigma, solve_head
from headway.core.settings import Settings
from headway.strategies.base import TrainRound

from tests.fakes import FakeGrid, engine_for, make_strategy, reply

DP = {"algorithm": "fedlog", "num-clients": 3, "train-fraction": 0.01, "local-epochs": 0, "fedlog-clip": 2.0, "fedlog-epsilon": 1.0}


def old_derivations(cfg: Settings, partition_id: int, server_round: int) -> list[np.random.Generator]:
    """The generators an attacker holding config.json would try (what the code used to do)."""
    seeds = [cfg.seed, cfg.seed + 104729, cfg.seed + 7919]
    for salt in (0, 1, 2):
        key = f"{cfg.seed}:{partition_id}:{server_round}:{salt}".encode()
        seeds.append(int.from_bytes(hashlib.sha256(key).digest()[:4], "little"))
    return [np.random.default_rng(s) for s in seeds]


def local_stats(data_dir: str) -> tuple[Settings, list[RecordDict], np.ndarray]:
    cfg = resolve_settings({**DP, "fedlog-dp": "local", "data-dir": data_dir})
    env = client_env(cfg.to_config(), {"partition-id": 0})
    eta = np.zeros((10, 51), np.float32)
    content = RecordDict({"arrays": ArrayRecord({"eta": Array(eta)}), "config": ConfigRecord({"server-round": 3, "phase": "stats"})})
    replies = [FedLogClient().train(env, content, RecordDict()) for _ in range(2)]
    clean_cfg = resolve_settings({**DP, "fedlog-dp": "off", "data-dir": data_dir})
    clean = FedLogClient().train(client_env(clean_cfg.to_config(), {"partition-id": 0}), content, RecordDict())
    return cfg, replies, clean.array_records["arrays"]["stats"].numpy().astype(np.float64)


def test_local_dp_noise_differs_between_runs_and_is_not_derived_from_the_config(data_dir):
    cfg, replies, clean = local_stats(data_dir)
    noise = [r.array_records["arrays"]["stats"].numpy().astype(np.float64) - clean for r in replies]
    sigma = noise_sigma(cfg, 51)
    assert not np.allclose(noise[0], noise[1])  # same config, same client, same round: fresh noise
    assert np.std(noise[0]) == pytest.approx(sigma, rel=0.15)
    for rng in old_derivations(cfg, 0, 3):
        guess = rng.normal(0.0, sigma, size=clean.shape)
        assert not np.allclose(guess, noise[0], atol=1e-2 * sigma)


def test_local_dp_reply_releases_only_the_noised_statistic(data_dir):
    _, replies, _ = local_stats(data_dir)
    assert set(replies[0].metric_records["metrics"].keys()) == {"partition-id"}  # no count, no training loss
    assert list(replies[0].array_records["arrays"].keys()) == ["stats"]


def test_local_dp_server_takes_the_count_from_the_noised_count_row(task_identity):
    """No reply carries a count; the head is solved with n = 20 + 30 + 40, the sum of the
    count rows (n = 0 or n = 3 replies gives another η)."""
    s = make_strategy("fedlog", **{"fedlog-dp": "local", "fedlog-clip": 2.0})
    assert s.train_layout(TrainRound(1, engine_for(s, FakeGrid(3)), s.initial_state())).count is False
    counts = {0: 20.0, 1: 30.0, 2: 40.0}
    phi = np.zeros((10, 51))

    def answer(pid, msg):
        stats = np.zeros((10, 51), np.float32)
        stats[pid, 0], stats[pid, 1:] = counts[pid], 0.5 * counts[pid]  # features of 0.5, within the clip
        return reply({"stats": stats}, None, pid)

    for pid in counts:
        phi += answer(pid, None).array_records["arrays"]["stats"].numpy()
    step = s.train_round(1, s.initial_state(), engine_for(s, FakeGrid(3, answer)))
    assert step.clients == 3 and "loss" not in step.metrics
    chi, nu = s.settings.fedlog.prior_chi, s.settings.fedlog.prior_nu
    expected = solve_head(phi, 90.0, chi=chi, nu=nu).astype(np.float32)
    assert np.allclose(step.arrays["eta"].numpy(), expected, rtol=1e-6, atol=0)
    assert not np.allclose(solve_head(phi, 0.0, chi=chi, nu=nu), expected, rtol=1e-2)  # the count is what decides it


def test_central_dp_noise_is_fresh_each_time_and_not_seeded_by_the_run(task_identity):
    def eta_after_one_round():
        s = make_strategy("fedlog", **{"fedlog-dp": "central", "fedlog-clip": 2.0})

        def answer(pid, msg):
            stats = np.zeros((10, 51), np.float32)
            stats[pid, 0], stats[pid, 1:] = 10.0, 1.0
            return reply({"stats": stats}, 10, pid, loss=0.5)

        return s.train_round(1, s.initial_state(), engine_for(s, FakeGrid(3, answer))).arrays["eta"].numpy()

    assert not np.allclose(eta_after_one_round(), eta_after_one_round())
