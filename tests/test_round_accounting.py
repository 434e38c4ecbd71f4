"""Round accounting (issue 38, the testers' second walkthrough): a round says how many of the clients
it wanted sent a reply it used and who is missing, why; its training rows are those of the clients
whose replies were used; evaluation over fewer clients than registered is said; every round has
failure_reasons and absent_partitions; whole counts are ints; mostly empty partitions are refused."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest
from flwr.app import MessageType, MetricRecord, RecordDict
from headway.core import protocol as P
from headway.core.data import Dataset
from headway.core.partition import check_filled, empty_note, make_partition
from headway.core.rounds import clients_note, eval_note, short_rounds, short_rounds_note
from headway.core.settings import Settings
from headway.strategies.engine import Engine

from tests.fakes import FakeGrid, make_strategy, reply


def _evaluation(pid: int) -> RecordDict:
    return RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10 * (pid + 1), P.CORRECT: 5, P.PARTITION_ID: pid})})


def _three_rounds(data_dir):
    """A FedAvg run of 3 rounds on 3 clients: partition 1 stays silent in round 2's training, and
    partition 2's node is gone (killed) from round 3 on. The records and the strategy."""
    s = make_strategy("fedavg", **{"data-dir": data_dir})
    grid: FakeGrid

    def answer(pid, msg):
        rnd = msg.content[P.CONFIG][P.ROUND]
        if msg.metadata.message_type == MessageType.EVALUATE:
            if rnd == 2 and pid == 2:
                grid.nodes.remove(103)  # killed after its round-2 scores: registered, not connected from round 3
            return _evaluation(pid)
        if rnd == 2 and pid == 1:
            return None  # no reply within round-timeout
        return reply({k: v.numpy() for k, v in msg.content[P.ARRAYS].items()}, 10, pid, loss=0.5)

    grid = FakeGrid(3, answer)
    records: list[dict] = []
    # the grid's clock: a silent node costs the deadline
    engine = Engine(grid, s.settings, s.services, clock=grid.clock, admit=s.body_problem)
    s.run(engine, s.initial_state(), 3, on_round=records.append)
    return records, s


def test_a_round_names_the_clients_it_ran_without_and_counts_only_the_rows_it_used(task_identity, data_dir):
    records, s = _three_rounds(data_dir)
    rows = [train for train, _ in s.services.data.partition_sizes]
    one, two, three = records
    assert one["missing_clients"] == {} and clients_note(one) == "clients 3 of 3"
    assert one["train_examples"] == sum(rows) == one["selected_train_examples"]
    # round 2: partition 1 was asked and stayed silent; its rows were not in the aggregate
    assert two["clients"] == 2 and two["selected"] == [0, 1, 2]
    assert two["missing_clients"] == {"1": "train: no reply within 5 s"}
    assert clients_note(two) == "clients 2 of 3 (missing: partition 1: train: no reply within 5 s)"
    assert two["train_examples"] == rows[0] + rows[2] and two["selected_train_examples"] == sum(rows)
    # round 3: partition 2 is registered but not connected; not a failure, but missing all the same
    assert three["failures"] == 0 and three["absent_partitions"] == [2] and three["selected"] == [0, 1]
    assert clients_note(three) == "clients 2 of 3 (missing: partition 2: not connected)"
    assert three["train_examples"] == rows[0] + rows[1]
    # evaluation: round 2 lost partition 1's scores too (it missed the round's deadline), round 3 partition 2's
    assert [r["eval_clients"] for r in records] == [3, 2, 2] and [r["registered_clients"] for r in records] == [3, 3, 3]
    assert eval_note(one) == "" and eval_note(two) == " (on 2 of 3 clients' test splits, 40 test rows)"
    assert eval_note(three) == " (on 2 of 3 clients' test splits, 30 test rows)"
    assert short_rounds(records) == {"rounds_with_missing_clients": [2, 3], "rounds_with_partial_evaluation": [2, 3]}
    assert short_rounds_note(short_rounds(records)) == "; rounds 2, 3 ran with clients missing (rounds.jsonl: missing_clients)"


def test_every_round_has_its_failure_and_absence_lists_and_whole_counts_are_ints(task_identity, data_dir):
    records, _ = _three_rounds(data_dir)
    for r in records:
        assert isinstance(r["failure_reasons"], list) and isinstance(r["absent_partitions"], list)
        assert type(r["eval_clients"]) is int and type(r["test_examples"]) is int, r
    assert records[0]["failure_reasons"] == [] and records[0]["absent_partitions"] == []
    assert json.dumps(records[0]["test_examples"]) == "60"  # 10 + 20 + 30, not 60.0


