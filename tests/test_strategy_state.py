"""The server's state in one value (strategies/state.py), the wrappers around a method's aggregation
(strategies/aggregation.py, robust.py, privacy.py) and the capabilities read from what a strategy
class implements (strategies/capabilities.py)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord

from core import protocol as P
from core.config import ConfigError
from strategies.aggregation import PlainAggregation, SecureAggregation
from strategies.base import Step
from strategies.capabilities import ROBUST_AGGREGATION, SECURE_SUM, capabilities_of
from strategies.fedavg import FedAvg, FedAvgState
from strategies.fedlog import FedLog, FedLogState
from strategies.fedpft import FedPFT
from strategies.fedprof import FedProf
from strategies.fedproto import FedProto
from strategies.fedprox import FedProx
from strategies.lg_fedavg import LGFedAvg
from strategies.privacy import CentralNoise, exact_release, release_for
from strategies.robust import RobustAverage, WeightedMean
from strategies.state import ServerState
from tests.fakes import FakeGrid, engine_for, make_strategy, reply

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


def test_a_state_after_a_round_pickles_and_drives_the_next_round_alike(task_identity):
    """What the next issue's checkpoint needs: the state survives pickling and a restored state makes the same round."""
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
