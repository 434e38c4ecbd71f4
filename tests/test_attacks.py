"""Attacks from an outside attempt to break a run (issue 23), each as a crafted client:
a node that answers what it likes, not the project's honest procedure. Each must be
refused or bounded, counted, and leave the run going."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MessageType, MetricRecord, RecordDict
from headway.core import protocol as P
from headway.core.fedlog import StatsCheck
from headway.core.fedpft import ClassMixture, encode

from tests.fakes import FakeGrid, engine_for, make_strategy, reply, smuggle


def model_reply(msg, pid: int, scale: float = 1.0, shift: float = 0.0, n: int = 10) -> RecordDict:
    """A training reply of the model a client was sent, scaled and shifted."""
    return reply({k: v.numpy() * scale + shift for k, v in msg.content[P.ARRAYS].items()}, n, pid, loss=0.5)


def evaluation(pid: int) -> RecordDict:
    return RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10, P.CORRECT: 5, P.PARTITION_ID: pid})})


# ----- 1. one client ends an LG-FedAvg run ----------------------------------------
@pytest.mark.parametrize("body", ["resnet-9000", 7])
def test_a_node_registering_an_unknown_body_is_refused_and_lg_fedavg_runs_on(task_identity, data_dir, body):
    """The body a node names is refused at registration (before the upload phase could
    build it), the refusal is counted, and the run finishes with the other nodes."""
    s = make_strategy("lg-fedavg", **{"data-dir": data_dir, "lg-global-layers": 1, "lg-new-test": True})

    def answer(pid, msg):
        if msg.metadata.message_type == MessageType.EVALUATE:
            if msg.content[P.CONFIG][P.PHASE] == P.PHASE_UPLOAD:  # the whole local model, once
                return reply({k: v.numpy() for k, v in s.template.state_dict().items()}, None, pid)
            return evaluation(pid)
        return model_reply(msg, pid, shift=0.01)

    grid = FakeGrid(3, answer, bodies=["mnist-cnn", body, "mnist-cnn"])
    records: list[dict] = []
    engine = s.start(grid=grid, initial_arrays=s.initial_arrays(), num_rounds=2, on_round=records.append)
    assert [r["clients"] for r in records] == [2, 2]
    assert records[0]["failures"] == 1 and "registration" in records[0]["failure_reasons"][0]
    assert records[-1]["new_test_models"] == 2.0  # the upload phase ran on the registered nodes
    assert list(s.participants(engine)["participants"]) == ["0", "2"] and len(s.participants(engine)["refused_nodes"]) == 1


def test_a_body_whose_shared_layers_do_not_fit_is_refused_at_registration(task_identity, data_dir):
    s = make_strategy("lg-fedavg", **{"data-dir": data_dir, "lg-global-layers": 1, "feature-dim": 50})
    assert s.body_problem("mnist-cnn") is None and s.body_problem("mlp") is None  # both give 50 features to the head
    wide = make_strategy("lg-fedavg", **{"data-dir": data_dir, "lg-global-layers": 2})
    assert "do not match" in wide.body_problem("mlp")  # the second layer from the top differs
    assert "does not know" in wide.body_problem("nope")
    fedavg = make_strategy("fedavg", **{"data-dir": data_dir})
    assert "every client must run it" in fedavg.body_problem("mlp")
    fedlog = make_strategy("fedlog", **{"data-dir": data_dir})
    assert fedlog.body_problem("mnist-cnn") is None and "features" in fedlog.body_problem("mlp")


# ----- 2. unbounded counts under local DP ------------------------------------------
def test_local_dp_count_row_is_bounded_by_what_the_client_can_hold(task_identity, data_dir):
    """A client with ~60 examples claiming ~1,000,000 through its noised count row was
    accepted; the row's total is now bounded by the partition's size plus 8 noise std."""
    s = make_strategy(
        "fedlog", **{"data-dir": data_dir, "fedlog-dp": "local", "fedlog-clip": 1.0, "fedlog-epsilon": 50.0, "num-server-rounds": 2}
    )
    sizes = s.services.data.partition_sizes
    rng = np.random.default_rng(0)

    def stats_of(pid: int, inflate: float) -> np.ndarray:
        stats = np.zeros((s.classes, s.m))
        stats[pid, 0] = sizes[pid][0] + inflate
        stats[pid, 1:] = 0.5 * stats[pid, 0]  # features inside the clip, as honest as the count
        return (stats + rng.normal(0.0, s.sigma, stats.shape)).astype(np.float32)

    def answer(pid, msg):
        return RecordDict(
            {
                P.ARRAYS: ArrayRecord({P.STATS: Array(stats_of(pid, 999_960.0 if pid == 1 else 0.0))}),
                P.METRICS: MetricRecord({P.PARTITION_ID: pid}),
            }
        )

    engine = engine_for(s, FakeGrid(3, answer))
    step = s.train_round(1, s.initial_state(), engine)
    assert step.clients == 2, engine.meter.failures
    assert len(engine.meter.failures) == 1 and "the sender (one client, or those in a secure sum) can hold" in engine.meter.failures[0]
    # honest noised rows pass many times over (8 std of slack); a count far beyond the size does not
    check = s.checker
    for _ in range(200):
        assert check.problem(stats_of(0, 0.0).astype(np.float64), 0.0, sizes[0][0]) is None
    slack = 8 * s.sigma * np.sqrt(s.classes)
    assert check.problem(stats_of(0, slack + 20 * s.sigma).astype(np.float64), 0.0, sizes[0][0]) is not None


def test_the_local_dp_count_rule_in_isolation():
    check = StatsCheck(num_classes=3, m=3, clip=1.0, noise_sigma=1.0, count_known=False)
    stats = np.zeros((3, 3))
    stats[0] = [100.0, 50.0, 50.0]
    assert check.problem(stats, 0.0, 100) is None
    stats[0] = [109.0, 50.0, 50.0]  # one class beyond size + 8σ = 108
    assert "can hold" in str(check.problem(stats, 0.0, 100))
    stats[0], stats[1] = [104.0, 0.0, 0.0], [12.0, 0.0, 0.0]  # each class within 100 + 8σ, total 116 > 100 + 8σ√3 = 113.9
    assert "beyond the 100 examples" in str(check.problem(stats, 0.0, 100))
    stats[:, 0] = -7.9  # each class within its noise, but a total of -23.7 < -8σ√3 = -13.9: weight taken off every class
    stats[:, 1:] = 0.0
    assert "below 0" in str(check.problem(stats, 0.0, 100))


# ----- 3. sign-flipped and ×10 models ----------------------------------------------
@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "lg-fedavg", "fedper"])
@pytest.mark.parametrize("scale", [-1.0, 10.0])
def test_sign_flipped_and_scaled_models_are_refused_by_the_default_bound(task_identity, data_dir, algorithm, scale):
    s = make_strategy(algorithm, **{"data-dir": data_dir})

    def answer(pid, msg):
        return model_reply(msg, pid, scale=scale if pid == 1 else 0.98, shift=0.0)

    engine = engine_for(s, FakeGrid(3, answer), server_round=2)
    step = s.train_round(2, s.initial_state(), engine)  # from round 2: round 1 has its own, looser bound (below)
    assert step.clients == 2 and len(engine.meter.failures) == 1, engine.meter.failures
    assert "exceeds max-update-norm=1.5" in engine.meter.failures[0]
    flipped = engine.meter.rejected_figures["update_norm"]
    assert flipped == [pytest.approx(abs(scale - 1.0), rel=1e-3)]  # -w moves the model by 2|w|, 10w by 9|w|
    assert step.metrics["update_norm_max"] == pytest.approx(0.02, rel=1e-3)  # the honest replies, reported beside


def test_rounds_report_honest_and_rejected_update_norms(task_identity, data_dir):
    s = make_strategy("fedavg", **{"data-dir": data_dir})

    def answer(pid, msg):
        if msg.metadata.message_type == MessageType.EVALUATE:
            return evaluation(pid)
        return model_reply(msg, pid, scale=-1.0 if pid == 2 else 1.0 - 0.1 * (pid + 1))

    records: list[dict] = []
    s.start(grid=FakeGrid(3, answer), initial_arrays=s.initial_arrays(), num_rounds=2, on_round=records.append)
    for rec in records:  # round 1 (max-first-update-norm) and round 2 (max-update-norm), both 1.5
        assert rec["update_norm_max"] == pytest.approx(0.2, rel=1e-3) and rec["update_norm_mean"] == pytest.approx(0.15, rel=1e-3)
        assert rec["clients"] == 2 and rec["rejected_update_norms"] == [pytest.approx(2.0, rel=1e-3)]


def test_round_one_has_its_own_bound_for_the_long_moves_of_honest_training_from_the_random_model(task_identity, data_dir):
    """Honest clients with 4,000-20,000 examples moved 1.55-2.7 × |w| from the seeded initial
    model in round 1 (mnist-cnn, 5 Adam epochs); after it, at most 0.95. By default round 1 is
    held to 1.5 too (a sign flip there locked a run: the damaged model made honest round-2
    updates 1.54); the refusal says which key to raise, and raising it loosens round 1 only."""

    def answer(pid, msg):
        return model_reply(msg, pid, scale=3.7)  # moved by 2.7 |w|

    s = make_strategy("fedavg", **{"data-dir": data_dir})
    engine = engine_for(s, FakeGrid(3, answer))
    assert s.train_round(1, s.initial_state(), engine).clients == 0
    assert "exceeds max-first-update-norm=1.5 (raise it" in engine.meter.failures[0]
    long = make_strategy("fedavg", **{"data-dir": data_dir, "max-first-update-norm": 5.0})
    for rnd, accepted in ((1, 3), (2, 0)):
        engine = engine_for(long, FakeGrid(3, answer), server_round=rnd)
        assert long.train_round(rnd, long.initial_state(), engine).clients == accepted, engine.meter.failures
    assert "exceeds max-update-norm=1.5" in engine.meter.failures[0]
    engine = engine_for(long, FakeGrid(3, lambda pid, msg: model_reply(msg, pid, scale=10.0)))  # ×10: 9 |w|
    assert long.train_round(1, long.initial_state(), engine).clients == 0


# ----- 5. a metric of the wrong type -----------------------------------------------
@pytest.mark.parametrize("where", ["train", "register"])
def test_a_string_metric_smuggled_past_metricrecord_is_a_rejected_reply(task_identity, data_dir, where):
    """A crafted client builds its Message itself; in simulation a str inside a
    MetricRecord reaches the server, where measuring its size raised TypeError."""
    s = make_strategy("fedavg", **{"data-dir": data_dir})

    def answer(pid, msg):
        out = model_reply(msg, pid, scale=0.99)
        if pid == 1:
            smuggle(out.metric_records[P.METRICS], P.LOSS, "0.1")
        return out

    class Grid(FakeGrid):
        def send_and_receive(self, messages, *, timeout=None):
            replies = super().send_and_receive(messages, timeout=timeout)
            if where == "register":
                for r in replies:
                    if r.metadata.src_node_id == 102 and r.metadata.message_type == MessageType.QUERY:
                        smuggle(r.content.metric_records[P.METRICS], P.PARTITION_ID, "1")
            return replies

    engine = engine_for(s, Grid(3, answer))
    step = s.train_round(1, s.initial_state(), engine)
    if where == "register":
        assert 102 in engine.registry.refused and step.clients == 2
    else:
        assert step.clients == 2 and len(engine.meter.failures) == 1
        assert "cannot be measured: TypeError" in engine.meter.failures[0] and "type Flower" in engine.meter.failures[0]


# ----- 9. FedPFT's head depends on arrival order ---------------------------------------
class ReversedGrid(FakeGrid):
    """Replies arrive in the reverse order of the messages."""

    def send_and_receive(self, messages, *, timeout=None):
        return list(reversed(super().send_and_receive(messages, timeout=timeout)))


def test_fedpft_head_does_not_depend_on_the_order_replies_arrive(task_identity, data_dir):
    def payload(pid):
        rng = np.random.default_rng(pid)
        return encode(
            [
                ClassMixture(c, 20, np.ones(1), np.clip(rng.normal(0.4 * c, 0.3, (1, 784)), -0.4, 2.8), np.full((1, 784), 0.5), "diag")
                for c in (pid, pid + 3)
            ],
            784,
            "diag",
        )

    heads = []
    for grid_type in (FakeGrid, ReversedGrid):
        s = make_strategy(
            "fedpft",
            **{
                "num-server-rounds": 1,
                "fedpft-extractor": "identity",
                "fedpft-covariance": "diag",
                "fedpft-head-epochs": 2,
                "data-dir": data_dir,
                "global-eval": False,
            },
        )
        engine = engine_for(s, grid_type(3, lambda pid, msg: reply(payload(pid), 40, pid)))
        step = s.train_round(1, s.initial_state(), engine)
        assert step.clients == 3
        heads.append({k: v.numpy() for k, v in step.arrays.items()})
    assert heads[0].keys() == heads[1].keys()
    for name in heads[0]:
        np.testing.assert_array_equal(heads[0][name], heads[1][name])


def test_exchange_returns_replies_in_partition_order(task_identity, data_dir):
    s = make_strategy("fedavg", **{"data-dir": data_dir, "num-clients": 4})
    engine = engine_for(s, ReversedGrid(4, lambda pid, msg: model_reply(msg, pid, scale=0.99)))
    ctx, content = s.configure_train(1, s.initial_state(), engine)
    replies = engine.exchange(P.PHASE_TRAIN, content, MessageType.TRAIN, s.train_layout(ctx))
    assert [r.partition_id for r in replies] == [0, 1, 2, 3]


# ----- 10. poisoning inside the old bounds -------------------------------------------
def test_fedlog_statistics_pushed_below_zero_are_refused_where_features_are_relus(task_identity, data_dir):
    """Sums at −b·count passed the clip bound; mnist-cnn's features leave a ReLU, so no data
    gives a negative sum. +b·count still passes (see docs/trust-and-dp.md)."""
    s = make_strategy("fedlog", **{"data-dir": data_dir, "fedlog-clip": 1.0})
    assert s.nonnegative

    def answer(pid, msg):
        stats = np.zeros((10, 51), np.float32)
        stats[pid] = [10.0] + [(-1.0 if pid == 1 else 0.4)] * 50
        if pid == 2:
            stats[pid, 1:] = 10.0  # +b·count: inside every bound the data allows
        return reply({P.STATS: stats}, 10, pid, loss=0.5)

    engine = engine_for(s, FakeGrid(3, answer))
    step = s.train_round(1, s.initial_state(), engine)
    assert step.clients == 2 and "feature sum is negative" in engine.meter.failures[0]
    signed = make_strategy(
        "fedlog", **{"data-dir": data_dir, "body": "linear", "fedlog-clip": 1.0}
    )  # raw pixels: signed after normalization
    assert not signed.nonnegative


def test_fedpft_means_outside_the_extractors_range_are_refused(task_identity, data_dir):
    """Means up to 1e4 passed max-feature-value; with the identity extractor on MNIST a
    feature is a normalized pixel, in [(0 − 0.1307)/0.3081, (1 − 0.1307)/0.3081]."""
    s = make_strategy(
        "fedpft", **{"num-server-rounds": 1, "fedpft-extractor": "identity", "fedpft-covariance": "diag", "data-dir": data_dir}
    )
    lo, hi = s.checker.value_range
    assert lo == pytest.approx(-0.4242, abs=1e-3) and hi == pytest.approx(2.8215, abs=1e-3)

    def answer(pid, msg):
        mean = {0: 0.5, 1: 1e4, 2: hi}[pid]  # the pixel range's edge is still data
        return reply(
            encode([ClassMixture(pid, 20, np.ones(1), np.full((1, 784), mean), np.full((1, 784), 0.5), "diag")], 784, "diag"), 20, pid
        )

    engine = engine_for(s, FakeGrid(3, answer))
    step = s.train_round(1, s.initial_state(), engine)
    assert step.clients == 2 and "range of the extractor" in engine.meter.failures[0]
    dp = make_strategy(
        "fedpft",
        **{
            "num-server-rounds": 1,
            "fedpft-extractor": "identity",
            "fedpft-covariance": "diag",
            "data-dir": data_dir,
            "fedpft-dp": "on",
            "fedpft-components": 1,
        },
    )
    assert dp.checker.value_range is None  # noised means may leave the range
    chain = make_strategy(
        "fedpft",
        **{
            "num-server-rounds": 1,
            "fedpft-extractor": "identity",
            "fedpft-covariance": "diag",
            "data-dir": data_dir,
            "fedpft-topology": "chain",
        },
    )
    assert chain.checker.value_range is None  # a chain client also fits Gaussian samples of what it was relayed


def _class_stats(counts: np.ndarray, means: np.ndarray) -> np.ndarray:
    """A client's T (classes × 51): [count, count · mean] per class."""
    return np.hstack([counts[:, None], counts[:, None] * means]).astype(np.float32)


