"""The wire meter's cheap count: the same bytes as the plain count, each object hashed once."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.common.constant import FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE
from flwr.supercore.inflatable import inflatable_object
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from headway.strategies.wire import WireMeter, message_size_uncached

from tests.test_engine import EMPTY_CONTENT_FIELD, shipped


def _request(content: RecordDict, node: int) -> Message:
    m = Message(content=content, dst_node_id=node, message_type="train")
    m.metadata.__dict__["_message_id"] = m.object_id  # the deployed id a reply points back to
    return m


def _messages() -> list[Message]:
    """Requests sharing content, replies, an error, an empty reply, arrays that are equal (one
    object on the wire), and an array of several equal chunks: every case where the object tree
    depends on the data, not only on the shapes."""
    rng = np.random.default_rng(0)
    zeros = ArrayRecord({"b1": Array(np.zeros(8, np.float32)), "b2": Array(np.zeros(8, np.float32))})
    model = RecordDict({"arrays": ArrayRecord({"w": Array(rng.random((10, 51), np.float32))}), "config": ConfigRecord({"server-round": 3})})
    chunked = np.zeros(FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE // 4 * 3 + 5, np.float32)  # four chunks, the middle two equal
    big = RecordDict({"arrays": ArrayRecord({"z": Array(chunked)}), "same": ArrayRecord({"z": Array(chunked)})})
    sent = [_request(model, n) for n in (5, 6)] + [_request(RecordDict({"zeros": zeros, "again": zeros}), 7), _request(big, 8)]
    stats = RecordDict(
        {
            "arrays": ArrayRecord({"stats": Array(rng.random((10, 51), np.float32)), "n": Array(np.arange(10))}),
            "metrics": MetricRecord({"num-examples": 60, "partition-id": 1, "loss": 0.25}),
            "config": ConfigRecord({"body": "mnist-cnn", "classes": [1, 2]}),
        }
    )
    return [
        *sent,
        Message(content=stats, reply_to=sent[0]),
        Message(content=RecordDict({"metrics": MetricRecord({"correct": 5, "num-examples": 9})}), reply_to=sent[1]),
        Message(RecordDict(), reply_to=sent[2]),
        Message(Error(code=3, reason="boom"), reply_to=sent[3]),
    ]


def test_the_meter_counts_exactly_what_the_plain_count_and_flower_give(task_identity):
    """Against the plain count and against Flower's own push path (up to the one known 2-byte
    gap, see tests/test_engine.py)."""
    meter = WireMeter()
    for m in _messages():
        assert meter.message(m) == message_size_uncached(m)
    for m in _messages():
        gap = 0 if m.has_error() else EMPTY_CONTENT_FIELD  # an error message's header has no content field
        assert WireMeter().message(m) == shipped(m) - gap
    for m in _messages():  # a second pass over the same content (the meter's content cache)
        assert meter.message(m) == message_size_uncached(m)


def test_equal_arrays_and_chunks_are_one_object_on_the_wire_and_counted_once(task_identity):
    """The object tree deduplicates by content: a size computed from shapes alone would be wrong."""
    m = _messages()[2]
    unique = get_all_nested_objects(m.content)
    assert sum(isinstance(o, Array) for o in unique.values()) == 1  # four zero arrays, one object
    assert WireMeter().message(m) == message_size_uncached(m)


def test_the_meter_hashes_each_object_of_a_message_once(task_identity, monkeypatch):
    """The plain count rehashes a record every time a parent asks for its id; the meter must not."""
    calls = [0]
    real = inflatable_object.get_object_id

    def counting(content: bytes) -> str:
        calls[0] += 1
        return real(content)

    monkeypatch.setattr(inflatable_object, "get_object_id", counting)
    for m in _messages()[4:6]:
        objects = len(get_all_nested_objects(m))
        calls[0] = 0
        WireMeter().message(m)
        meter_calls = calls[0]
        calls[0] = 0
        message_size_uncached(m)
        assert meter_calls <= objects < calls[0]


def test_a_record_changed_after_it_was_metered_is_counted_anew(task_identity):
    """Ids are reused only within one measurement: a later change shows in the next count."""
    config = ConfigRecord({"server-round": 1})
    m = _request(RecordDict({"config": config}), 5)
    before = WireMeter().message(m)
    config["phase"] = "a longer value than before"
    after = WireMeter().message(m)
    assert after == message_size_uncached(m) > before


@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_scalar_arrays_are_counted_exactly(task_identity, n):
    m = _request(RecordDict({"a": ArrayRecord({"x": Array(np.zeros(n, np.float64)), "s": Array(np.array(2.0))})}), 9)
    assert WireMeter().message(m) == message_size_uncached(m)


def test_an_array_of_equal_chunks_lists_each_chunk_once(task_identity):
    m = _messages()[3]
    array = m.content.array_records["arrays"]["z"]
    assert len(array.slice_array()) == 4 and len(array.children) == 3
    assert WireMeter().message(m) == message_size_uncached(m)


def test_the_bytes_of_one_record_are_the_message_less_the_same_message_without_it(task_identity):
    """What a train reply's scores cost (client-evaluation=with-next-train), metered as evaluation traffic."""
    request = _messages()[0]
    scores = MetricRecord({"num-examples": 60, "partition-id": 1, "correct": 51, "loss": 0.25})
    arrays = ArrayRecord({"stats": Array(np.ones((10, 51), np.float32))})
    metrics = MetricRecord({"num-examples": 60})
    full = Message(content=RecordDict({"arrays": arrays, "metrics": metrics, "scores": scores}), reply_to=request)
    bare = Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=request)
    share = WireMeter().record_bytes(full, "scores")
    assert share == message_size_uncached(full) - message_size_uncached(bare) > len(scores.deflate())
    assert WireMeter().record_bytes(bare, "scores") == 0
