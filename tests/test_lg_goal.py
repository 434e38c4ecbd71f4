"""goal-accuracy (any method) stops a run after the first evaluated round that reaches it; lg-warmup-goal ends
LG-FedAvg's whole-model warm-up at a goal and lg-rounds ends the run that many rounds later (core/goal.py, the
strategies' ``evaluated`` hook, RoundLoop). Strategy level on a fake grid whose clients score 0.2 x the round."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from flwr.app import MessageType, MetricRecord, RecordDict
from headway.core import protocol as P
from headway.core.config import ConfigError, resolve_settings
from headway.core.goal import first_round_reaching, lg_rounds_over, warming_up, warmup_end_after
from headway.strategies.engine import Engine
from headway.strategies.round_loop import RoundLoop
from headway.strategies.state import ServerState

from tests.fakes import FakeGrid, make_strategy, reply

CLIENTS = 4
pytestmark = pytest.mark.usefixtures("task_identity")  # Flower messages need a run id (tests/conftest.py)


def _answer(pid: int, msg) -> RecordDict | None:
    """Training: a small honest update of what was sent; evaluation: 2 x round correct of 10 (0.2, 0.4, ...); uploads: the model sent."""
    config = msg.content["config"]
    sent = {k: v.numpy() for k, v in msg.content["arrays"].items()}
    if msg.metadata.message_type == MessageType.EVALUATE:
        if config.get(P.PHASE) == P.PHASE_UPLOAD:
            return None  # no new test: the ensemble is not what these tests check
        correct = min(10, 2 * P.as_int(config[P.ROUND]))
        return RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10, P.CORRECT: correct, P.PARTITION_ID: pid})})
    return reply({k: v + (0.001 * np.abs(v)).astype(v.dtype) for k, v in sent.items()}, 10, pid)


def _run(algorithm: str, rounds: int, state=None, first: int = 1, cfg: dict[str, Any] | None = None):
    """Run ``algorithm`` on a fake grid from ``state`` (default: its initial one) at round ``first``: the records,
    the grid (every message sent), the states after each round, and the last state."""
    s = make_strategy(algorithm, **{"num-clients": CLIENTS, "num-server-rounds": rounds, "fraction-train": 0.5, **(cfg or {})})
    grid = FakeGrid(CLIENTS, _answer)
    records: list[dict] = []
    states: dict[int, bytes] = {}
    loop = RoundLoop(
        s,
        Engine(grid, s.settings, s.services, clock=grid.clock, admit=s.body_problem),
        on_round=records.append,
        on_checkpoint=lambda rnd, st, pending: states.__setitem__(rnd, pickle.dumps(st)),
    )
    last = loop.run(s.initial_state() if state is None else state, rounds, first)
    return s, records, grid, states, last


def _train_arrays(grid: FakeGrid) -> dict[int, set[str]]:
    """The array names each round's training messages carried."""
    out: dict[int, set[str]] = {}
    for msg in grid.sent:
        if msg.metadata.message_type == MessageType.TRAIN:
            out.setdefault(P.as_int(msg.content["config"][P.ROUND]), set()).update(msg.content["arrays"])
    return out


def test_the_run_stops_after_the_first_round_that_reaches_the_goal():
    _, records, grid, states, last = _run("fedavg", 8, cfg={"goal-accuracy": 0.6})
    assert [r["round"] for r in records] == [1, 2, 3]
    assert records[-1]["accuracy"] == pytest.approx(0.6) and records[-1]["stop"] == "goal-accuracy"
    assert "stop" not in records[1] and last.end == 3 and max(states) == 3
    assert max(_train_arrays(grid)) == 3  # no round 4 was asked


def test_without_a_goal_the_run_goes_to_num_server_rounds():
    _, records, _, _, last = _run("fedavg", 4)
    assert [r["round"] for r in records] == [1, 2, 3, 4] and last.end is None
    assert not any("stop" in r for r in records)


