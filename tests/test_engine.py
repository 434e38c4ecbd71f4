"""The round engine on a fake grid: registry, deadlines and quorum, decoding, sampling,
relays, per-client content, and the wire meter."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.common.serde import recorddict_to_proto
from headway.core.aggregate import relative_update_norm, weighted_average
from headway.core.sampling import draw_with_replacement, sample_positions
from headway.strategies.fedavg import FedAvgState
from headway.strategies.replies import ArraySpec, Layout
from headway.strategies.state import ServerState
from headway.strategies.wire import WireMeter, values_bytes

from tests.fakes import FakeGrid, engine_for, make_strategy, reply
from tests.oracles import inclusion_probabilities

LAYOUT = Layout({"x": ArraySpec((4,))}, count=True, optional=("loss",))


def test_weighted_average_casts_to_the_servers_dtype_and_rounds_integers():
    a: dict[str, np.ndarray] = {"w": np.array([1.0, 2.0], np.float32), "n": np.array(3, np.int64)}
    b: dict[str, np.ndarray] = {"w": np.array([3.0, 6.0], np.float32), "n": np.array(4, np.int64)}
    out = weighted_average([a, b], [1, 3], like=a)
    assert out["w"].dtype == np.float32 and np.allclose(out["w"], [2.5, 5.0]) and out["n"] == 4
    with pytest.raises(ValueError, match="a positive sum"):
        weighted_average([a], [0])


def test_update_norm_is_relative_to_the_global_model():
    ref: dict[str, np.ndarray] = {
        "w": np.full(100, 0.5, np.float32),
        "n": np.array(7, np.int64),
    }  # float norm 5; the int counter is not a weight
    assert relative_update_norm(ref, {"w": ref["w"] * 3, "n": np.array(9, np.int64)}) == pytest.approx(2.0)  # moved by 10
    assert relative_update_norm(ref, {"w": -ref["w"], "n": ref["n"]}) == pytest.approx(2.0)  # a sign flip is 2
    small = {"w": np.full(4, 0.1, np.float32)}  # norm 0.2: measured against 1, not 0.2
    assert relative_update_norm(small, {"w": small["w"] + 0.5}) == pytest.approx(1.0)


def test_exchange_decodes_meters_both_ways_and_counts_errors_silence_and_bad_replies(task_identity):
    def answer(pid, msg):
        return [
            reply({"x": np.ones(4, np.float32)}, 5, pid),
            Error(code=7, reason="Traceback ...\nValueError: boom"),
            None,
            reply({"x": np.ones(3, np.float32)}, 5, pid),
        ][pid]

    s = make_strategy("fedavg", **{"num-clients": 4})
    grid = FakeGrid(4, answer)
    engine = engine_for(s, grid)
    content = RecordDict({"arrays": ArrayRecord({"x": Array(np.zeros(100, np.float32))}), "config": ConfigRecord({"r": 1})})
    replies = engine.exchange("train", {n: content for n in engine.nodes()}, MessageType.TRAIN, LAYOUT)
    assert [r.partition_id for r in replies] == [0] and replies[0].count == 5
    reasons = " | ".join(engine.meter.failures)
    assert len(engine.meter.failures) == 3
    assert "(partition 1): error 7: ValueError: boom |" in reasons  # the last line, not the traceback
    assert "(partition 2): no reply within 5 s" in reasons
    assert "(partition 3): array 'x' has shape (3,), expected (4,)" in reasons
    sent = [m for m in grid.sent if m.metadata.message_type == "train"]
    meter = WireMeter()
    assert engine.meter.phase("train")[0] == sum(meter.message(m) for m in sent)
    assert engine.meter.phase("train")[1] == replies[0].nbytes > 0
    assert engine.meter.rejected_bytes_up > 0  # the bad replies' bytes are not the method's
    # values alone: 100 float32 to each of 4 nodes; back only the valid reply's 4 float32
    assert engine.meter.values["train"] == [4 * 100 * 4, 4 * 4]
    assert engine.meter.cost(values=True) == (1600, 16)


def test_values_bytes_count_elements_not_framing_and_survive_a_hostile_dtype():
    content = RecordDict(
        {
            "a": ArrayRecord({"x": Array(np.zeros((2, 3), np.float16)), "y": Array(np.zeros(5, np.int64))}),
            "c": ConfigRecord({"k": "v" * 50}),
        }
    )
    assert values_bytes(content) == 2 * 3 * 2 + 5 * 8  # no npy header, no config
    for dtype in ("<not a dtype>", "f8,("):  # numpy raises TypeError, and SyntaxError, on these
        garbage = Array(dtype=dtype, shape=(3,), stype="numpy.ndarray", data=b"x" * 7)
        assert values_bytes(RecordDict({"a": ArrayRecord({"g": garbage})})) == 7  # its serialized bytes, no crash


def test_a_reply_with_an_unparsable_dtype_is_one_failure_not_a_crash(task_identity):
    garbage = Array(dtype="f8,(", shape=(4,), stype="numpy.ndarray", data=b"x" * 16)

    def answer(pid, msg):
        if pid == 1:
            return RecordDict({"arrays": ArrayRecord({"x": garbage}), "metrics": MetricRecord({"num-examples": 5, "partition-id": pid})})
        return reply({"x": np.ones(4, np.float32)}, 5, pid)

    engine = engine_for(make_strategy("fedavg", **{"num-clients": 3}), FakeGrid(3, answer))
    content = RecordDict({"arrays": ArrayRecord({"x": Array(np.zeros(4, np.float32))})})
    replies = engine.exchange("train", {n: content for n in engine.nodes()}, MessageType.TRAIN, LAYOUT)
    assert sorted(r.partition_id for r in replies) == [0, 2]
    assert len(engine.meter.failures) == 1 and "partition 1" in engine.meter.failures[0]


def test_a_node_that_misses_the_deadline_is_not_asked_again_that_round(task_identity):
    """A dead node costs one deadline per round: it is left out of the evaluation."""
    s = make_strategy("fedavg")

    def answer(pid, msg):
        if pid == 2:
            return None  # dead
        if msg.metadata.message_type == "train":
            return reply({k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}, 10, pid, loss=0.5)
        return RecordDict({"metrics": MetricRecord({"partition-id": pid, "num-examples": 10, "correct": 7})})

    grid = FakeGrid(3, answer)
    engine = engine_for(s, grid)
    state = s.initial_state()
    evaluation = s.evaluate_round(1, state.advance(s.train_round(1, state, engine)), engine)
    evaluated = {m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == "evaluate"}
    assert evaluated == {101, 102} and evaluation["accuracy"] == pytest.approx(0.7)
    assert len(engine.meter.failures) == 1 and "no reply within 5 s" in engine.meter.failures[0]
    assert grid.timeouts == [5.0, 5.0, 5.0]  # registration, train, evaluate: each one deadline at most


def test_quorum_keeps_the_previous_model_when_too_few_replies_are_valid(task_identity):
    s = make_strategy("fedavg", **{"min-replies": 3})
    grid = FakeGrid(
        3, lambda pid, msg: reply({k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}, 10, pid) if pid else None
    )
    engine = engine_for(s, grid)
    step = s.train_round(1, s.initial_state(), engine)
    assert step.arrays is None and step.clients == 2
    assert "fewer than min-replies=3" in engine.meter.failures[-1]


def test_registry_refuses_a_second_claim_and_replies_under_another_partition(task_identity, monkeypatch):
    s = make_strategy("fedavg")
    grid = FakeGrid(
        3, lambda pid, msg: reply({k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}, 10, 0)
    )  # everyone claims 0 in replies
    answer = grid.send_and_receive

    def registration_claims(messages, *, timeout=None):  # nodes 101 and 102 both register as partition 0
        out = answer(messages, timeout=timeout)
        for r in out:
            if r.metadata.message_type == MessageType.QUERY:
                r.content.metric_records["metrics"]["partition-id"] = 0 if r.metadata.src_node_id in (101, 102) else 2
        return out

    monkeypatch.setattr(grid, "send_and_receive", registration_claims)
    engine = engine_for(s, grid)
    assert engine.registry.partition(101) == 0 and 102 in engine.registry.refused and engine.registry.partition(103) == 2
    assert "already held by node 101" in engine.meter.failures[0]
    assert engine.nodes() == [101, 103]
    step = s.train_round(1, s.initial_state(), engine)
    assert step.clients == 1 and "claims partition 0, but this node registered as partition 2" in engine.meter.failures[-1]


def test_absent_known_nodes_are_reported_and_new_nodes_register(task_identity):
    s = make_strategy("fedavg")
    grid = FakeGrid(3)
    engine = engine_for(s, grid)
    engine.end_round()
    grid.nodes = [101, 103, 104]  # 102 left; 104 (a restarted client, new node id) arrives
    assert grid.bodies is not None  # engine_for gave every partition its body
    grid.bodies.append("mnist-cnn")
    engine.begin_round(2)
    assert engine.meter.absent == [1]
    assert 104 in engine.registry.refused  # it claimed partition 3 of num-clients=3
    assert engine.nodes() == [101, 103]


def test_uniform_and_weighted_sampling_are_seeded_and_keyed_by_node_id(task_identity):
    s = make_strategy("fedavg", **{"num-clients": 5})
    engine = engine_for(s, FakeGrid(5))
    first = engine.sample(0.4)
    assert len(first) == 2 and set(first) <= {101, 102, 103, 104, 105}
    again = engine_for(make_strategy("fedavg", **{"num-clients": 5}), FakeGrid(5)).sample(0.4)
    assert again == first  # seeded by the run seed, whatever the node ids
    assert sorted(engine.sample(0.4, weights={104: 1.0, 105: 2.0})) == [104, 105]  # only positive weights


def test_weighted_sampling_matches_its_documented_inclusion_probabilities():
    w = [1.0, 2.0, 3.0, 4.0, 10.0]
    pi = inclusion_probabilities(w, 2)
    assert pi.sum() == pytest.approx(2.0)
    assert pi[0] == pytest.approx(sum(1 / 20 * w[j] / (20 - 1) + w[j] / 20 * 1 / (20 - w[j]) for j in range(1, 5)))
    rng = np.random.default_rng(1)
    hits = np.zeros(5)
    draws = 20000
    for _ in range(draws):
        hits[sample_positions(5, 2, rng, w)] += 1
    assert np.allclose(hits / draws, pi, atol=0.015)
    assert not np.allclose(pi, 2 * np.array(w) / sum(w), atol=0.05)  # not simply k·w/Σw


def test_draws_with_replacement_come_up_in_proportion_to_their_weights():
    rng = np.random.default_rng(3)
    w = [1.0, 0.0, 3.0, 6.0]
    total = np.zeros(4)
    repeats = 0
    for _ in range(5000):
        counts = draw_with_replacement(4, 3, rng, w)
        assert counts.sum() == 3 and counts[1] == 0
        repeats += int(counts.max() > 1)
        total += counts
    assert np.allclose(total / (5000 * 3), np.array(w) / sum(w), atol=0.01)  # each draw ∝ w: expected k·w/Σw
    assert repeats > 1000  # with replacement: a client can come up twice in one round
    assert draw_with_replacement(3, 2, rng, [0.0, float("nan"), -1.0]).sum() == 0


def test_data_ratio_sampling_draws_by_partition_size_and_weighs_every_draw_equally(task_identity):
    """client-sampling=data-ratio (FedProx's scheme I): draws ∝ n_k/n with replacement, and
    the new model is the plain mean over the draws, whatever counts the replies claim."""
    s = make_strategy("fedprox", **{"client-sampling": "data-ratio", "fraction-train": 1.0})
    s.services.data.__dict__["partition_sizes"] = [(10, 1), (0, 1), (30, 1)]  # partition 1 holds nothing: never drawn
    delta = {0: 0.001, 1: 0.5, 2: 0.007}
    grid = FakeGrid(
        3,
        lambda pid, msg: reply(
            {k: v.numpy() + delta[pid] for k, v in msg.content.array_records["arrays"].items()}, {0: 10, 1: 1, 2: 1}[pid], pid
        ),
    )  # counts n-weighting would use
    state = s.initial_state()
    arrays = state.arrays
    name = next(iter(arrays.keys()))
    base = arrays[name].numpy().astype(np.float64)
    drawn = {0: 0, 2: 0}
    mixed = 0
    for r in range(1, 41):
        engine = engine_for(s, grid, r)
        ctx, contents = s.configure_train(r, state, engine)
        assert set(contents) == set(ctx.draws)
        step = s.aggregate_train(ctx, engine.exchange("train", contents, MessageType.TRAIN, s.train_layout(ctx)))
        draws = {engine.partition_of(n): m for n, m in ctx.draws.items()}
        assert 1 not in draws and sum(draws.values()) == 3
        for pid, m in draws.items():
            drawn[pid] += m
        expected = sum(m * delta[pid] for pid, m in draws.items()) / 3
        assert np.allclose(step.arrays[name].numpy().astype(np.float64) - base, expected, atol=1e-6)
        mixed += len(draws) == 2
    assert mixed > 10  # rounds where both were drawn tell draw weights from count weights
    assert 2.0 < drawn[2] / drawn[0] < 4.5  # n_2/n_0 = 3


def test_data_ratio_without_server_data_weighs_by_the_counts_clients_reported(task_identity):
    s = make_strategy("fedavg", **{"client-sampling": "data-ratio", "fraction-train": 1.0})
    s.services.data.__dict__["partition_sizes"] = None  # a deployment server without the data
    grid = FakeGrid(
        3, lambda pid, msg: reply({k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}, {0: 40, 1: 10, 2: 20}[pid], pid)
    )
    engine = engine_for(s, grid)
    state = s.initial_state()
    assert s.data_ratio(engine, state.method) == {101: 1.0, 102: 1.0, 103: 1.0}  # nobody heard from yet: equal
    for r in range(1, 6):
        state = ServerState(state.arrays, state.advance(s.train_round(r, state, engine)).method)  # the counts heard, the model kept
    heard = {n for n in (101, 102, 103) if engine.partition_of(n) in state.method.counts}
    ratio = s.data_ratio(engine, state.method)
    assert heard and all(ratio[n] == {101: 40, 102: 10, 103: 20}[n] for n in heard)
    assert all(ratio[n] == np.mean([ratio[h] for h in heard]) for n in {101, 102, 103} - heard)


def test_client_sampling_is_refused_for_methods_that_draw_their_own_clients():
    from headway.core.config import ConfigError, resolve

    with pytest.raises(ConfigError, match="only fedavg and fedprox"):
        resolve({"algorithm": "fedprof", "client-sampling": "data-ratio"})


def test_each_client_can_get_its_own_content(task_identity):
    s = make_strategy("fedavg")
    grid = FakeGrid(3, lambda pid, msg: reply({"x": msg.content.array_records["arrays"]["x"].numpy() + 1}, 1, pid))
    engine = engine_for(s, grid)
    contents = {n: RecordDict({"arrays": ArrayRecord({"x": Array(np.full(4, float(n), np.float32))})}) for n in engine.nodes()}
    replies = engine.exchange("train", contents, MessageType.TRAIN, LAYOUT)
    assert {r.node_id: float(r.arrays["x"][0]) for r in replies} == {101: 102.0, 102: 103.0, 103: 104.0}


def test_relay_passes_each_reply_on_and_skips_a_dropped_hop(task_identity):
    s = make_strategy("fedavg", **{"num-clients": 4})
    grid = FakeGrid(
        4, lambda pid, msg: None if pid == 1 else reply({"x": msg.content.array_records["arrays"]["x"].numpy() + 10**pid}, 1, pid)
    )
    engine = engine_for(s, grid)

    def forward(r):
        return RecordDict({"arrays": ArrayRecord({"x": Array(r.arrays["x"])})}), LAYOUT

    start = RecordDict({"arrays": ArrayRecord({"x": Array(np.zeros(4, np.float32))})})
    out = engine.relay("relay", engine.nodes(), start, forward, LAYOUT, hop_timeout=2.0)
    assert [r.partition_id for r in out] == [0, 2, 3]
    assert [float(r.arrays["x"][0]) for r in out] == [1.0, 101.0, 1101.0]  # partition 1 skipped: 2 got 0's result
    assert "relay: node 102 (partition 1): no reply within 2 s" in engine.meter.failures[0]
    assert grid.timeouts[1:] == [2.0] * 4  # per-hop deadline
    assert engine.meter.phase("relay")[0] > 0 and engine.meter.phase("relay")[1] > 0


def test_fedlog_collects_statistics_from_every_client_before_round_1(task_identity):
    s = make_strategy("fedlog", **{"num-clients": 3, "fraction-train": 0.34})

    def answer(pid, msg):
        stats = np.zeros((10, 51), np.float32)
        stats[pid, 0] = 4
        return reply({"stats": stats}, 4, pid, loss=1.0)

    grid = FakeGrid(3, answer)
    engine = engine_for(s, grid)
    state, prep = s.prepare(s.initial_state(), engine)
    arrays = state.arrays
    assert prep.clients == 3 and {m.metadata.dst_node_id for m in grid.sent if m.content["config"].get("phase") == "stats"} == {
        101,
        102,
        103,
    }
    assert engine.meter.phase("stats")[0] > 0 and "eta" in arrays


def test_wire_meter_counts_header_tree_and_objects_and_caches_shared_content(task_identity):
    small = RecordDict({"arrays": ArrayRecord({"x": Array(np.zeros((10, 51), np.float32))})})
    big = RecordDict({"arrays": ArrayRecord({"x": Array(np.zeros((100, 101), np.float32))})})
    m_small = Message(content=small, dst_node_id=5, message_type="train")
    m_big = Message(content=big, dst_node_id=5, message_type="train")
    assert WireMeter().message(m_big) - WireMeter().message(m_small) == pytest.approx(
        (100 * 101 - 10 * 51) * 4, abs=8
    )  # the data (and a few length digits)
    assert WireMeter().message(m_small) > recorddict_to_proto(small).ByteSize() + 500  # ids, headers: the old size undercounts


# The header as Flower pushes it (message_to_proto of the message without content) holds an empty
# content field, 2 bytes (tag, length 0), that the meter leaves out: the one known gap, see
# test_wire_meter_counts_the_header_exactly_as_flower_pushes_it.
EMPTY_CONTENT_FIELD = 2


def shipped(message: Message) -> int:
    """Bytes Flower 1.39 ships for ``message`` in its deployed form, from Flower's own push code
    (``flwr.client.grpc_rere_client.connection``, ``flwr.superlink.grid.http_grid``): the header
    proto of the message without its content, its ObjectTree, and every deflated object of it.
    The message id is set to the object id, as a deployment's grid does."""
    from flwr.app.message import remove_content_from_message
    from flwr.common.serde import message_to_proto
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree

    message.metadata.__dict__["_message_id"] = message.object_id
    header = message_to_proto(remove_content_from_message(message)).ByteSize()
    return header + get_object_tree(message).ByteSize() + sum(len(o.deflate()) for o in get_all_nested_objects(message).values())


def _requests_and_replies() -> list[Message]:
    big = RecordDict({"arrays": ArrayRecord({"x": Array(np.zeros((100, 101), np.float32))}), "config": ConfigRecord({"r": 1})})
    small = RecordDict({"arrays": ArrayRecord({"x": Array(np.ones((10, 51), np.float16))}), "metrics": MetricRecord({"num-examples": 7})})
    sent = [Message(content=big, dst_node_id=n, message_type="train") for n in (5, 6)]  # one content, two recipients
    for m in sent:
        m.metadata.__dict__["_message_id"] = m.object_id  # the deployed id a reply points back to
    return [
        *sent,
        Message(content=small, reply_to=sent[0]),
        Message(content=small, reply_to=sent[1]),
        Message(RecordDict(), reply_to=sent[0]),
    ]


def test_wire_meter_counts_what_flower_serializes(task_identity):
    """One meter over requests sharing content and replies: each message's count is the size
    Flower's own serialization gives it (up to the empty content field, see above)."""
    meter = WireMeter()
    for m in _requests_and_replies():
        assert meter.message(m) == shipped(m) - EMPTY_CONTENT_FIELD


@pytest.mark.xfail(strict=True, reason="gap: the meter leaves out the 2 bytes of the empty content field in Flower's message header")
def test_wire_meter_counts_the_header_exactly_as_flower_pushes_it(task_identity):
    m = _requests_and_replies()[0]
    assert WireMeter().message(m) == shipped(m)


def test_wire_meter_counts_reply_ids_in_their_deployed_form(task_identity):
    """Simulation points replies back by uuid4 (36 characters), a deployment by object id (64):
    the meter counts the deployed form either way, both in the header and the message object."""
    content = RecordDict({"arrays": ArrayRecord({"x": Array(np.zeros((10, 51), np.float32))})})
    request = Message(content=RecordDict(), dst_node_id=5, message_type="train")
    request.metadata.__dict__["_message_id"] = "0123456789abcdef0123-4567-89ab-cdef"  # 36, as simulation's uuid4
    simulated = Message(content=content, reply_to=request)
    request.metadata.__dict__["_message_id"] = request.object_id  # 64, as a deployment's
    deployed = Message(content=content, reply_to=request)
    assert len(simulated.metadata.reply_to_message_id) == 35 and len(deployed.metadata.reply_to_message_id) == 64
    assert WireMeter().message(simulated) == WireMeter().message(deployed)
    assert len(simulated.deflate()) + 29 == len(deployed.deflate())  # the id sits in the message object (and the header)


def test_a_restarted_node_takes_over_its_partition_once_the_old_node_is_gone(task_identity, monkeypatch):
    """Two nodes claiming one partition: the second is refused while the first is connected,
    registered again when it leaves, and inherits the server's state of that client; the
    first holder, back under its own node id, takes its partition (and state) back: the state is
    keyed by partition id (here FedAvg's count of partition 1, what data-ratio sampling weighs by)."""
    s = make_strategy("fedavg")
    s.services.data.__dict__["partition_sizes"] = None  # the weights come from the counts the state holds
    counts = FedAvgState({1: 25})
    grid = FakeGrid(3)
    engine = engine_for(s, grid)
    engine.end_round()
    restarted = 104
    grid.nodes = [101, 102, 103, restarted]
    answer = grid.send_and_receive

    def claims_partition_1(messages, *, timeout=None):  # the new node 104 says it is partition 1
        out = answer(messages, timeout=timeout)
        for r in out:
            if r.metadata.src_node_id == restarted and r.metadata.message_type == MessageType.QUERY:
                r.content.metric_records["metrics"]["partition-id"] = 1
        return out

    monkeypatch.setattr(grid, "send_and_receive", claims_partition_1)
    assert grid.bodies is not None  # engine_for gave every partition its body
    grid.bodies.append("mnist-cnn")
    engine.begin_round(2)
    assert restarted in engine.registry.refused and "still connected" in engine.meter.failures[-1]
    assert engine.registry.partition(102) == 1 and engine.nodes() == [101, 102, 103]
    engine.end_round()
    grid.nodes = [101, 103, restarted]  # the old node of partition 1 is gone
    engine.begin_round(3)
    assert engine.registry.partition(restarted) == 1 and 102 not in engine.registry.clients
    assert s.data_ratio(engine, counts)[restarted] == 25.0
    assert engine.nodes() == [101, restarted, 103] and not engine.meter.failures and engine.meter.absent == []
    engine.end_round()
    grid.nodes = [101, 102, 103, restarted]  # the first holder returns under its own id (as with SuperNode authentication)
    engine.begin_round(4)
    assert engine.registry.partition(102) == 1 and s.data_ratio(engine, counts)[102] == 25.0
    assert restarted in engine.registry.refused and engine.nodes() == [101, 102, 103]
