"""New devices joining a running federation (join-clients, join-round, join-fraction-old) and the
per-client image transform (client-transform): LG-FedAvg's Table 3 as a capability."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import MessageType
from headway.core.config import ConfigError, resolve_settings
from headway.core.joining import JoinPlan, parse_partition_ids
from headway.core.noise import parse_client_transform, transform
from headway.strategies.base import Step
from headway.strategies.engine import Engine
from headway.strategies.evaluation import group_accuracies
from headway.strategies.replies import Reply
from headway.strategies.round_record import round_record

from tests.fakes import FakeGrid, engine_for, make_strategy

JOIN = {"num-clients": 6, "join-clients": "4,5", "join-round": 2, "num-server-rounds": 5}


def partitions(engine, nodes):
    return sorted(engine.partition_of(n) for n in nodes)


def test_joiners_are_neither_registered_nor_sampled_until_their_round(task_identity):
    s = make_strategy("fedavg", **JOIN)
    grid = FakeGrid(6)
    engine = engine_for(s, grid, server_round=1)
    assert sorted(c.partition_id for c in engine.registry.clients.values()) == [0, 1, 2, 3]
    assert engine.meter.joined == [] and engine.meter.registered == 4
    assert partitions(engine, engine.sample(1.0)) == [0, 1, 2, 3]
    engine.end_round()
    asked = len(grid.sent)
    engine.begin_round(2)  # held: not asked again before their round
    assert len(grid.sent) == asked and partitions(engine, engine.nodes()) == [0, 1, 2, 3]
    engine.begin_round(3)
    assert engine.meter.joined == [4, 5]
    assert partitions(engine, engine.nodes()) == [0, 1, 2, 3, 4, 5]
    engine.begin_round(4)
    assert engine.meter.joined == []  # joined once, not every round after


def test_after_the_join_a_round_trains_the_joined_plus_a_share_of_the_others(task_identity):
    s = make_strategy("fedavg", **{**JOIN, "join-fraction-old": 0.0})
    engine = engine_for(s, FakeGrid(6), server_round=3)
    assert partitions(engine, engine.sample(s.settings.fraction_train)) == [4, 5]  # C = 0: only the joined ones
    s = make_strategy("fedavg", **{**JOIN, "join-fraction-old": 0.5})
    engine = engine_for(s, FakeGrid(6), server_round=3)
    chosen = partitions(engine, engine.sample(s.settings.fraction_train))
    assert len(chosen) == 4 and chosen[-2:] == [4, 5]  # both joined and round(4 · 0.5) = 2 of the others
    s = make_strategy("fedavg", **{**JOIN, "fraction-train": 0.25})  # default: fraction-train of the others
    engine = engine_for(s, FakeGrid(6), server_round=3)
    assert len(engine.sample(s.settings.fraction_train)) == 3


def test_a_run_without_join_keys_samples_and_records_as_before(task_identity):
    s = make_strategy("fedavg", **{"num-clients": 6})
    engine = engine_for(s, FakeGrid(6))
    assert engine.meter.joined is None and len(engine.nodes()) == 6
    record = round_record(1, Step(None, 0), {}, engine.end_round(), 0.0, 0.0, {})
    assert "joined" not in record


def test_the_round_record_names_who_joined(task_identity):
    s = make_strategy("fedavg", **JOIN)
    engine = engine_for(s, FakeGrid(6), server_round=3)
    record = round_record(3, Step(None, 0), {}, engine.end_round(), 0.0, 0.0, {})
    assert record["joined"] == [4, 5]


def test_group_accuracies_split_joined_from_old_clients():
    def scored(pid: int, correct: float, n: int) -> Reply:
        return Reply(node_id=pid, partition_id=pid, arrays={}, count=n, metrics={"correct": correct}, payload=None)

    out = group_accuracies([scored(0, 9, 10), scored(1, 1, 10), scored(4, 3, 4)], frozenset({4}))
    assert out == {"accuracy_joined": 0.75, "accuracy_old": 0.5}


@pytest.mark.parametrize(
    "cfg, says",
    [
        ({"join-clients": "4,x"}, "run-config key 'join-clients': 'x' is not a partition id"),
        ({"join-clients": "9"}, "partition id 9 is outside 0..5"),
        ({"join-clients": "1", "join-round": 7}, "the join-clients would never take part"),
        ({"join-clients": "0,1,2,3,4,5"}, "names every partition"),
        ({"join-clients": "1", "client-sampling": "data-ratio"}, "client-sampling=uniform"),
        ({"join-fraction-old": 2.0}, "join-fraction-old"),
        ({"client-transform": "5:rotate45"}, "run-config key 'client-transform': client-transform item '5:rotate45'"),
        ({"client-transform": "8:rotate90"}, "partition id 8 is outside 0..5"),
    ],
)
def test_bad_join_and_transform_specs_are_refused_in_one_line(cfg, says):
    with pytest.raises(ConfigError) as err:
        resolve_settings({"num-clients": 6, "num-server-rounds": 5, **cfg})
    assert says in str(err.value) and "\n" not in str(err.value)


def test_join_plan_and_partition_ids():
    assert parse_partition_ids(" 100, 7 ,") == {7, 100}
    plan = JoinPlan(frozenset({7}), after=3, fraction_old=0.1)
    assert plan.waiting(7, 3) and not plan.waiting(7, 4) and not plan.waiting(1, 1)
    assert plan.old_count(100) == 10 and plan.old_count(0) == 0
    assert JoinPlan(frozenset({7}), 3, 0.0).old_count(100) == 0


def test_rotate90_turns_train_and_test_images_counter_clockwise():
    x = np.arange(2 * 1 * 3 * 3, dtype=np.uint8).reshape(2, 1, 3, 3)
    out = transform(x, "rotate90")
    assert out.shape == x.shape and out[0, 0, 0].tolist() == [2, 5, 8]  # the right column becomes the top row
    assert np.array_equal(transform(transform(out, "rotate90"), "rotate180"), x)
    assert parse_client_transform("100:rotate90") == {100: "rotate90"}
    with pytest.raises(ValueError, match="square images"):
        transform(np.zeros((1, 1, 2, 3), np.uint8), "rotate90")


def test_client_transform_reaches_only_the_named_clients_train_and_test_data():
    from headway.client.env import client_env

    run = {"dataset": "cifar10", "num-clients": 4, "partition": "iid", "train-fraction": 0.01, "client-transform": "3:rotate90"}
    plain = client_env(run, {"partition-id": 3, "num-partitions": 4})
    turned = client_env({**run, "client-transform": "2:rotate90,3:rotate90"}, {"partition-id": 3, "num-partitions": 4})
    other = client_env({**run, "client-transform": "2:rotate90"}, {"partition-id": 3, "num-partitions": 4})
    assert torch_equal(turned.x_train, plain.x_train) and torch_equal(turned.x_test, plain.x_test)
    assert torch_equal(other.x_train.rot90(1, (2, 3)), plain.x_train) and torch_equal(other.x_test.rot90(1, (2, 3)), plain.x_test)


def torch_equal(a, b) -> bool:
    return bool((a == b).all())


def test_a_joining_device_trains_only_after_its_round_in_a_cifar10_run(task_identity):
    """Other data set than Table 3's: three CIFAR-10 clients, the third joins after round 1 with C = 0."""
    s = make_strategy(
        "lg-fedavg",
        **{"dataset": "cifar10", "num-clients": 3, "join-clients": "2", "join-round": 1, "join-fraction-old": 0.0, "num-server-rounds": 3},
    )
    grid = FakeGrid(3)
    engine = engine_for(s, grid, server_round=1)
    assert 2 not in partitions(engine, engine.sample(1.0))
    engine.begin_round(2)
    trained = [m.metadata.dst_node_id - 101 for m in grid.sent if m.metadata.message_type == MessageType.TRAIN]
    assert trained == [] and partitions(engine, engine.sample(1.0)) == [2]


