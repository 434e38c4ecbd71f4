"""Robust aggregation (run-config ``aggregation``, issue 27 item 3).

Each rule gives exactly what Flower's own strategy class gives on the same replies; ``mean``
is today's n_k-weighted average, bit for bit. Against 2 poisoned replies of 11 (−10× the
honest update, inside the update-norm bound, so the reply checks admit them) the mean moves
far from the honest average and every robust rule stays near it: on hand-made updates, through
a strategy's round on a fake grid, and in a real Flower simulation on UCI Adult whose attackers
are ClientApps that send what they like. Configs a rule cannot run are refused before anything
starts, and a round with too few replies for its rule keeps the previous model."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import flwr.simulation
import headway.client.app
import headway.simulation as simulation
import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp.strategy import Bulyan, FedMedian, FedTrimmedAvg, Krum, MultiKrum
from headway.client.app import build_client_app as honest_client_app
from headway.client.app import partition_of
from headway.core import protocol as P
from headway.core.aggregate import relative_update_norm, weighted_average
from headway.core.config import ConfigError, resolve, resolve_settings
from headway.core.methods import METHODS
from headway.strategies.capabilities import ROBUST_AGGREGATION
from headway.strategies.fedavg import FedAvg
from headway.strategies.feddbe import FEATURE_MEAN, GLOBAL_MEAN
from headway.strategies.registry import CAPABILITIES, check_capabilities
from headway.strategies.robust import Rule, robust_aggregate

from tests.conftest import needs_data
from tests.fakes import FakeGrid, engine_for, make_strategy, reply

RULES = ("median", "trimmed-mean", "krum", "multi-krum", "bulyan")
AVERAGING = tuple(n for n in METHODS if ROBUST_AGGREGATION in CAPABILITIES[n])  # the methods whose strategy averages model updates
COMBINING = tuple(n for n in METHODS if ROBUST_AGGREGATION not in CAPABILITIES[n])
ATTACKERS = (9, 10)  # partition ids of the poisoned replies: 2 of 11 (Bulyan with f = 2 needs n >= 4f + 3 = 11)
F = len(ATTACKERS)


def flower_strategy(rule: str, f: int = F, m: int = 0, n: int = 11, beta: float = 0.2):
    """Flower's own strategy class for ``rule``, set as ``Rule(rule, beta, f, m)`` is (m = 0: n − f)."""
    return {
        "median": lambda: FedMedian(),
        "trimmed-mean": lambda: FedTrimmedAvg(beta=beta),
        "krum": lambda: Krum(num_malicious_nodes=f),
        "multi-krum": lambda: MultiKrum(num_malicious_nodes=f, num_nodes_to_select=m or n - f),
        "bulyan": lambda: Bulyan(num_malicious_nodes=f),
    }[rule]()


def flower_aggregate(strategy, models: list[dict[str, np.ndarray]], counts: list[int]) -> dict[str, np.ndarray]:
    """What ``strategy.aggregate_train`` makes of these replies, as the Messages a Grid hands it."""
    asked = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=1, message_type=MessageType.TRAIN)
    replies = [
        Message(
            RecordDict(
                {
                    "arrays": ArrayRecord({k: Array(np.asarray(v, order="C")) for k, v in model.items()}),
                    "metrics": MetricRecord({"num-examples": n}),
                }
            ),
            reply_to=asked,
        )
        for model, n in zip(models, counts, strict=True)
    ]
    arrays, _ = strategy.aggregate_train(1, replies)
    return {k: v.numpy() for k, v in arrays.items()}


def hand_made(n: int = 11, seed: int = 0):
    """A sent model and ``n`` float32 replies scattered around it at different distances, with counts."""
    rng = np.random.default_rng(seed)
    sent = {"w": rng.normal(size=(6, 4)).astype(np.float32), "b": rng.normal(size=5).astype(np.float32)}
    models = [{k: (v + rng.normal(0, 0.05 * (1 + i), v.shape)).astype(np.float32) for k, v in sent.items()} for i in range(n)]
    order = rng.permutation(n)  # the spread does not follow the position
    return sent, [models[i] for i in order], [int(c) for c in rng.integers(5, 60, n)]


