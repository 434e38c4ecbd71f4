"""What the server says while it waits for clients (issue 38 item 6), and why a reply is
missing (item 11): the line a user reads must match what happened, on the engine's fakes."""

from __future__ import annotations

import logging

import numpy as np
from flwr.app import MessageType, RecordDict
from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message
from headway.strategies.engine import WAIT_REPORT_EVERY, Engine

from tests.fakes import FakeGrid, engine_for, make_strategy, reply
from tests.test_engine import LAYOUT


class ArrivingGrid(FakeGrid):
    """SuperNodes that connect one by one: node count ``arrivals(t)`` at fake time t."""

    def __init__(self, arrivals):
        super().__init__(50)
        self.arrivals = arrivals

    def get_node_ids(self):
        return self.nodes[: self.arrivals(self.now)]

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _wait(grid: ArrivingGrid, caplog, **cfg) -> tuple[list[int], list[str]]:
    s = make_strategy("fedavg", **{"num-clients": 50, "sample-timeout": 120.0, **cfg})
    engine = Engine(grid, s.settings, s.services, clock=grid.clock, sleep=grid.sleep)
    with caplog.at_level(logging.INFO, logger="headway"):
        nodes = engine.wait_for_clients()
    return nodes, [r.getMessage() for r in caplog.records if r.name == "headway"]


def test_num_clients_50_with_3_nodes_says_so_at_once_as_nodes_arrive_and_with_the_fix(caplog):
    """Three SuperNodes (at 0, 4 and 25 s) for num-clients=50: the first line comes at once,
    one line per arrival, a reminder at most every WAIT_REPORT_EVERY s, and the last line
    when the server goes on after sample-timeout; each says N of 50 and how to fix it."""
    grid = ArrivingGrid(lambda t: 1 if t < 4 else 2 if t < 25 else 3)
    nodes, lines = _wait(grid, caplog)
    assert nodes == [101, 102, 103]
    assert lines[0].startswith("waiting for clients: 1 of 50 connected (num-clients=50); going on with those connected in 120 s")
    assert "set num-clients=1" in lines[0] and "start 49 more SuperNodes" in lines[0]
    counts = [int(line.split(" of ")[0].split()[-1]) for line in lines]
    assert counts[:3] == [1, 2, 2] and sorted(set(counts)) == [1, 2, 3]  # every change is reported, in order
    assert any(line.startswith("waiting for clients: 2 of 50") and "set num-clients=2" in line for line in lines)
    assert any(line.startswith("waiting for clients: 3 of 50") and "start 47 more SuperNodes" in line for line in lines)
    assert lines[-1].startswith("only 3 of 50 clients (num-clients=50) connected after 120 s; going on with them")
    assert "set num-clients=3" in lines[-1]
    # no silence longer than the reminder period: 120 s of waiting gives at least 12 lines, at most one per poll
    assert 120 / WAIT_REPORT_EVERY <= len(lines) <= 120 / WAIT_REPORT_EVERY + 4, lines


def test_enough_clients_is_one_line_and_min_available_clients_is_named_when_it_is_the_key(caplog):
    _, lines = _wait(ArrivingGrid(lambda t: 3 if t < 2 else 5), caplog, **{"num-clients": 5})
    assert lines[0].startswith("waiting for clients: 3 of 5 connected (num-clients=5)")
    assert lines[-1] == "clients: 5 of 5 connected after 2 s" and len(lines) == 2
    caplog.clear()
    _, lines = _wait(ArrivingGrid(lambda t: 0), caplog, **{"min-available-clients": 4, "sample-timeout": 5.0})
    assert lines[0].startswith("waiting for clients: 0 of 4 connected (min-available-clients=4)")
    assert "no SuperNode is connected" in lines[0] and lines[-1].startswith("only 0 of 4 clients (min-available-clients=4)")


class UnavailableGrid(FakeGrid):
    """Flower's SuperLink answering, ``after`` seconds into the deadline, in place of node 103
    (partition 2), which stopped sending heartbeats: the error reply Flower itself makes."""

    def __init__(self, after: float, superlink_says: bool = True):
        super().__init__(3, lambda pid, msg: reply({"x": np.ones(4, np.float32)}, 5, pid))
        self.after, self.superlink_says = after, superlink_says

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        for m in messages:  # as Flower's push_messages does
            m.metadata.__dict__["_message_id"] = m.object_id
        dead = [m for m in messages if m.metadata.dst_node_id == 103 and m.metadata.message_type != MessageType.QUERY]
        out = list(super().send_and_receive([m for m in messages if m not in dead], timeout=timeout))
        if dead:
            self.now += self.after
            if self.superlink_says:
                out += [create_message_error_unavailable_res_message(m.metadata, "node_unavail") for m in dead]
        return out


def _train(grid: FakeGrid) -> list[str]:
    s = make_strategy("fedavg", **{"num-clients": 3, "round-timeout": 60.0})
    engine = engine_for(s, grid)
    replies = engine.exchange("train", {n: RecordDict() for n in engine.nodes()}, MessageType.TRAIN, LAYOUT)
    assert [r.partition_id for r in replies] == [0, 1]
    return engine.meter.failures


def test_a_node_the_superlink_reports_unavailable_is_not_said_to_have_missed_the_deadline(task_identity):
    """The issue's round: 39.5 s long with round-timeout=60, reported as "no reply within 60 s".
    Flower answered for the node (NODE_UNAVAILABLE, sent from the SuperLink, not the node)."""
    [reason] = _train(UnavailableGrid(39.5))
    assert "within 60 s" not in reason
    assert reason.startswith("train: node 103 (partition 2): no reply; the SuperLink answered for it: error 5: ")
    assert "Node Unavailable" in reason and "heartbeat" in reason and reason.endswith("(after 39.5 s of the 60 s deadline)")


def test_a_reply_missing_before_the_deadline_says_how_long_was_waited_and_a_missed_deadline_says_so(task_identity):
    [early] = _train(UnavailableGrid(12.0, superlink_says=False))
    assert early == "train: node 103 (partition 2): no reply; Flower stopped waiting after 12.0 s of the 60 s deadline"
    [late] = _train(UnavailableGrid(61.5, superlink_says=False))
    assert late == "train: node 103 (partition 2): no reply within 60 s"
