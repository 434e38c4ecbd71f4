"""client-evaluation=with-next-train: clients score the model a train message brings before
training and send the scores in the train reply; the evaluation exchange is left for the last round."""

from __future__ import annotations

import json

import pytest
from flwr.app import Message, MetricRecord, RecordDict
from headway.core import protocol as P
from headway.core.config import ConfigError, resolve, resolve_settings, scores_with_train
from headway.core.methods import METHODS
from headway.simulation import simulate
from headway.strategies.wire import WireMeter, message_size_uncached

from tests.fakes import FakeGrid, engine_for, make_strategy, reply

BASE = {
    "dataset": "mnist",
    "num-clients": 3,
    "num-server-rounds": 3,
    "partition": "pathological",
    "train-fraction": 0.02,
    "local-epochs": 1,
    "batch-size": 10,
    "seed": 0,
    "sample-timeout": 30.0,
}


def test_which_rounds_carry_scores():
    cfg = resolve_settings({"client-evaluation": "with-next-train", "num-server-rounds": 5, "eval-every": 2})
    # round r's train replies score round r-1's model: rounds 2 and 4 are due (eval-every 2); 5 is the last (an exchange)
    assert [r for r in range(1, 7) if scores_with_train(cfg, r)] == [3, 5]
    assert not any(scores_with_train(resolve_settings({"num-server-rounds": 5}), r) for r in range(1, 7))  # exchange: never
    assert not any(scores_with_train(resolve_settings({"client-evaluation": "with-next-train", "eval-every": 0}), r) for r in range(1, 200))


@pytest.mark.parametrize("algorithm", [m.name for m in METHODS.values() if not m.scores_with_train])
def test_methods_whose_evaluation_a_train_message_does_not_bring_refuse_it(algorithm):
    with pytest.raises(ConfigError, match="client-evaluation"):
        resolve({"algorithm": algorithm, "client-evaluation": "with-next-train"})


def test_local_dp_fedlog_refuses_it():
    with pytest.raises(ConfigError, match="fedlog-dp='local'"):
        resolve({"algorithm": "fedlog", "fedlog-dp": "local", "fedlog-clip": 1.0, "client-evaluation": "with-next-train"})


MODEL = {k: v.numpy() for k, v in make_strategy("fedavg").initial_arrays().items()}


def _scored(pid: int, correct: float, n: float = 5, **extra: float) -> RecordDict:
    """A FedAvg train reply (the model sent, unchanged) carrying test scores."""
    content = reply(MODEL, 5, pid)
    content[P.SCORES] = MetricRecord({P.NUM_EXAMPLES: n, P.PARTITION_ID: pid, P.CORRECT: correct, **extra})
    return content


@pytest.mark.parametrize(
    "bad, reason",
    [
        (lambda pid: _scored(pid, correct=7), "scores: metric 'correct' is 7, not a whole number in [0, num-examples=5]"),
        (lambda pid: _scored(pid, correct=2.5), "scores: metric 'correct' is 2.5"),
        (lambda pid: _scored(pid, correct=-1), "scores: metric 'correct' is -1"),
        (lambda pid: _scored(pid, correct=1, n=10**9), "scores: metric 'num-examples' is 1e+09, above"),
        (lambda pid: _scored(pid, correct=1, loss=float("nan")), "scores: metric 'loss' is nan"),
        (lambda pid: _scored(pid, correct=1, stolen=1.0), "scores: unexpected metric 'stolen'"),
        (lambda pid: reply(MODEL, 5, pid), "reply without its scores record"),
    ],
)
def test_bad_scores_reject_the_whole_train_reply_and_the_round_goes_on(task_identity, bad, reason):
    """Scores inside a train reply are checked as an evaluation reply is; a reply with bad
    scores is a rejected reply (its update unused), the others make the round."""

    def answer(pid, msg):
        if msg.metadata.message_type != "train":
            return None
        return bad(pid) if pid == 1 else _scored(pid, correct=pid + 1, loss=0.5)

    s = make_strategy("fedavg", **{"num-clients": 3, "client-evaluation": "with-next-train", "min-replies": 1})
    grid = FakeGrid(3, answer)
    replies: list[Message] = []
    sent_and_received = grid.send_and_receive

    def keep(messages, *, timeout=None):
        out = sent_and_received(messages, timeout=timeout)
        replies.extend(out)
        return out

    grid.send_and_receive = keep  # type: ignore[method-assign]
    engine = engine_for(s, grid)
    engine.begin_round(2)
    step = s.train_round(2, s.initial_state(), engine)
    assert step.clients == 2 and sorted(r.partition_id for r in step.scores) == [0, 2]
    assert any(reason in f for f in engine.meter.failures), engine.meter.failures
    figures = s.aggregate_evaluate(1, step.scores)
    assert figures["accuracy"] == (1 + 3) / 10
    # the scores' bytes are evaluation traffic: the method's train bytes are the accepted replies less their scores
    accepted = [m for m in replies if m.metadata.message_type == "train" and m.metadata.src_node_id in (101, 103)]
    scores_bytes = sum(WireMeter().record_bytes(m, P.SCORES) for m in accepted)
    (_, train_up), (_, eval_up) = engine.meter.phase(P.PHASE_TRAIN), engine.meter.phase(P.PHASE_EVALUATE)
    assert eval_up == scores_bytes > 0 and train_up == sum(message_size_uncached(m) for m in accepted) - scores_bytes