def test_the_warm_up_ends_at_its_goal_then_only_the_global_layers_go_and_lg_rounds_end_the_run():
    s, records, grid, _, last = _run(
        "lg-fedavg", 10, cfg={"lg-warmup-goal": 0.4, "lg-rounds": 2, "lg-global-layers": 2, "lg-new-test": True}
    )
    whole = set(s.template.state_dict())
    global_layers = set(s.shared(3, s.initial_arrays(), last.method))
    assert global_layers < whole
    sent = _train_arrays(grid)
    assert sent == {1: whole, 2: whole, 3: global_layers, 4: global_layers}  # warm-up to round 2 (0.4), then 2 LG rounds
    assert [r["round"] for r in records] == [1, 2, 3, 4]
    assert records[1].get("warmup_ended") is True and records[-1]["stop"] == "lg-rounds"
    assert last.method.warmup_end == 2 and last.end == 4
    assert s.summary_extra(None, last) == {"warmup_rounds_used": 2}  # type: ignore[arg-type]
    uploads = [m for m in grid.sent if m.content["config"].get(P.PHASE) == P.PHASE_UPLOAD]
    assert uploads and {int(m.content["config"][P.ROUND]) for m in uploads} == {4}  # the new test after the stopping round
    assert all(set(m.content["arrays"]) == global_layers for m in uploads)


def test_lg_warmup_rounds_caps_a_warm_up_whose_goal_is_not_reached():
    _, records, grid, _, last = _run("lg-fedavg", 4, cfg={"lg-warmup-goal": 0.9, "lg-warmup-rounds": 1, "lg-new-test": False})
    sent = _train_arrays(grid)
    assert len(sent[1]) > len(sent[2]) == len(sent[3])  # round 1 whole models, then the global layers
    assert last.method.warmup_end == 1 and records[0].get("warmup_ended") is True and last.end is None


def test_a_counted_warm_up_without_a_goal_is_unchanged():
    _, _, grid, _, last = _run("lg-fedavg", 3, cfg={"lg-warmup-rounds": 2, "lg-new-test": False})
    sent = _train_arrays(grid)
    assert sent[1] == sent[2] and len(sent[3]) < len(sent[2]) and last.method.warmup_end == 2


def test_lg_rounds_ending_the_run_between_scored_rounds_still_scores_the_last_one():
    _, records, _, _, last = _run("lg-fedavg", 8, cfg={"lg-warmup-rounds": 1, "lg-rounds": 2, "eval-every": 2, "lg-new-test": False})
    assert [r["round"] for r in records] == [1, 2, 3] and records[-1]["stop"] == "lg-rounds" and last.end == 3
    assert records[-1]["accuracy"] is not None  # round 3 is not an eval-every round, but it is the last


def test_a_resumed_run_stops_where_the_unbroken_one_did():
    keys = {"lg-warmup-goal": 0.4, "lg-rounds": 2, "lg-new-test": False, "goal-accuracy": 0.95}
    _, unbroken, _, states, whole = _run("lg-fedavg", 10, cfg=keys)
    _, resumed, _, _, again = _run("lg-fedavg", 10, pickle.loads(states[1]), 2, cfg=keys)  # warm-up not yet ended
    assert [r["round"] for r in resumed] == [2, 3, 4] and resumed[-1]["stop"] == unbroken[-1]["stop"] == "lg-rounds"
    assert [r["selected"] for r in resumed] == [r["selected"] for r in unbroken[1:]]
    assert (again.end, again.method.warmup_end) == (whole.end, whole.method.warmup_end) == (4, 2)
    for name in whole.arrays:
        np.testing.assert_array_equal(again.arrays[name].numpy(), whole.arrays[name].numpy())
    _, after_end, grid, _, same = _run("lg-fedavg", 10, pickle.loads(states[4]), 5, cfg=keys)  # the checkpoint of the stop round
    assert after_end == [] and grid.sent == [] and same.end == 4


