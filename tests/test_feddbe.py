"""FedDBE: the maths of MR and the global mean, the server's rounds (mean asked in round 1 only, or
every round; the global mean count-weighted and kept in the method state), hostile means refused
with the round going on, the client's bias vector kept local and used in scoring, and a short real
MNIST run."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from headway.client.env import ClientEnv, client_env
from headway.client.procedures.feddbe import BIAS, FedDBEClient
from headway.core.aggregate import clipped_means
from headway.core.dbe import global_mean, mean_problem, mean_regularization, running_mean
from headway.core.models import build_model
from headway.core.settings import Settings
from headway.strategies.feddbe import FEATURE_MEAN, GLOBAL_MEAN, FedDBEState

from tests.fakes import FakeGrid, engine_for, make_strategy, reply

M = 50  # mnist-cnn's feature width


def test_running_mean_mr_and_the_global_mean():
    prev, batch = torch.ones(3), torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]])
    assert torch.allclose(running_mean(prev, batch, 0.25), torch.tensor([1.25, 1.5, 1.75]))
    assert torch.allclose(running_mean(None, batch, 1.0), torch.tensor([2.0, 3.0, 4.0]))
    assert float(mean_regularization(torch.tensor([1.0, 3.0]), torch.zeros(2))) == pytest.approx(2.5)  # ½·(1 + 9)/2
    g = global_mean([np.zeros(2), np.ones(2)], [10, 30])
    assert g.dtype == np.float64 and np.allclose(g, 0.75)
    assert mean_problem(np.zeros(3), 3, 1.0) is None
    assert "shape" in str(mean_problem(np.zeros(4), 3, 1.0))
    assert "NaN" in str(mean_problem(np.array([0.0, np.nan, 0.0]), 3, 1.0))
    assert "max-feature-value" in str(mean_problem(np.array([0.0, 2.0, 0.0]), 3, 1.0))


def _answer(means: dict[int, np.ndarray], n: dict[int, int]):
    """Clients that send the model they got (×0.99) and, when the message holds no global mean, ``means[pid]``."""

    def answer(pid, msg):
        arrays = msg.content.array_records["arrays"]
        model = {k: v.numpy() * 0.99 for k, v in arrays.items() if k != GLOBAL_MEAN}
        if GLOBAL_MEAN not in arrays and pid in means:
            model[FEATURE_MEAN] = means[pid]
        return reply(model, n[pid], pid)

    return answer


def test_round_one_forms_the_count_weighted_global_mean_and_round_two_sends_it_and_asks_none(task_identity):
    s = make_strategy("feddbe")
    means = {0: np.full(M, 1.0, np.float32), 1: np.full(M, 3.0, np.float32)}
    grid = FakeGrid(2, _answer(means, {0: 10, 1: 30}))
    state = s.initial_state()
    step = s.train_round(1, state, engine_for(s, grid))
    assert step.clients == 2 and isinstance(step.method, FedDBEState) and step.method.global_mean is not None
    assert np.allclose(step.method.global_mean, 2.5)  # (10·1 + 30·3) / 40
    trained = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trained) == 2 and all(GLOBAL_MEAN not in m.content.array_records["arrays"] for m in trained)  # none before it exists
    state = state.advance(step)
    assert set(state.arrays) == set(s.initial_arrays())  # the mean never enters the model's arrays
    grid2 = FakeGrid(2, _answer({}, {0: 10, 1: 30}))
    step2 = s.train_round(2, state, engine_for(s, grid2, server_round=2))
    assert step2.clients == 2 and np.allclose(state.advance(step2).method.global_mean, 2.5)  # first-round: it stays as formed
    sent = [m for m in grid2.sent if m.metadata.message_type == "train"]
    assert sent and all(np.allclose(m.content.array_records["arrays"][GLOBAL_MEAN].numpy(), 2.5) for m in sent)


def test_every_round_asks_for_means_again_and_moves_the_global_mean(task_identity):
    s = make_strategy("feddbe", **{"feddbe-global-mean": "every-round"})
    state = s.initial_state()
    state = replace(state, method=FedDBEState(global_mean=np.zeros(M)))

    def answer(pid, msg):
        model = {k: v.numpy() * 0.99 for k, v in msg.content.array_records["arrays"].items() if k != GLOBAL_MEAN}
        return reply({**model, FEATURE_MEAN: np.full(M, 4.0, np.float32)}, 10, pid)

    step = s.train_round(2, state, engine_for(s, FakeGrid(2, answer), server_round=2))
    assert step.clients == 2 and np.allclose(step.method.global_mean, 4.0)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (np.full(M, np.nan, np.float32), "NaN"),
        (np.zeros(M + 1, np.float32), "shape"),
        (np.full(M, 1e6, np.float32), "max-feature-value"),
        (None, "missing"),
    ],
)
def test_a_hostile_mean_is_refused_and_the_round_goes_on(task_identity, bad, reason):
    s = make_strategy("feddbe")
    honest = _answer({0: np.full(M, 1.0, np.float32), 1: np.full(M, 2.0, np.float32)}, {0: 10, 1: 10, 2: 10})

    def answer(pid, msg):
        content = honest(pid, msg)
        if pid == 2:
            arrays = {k: v.numpy() for k, v in content.array_records["arrays"].items()}
            if bad is not None:
                arrays[FEATURE_MEAN] = bad
            content = reply(arrays, 10, pid)
        return content

    engine = engine_for(s, FakeGrid(3, answer))
    step = s.train_round(1, s.initial_state(), engine)
    assert step.clients == 2 and len(engine.meter.failures) == 1 and reason in engine.meter.failures[0], engine.meter.failures
    assert np.allclose(step.method.global_mean, 1.5)  # the honest two alone
    assert all(np.all(np.isfinite(v.numpy())) for v in step.arrays.values())


def test_secure_aggregation_is_refused_and_a_robust_rule_is_taken():
    from headway.core.config import ConfigError

    with pytest.raises(ConfigError):
        make_strategy("feddbe", **{"secure-aggregation": "secagg+", "min-replies": 2})
    assert make_strategy("feddbe", aggregation="median").averaging is not None


@lru_cache(maxsize=2)
def _loaded(data_dir: str, pid: int) -> ClientEnv:
    run = {"algorithm": "feddbe", "num-clients": 3, "train-fraction": 0.02, "batch-size": 10, "local-epochs": 1, "data-dir": data_dir}
    return client_env(run, {"partition-id": pid})


def _env(data_dir, **cfg) -> ClientEnv:
    env = _loaded(data_dir, 0)
    return replace(env, cfg=Settings.from_config({**env.cfg.to_config(), **cfg}))


def _content(env, server_round: int, mean: np.ndarray | None = None) -> RecordDict:
    model = build_model(env.body, env.data.input_shape, env.cfg.feature_dim, env.outputs, env.cfg.seed).state_dict()
    arrays = ArrayRecord(model)
    if mean is not None:
        arrays[GLOBAL_MEAN] = Array(mean.astype(np.float32))
    return RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": server_round})})


def test_the_client_sends_its_mean_first_then_keeps_its_bias_local_and_scores_with_it(data_dir):
    env, proc, state = _env(data_dir), FedDBEClient(), RecordDict()
    first = proc.train(env, _content(env, 1), state).array_records["arrays"]
    assert FEATURE_MEAN in first and first[FEATURE_MEAN].numpy().shape == (M,) and not state.array_records  # no bias yet
    target = first[FEATURE_MEAN].numpy() + 1.0
    second = proc.train(env, _content(env, 2, target), state).array_records["arrays"]
    assert FEATURE_MEAN not in second and BIAS not in second and GLOBAL_MEAN not in second
    bias = state.array_records[BIAS][BIAS].numpy()
    assert bias.shape == (M,) and np.any(bias != 0)  # b trained and stayed on the client
    with_bias = proc.evaluate(env, _content(env, 2), state).metric_records["metrics"]
    state[BIAS] = ArrayRecord({BIAS: Array(np.full(M, 100.0, np.float32))})  # a very different b changes the score
    shifted = proc.evaluate(env, _content(env, 2), state).metric_records["metrics"]
    assert with_bias["loss"] != shifted["loss"]


def test_kappa_pulls_the_sent_mean_towards_the_global_mean(data_dir):
    """every-round: with κ large the mean a client sends ends nearer ḡ than with κ = 0, from the same start."""
    gaps = {}
    for kappa in (0.0, 500.0):
        env, proc = _env(data_dir, **{"feddbe-kappa": kappa, "feddbe-global-mean": "every-round", "lr": 0.01}), FedDBEClient()
        start = proc.train(env, _content(env, 1), RecordDict()).array_records["arrays"][FEATURE_MEAN].numpy()
        target = start + 0.5
        sent = proc.train(env, _content(env, 2, target), RecordDict()).array_records["arrays"][FEATURE_MEAN].numpy()
        gaps[kappa] = float(np.abs(sent - target).mean())
    assert gaps[500.0] < 0.8 * gaps[0.0], gaps


@pytest.mark.system
def test_a_short_mnist_simulation_learns_and_holds_a_global_mean(tmp_path, data_dir):
    from tests.test_simulation import run

    overrides = {"num-clients": 3, "num-server-rounds": 3}
    _, summary, rounds = run(tmp_path, data_dir, algorithm="feddbe", **overrides)
    assert summary["status"] == "complete" and all(r["clients"] == 3 and r["failures"] == 0 for r in rounds)
    assert "global_mean_norm" in rounds[0] and "global_mean_norm" not in rounds[1]  # formed once, in round 1
    assert rounds[-1]["accuracy"] > 0.5  # 2-class clients; a 10-class guess scores 0.1


def test_one_client_with_a_huge_mean_within_max_feature_value_moves_the_global_mean_by_a_bounded_amount(task_identity):
    """The outside probe's freeze: one client of four sends a mean of 9999 per entry (within max-feature-value), which
    the count-weighted mean took at 1/4 weight (norm ~17,700 against honest ~7), pulling every honest update beyond
    max-update-norm. Its mean is cut to twice the round's median norm: the global mean stays near honest scale."""
    s = make_strategy("feddbe", **{"num-clients": 4})
    means = {
        0: np.full(M, 1.0, np.float32),
        1: np.full(M, 1.2, np.float32),
        2: np.full(M, 0.8, np.float32),
        3: np.full(M, 9999.0, np.float32),
    }
    engine = engine_for(s, FakeGrid(4, _answer(means, {p: 10 for p in range(4)})))
    step = s.train_round(1, s.initial_state(), engine)
    assert step.clients == 4 and step.metrics["feddbe_means_clipped"] == 1.0
    honest = np.linalg.norm(np.full(M, 1.0))
    assert np.linalg.norm(step.method.global_mean) <= 1.3 * honest, np.linalg.norm(step.method.global_mean)  # 9999 uncut: ~2,500x
    clipped, cut = clipped_means([np.full(M, 1.0), np.full(M, 3.0)])  # two means: no median to trust, nothing cut
    assert cut == 0 and np.allclose(clipped[1], 3.0)


def test_two_means_leave_the_cut_off_and_each_round_says_so(task_identity, caplog):
    """With 2 means no median tells a lying mean from an honest one (an outside probe moved accuracy
    0.777 → 0.096 so): nothing is cut, and the round logs why."""
    s = make_strategy("feddbe", **{"num-clients": 2})
    means = {0: np.full(M, 1.0, np.float32), 1: np.full(M, 9999.0, np.float32)}
    with caplog.at_level("WARNING", logger="headway"):
        step = s.train_round(1, s.initial_state(), engine_for(s, FakeGrid(2, _answer(means, {0: 10, 1: 10}))))
    assert step.metrics["feddbe_means_clipped"] == 0.0
    assert any("only 2 client mean(s): the cut of outlying means is off" in r.getMessage() for r in caplog.records)
