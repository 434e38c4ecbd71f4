"""The server's state in one value (strategies/state.py), the wrappers around a method's aggregation
(strategies/aggregation.py, robust.py, privacy.py) and the capabilities read from what a strategy
class implements (strategies/capabilities.py)."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MessageType, MetricRecord, RecordDict
from headway.core import protocol as P
from headway.core.config import ConfigError
from headway.core.fedpft import ClassMixture, encode
from headway.strategies.aggregation import PlainAggregation, SecureAggregation
from headway.strategies.base import Step
from headway.strategies.capabilities import ROBUST_AGGREGATION, SECURE_SUM, capabilities_of
from headway.strategies.engine import Engine
from headway.strategies.fedavg import FedAvg, FedAvgState
from headway.strategies.fedlog import FedLog, FedLogState
from headway.strategies.fedpft import FedPFT
from headway.strategies.fedprof import SECRET_ENV, FedProf
from headway.strategies.fedproto import FedProto
from headway.strategies.fedprox import FedProx
from headway.strategies.lg_fedavg import LGFedAvg
from headway.strategies.privacy import CentralNoise, exact_release, release_for
from headway.strategies.robust import RobustAverage, WeightedMean
from headway.strategies.round_loop import RoundLoop
from headway.strategies.state import ServerState

from tests.fakes import FakeGrid, engine_for, make_strategy, reply
from tests.fedprof_baseline import Baseline

BOTH = frozenset({SECURE_SUM, ROBUST_AGGREGATION})


@pytest.mark.parametrize(
    ("cls", "expected"),
    [
        (FedAvg, BOTH),
        (FedProx, BOTH),
        (LGFedAvg, BOTH),
        (FedLog, frozenset({SECURE_SUM})),
        (FedProto, frozenset({SECURE_SUM})),
        (FedPFT, frozenset()),
        (FedProf, frozenset()),  # its own aggregate_train: FedAvg's sum and averaging hooks describe a rule it replaced
    ],
)
def test_capabilities_are_what_each_class_implements(cls, expected):
    assert capabilities_of(cls) == expected


def test_a_subclass_that_replaces_the_aggregation_loses_the_capabilities_it_inherited():
    class Replaced(FedAvg):
        def aggregate_train(self, ctx, replies):  # noqa: D102
            raise AssertionError

    class Summing(Replaced):
        def sum_spec(self, ctx, nodes):  # noqa: D102
            raise AssertionError

        def aggregate_sum(self, ctx, total):  # noqa: D102
            raise AssertionError

    class Kept(FedAvg):
        pass

    assert capabilities_of(Replaced) == frozenset()
    assert capabilities_of(Summing) == frozenset({SECURE_SUM})
    assert capabilities_of(Kept) == BOTH


@pytest.mark.parametrize(
    ("setting", "says"),
    [({"secure-aggregation": "secagg+"}, "secure-aggregation=secagg+"), ({"aggregation": "median"}, "aggregation=median")],
)
def test_fedprof_refuses_secure_and_robust_aggregation_when_built(task_identity, data_dir, setting, says):
    """The config check refuses both for fedprof; built anyway (past the check), the strategy refuses
    too: its round can never run without the setting it was given."""
    cfg = {"fedprof-val-size": 200, "data-dir": data_dir}
    with pytest.raises(ConfigError, match=says):
        make_strategy("fedprof", **cfg, **setting)
    assert isinstance(make_strategy("fedprof", **cfg).aggregation, PlainAggregation)


def test_the_wrappers_are_chosen_from_the_config(task_identity):
    assert isinstance(make_strategy("fedavg").aggregation, PlainAggregation)
    assert isinstance(make_strategy("fedavg").averaging, WeightedMean)
    secure = make_strategy("fedlog", **{"secure-aggregation": "secagg+", "fedlog-clip": 2.0})
    assert isinstance(secure.aggregation, SecureAggregation) and secure.release is exact_release
    robust = make_strategy("fedavg", **{"aggregation": "median"})
    assert isinstance(robust.averaging, RobustAverage) and robust.averaging.rule.name == "median"
    central = make_strategy("fedlog", **{"fedlog-dp": "central", "fedlog-clip": 1.0})
    assert isinstance(central.release, CentralNoise) and central.release.sigma == central.sigma > 0


def test_central_noise_noises_the_sum_once_and_reads_n_from_the_noised_count_row():
    phi = np.zeros((3, 4))
    phi[:, 0] = 10.0
    noised, n = CentralNoise(2.0, np.random.default_rng(0))(phi, 30.0)
    expected = phi + np.random.default_rng(0).normal(0.0, 2.0, size=phi.shape)
    np.testing.assert_array_equal(noised, expected)
    assert n == pytest.approx(max(float(np.sum(expected[:, 0])), 0.0)) and n != 30.0
    assert release_for("off", 2.0, np.random.default_rng()) is exact_release


def test_fedlog_sends_the_head_of_the_state_it_is_given_and_returns_the_next(task_identity):
    s = make_strategy("fedlog")
    mine = FedLogState(np.full((10, 51), 0.25))
    _, contents = s.configure_train(1, ServerState(s.head_record(mine), mine), engine_for(s, FakeGrid(3)))
    sent = next(iter(contents.values()))[P.ARRAYS][P.ETA].numpy()
    np.testing.assert_array_equal(sent, np.full((10, 51), 0.25, np.float32))  # not a head the strategy keeps itself

    stats = np.zeros((10, 51), np.float32)
    stats[:, 0], stats[:, 1] = 4, 1.0
    start = s.initial_state()
    step = s.train_round(1, start, engine_for(s, FakeGrid(3, lambda pid, msg: reply({P.STATS: stats}, 40, pid))))
    after = start.advance(step)
    assert isinstance(after.method, FedLogState) and after.method is step.method
    np.testing.assert_array_equal(after.method.phi_sum, 3 * stats.astype(np.float64))
    assert len(after.method.solve_seconds) == 1 and start.method.solve_seconds == ()  # the old state is untouched
    np.testing.assert_array_equal(after.arrays[P.ETA].numpy(), s.head_record(after.method)[P.ETA].numpy())


def test_a_state_after_a_round_pickles_whole(task_identity):
    """What the next issue's checkpoint needs: the state survives pickling (the round a restored state drives:
    test_a_state_pickled_after_round_k_drives_round_k_plus_1_in_a_fresh_strategy_as_the_unbroken_run)."""
    s = make_strategy("fedavg", **{"client-sampling": "data-ratio", "fraction-train": 1.0})
    s.services.data.__dict__["partition_sizes"] = None  # counts come from the replies: they are in the state
    echo = lambda pid, msg: reply({k: v.numpy() for k, v in msg.content["arrays"].items()}, {0: 40, 1: 10, 2: 20}[pid], pid)  # noqa: E731
    state = s.initial_state()
    state = state.advance(s.train_round(1, state, engine_for(s, FakeGrid(3, echo))))
    restored = pickle.loads(pickle.dumps(state))
    assert isinstance(restored.method, FedAvgState) and restored.method == state.method and restored.method.counts
    assert {k: v.numpy().tolist() for k, v in restored.arrays.items()} == {k: v.numpy().tolist() for k, v in state.arrays.items()}


def test_a_step_without_new_arrays_or_method_state_keeps_both():
    state = ServerState(ArrayRecord(), FedAvgState({1: 5}))
    assert state.advance(Step(None, 0)) == state
    moved = state.advance(Step(None, 0, method=FedAvgState({1: 6})))
    assert moved.method == FedAvgState({1: 6}) and moved.arrays is state.arrays


@pytest.mark.parametrize(("algorithm", "cfg"), [("fedlog", {}), ("fedproto", {}), ("fedpft", {"num-server-rounds": 1})])
def test_a_method_whose_state_makes_its_arrays_refuses_other_initial_arrays(algorithm, cfg):
    """FedLog, FedProto and FedPFT send what their method state makes: arrays given beside it would be a second truth."""
    s = make_strategy(algorithm, **cfg)
    assert s.initial_state(s.initial_arrays()).arrays.keys() == s.initial_arrays().keys()
    with pytest.raises(ValueError, match=f"{algorithm} sends what its method state makes"):
        s.initial_state(ArrayRecord({"other": Array(np.zeros(3, np.float32))}))
    fedavg = make_strategy("fedavg")
    assert list(fedavg.initial_state(ArrayRecord()).arrays) == []  # a model-averaging server's arrays are its own truth


def test_fedlog_scores_with_the_head_its_state_holds(task_identity):
    s = make_strategy("fedlog")
    state = s.initial_state()
    state = ServerState(ArrayRecord({P.ETA: Array(np.full((10, 51), 0.5, np.float32))}), state.method)
    contents = s.configure_evaluate(1, state, engine_for(s, FakeGrid(3)))
    np.testing.assert_array_equal(next(iter(contents.values()))[P.ARRAYS][P.ETA].numpy(), np.full((10, 51), 0.5, np.float32))


def test_a_record_that_waits_for_the_next_rounds_scores_sums_its_own_rounds_rows(task_identity, monkeypatch):
    """client-evaluation=with-next-train: round 1's record goes out during round 2 (its train replies carry no scores here: they
    are refused, which does not matter), with round 1's training rows."""
    s = make_strategy("fedavg", **{"client-evaluation": "with-next-train", "eval-every": 1, "num-server-rounds": 2})
    monkeypatch.setattr(s, "train_counts", lambda engine: {p: 10 * engine.round for p in range(3)})  # rows that change by round

    def answer(pid, msg):
        if msg.metadata.message_type == MessageType.EVALUATE:
            return RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10, P.CORRECT: 5, P.PARTITION_ID: pid})})
        return reply({k: v.numpy() for k, v in msg.content[P.ARRAYS].items()}, 10, pid)

    grid = FakeGrid(3, answer)
    records: list[dict] = []
    s.run(Engine(grid, s.settings, s.services, clock=grid.clock, admit=s.body_problem), s.initial_state(), 2, on_round=records.append)
    assert [r["round"] for r in records] == [1, 2]
    assert records[0]["train_examples"] == 30  # round 2 counts 20 a partition: its rows are not round 1's