# ----------------------------------------------------------------- each rule is Flower's


@pytest.mark.parametrize(("rule", "f", "m"), [(r, F, 0) for r in RULES] + [("multi-krum", 2, 4), ("krum", 0, 0), ("bulyan", 1, 0)])
def test_each_rule_gives_what_flowers_strategy_gives(task_identity, rule, f, m):
    sent, models, counts = hand_made()
    ours, kept = robust_aggregate(models, counts, Rule(rule, 0.2, f, m), sent)
    theirs = flower_aggregate(flower_strategy(rule, f, m), models, counts)
    assert set(ours) == set(theirs) == set(sent)
    for name in sent:
        assert ours[name].dtype == np.float32 and ours[name].shape == sent[name].shape
        assert np.array_equal(ours[name], theirs[name]), (rule, name, np.max(np.abs(ours[name] - theirs[name])))
    if rule == "krum":
        assert len(kept) == 1 and all(np.array_equal(ours[k], models[kept[0]][k]) for k in sent)  # Krum returns one reply
    if rule == "multi-krum":
        assert len(kept) == (m or 11 - f)


def test_trimmed_mean_with_another_beta_and_median_of_an_even_count_match_flower(task_identity):
    sent, models, counts = hand_made(n=10, seed=3)
    for rule, beta in (("trimmed-mean", 0.35), ("trimmed-mean", 0.1), ("median", 0.2)):
        ours, _ = robust_aggregate(models, counts, Rule(rule, beta), sent)
        theirs = flower_aggregate(flower_strategy(rule, beta=beta), models, counts)
        assert all(np.array_equal(ours[k], theirs[k]) for k in sent), (rule, beta)


def test_mean_is_todays_weighted_average_bit_for_bit(task_identity, data_dir):
    """aggregation=mean (the default, or named) is weighted_average with weights n_k, unchanged."""
    for setting in ({}, {"aggregation": "mean"}):
        s = make_strategy("fedavg", **{"data-dir": data_dir, **setting})
        sizes = [train for train, _ in s.services.data.partition_sizes]
        sent = {k: v.numpy() for k, v in s.initial_arrays().items()}
        rng = np.random.default_rng(7)
        made = [{k: v + rng.normal(0, 0.01, v.shape).astype(v.dtype) for k, v in sent.items()} for _ in range(3)]

        def answer(pid: int, msg: Message, made=made, sizes=sizes) -> RecordDict:
            return reply(made[pid], sizes[pid] - pid, pid)

        grid = FakeGrid(3, answer)
        step = s.train_round(1, s.initial_state(), engine_for(s, grid))
        expected = weighted_average(made, [sizes[p] - p for p in range(3)], like=sent)
        assert step.clients == 3 and step.details == {}
        assert all(np.array_equal(step.arrays[k].numpy(), expected[k]) for k in expected), setting


def test_integer_counters_are_cast_back_and_do_not_sway_krum(task_identity):
    """BatchNorm's batches-seen counter grows with a client's data, not its model: Krum's distances leave it out
    (Flower's take every array), and every rule returns it in its own integer dtype."""
    sent, models, counts = hand_made(n=7, seed=5)
    (central,) = robust_aggregate(models, counts, Rule("krum", f=1), sent)[1]  # Krum's pick on the float arrays
    sent["seen"] = np.array(100, np.int64)
    for i, model in enumerate(models):
        model["seen"] = np.array(100 + (5000 if i == central else 10 * i), np.int64)  # the central model's client holds most data
    ours, kept = robust_aggregate(models, counts, Rule("krum", f=1), sent)
    assert kept == [central] and ours["seen"].dtype == np.int64 and ours["seen"].shape == ()
    theirs = flower_aggregate(flower_strategy("krum", f=1, n=7), models, counts)
    assert not np.array_equal(theirs["w"], models[central]["w"])  # Flower's distances, counter included, pick another
    for rule in RULES:
        out, _ = robust_aggregate(models, counts, Rule(rule, f=1), sent)
        assert out["seen"].dtype == np.int64 and out["seen"].shape == ()


# ----------------------------------------------------------------- a poisoned minority