JOIN_RUN = [
    "algorithm=lg-fedavg",
    "dataset=mnist",
    "partition=iid",
    "num-clients=4",
    "train-fraction=0.02",
    "local-epochs=1",
    "num-server-rounds=3",
    "lg-warmup-rounds=1",
    "join-clients=3",
    "join-round=1",
    "join-fraction-old=0.0",
    "client-transform=3:rotate90",
]


@pytest.mark.system
def test_a_run_killed_at_the_join_resumes_to_the_unbroken_runs_rounds(tmp_path, data_dir):
    """Killed after the join round's record and before its checkpoint: the resumed process holds partition 3 out of
    nothing (the join follows from the round number), re-runs round 2 with it joining, and ends as the unbroken run."""
    import signal

    from tests.test_resume_simulation import headway_run, resume, rounds, sets

    config = sets(*JOIN_RUN)
    assert headway_run(["--out", str(tmp_path / "unbroken"), *config], tmp_path / "unbroken.log") == 0
    rc = headway_run(["--out", str(tmp_path / "killed"), *config], tmp_path / "killed.log", kill="record:2")
    assert rc == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-2000:]
    assert resume(tmp_path / "killed", tmp_path) == 0, (tmp_path / "resume-killed.log").read_text()[-3000:]
    a, b = rounds(tmp_path / "unbroken"), rounds(tmp_path / "killed")
    assert [r["joined"] for r in a] == [[], [3], []]
    assert [r["selected"] for r in a] == [[0, 1, 2], [3], [3]]  # C = 0: the joined device alone after the join
    assert "accuracy_joined" not in a[0] and "accuracy_joined" in a[2]
    for x, y in zip(a, b, strict=True):
        same = ("round", "accuracy", "accuracy_joined", "accuracy_old", "selected", "joined", "bytes_down", "bytes_up")
        assert {k: y.get(k) for k in same} == {k: x.get(k) for k in same}