def _fedavg_answer(pid, msg):
    if msg.metadata.message_type == MessageType.EVALUATE:
        return RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10, P.CORRECT: 5, P.PARTITION_ID: pid})})
    model = {k: v.numpy() for k, v in msg.content[P.ARRAYS].items()}
    moved = {k: v + np.float32(0.01 * (pid + 1)) if np.issubdtype(v.dtype, np.floating) else v for k, v in model.items()}
    return reply(moved, 10 * (pid + 1), pid)


def _fedlog_answer(pid, msg):
    if msg.metadata.message_type == MessageType.EVALUATE:
        return RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10, P.CORRECT: 5, P.PARTITION_ID: pid})})
    stats = np.zeros((10, 51), np.float32)
    stats[:, 0], stats[:, 1 + pid] = pid + 1, 0.5 * (pid + 1)  # each client's own statistics: the head depends on who was drawn
    return reply({P.STATS: stats}, 10 * (pid + 1), pid)


def _fedpft_answer(pid, msg):
    if msg.metadata.message_type == MessageType.EVALUATE:
        return RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10, P.CORRECT: 5, P.PARTITION_ID: pid})})
    means = np.full((1, 784), 0.1 * (pid + 1))
    return reply(encode([ClassMixture(pid, 20, np.ones(1), means, np.full((1, 784), 0.5), "diag")], 784, "diag"), 20, pid)