def honest_distance(aggregate: dict[str, np.ndarray], honest: dict[str, np.ndarray], sent: dict[str, np.ndarray]) -> float:
    """‖aggregate − honest average‖ / ‖honest average − sent‖ over the float arrays: 0 is the honest average, 1 is as far
    from it as the honest update is long; 2 is the honest update undone and reversed."""
    floats = [k for k, v in sent.items() if np.issubdtype(v.dtype, np.floating)]

    def norm(d: dict[str, np.ndarray]) -> float:
        return float(np.sqrt(sum(np.sum(np.square(d[k], dtype=np.float64)) for k in floats)))

    return norm({k: aggregate[k] - honest[k] for k in floats}) / norm({k: honest[k] - sent[k] for k in floats})


def test_two_poisoned_replies_of_eleven_move_the_mean_but_no_robust_rule(task_identity):
    """9 honest updates u + noise, 2 replies of −10× an honest update, claiming the largest count."""
    rng = np.random.default_rng(11)
    sent = {"w": rng.normal(size=(20, 10)).astype(np.float32), "b": rng.normal(size=10).astype(np.float32)}
    u = {k: rng.normal(0, 0.05, v.shape) for k, v in sent.items()}
    models = [{k: (v + u[k] + rng.normal(0, 0.015, v.shape)).astype(np.float32) for k, v in sent.items()} for _ in range(11)]
    for i in ATTACKERS:
        models[i] = {k: (sent[k] - 10.0 * (models[i][k] - sent[k])).astype(np.float32) for k in sent}
    counts = [int(c) for c in rng.integers(20, 60, 11)]
    counts[ATTACKERS[0]] = counts[ATTACKERS[1]] = 60
    good = [i for i in range(11) if i not in ATTACKERS]
    honest = weighted_average([models[i] for i in good], [counts[i] for i in good], like=sent)
    mean = weighted_average(models, counts, like=sent)
    distance = {"mean": honest_distance(mean, honest, sent)}
    for rule in RULES:
        out, kept = robust_aggregate(models, counts, Rule(rule, 0.2, F), sent)
        distance[rule] = honest_distance(out, honest, sent)
        if rule in ("krum", "multi-krum", "bulyan"):
            assert not set(kept) & set(ATTACKERS), (rule, kept)
    # the mean is dragged past the sent model (2.56 here: the honest update reversed); the robust rules stay within
    # a fraction of the honest update (measured: median 0.11, trimmed-mean 0.10, krum 0.25, bulyan 0.13; multi-krum 0: it keeps
    # exactly the 9 honest replies and weighs them by n_k)
    assert distance["mean"] > 2.0, distance
    assert all(distance[r] < 0.4 for r in RULES), distance


@pytest.mark.parametrize("rule", RULES)
def test_poisoned_replies_inside_the_norm_bound_pass_the_checks_and_the_rule_holds(task_identity, data_dir, rule):
    """The same attack through FedAvg's round (mnist-cnn, 11 clients): the checks admit every reply (the attackers'
    update norm is 10× an honest one, under max-update-norm), then the rule keeps the model near the honest average."""
    s = make_strategy("fedavg", **{"data-dir": data_dir, "num-clients": 11, "aggregation": rule, "malicious-clients": F})
    sizes = [train for train, _ in s.services.data.partition_sizes]
    rng = np.random.default_rng(3)
    sent = {k: v.numpy() for k, v in s.initial_arrays().items()}
    u = {k: rng.normal(0, 0.002, v.shape) for k, v in sent.items()}
    made = {}
    for pid in range(11):
        honest = {k: (v + u[k] + rng.normal(0, 0.0005, v.shape)).astype(v.dtype) for k, v in sent.items()}
        made[pid] = {k: (sent[k] - 10.0 * (honest[k] - sent[k])).astype(sent[k].dtype) for k in sent} if pid in ATTACKERS else honest
    engine = engine_for(s, FakeGrid(11, lambda pid, msg: reply(made[pid], sizes[pid], pid)), server_round=2)
    step = s.train_round(2, s.initial_state(), engine)
    assert engine.meter.failures == [] and step.clients == 11
    bad = max(relative_update_norm(sent, made[p]) for p in ATTACKERS)
    assert 0.1 < bad < s.settings.max_update_norm  # large, and admitted
    good = [p for p in range(11) if p not in ATTACKERS]
    honest_avg = weighted_average([made[p] for p in good], [sizes[p] for p in good], like=sent)
    mean = weighted_average([made[p] for p in range(11)], sizes[:11], like=sent)
    out = {k: v.numpy() for k, v in step.arrays.items()}
    assert honest_distance(mean, honest_avg, sent) > 1.5  # ≈ 2: (9 − 2 × 10) / 11 of the honest update, equal counts
    assert honest_distance(out, honest_avg, sent) < 0.4
    if rule in ("krum", "multi-krum", "bulyan"):
        assert not set(step.details["aggregation_kept"]) & set(ATTACKERS)