def test_fedlog_class_means_inflated_within_every_check_are_cut_to_honest_scale(task_identity, data_dir):
    """The outside probe's attack: one client of four sends feature sums of 0.99 × max-feature-value × its
    honest class counts. Every check passes; summed as sent, its class means set Φ's (accuracy 0.833 → 0.149
    on MNIST iid). Its means are cut to the factor × each class's median norm: Φ's class means stay at honest scale,
    and the honest clients' statistics are summed as sent."""
    from headway.core.fedlog import CLASS_MEAN_NORM_FACTOR, class_means

    s = make_strategy("fedlog", **{"data-dir": data_dir, "num-clients": 4})
    rng = np.random.default_rng(0)
    counts = np.full(10, 12.0)
    honest = {pid: _class_stats(counts, rng.uniform(0.0, 1.0, (10, 50))) for pid in range(3)}
    liar = _class_stats(counts, np.full((10, 50), 0.99 * s.settings.max_feature_value))
    assert s.checker.problem(liar.astype(np.float64), 120.0) is None  # inside every bound the checks know
    engine = engine_for(s, FakeGrid(4, lambda pid, msg: reply({P.STATS: honest.get(pid, liar)}, 120, pid, loss=0.5)))
    step = s.train_round(1, s.initial_state(), engine)
    assert step.clients == 4 and step.metrics["fedlog_means_cut"] == 10.0 and step.metrics["fedlog_mean_norm_ratio"] > 1000
    honest_means = [np.linalg.norm(class_means(t.astype(np.float64))[:, 1:], axis=1) for t in honest.values()]
    top = np.max(honest_means, axis=0)  # the largest honest class-mean norm of each class
    phi_means = np.linalg.norm(class_means(step.method.phi_sum)[:, 1:], axis=1)
    bound = (3.0 + CLASS_MEAN_NORM_FACTOR) / 4.0  # three honest means and one at most the factor × their median
    assert np.all(phi_means <= bound * top), phi_means / top  # uncut: ~1,700 × top