def test_before_round_1_the_server_waits_for_the_old_clients_only(task_identity):
    """Deployment: the joining device's node may connect only when its round comes; round 1 must not wait for it."""
    s = make_strategy("fedavg", **{**JOIN, "sample-timeout": 30.0})
    grid = FakeGrid(4)  # partitions 0..3 connected, 4 and 5 not yet
    engine = Engine(grid, s.settings, s.services, clock=grid.clock, sleep=lambda dt: setattr(grid, "now", grid.now + dt))
    assert len(engine.wait_for_clients()) == 4 and grid.now == 0.0  # no wait: all 4 old clients are there


def test_a_joining_node_that_connects_late_is_admitted_when_it_first_appears(task_identity):
    s = make_strategy("fedavg", **JOIN)
    grid = FakeGrid(6)
    grid.nodes, grid.bodies = grid.nodes[:4], ["mnist-cnn"] * 6  # partitions 4 and 5 not connected yet
    engine = engine_for(s, grid, server_round=1)
    grid.nodes.append(105)  # partition 4 connects in round 2, before its round: held
    engine.begin_round(2)
    assert 105 in engine.registry.held and partitions(engine, engine.nodes()) == [0, 1, 2, 3]
    engine.begin_round(3)
    assert engine.meter.joined == [4]
    grid.nodes.append(106)  # partition 5 connects in round 4, after the join round: admitted at once
    engine.begin_round(4)
    assert engine.meter.joined == [5] and partitions(engine, engine.nodes()) == [0, 1, 2, 3, 4, 5]


def test_the_table3_new_device_holds_the_papers_3000_training_and_500_test_images(data_dir):
    """benchmarks/lg_table3.py's default: partition 100 gets exactly 3,000/500 MNIST images (not its 1/101 share), rotated."""
    import tomllib

    from headway.client.env import client_env

    from benchmarks.lg_table3 import CONFIG, overrides

    with open(CONFIG, "rb") as f:
        base = tomllib.load(f)["run-config"]
    run = {**base, **overrides("lg-fedavg", "iid", 0.0, 5, 0.1, 10, 0), "data-dir": data_dir}
    new = client_env(run, {"partition-id": 100, "num-partitions": 101})
    old = client_env(run, {"partition-id": 0, "num-partitions": 101})
    assert (len(new.y_train), len(new.y_test)) == (3000, 500)
    assert (len(old.y_train), len(old.y_test)) == (570, 95)  # the other 100 split the rest: 57,000 and 9,500
    shared = {**base, **overrides("lg-fedavg", "iid", 0.0, 5, 0.1, 10, 0, "share"), "data-dir": data_dir}
    share = client_env(shared, {"partition-id": 100, "num-partitions": 101})
    assert len(share.y_train) < 600