@pytest.mark.parametrize("algorithm", [a for a in AVERAGING if a != "fedavg"])
def test_the_layer_sharing_methods_and_fedprox_aggregate_their_shared_part_by_the_rule(task_identity, data_dir, algorithm):
    s = make_strategy(algorithm, **{"data-dir": data_dir, "aggregation": "median"})

    def answer(pid, msg):  # three clients: the median of (x, x + 0.001, x + 0.01) is the middle one (the mean: x + 0.0037)
        arrays = {k: v.numpy() + np.float32((0.0, 0.001, 0.01)[pid]) for k, v in msg.content["arrays"].items()}
        if algorithm == "feddbe" and GLOBAL_MEAN not in arrays:  # a round without a global mean asks for each client's mean
            arrays[FEATURE_MEAN] = np.ones(s.m, np.float32)
        return reply(arrays, 10, pid)

    grid = FakeGrid(3, answer)
    step = s.train_round(2, s.initial_state(), engine_for(s, grid, server_round=2))
    sent = grid.sent[-1].content.array_records["arrays"]
    assert set(step.arrays) == set(sent) and step.clients == 3
    for k, v in step.arrays.items():
        assert np.allclose(v.numpy(), sent[k].numpy() + 0.001, rtol=0, atol=1e-6), k


def test_a_round_with_too_few_replies_for_the_rule_keeps_the_previous_model(task_identity, data_dir):
    """Krum with f = 2 needs 7 replies; 5 of 11 stay silent: the round keeps the model, says why, and is not
    counted as aggregated; the next round, with every client back, aggregates."""
    s = make_strategy("fedavg", **{"data-dir": data_dir, "num-clients": 11, "aggregation": "krum", "malicious-clients": F})
    silent = {1}  # rounds in which clients 0-4 are silent

    def answer(pid, msg):
        if msg.metadata.message_type == MessageType.EVALUATE:
            return RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10, P.CORRECT: 5, P.PARTITION_ID: pid})})
        if pid < 5 and msg.content["config"][P.ROUND] in silent:
            return None
        return reply({k: v.numpy() * (1.0 + 0.001 * pid) for k, v in msg.content["arrays"].items()}, 10, pid)

    records: list[dict] = []
    initial = s.initial_arrays()
    s.start(grid=FakeGrid(11, answer), initial_arrays=initial, num_rounds=2, on_round=records.append)
    first, second = records
    assert first["clients"] == 6 and first["aggregated"] is False
    assert (
        "train: aggregation=krum with malicious-clients=2 needs at least 2f + 3 = 7 valid replies, got 6; keeping the previous model"
        in first["failure_reasons"]
    )
    assert second["aggregated"] is True and second["clients"] == 11 and len(second["aggregation_kept"]) == 1


