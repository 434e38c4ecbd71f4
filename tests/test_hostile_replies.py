"""Every injectable bad reply (client/faults.py) against every method's server side:
rejected with a reason, counted, never aggregated; the global state stays finite."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict
from headway.client.faults import MODEL_MODES, TRAIN_MODES, damage_reply
from headway.core.fedpft import ClassMixture, encode
from headway.core.methods import ALGORITHMS
from headway.strategies.fedavg import ModelAveraging
from headway.strategies.registry import STRATEGIES
from headway.strategies.state import ServerState

from tests.fakes import FakeGrid, engine_for, make_strategy, reply

EXPECTED_REASON = {
    "nan": "NaN",
    "wrong-shape": "shape",
    "negative-count": "whole number >= 0",
    "huge-count": "above the",
    "zero-model": "above the",
    "int-arrays": "int32, expected float",
    "extra-array": "over this phase's cap",
    "oversized": "over this phase's cap",
    "list-metric": "is a list",
    "string-metric": "cannot be measured: TypeError",
    "sign-flip": "exceeds max-update-norm",
}
# the methods whose server checks a model update against max-update-norm: ModelAveraging's reply check, read from the strategies
MODEL_AVERAGING = [name for name, cls in STRATEGIES.items() if issubclass(cls, ModelAveraging)]


# keys a method needs before its strategy can be built on MNIST's spec
SETUP = {"fedpft": {"num-server-rounds": 1, "fedpft-extractor": "identity", "fedpft-covariance": "diag"}}


def honest(algorithm: str, pid: int, msg) -> RecordDict:
    """What an honest client of ``algorithm`` might answer (10 examples of class ``pid``)."""
    if algorithm == "fedpft":  # one diag Gaussian of 784 raw pixels for its class
        mix = ClassMixture(pid, 10, np.ones(1), np.full((1, 784), 0.1 * pid), np.full((1, 784), 0.5), "diag")
        return reply(encode([mix], 784, "diag"), 10, pid)
    if algorithm == "fedlog":
        stats = np.zeros((10, 51), np.float32)
        stats[pid] = [10.0] + [2.0 + pid] * 50
        return reply({"stats": stats}, 10, pid, loss=0.7)
    if algorithm == "fedproto":
        protos, counts = np.zeros((10, 50), np.float32), np.zeros(10, np.float32)
        protos[pid], counts[pid] = 1.0 + pid, 10
        return reply({"prototypes": protos, "class-counts": counts}, 10, pid, loss=0.7)
    profile = np.tile(np.array([[0.5, 1.0]], np.float32), (50, 1))  # FedProf: mnist-cnn's 50 features
    if algorithm == "fedprof" and msg.content.config_records["config"].get("phase") == "profile":  # a profile request: no training
        return reply({"profile": profile}, 10, pid)
    model = {k: v.numpy() * 0.9 + 0.01 * pid for k, v in msg.content.array_records["arrays"].items()}
    if algorithm == "fedprof":  # the model and its profile
        model["profile"] = profile
    if algorithm == "feddbe":  # the model and, while the server has no global mean, the client's mean feature
        model.pop("global-mean", None)
        if "global-mean" not in msg.content.array_records["arrays"]:
            model["feature-mean"] = np.full(50, 0.5 + pid, np.float32)
    return reply(model, 10, pid, loss=0.7)


# methods whose training replies carry no arrays (local-only): nothing for the modes that damage arrays to damage
NO_ARRAYS, ARRAY_MODES = ("local-only",), ("nan", "wrong-shape", "scaled", "huge-values", "int-arrays", "oversized", "sign-flip")


@pytest.mark.parametrize(
    ("algorithm", "mode"),
    [
        (a, m)
        for a, m in [(a, m) for a in ALGORITHMS for m in TRAIN_MODES] + [(a, m) for a in MODEL_AVERAGING for m in MODEL_MODES]
        if not (a in NO_ARRAYS and m in ARRAY_MODES)
    ],
)
def test_a_bad_training_reply_is_rejected_and_the_round_goes_on(task_identity, data_dir, algorithm, mode):
    s = make_strategy(algorithm, **{"data-dir": data_dir, **SETUP.get(algorithm, {})})

    def answer(pid, msg):
        content = honest(algorithm, pid, msg)
        training = (
            msg.content.config_records["config"].get("phase") != "profile"
        )  # FedProf profiles newcomers first: only the training reply is bad
        return damage_reply(content, mode, "train") if pid == 2 and training else content

    rnd = 2 if mode in MODEL_MODES else 1  # a sign flip is refused from round 2 (round 1's bound admits long honest moves)
    engine = engine_for(s, FakeGrid(3, answer), server_round=rnd)
    step = s.train_round(rnd, s.initial_state(), engine)
    assert step.clients == 2, engine.meter.failures
    assert len(engine.meter.failures) == 1
    if mode in EXPECTED_REASON:
        assert EXPECTED_REASON[mode] in engine.meter.failures[0]
    for name, arr in step.arrays.items():
        values = arr.numpy()
        assert values.dtype != np.int32 and np.all(np.isfinite(values)), name
        assert np.max(np.abs(values), initial=0.0) < 1e4, name  # nothing of the ×1e6 / 1e30 reply got in


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprof"])
def test_an_honest_reply_of_a_model_with_hundreds_of_arrays_fits_the_cap(task_identity, data_dir, algorithm):
    """ShuffleNet V2 (FedProf's CIFAR-10 model) has 338 arrays, each with ~0.5 kB of framing:
    a cap with a fixed slack refused every honest reply of it."""
    s = make_strategy(algorithm, **{"data-dir": data_dir, "dataset": "cifar10", "body": "shufflenet-v2"})
    rng = np.random.default_rng(0)

    def answer(pid, msg):  # trained-like: every array its own values (identical arrays would share one object)
        model = {
            k: v.numpy() + (rng.normal(0, 1e-3, v.numpy().shape).astype(v.numpy().dtype) if v.numpy().dtype.kind == "f" else 0)
            for k, v in msg.content.array_records["arrays"].items()
        }
        if algorithm == "fedprof":
            model["profile"] = np.tile(np.array([[0.5, 1.0]], np.float32), (1024, 1))
        return reply(model, 10, pid, loss=0.7)

    state = s.initial_state()
    if algorithm == "fedprof":  # the profiling round is not part of this test: its baseline is given
        from headway.strategies.fedprof import FedProfState

        state = ServerState(state.arrays, FedProfState(units=1024, baselines={0: np.tile(np.array([[0.5, 1.0]]), (1024, 1))}))
    engine = engine_for(s, FakeGrid(3, answer))
    step = s.train_round(1, state, engine)
    assert step.clients == 3, engine.meter.failures


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_an_evaluation_reply_claiming_impossible_scores_is_rejected(task_identity, data_dir, algorithm):
    s = make_strategy(algorithm, **{"data-dir": data_dir, **SETUP.get(algorithm, {})})

    def answer(pid, msg):
        met = MetricRecord({"partition-id": pid, "num-examples": 100, "correct": 80, "loss": 0.3})
        content = RecordDict({"metrics": met})
        return damage_reply(content, "bad-eval", "evaluate") if pid == 1 else content

    engine = engine_for(s, FakeGrid(3, answer))
    out = s.evaluate_round(1, s.initial_state(), engine)
    assert out["accuracy"] == pytest.approx(0.8) and out["eval_clients"] == 2
    assert "not a whole number in [0, num-examples=100]" in engine.meter.failures[0]


@pytest.mark.parametrize("loss", [float("nan"), None])
def test_a_nan_or_missing_loss_from_one_client_does_not_poison_the_round_loss(task_identity, data_dir, loss):
    """A NaN loss is a non-finite metric: that reply is refused with the reason and the round
    goes on; a reply without a loss (a client that trained no batch) is kept, and the round's
    loss is the mean of the losses sent (0.6 and 0.9)."""
    s = make_strategy("fedavg", **{"data-dir": data_dir})
    seen = []

    def answer(pid, msg):
        content = honest("fedavg", pid, msg)
        metrics = {"partition-id": pid, "num-examples": 10, "loss": {0: loss, 1: 0.6, 2: 0.9}[pid]}
        if metrics["loss"] is None:  # client 0 sent no loss
            del metrics["loss"]
        content["metrics"] = MetricRecord(metrics)
        seen.append(pid)
        return content

    engine = engine_for(s, FakeGrid(3, answer))
    step = s.train_round(1, s.initial_state(), engine)
    assert sorted(seen) == [0, 1, 2]  # every client answered
    assert step.metrics["loss"] == pytest.approx(0.75)
    if loss is None:
        assert step.clients == 3 and engine.meter.failures == []
    else:
        assert step.clients == 2 and "metric 'loss' is nan, expected a finite number" in engine.meter.failures[0]


def test_a_count_above_the_clients_partition_size_is_rejected(task_identity, data_dir):
    s = make_strategy("fedavg", **{"data-dir": data_dir})
    sizes = [train for train, _ in s.services.data.partition_sizes]
    engine = engine_for(
        s,
        FakeGrid(
            3, lambda pid, msg: reply({k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}, sizes[pid] + (pid == 1), pid)
        ),
    )
    step = s.train_round(1, s.initial_state(), engine)
    assert step.clients == 2 and f"is {sizes[1] + 1}, above the {sizes[1]} this client can hold" in engine.meter.failures[0]
