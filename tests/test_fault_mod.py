"""The fault-injection mod (client/faults.py) on the real ClientApp, with the ClientApp's own
handling replaced by a fixed honest reply: only the nodes that the run config's
fault-clients names have their train and evaluate replies damaged; registration, error
replies and every other node pass through untouched."""

import headway.client.app
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from headway.client.app import JOINED, build_client_app
from headway.core import protocol as P


def _honest(msg: Message, context: Context, kind: str, overrides, state_dir=None) -> Message:
    content = RecordDict(
        {P.ARRAYS: ArrayRecord({"w": Array(np.ones(3, np.float32))}), P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10, P.CORRECT: 7})}
    )
    return Message(content=content, reply_to=msg)


@pytest.fixture
def honest(monkeypatch, task_identity):
    monkeypatch.setattr(headway.client.app, "_handle", _honest)


def _context(node_config, run_config=None, state=None) -> Context:
    base: dict[str, bool | float | int | str] = {"fault-clients": "", "fault-mode": "nan"}
    return Context(1, 7, node_config, state or RecordDict(), {**base, **(run_config or {})})


def _ask(app, kind: str, context: Context) -> Message:
    return app(Message(content=RecordDict(), dst_node_id=7, message_type=kind), context)


def test_only_the_named_partitions_train_replies_are_damaged(honest):
    app = build_client_app()
    faulty = _context({"partition-id": 2}, {"fault-clients": "1,2", "fault-mode": "negative-count"})
    reply = _ask(app, "train", faulty)
    assert reply.content.metric_records[P.METRICS][P.NUM_EXAMPLES] == -5
    for ctx in (_context({"partition-id": 0}, {"fault-clients": "1,2", "fault-mode": "negative-count"}), _context({"partition-id": 2})):
        assert _ask(app, "train", ctx).content.metric_records[P.METRICS][P.NUM_EXAMPLES] == 10
    assert _ask(app, "query", faulty).content.metric_records[P.METRICS][P.NUM_EXAMPLES] == 10  # registration: never


def test_simulation_overrides_name_the_faulty_clients(honest):
    app = build_client_app({"fault-clients": "0", "fault-mode": "nan"})
    values = _ask(app, "train", _context({"partition-id": 0})).content.array_records[P.ARRAYS]["w"].numpy()
    assert np.isnan(values[0]) and (values[1:] == 1).all()


def test_bad_eval_damages_evaluation_replies_only(honest):
    app = build_client_app()
    ctx = _context({"partition-id": 1}, {"fault-clients": "1", "fault-mode": "bad-eval"})
    assert _ask(app, "evaluate", ctx).content.metric_records[P.METRICS][P.CORRECT] == 1_000_000
    assert _ask(app, "train", ctx).content.metric_records[P.METRICS][P.CORRECT] == 7


def test_error_mode_answers_with_the_failing_procedures_error_reply(honest):
    reply = _ask(build_client_app(), "train", _context({"partition-id": 1}, {"fault-clients": "1", "fault-mode": "error"}))
    assert reply.has_error() and reply.error.code == P.ERROR_CLIENT and "fault injection" in str(reply.error.reason)


def test_a_node_with_its_own_data_is_named_by_its_registered_client_index(honest):
    state = RecordDict({JOINED: ConfigRecord({P.DATA_SCHEMA: "{}", P.CLIENT_INDEX: 3})})
    run = {"fault-clients": "3", "fault-mode": "huge-count"}
    reply = _ask(build_client_app(), "train", _context({"data": "/somewhere", "partition-id": 0}, run, state))
    assert reply.content.metric_records[P.METRICS][P.NUM_EXAMPLES] == 1_000_000_000
    unregistered = _ask(build_client_app(), "train", _context({"data": "/somewhere"}, run))
    assert unregistered.content.metric_records[P.METRICS][P.NUM_EXAMPLES] == 10


def test_bad_eval_damages_the_scores_a_train_reply_carries():
    """Under client-evaluation=with-next-train the scores ride in the train reply: bad-eval damages
    them there, and leaves the training payload alone."""
    from headway.client.faults import damage_reply

    honest_reply = RecordDict(
        {P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10}), P.SCORES: MetricRecord({P.CORRECT: 7, P.NUM_EXAMPLES: 9, P.LOSS: 0.5})}
    )
    damaged = damage_reply(honest_reply, "bad-eval", "train")
    assert damaged.metric_records[P.SCORES][P.CORRECT] == 1_000_000
    assert damaged.metric_records[P.SCORES][P.NUM_EXAMPLES] == 9 and damaged.metric_records[P.METRICS][P.NUM_EXAMPLES] == 10
    assert honest_reply.metric_records[P.SCORES][P.CORRECT] == 7  # the honest reply itself is not changed
    plain = RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10})})
    assert damage_reply(plain, "bad-eval", "train") is plain  # no scores carried: nothing to damage


def test_inflated_stats_passes_fedlogs_checks_with_means_at_the_bound():
    """``inflated-stats``: FedLog's dense sums become 0.99 × b × each class count (counts as sent), inside
    every check; as [count, means] rows (float16 uplink) the means become 0.99 × b; sparse rows keep their index."""
    from headway.client.faults import damage_reply
    from headway.core.fedlog import StatsCheck

    stats = np.zeros((10, 51), np.float32)
    stats[[2, 5], 0], stats[[2, 5], 1:] = 4.0, 1.5
    content = RecordDict({P.ARRAYS: ArrayRecord({P.STATS: Array(stats)}), P.METRICS: MetricRecord({P.NUM_EXAMPLES: 8})})
    sent = damage_reply(content, "inflated-stats", bound=1e4).array_records[P.ARRAYS][P.STATS].numpy()
    assert np.array_equal(sent[:, 0], stats[:, 0]) and np.allclose(sent[[2, 5], 1:], 0.99 * 1e4 * 4.0) and not sent[0].any()
    assert StatsCheck(10, 51, 1e4, nonnegative=True).problem(sent.astype(np.float64), 8.0) is None
    rows = np.hstack([np.array([[2.0], [5.0]]), stats[[2, 5]] / np.array([[1.0] + [4.0] * 50])]).astype(np.float16)
    content = RecordDict({P.ARRAYS: ArrayRecord({P.STATS_ROWS: Array(rows)})})
    sent = damage_reply(content, "inflated-stats", bound=1e4, mean_rows=True).array_records[P.ARRAYS][P.STATS_ROWS].numpy()
    assert sent.dtype == np.float16 and np.array_equal(sent[:, :2], rows[:, :2]) and np.allclose(sent[:, 2:], 9900.0)