def test_a_trimmed_mean_round_too_small_to_cut_one_reply_keeps_the_model(task_identity, data_dir):
    """Issue 37 item 7: trimmed-mean with beta 0.2 and 5 clients; in round 1 two are silent and one of the three left
    sends −10× its update (admitted by the norm bound). floor(0.2 x 3) = 0 would cut nothing and the round would move
    the model as the mean does, attacker included: it keeps the model and says why. Round 2, all 5 back, cuts it."""
    s = make_strategy("fedavg", **{"data-dir": data_dir, "num-clients": 5, "aggregation": "trimmed-mean"})
    attacker = 4

    def answer(pid, msg):
        if msg.metadata.message_type == MessageType.EVALUATE:
            return RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10, P.CORRECT: 5, P.PARTITION_ID: pid})})
        if pid < 2 and msg.content["config"][P.ROUND] == 1:
            return None
        sent = {k: v.numpy() for k, v in msg.content["arrays"].items()}
        scale = -10.0 if pid == attacker else 1.0
        return reply({k: v + (scale * 0.001 * (1 + 0.01 * pid) * np.abs(v)).astype(v.dtype) for k, v in sent.items()}, 10, pid)

    records: list[dict] = []
    initial = s.initial_arrays()
    s.start(grid=FakeGrid(5, answer), initial_arrays=initial, num_rounds=2, on_round=records.append)
    first, second = records
    assert first["clients"] == 3 and first["aggregated"] is False, first
    assert (
        "train: aggregation=trimmed-mean with trimmed-mean-beta=0.2 cuts floor(0.2 x 3) = 0 of 3 valid replies at each end; "
        "keeping the previous model" in first["failure_reasons"]
    ), first["failure_reasons"]
    assert second["aggregated"] is True and second["clients"] == 5


# ----------------------------------------------------------------- configs refused before anything starts


@pytest.mark.parametrize("algorithm", COMBINING)
def test_methods_that_do_not_average_model_updates_refuse_a_robust_rule(algorithm):
    with pytest.raises(ConfigError) as refused:
        # the strategy's capability, checked by the server
        check_capabilities(resolve_settings({"algorithm": algorithm, "aggregation": "median"}))
    text = str(refused.value)
    assert "\n" not in text and METHODS[algorithm].server_combines in text, text
    assert text.startswith(
        f"run-config key 'aggregation' is 'median', which only {', '.join(AVERAGING)} implement "
        "(it replaces their average of the round's model updates); " + algorithm
    ), text
    assert text.endswith(": leave it 'mean'")
    assert resolve({"algorithm": algorithm})["aggregation"] == "mean"


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        (
            {"algorithm": "fedavg", "aggregation": "krum", "num-clients": 10, "malicious-clients": 4},
            "run-config key 'malicious-clients' is 4, but aggregation=krum needs at least 2f + 3 = 11 valid replies a round "
            "and a round of fedavg asks 10 client(s): lower malicious-clients or ask more clients",
        ),
        (
            {"algorithm": "fedavg", "aggregation": "multi-krum", "num-clients": 20, "fraction-train": 0.3, "malicious-clients": 2},
            "needs at least 2f + 3 = 7 valid replies a round and a round of fedavg asks 6 client(s)",
        ),
        (
            {"algorithm": "fedavg", "aggregation": "bulyan", "num-clients": 10, "malicious-clients": 2},
            "aggregation=bulyan needs at least 4f + 3 = 11 valid replies a round and a round of fedavg asks 10 client(s)",
        ),
        ({"aggregation": "krum", "algorithm": "fedper", "num-clients": 4}, "is 1, but aggregation=krum needs at least 2f + 3 = 5"),
        (
            {"algorithm": "fedavg", "aggregation": "multi-krum", "num-clients": 10, "malicious-clients": 2, "multi-krum-select": 9},
            "run-config key 'multi-krum-select' is 9, but a round asks 10 client(s), of which malicious-clients=2 may be poisoned: "
            "multi-krum averages at most 8",
        ),
        (
            {"algorithm": "fedavg", "aggregation": "trimmed-mean", "trimmed-mean-beta": 0.5},
            "run-config key 'trimmed-mean-beta' is 0.5; it must be in [0, 0.5)",
        ),
        ({"aggregation": "average"}, "run-config key 'aggregation' is 'average'; allowed values: mean, median, trimmed-mean, krum"),
        (
            {"algorithm": "fedavg", "aggregation": "trimmed-mean", "num-clients": 4},
            "run-config key 'trimmed-mean-beta' is 0.2: a full round of 4 replies cuts floor(0.2 x 4) = 0 at each end, so "
            "trimmed-mean would be the plain mean; set a round of at least 5 clients (num-clients x fraction-train) or "
            "trimmed-mean-beta >= 0.25, or use aggregation=mean",
        ),
        (
            {"algorithm": "fedavg", "aggregation": "trimmed-mean", "num-clients": 20, "fraction-train": 0.1, "trimmed-mean-beta": 0.0},
            "a full round of 2 replies cuts floor(0 x 2) = 0 at each end",
        ),
    ],
)
def test_a_rule_that_a_full_round_cannot_feed_is_refused(setting, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        resolve(setting)


def test_the_bounds_admit_what_runs():
    assert (
        resolve({"algorithm": "fedavg", "aggregation": "krum", "num-clients": 7, "malicious-clients": 2})["malicious-clients"] == 2
    )  # 7 = 2f + 3
    assert (
        resolve({"algorithm": "fedavg", "aggregation": "bulyan", "num-clients": 11, "malicious-clients": 2})["aggregation"] == "bulyan"
    )  # 11 = 4f + 3
    assert resolve({"algorithm": "fedavg", "aggregation": "multi-krum", "num-clients": 10, "malicious-clients": 2, "multi-krum-select": 8})
    assert resolve({"aggregation": "krum", "num-clients": 3, "malicious-clients": 0, "algorithm": "lg-fedavg"})
    assert resolve({"algorithm": "fedavg", "aggregation": "median", "num-clients": 1})["aggregation"] == "median"


@pytest.mark.parametrize(
    ("sets", "says"),
    [
        (["algorithm=fedlog", "aggregation=median"], "run-config key 'aggregation' is 'median', which only"),
        (["algorithm=fedavg", "aggregation=bulyan"], "run-config key 'malicious-clients' is 1, but aggregation=bulyan needs"),
        (["algorithm=fedavg", "aggregation=trimmed-mean"], "run-config key 'trimmed-mean-beta' is 0.2: a full round of 3 replies cuts"),
        (["image-size=60000"], "run-config key 'image-size' is 60000; it must be in [0, 1024]"),
    ],
)
def test_headway_run_refuses_them_before_the_engine_starts(tmp_path, capsys, monkeypatch, data_dir, sets, says):
    def started(**kwargs):
        raise AssertionError("the simulation engine started")

    monkeypatch.setattr(flwr.simulation, "run_simulation", started)
    args = ["--out", str(tmp_path / "out"), "--set", f"data-dir={data_dir}"]
    for s in ["dataset=mnist", "num-clients=3", "num-server-rounds=1", "train-fraction=0.02", *sets]:
        args += ["--set", s]
    code = simulation.main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], lines
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------- end to end: a Flower simulation with attackers