def test_fedlog_prepare_clients_is_an_int(task_identity, data_dir):
    from headway.strategies.round_record import round_record

    record = round_record(1, _Step(), {"prepare_clients": 3.0, "eval_clients": 3.0, "test_examples": 120.0}, _Meter(), 1.0, 1.0, {})
    assert (record["prepare_clients"], record["eval_clients"], record["test_examples"]) == (3, 3, 120)
    assert all(type(record[k]) is int for k in ("prepare_clients", "eval_clients", "test_examples"))


def _Step():
    from headway.strategies.base import Step

    return Step(None, 3)


def _Meter():
    from headway.strategies.engine import RoundMeter

    return RoundMeter(selected={0, 1, 2}, registered=3)


def test_the_round_line_says_who_is_missing_and_the_summary_which_rounds(task_identity, data_dir, tmp_path, caplog):
    from headway.server.results import Recorder

    records, s = _three_rounds(data_dir)
    recorder = Recorder(tmp_path / "out", dataclasses.replace(s.settings, num_server_rounds=3))
    with caplog.at_level(logging.INFO, logger="headway"):
        for r in records:
            recorder.round(dict(r))
    lines = [m for m in caplog.messages if m.startswith("round ")]
    assert "clients 3 of 3  bytes" in lines[0]
    assert "clients 2 of 3 (missing: partition 1: train: no reply within 5 s)" in lines[1]
    assert "(on 2 of 3 clients' test splits, 30 test rows)  clients 2 of 3 (missing: partition 2: not connected)" in lines[2]
    summary = recorder.finish()
    assert summary["rounds_with_missing_clients"] == [2, 3] and summary["rounds_with_partial_evaluation"] == [2, 3]


def test_submit_verdict_says_rounds_ran_with_clients_missing():
    from headway.submit import judge

    summary = {"status": "complete", "final_accuracy": 0.7308, "rounds": 3, "rounds_with_missing_clients": [2, 3]}
    line = judge(7, {"status": "finished:completed"}, summary, "results/x").line
    assert "complete: final accuracy 0.7308 after 3 rounds; rounds 2, 3 ran with clients missing" in line


# ----- clients with no training rows ---------------------------------------------------------------------------
def _images(n: int) -> Dataset:
    rng = np.random.default_rng(0)
    y = np.arange(n) % 4
    x = rng.random((n, 1, 8, 8), dtype=np.float32)
    return Dataset("pngs", "classification", 4, (1, 8, 8), x, y, x[: n // 4], y[: n // 4])


def _cfg(num_clients: int, **extra) -> Settings:
    from headway.core.config import resolve_settings

    cfg = resolve_settings({"dataset": "mnist", "algorithm": "fedavg", "num-clients": num_clients, "partition": "iid", **extra})
    return dataclasses.replace(cfg, train_fraction=1.0)


def test_a_partition_where_most_clients_get_no_rows_is_refused_with_the_fix():
    """320 training images over 1000 clients left 680 with nothing, and the run went on (rc 0, complete)."""
    with pytest.raises(ValueError, match=r"680 of 1000 clients get no training rows.*lower num-clients \(to at most 320 here\)"):
        make_partition(_images(320), _cfg(1000))
    part = make_partition(_images(320), _cfg(320))
    assert min(len(t) for t in part.train) == 1 and empty_note([len(t) for t in part.train]) == ""


def test_a_few_empty_clients_are_warned_of_not_refused():
    check_filled([3, 0, 2, 5])  # one of four: warned (below), the run may go on
    note = empty_note([3, 0, 2, 5], "node")
    assert note.startswith("1 of 4 nodes get no training rows (10 training rows in all)") and "lower num-clients (to at most 3" in note
    with pytest.raises(ValueError, match="refused, since most clients would be empty"):
        check_filled([0, 0, 4])


def test_the_server_refuses_it_before_any_client_is_asked(task_identity, data_dir):
    from headway.core.config import ConfigError, resolve_settings
    from headway.server.app import build_strategy

    cfg = resolve_settings({"algorithm": "fedavg", "dataset": "mnist", "data-dir": data_dir, "num-clients": 1000, "train-fraction": 0.005})
    with pytest.raises(ConfigError, match=r"699 of 1000 clients get no training rows.*lower num-clients"):
        build_strategy(dataclasses.replace(cfg, partition="iid"))


def test_split_refuses_mostly_empty_nodes(tmp_path, capsys):
    from headway.deploy import main

    folder = tmp_path / "pngs"
    for k in range(8):
        (folder / f"c{k % 2}").mkdir(parents=True, exist_ok=True)
    _write_pngs(folder, 10)
    code = main(["split", str(folder), "--out", str(tmp_path / "nodes"), "--num-clients", "100", "--partition", "iid"])
    err = capsys.readouterr().err
    assert code == 2 and "84 of 100 clients get no training rows" in err and "lower num-clients" in err
    assert not (tmp_path / "nodes").exists()


def _write_pngs(folder, per_class: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for cls in ("c0", "c1"):
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(folder / cls / f"{i}.png")