RESUMED: dict[str, tuple[dict[str, Any], int]] = {
    "fedavg": ({"fraction-train": 0.5}, 2),
    "fedlog": ({"fraction-train": 0.5, "fedlog-alpha": 1.0}, 2),  # FedLog-C: Φ is sent too
    "fedprof": ({"fraction-train": 0.5, "fedprof-val-size": 200}, 2),
    "fedpft": ({"num-server-rounds": 1, "fedpft-extractor": "identity", "fedpft-covariance": "diag", "fedpft-head-epochs": 2}, 0),
}


@pytest.mark.parametrize("algorithm", sorted(RESUMED))
def test_a_state_pickled_after_round_k_drives_round_k_plus_1_in_a_fresh_strategy_as_the_unbroken_run(
    task_identity, data_dir, monkeypatch, algorithm
):
    """The next issue's resume: the state saved after round k (k = 0: before round 1, FedPFT being one-shot), restored into a
    fresh strategy and engine, makes round k+1's arrays, method state and draws those of the run that never stopped."""
    monkeypatch.setenv(SECRET_ENV, "test-secret")  # FedProf's D^V: the same draw in both strategies, and for the fake clients
    cfg, k = RESUMED[algorithm]
    cfg = {**cfg, "data-dir": data_dir, "num-clients": 6, "global-eval": False}
    rounds = cfg.get("num-server-rounds", k + 1)

    def run(state_of, first: int) -> tuple[list[dict], dict[int, bytes], ServerState]:
        s = make_strategy(algorithm, **{**cfg, "num-server-rounds": rounds})
        baseline = Baseline(s) if algorithm == "fedprof" else None

        def answer(pid, msg):
            if baseline is None:
                return {"fedavg": _fedavg_answer, "fedlog": _fedlog_answer, "fedpft": _fedpft_answer}[algorithm](pid, msg)
            profile = baseline(msg).astype(np.float32)
            if msg.content[P.CONFIG].get(P.PHASE) == P.PHASE_PROFILE:
                return reply({P.PROFILE: profile}, 10 * (pid + 1), pid)
            out = _fedavg_answer(pid, msg)
            if msg.metadata.message_type == MessageType.TRAIN:
                out[P.ARRAYS][P.PROFILE] = Array(profile)
            return out

        grid = FakeGrid(6, answer)
        records: list[dict] = []
        saved = {0: pickle.dumps(s.initial_state())}
        loop = RoundLoop(s, Engine(grid, s.settings, s.services, clock=grid.clock, admit=s.body_problem))

        def save(record: dict) -> None:
            records.append(record)
            saved[record["round"]] = pickle.dumps(loop.state)

        loop.on_round = save
        last = loop.run(state_of(s), rounds, first)
        return records, saved, last

    unbroken, saved, whole = run(lambda s: s.initial_state(), 1)
    resumed, _, again = run(lambda s: pickle.loads(saved[k]), k + 1)
    assert resumed[-1]["selected"] == unbroken[-1]["selected"] and resumed[-1]["clients"] == unbroken[-1]["clients"] > 0
    assert list(again.arrays) == list(whole.arrays) and list(whole.arrays) or algorithm == "fedpft"
    for name in whole.arrays:
        np.testing.assert_array_equal(again.arrays[name].numpy(), whole.arrays[name].numpy())
    assert pickle.dumps(again.sampling) == pickle.dumps(whole.sampling)


def test_a_layer_sharing_server_admits_a_body_once_without_keeping_it(monkeypatch):
    """Registration asks for every node: the shared-layer check of a body runs once, and the strategy holds nothing new."""
    s = make_strategy("lg-fedavg", **{"body": "mnist-cnn"})
    before = dict(vars(s))
    calls: list[str] = []
    check = type(s)._mismatch

    def counted(self, body):
        calls.append(body)
        return check(self, body)

    monkeypatch.setattr(type(s), "_mismatch", counted)
    assert s.body_problem("lenet5") == s.body_problem("lenet5")
    assert calls == ["lenet5"] and vars(s) == before