def poison_train(msg: Message, context: Context, honest: ClientApp, cfg: dict) -> Message:
    """An attacker's training reply: its honest update negated and scaled by 10, or less where that would pass the
    update-norm bound the server checks (it knows the run config), so the server admits it."""
    out = honest(msg, context)
    if out.has_error() or partition_of(context) not in ATTACKERS:
        return out
    sent = {k: v.numpy() for k, v in msg.content.array_records[P.ARRAYS].items()}
    trained = {k: v.numpy() for k, v in out.content.array_records[P.ARRAYS].items()}
    bound = cfg["max-first-update-norm"] if P.as_int(msg.content.config_records[P.CONFIG][P.ROUND]) <= 1 else cfg["max-update-norm"]
    scale = min(10.0, 0.9 * bound / max(relative_update_norm(sent, trained), 1e-12))
    poisoned = {k: (sent[k] - scale * (trained[k] - sent[k])).astype(sent[k].dtype) for k in sent}
    content = RecordDict(dict(out.content.items()))
    content[P.ARRAYS] = ArrayRecord({k: Array(np.asarray(v, order="C")) for k, v in poisoned.items()})
    return Message(content=content, reply_to=msg)


def hostile_client_app(cfg: dict, state_dir: Path | None = None) -> ClientApp:
    """headway's ClientApp, except that partitions ATTACKERS send :func:`poison_train`'s replies."""
    honest = honest_client_app(cfg, state_dir=state_dir)
    app = ClientApp()

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        return poison_train(msg, context, honest, cfg)

    @app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return honest(msg, context)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return honest(msg, context)

    return app


