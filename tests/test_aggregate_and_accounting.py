import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict

from core.aggregate import array_problem, weighted_average
from strategies.exchange import Meter, exchange, payload_bytes, sample_positions


def test_weighted_average_uses_sample_weights():
    a = {"w": np.array([1.0, 2.0], dtype=np.float32)}
    b = {"w": np.array([3.0, 6.0], dtype=np.float32)}
    out = weighted_average([a, b], [1, 3])
    assert out["w"].dtype == np.float32 and np.allclose(out["w"], [2.5, 5.0])
    with pytest.raises(ValueError):
        weighted_average([a], [0])


def test_array_problem_names_the_defect():
    ref = {"w": np.zeros((2, 3)), "b": np.zeros(2)}
    assert array_problem(ref, {"w": np.zeros((2, 3)), "b": np.ones(2)}) is None
    assert "shape" in array_problem(ref, {"w": np.zeros((3, 2)), "b": np.zeros(2)})
    assert "NaN" in array_problem(ref, {"w": np.full((2, 3), np.nan), "b": np.zeros(2)})
    assert "names differ" in array_problem(ref, {"w": np.zeros((2, 3))})


def test_payload_bytes_grow_with_the_arrays_not_their_values():
    small = RecordDict({"arrays": ArrayRecord({"x": Array(np.zeros((10, 51), np.float32))})})
    same = RecordDict({"arrays": ArrayRecord({"x": Array(np.ones((10, 51), np.float32))})})
    big = RecordDict({"arrays": ArrayRecord({"x": Array(np.zeros((100, 101), np.float32))})})
    assert payload_bytes(small) == payload_bytes(same)
    assert 10 * 51 * 4 < payload_bytes(small) < 10 * 51 * 4 + 400
    assert payload_bytes(big) - payload_bytes(small) == pytest.approx((100 * 101 - 10 * 51) * 4, abs=16)


class FakeGrid:
    """Answers each message with a reply, an error, or nothing."""

    def __init__(self, behaviour):
        self.behaviour = behaviour

    def send_and_receive(self, messages, timeout):
        replies = []
        for i, msg in enumerate(messages):
            kind = self.behaviour[i]
            if kind == "ok":
                content = RecordDict({"metrics": MetricRecord({"num-examples": 5})})
                reply = Message(content=content, reply_to=msg)
            elif kind == "error":
                reply = Message(Error(code=7, reason="boom"), reply_to=msg)
            else:
                continue
            replies.append(reply)
        return replies


def test_exchange_meters_both_ways_and_counts_errors_and_silence(task_identity):
    content = RecordDict({"arrays": ArrayRecord({"x": Array(np.zeros(100, np.float32))}), "config": ConfigRecord({"r": 1})})
    msgs = [Message(content=content, dst_node_id=n, message_type="train") for n in (11, 12, 13)]
    meter = Meter()
    good = exchange(FakeGrid(["ok", "error", "missing"]), msgs, 1.0, meter, "train")
    down, up = meter.phase_bytes("train")
    assert len(good) == 1 and meter.failures == 2
    assert down == 3 * payload_bytes(content)
    assert up == payload_bytes(RecordDict({"metrics": MetricRecord({"num-examples": 5})}))


def test_sampling_positions_are_distinct_seeded_and_respect_weights():
    rng = np.random.default_rng(0)
    pos = sample_positions(50, 10, rng)
    assert len(set(pos)) == 10 and all(0 <= p < 50 for p in pos)
    assert sample_positions(50, 10, np.random.default_rng(3)) == sample_positions(50, 10, np.random.default_rng(3))
    weights = [0.0] * 48 + [1.0, 1.0]
    assert sample_positions(50, 2, rng, weights) == [48, 49]