def test_a_train_reply_without_scores_is_fine_in_a_round_that_carries_none(task_identity):
    s = make_strategy("fedavg", **{"num-clients": 2, "client-evaluation": "with-next-train"})
    grid = FakeGrid(2, lambda pid, msg: reply(MODEL, 5, pid))
    engine = engine_for(s, grid)
    engine.begin_round(1)
    step = s.train_round(1, s.initial_state(), engine)  # round 1 scores nothing (no model before it)
    assert step.clients == 2 and step.scores == [] and not engine.meter.failures


def _rounds(tmp_path, data_dir, **overrides):
    cfg = resolve_settings({**BASE, "data-dir": data_dir, **overrides})
    summary = simulate(cfg, tmp_path)
    return summary, [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]


@pytest.mark.integration
@pytest.mark.parametrize("algorithm", ["fedavg", "fedlog"])
def test_scores_sent_with_the_next_train_reply_equal_the_evaluation_exchange(tmp_path, data_dir, algorithm):
    """Every client trains every round: each round's accuracy, loss and evaluated clients are the
    same in both modes, and only the last round has an evaluation exchange."""
    _, exchange = _rounds(tmp_path / "exchange", data_dir, algorithm=algorithm)
    summary, carried = _rounds(tmp_path / "carried", data_dir, algorithm=algorithm, **{"client-evaluation": "with-next-train"})
    assert [r["round"] for r in carried] == [r["round"] for r in exchange] == [1, 2, 3] and summary["status"] == "complete"
    for a, b in zip(exchange, carried):
        assert a["accuracy"] == b["accuracy"] and a["loss"] == b["loss"] and a["eval_clients"] == b["eval_clients"] == 3
        assert a["accuracy_client_min"] == b["accuracy_client_min"]
        assert "eval_missing_partitions" not in b
    assert all(r["eval_bytes_down"] > 0 for r in exchange)
    # one evaluation exchange, after the last round; rounds 2 and 3's train replies carry the scores, metered as evaluation bytes up
    assert "eval_bytes_down" not in carried[0] and carried[1]["eval_bytes_down"] == 0 and carried[2]["eval_bytes_down"] > 0
    assert 0 < carried[1]["eval_bytes_up"] < exchange[1]["eval_bytes_up"]  # the scores alone cost less than evaluation replies
    for a, b in zip(exchange, carried):  # the method's own traffic is unchanged (up to the run id's varint, which differs per run)
        assert b["bytes_up"] == pytest.approx(a["bytes_up"], rel=0.01) and b["bytes_down"] == pytest.approx(a["bytes_down"], rel=0.01)


@pytest.mark.integration
def test_a_client_not_drawn_in_the_next_round_is_named_as_missing(tmp_path, data_dir):
    summary, rounds = _rounds(
        tmp_path, data_dir, algorithm="fedavg", **{"client-evaluation": "with-next-train", "fraction-train": 0.34, "min-replies": 1}
    )
    for r in rounds[:-1]:
        drawn_next = set(rounds[r["round"]]["selected"])
        assert r["eval_clients"] == len(drawn_next)
        assert r["eval_missing_partitions"] == sorted({0, 1, 2} - drawn_next)
    assert rounds[-1]["eval_clients"] == 3 and "eval_missing_partitions" not in rounds[-1]