@pytest.mark.integration
@pytest.mark.system  # a Flower simulation: make test-system, to keep make test under 15 minutes
@needs_data("uci-adult")
def test_in_a_simulation_two_attackers_of_eleven_drag_the_mean_but_not_the_median(tmp_path, data_dir, monkeypatch):
    """FedAvg on UCI Adult, 11 simulated clients of which 2 are ClientApps sending −10× their honest update (inside the
    bound: every reply is admitted). The run aggregates by median; the server's view is captured each round, and on the
    same real replies the mean lands far from the honest average while median (the model the run kept) and the other
    robust rules stay near it."""
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the attacker's ClientApp crosses to Ray's actors by value
    seen: list[dict] = []
    aggregate = FedAvg.aggregate_train

    def capture(self, ctx, replies):
        step = aggregate(self, ctx, replies)
        seen.append({"sent": ctx.sent, "replies": [(r.partition_id, r.payload, r.examples) for r in replies], "step": step})
        return step

    monkeypatch.setattr(FedAvg, "aggregate_train", capture)
    monkeypatch.setattr(headway.client.app, "build_client_app", hostile_client_app)
    cfg = resolve_settings(
        {
            "algorithm": "fedavg",
            "dataset": "uci-adult",
            "data-dir": data_dir,
            "body": "mlp",
            "partition": "iid",
            "num-clients": 11,
            "num-server-rounds": 3,
            "train-fraction": 0.3,
            "local-epochs": 1,
            "batch-size": 64,
            "optimizer": "sgd",
            "lr": 0.05,
            "eval-every": 0,
            "sample-timeout": 60.0,
            "aggregation": "median",
            "malicious-clients": F,
        }
    )
    try:
        summary = simulation.simulate(cfg, tmp_path)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert summary["status"] == "complete"
    assert [(r["clients"], r["failures"], r["aggregated"]) for r in rounds] == [(11, 0, True)] * 3  # the attackers were admitted
    assert len(seen) == 3
    for rnd, view in enumerate(seen, 1):
        sent = view["sent"]
        pids = [p for p, _, _ in view["replies"]]
        models = [m for _, m, _ in view["replies"]]
        counts = [n for _, _, n in view["replies"]]
        good = [i for i, p in enumerate(pids) if p not in ATTACKERS]
        assert sorted(pids) == list(range(11))
        norms = [relative_update_norm(sent, m) for m in models]
        assert min(norms[i] for i in range(11) if i not in good) > 5 * max(norms[i] for i in good)  # the attack ran, admitted
        honest = weighted_average([models[i] for i in good], [counts[i] for i in good], like=sent)
        kept = {k: v.numpy() for k, v in view["step"].arrays.items()}
        assert all(np.array_equal(kept[k], robust_aggregate(models, counts, Rule("median"), sent)[0][k]) for k in sent)
        distance = {"mean": honest_distance(weighted_average(models, counts, like=sent), honest, sent)}
        for rule in RULES:
            distance[rule] = honest_distance(robust_aggregate(models, counts, Rule(rule, 0.2, F), sent)[0], honest, sent)
        # measured: mean 1.90, 1.89, 1.97 in rounds 1-3; median, trimmed-mean, bulyan 0.03-0.08, krum 0.05-0.14, multi-krum 0
        assert distance["mean"] > 1.5, (rnd, distance)
        assert all(distance[r] < 0.3 for r in RULES), (rnd, distance)


def test_a_run_whose_rounds_all_kept_the_model_says_why_not_a_min_replies_shortfall():
    """An outside probe's run (trimmed-mean, 2 valid replies a round, min-replies 1) failed with "fewer than
    min-replies=1 valid replies arrived (at most 2)", which contradicts itself: the reason is the rounds' own."""
    from headway.server.app import never_aggregated

    why = "train: aggregation=trimmed-mean with trimmed-mean-beta=0.34 cuts floor(0.34 x 2) = 0 of 2 valid replies at each end"
    kept = [{"aggregated": False, "clients": 2, "failure_reasons": [why]}] * 3
    reason = never_aggregated(kept, 1)
    assert reason is not None and why in reason and "fewer than min-replies" not in reason
    short = [{"aggregated": False, "clients": 1, "failure_reasons": ["train: 1 valid replies, fewer than min-replies=3"]}] * 2
    assert "fewer than min-replies=3 valid replies arrived (at most 1)" in str(never_aggregated(short, 3))