def test_an_old_pickled_state_without_an_end_loads_as_running():
    state: ServerState[None] = ServerState(make_strategy("fedavg").initial_arrays(), None, None)
    _, args = state.__reduce__()
    assert pickle.loads(pickle.dumps(state)).end is None and len(args) == 4


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ({"goal-accuracy": 1.5}, "'goal-accuracy' is 1.5; it must be in [0, 1]"),
        ({"algorithm": "lg-fedavg", "lg-warmup-goal": -0.1}, "'lg-warmup-goal' is -0.1"),
        ({"algorithm": "lg-fedavg", "lg-rounds": -1}, "'lg-rounds' is -1"),
        ({"goal-accuracy": 0.9, "client-evaluation": "with-next-train"}, "set client-evaluation=exchange"),
        ({"algorithm": "lg-fedavg", "lg-warmup-goal": 0.9, "eval-every": 0}, "set eval-every=1"),
        ({"algorithm": "fedavg", "lg-rounds": 5}, "algorithm=fedavg does not read it: remove it, or set algorithm=lg-fedavg"),
        ({"algorithm": "lg-fedavg", "lg-rounds": 2, "client-evaluation": "with-next-train"}, "'lg-rounds' ends the run early"),
        ({"algorithm": "lg-fedavg", "lg-warmup-rounds": 4, "num-server-rounds": 4}, "every round would be a FedAvg warm-up round"),
    ],
)
def test_bad_goal_values_are_refused_in_one_line(keys, words):
    with pytest.raises(ConfigError) as err:
        resolve_settings({"algorithm": "fedavg", **keys})
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_goal_functions():
    assert [warming_up(r, None, 0.9, 0) for r in (1, 50)] == [True, True]  # until the goal, uncapped
    assert [warming_up(r, None, 0.0, 2) for r in (2, 3)] == [True, False]  # a count, as before
    assert [warming_up(r, None, 0.9, 3) for r in (3, 4)] == [True, False]  # the cap
    assert [warming_up(r, 2, 0.9, 5) for r in (2, 3)] == [True, False]  # ended at the goal
    assert warmup_end_after(2, {"accuracy": 0.91}, None, 0.9, 0) == 2 and warmup_end_after(2, {}, None, 0.9, 0) is None
    assert warmup_end_after(3, {"accuracy": 0.1}, None, 0.9, 3) == 3 and warmup_end_after(4, {"accuracy": 1.0}, 2, 0.9, 0) == 2
    assert warmup_end_after(1, {"accuracy": 1.0}, None, 0.0, 0) is None  # no warm-up: nothing ends
    assert not lg_rounds_over(9, None, 0.9, 0, 2) and lg_rounds_over(4, 2, 0.9, 0, 2) and not lg_rounds_over(3, 2, 0.9, 0, 2)
    assert lg_rounds_over(2, None, 0.0, 0, 2) and not lg_rounds_over(5, 2, 0.9, 0, 0)
    records: list[dict[str, Any]] = [{"round": 1, "accuracy": 0.5}, {"round": 2, "accuracy": None}, {"round": 3, "accuracy": 0.975}]
    assert first_round_reaching(records, 0.975) == 3 and first_round_reaching(records, 0.99) is None


def test_summary_says_the_goal_round_and_null_when_never_reached(tmp_path):
    from headway.server.results import Recorder

    def summary(goal: float) -> dict:
        rec = Recorder(tmp_path / str(goal), resolve_settings({"algorithm": "fedavg", "goal-accuracy": goal}))
        for rnd, acc in ((1, 0.5), (2, None), (3, 0.8)):
            rec.round({"round": rnd, "accuracy": acc, "bytes_down": 10, "bytes_up": 10, "clients": 2, "failures": 0, "seconds": 0.1})
        return rec.finish({})

    assert summary(0.8)["goal_round"] == 3 and summary(0.9)["goal_round"] is None
    assert "goal_round" not in summary(0.0)


@pytest.mark.system
def test_a_real_run_killed_after_a_checkpoint_resumes_and_stops_where_the_unbroken_one_did(tmp_path, data_dir):
    """Real `headway run` processes: LG-FedAvg whose warm-up ends at round 1 (any score reaches 0.01) and lg-rounds=2 ends
    after round 3 of 6; killed after round 2's checkpoint, or after round 3's (the stop) before its summary."""
    import json
    import signal

    from tests.test_resume_simulation import TINY, assert_same_rounds, headway_run, resume, rounds, sets

    config = sets(*TINY, "algorithm=lg-fedavg", "num-server-rounds=6", "lg-warmup-goal=0.01", "lg-rounds=2")
    unbroken = tmp_path / "unbroken"
    assert headway_run(["--out", str(unbroken), *config], tmp_path / "unbroken.log") == 0
    records = rounds(unbroken)
    assert [r["round"] for r in records] == [1, 2, 3] and records[0]["warmup_ended"] and records[-1]["stop"] == "lg-rounds"
    assert "new_test_accuracy" in records[-1]
    summary = json.loads((unbroken / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["warmup_rounds_used"] == 1
    for kill in ("checkpoint:2", "checkpoint:3"):
        killed = tmp_path / kill.replace(":", "-")
        assert headway_run(["--out", str(killed), *config], tmp_path / f"{killed.name}.log", kill=kill) == -signal.SIGKILL
        assert resume(killed, tmp_path) == 0, (tmp_path / f"resume-{killed.name}.log").read_text()[-3000:]
        assert_same_rounds(unbroken, killed)
        again = json.loads((killed / "summary.json").read_text())
        assert again["status"] == "complete" and again["rounds"] == 3 and again["warmup_rounds_used"] == 1