def test_fedlog_cut_bounds_classes_fewer_than_three_clients_hold_and_leaves_honest_statistics_alone():
    """Non-iid (2 classes a client): a class with fewer than 3 holders is bounded by the round's reference,
    the median over clients of each one's median class-mean norm; honest statistics pass unchanged."""
    from headway.core.fedlog import CLASS_MEAN_NORM_FACTOR, clip_class_means

    rng = np.random.default_rng(1)
    stats = []
    for k in range(4):  # client k holds classes 2k and 2k + 1
        counts = np.zeros(10)
        counts[[2 * k, 2 * k + 1]] = 20.0
        stats.append(_class_stats(counts, rng.uniform(0.0, 1.0, (10, 50)) * (counts > 0)[:, None]).astype(np.float64))
    kept, cut = clip_class_means(stats)
    assert cut.cut == 0 and cut.bounded == 8 and cut.unbounded == 0 and cut.largest_ratio < 1.5
    assert all(np.array_equal(a, b) for a, b in zip(kept, stats))
    stats[3][[6, 7], 1:] = 9900.0 * 20.0  # the liar's two classes, held by no one else
    kept, cut = clip_class_means(stats)
    assert cut.cut == 2 and np.array_equal(kept[3][:, 0], stats[3][:, 0])  # sums cut, counts as sent
    reference = np.median([np.median(np.linalg.norm(t[t[:, 0] > 0, 1:] / 20.0, axis=1)) for t in stats])
    assert np.allclose(np.linalg.norm(kept[3][[6, 7], 1:] / 20.0, axis=1), CLASS_MEAN_NORM_FACTOR * reference)


def test_fedlog_with_fewer_than_three_clients_warns_that_the_cut_is_off(task_identity, data_dir, caplog):
    """Two repliers: no median can tell the liar from the honest client; the round says so in the log."""
    s = make_strategy("fedlog", **{"data-dir": data_dir, "num-clients": 2})
    liar = _class_stats(np.full(10, 12.0), np.full((10, 50), 9900.0))
    honest = _class_stats(np.full(10, 12.0), np.full((10, 50), 0.5))
    engine = engine_for(s, FakeGrid(2, lambda pid, msg: reply({P.STATS: liar if pid else honest}, 120, pid, loss=0.5)))
    with caplog.at_level("WARNING", logger="headway"):
        step = s.train_round(1, s.initial_state(), engine)
    assert step.clients == 2 and step.metrics["fedlog_means_cut"] == 0.0
    assert any("10 class(es) left uncut: fewer than 3 clients replied" in r.getMessage() for r in caplog.records)


def test_fedlog_mean_cut_sets_the_factor_and_zero_turns_the_cut_off(task_identity, data_dir):
    """fedlog-mean-cut: its default is core's factor; a factor of 3 cuts the liar to 3 × the median, 0 sums it as sent."""
    from headway.core.config import ConfigError, resolve
    from headway.core.fedlog import CLASS_MEAN_NORM_FACTOR, class_means

    assert resolve({})["fedlog-mean-cut"] == CLASS_MEAN_NORM_FACTOR
    for bad in (0.5, -1.0):
        with pytest.raises(ConfigError, match=r"fedlog-mean-cut.*0 \(no cut\) or >= 1"):
            resolve({"fedlog-mean-cut": bad})
    counts = np.full(10, 12.0)
    honest = {pid: _class_stats(counts, np.full((10, 50), 0.5)) for pid in range(3)}
    liar = _class_stats(counts, np.full((10, 50), 9900.0))
    liar_means = {}
    for factor in (3.0, 0.0):
        s = make_strategy("fedlog", **{"data-dir": data_dir, "num-clients": 4, "fedlog-mean-cut": factor})
        engine = engine_for(s, FakeGrid(4, lambda pid, msg: reply({P.STATS: honest.get(pid, liar)}, 120, pid, loss=0.5)))
        step = s.train_round(1, s.initial_state(), engine)
        liar_means[factor] = 4 * class_means(step.method.phi_sum)[:, 1:] - 3 * 0.5  # the liar's class means as summed
        assert step.clients == 4
    assert np.allclose(liar_means[3.0], 3.0 * 0.5) and np.allclose(liar_means[0.0], 9900.0)
