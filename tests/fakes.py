"""A stand-in for Flower's Grid in unit tests: nodes that register, answer, fail or stay silent."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from headway.core.config import body_for, resolve_settings
from headway.core.extractors import input_spec
from headway.strategies.engine import Engine
from headway.strategies.registry import STRATEGIES
from headway.strategies.services import Services

Answer = Callable[[int, Message], "RecordDict | Error | None"]


class GridStub(Grid):
    """Flower's Grid with what the engine never calls stubbed out: a subclass supplies
    ``get_node_ids`` and ``send_and_receive``, as the round engine and discovery use them."""

    def set_run(self, run):
        raise NotImplementedError

    @property
    def run(self):
        raise NotImplementedError

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        raise NotImplementedError

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError


class FakeGrid(GridStub):
    """Nodes 101, 102, … register as partitions 0, 1, … (body from ``bodies``) and answer
    other messages with ``answer(partition_id, message)``: a RecordDict, an Error, or None
    (silence). Every message sent is kept in ``sent``. ``clock`` is the time the engine reads
    (:func:`engine_for` passes it): an exchange with a silent node spends its whole timeout,
    as Flower's grid does."""

    def __init__(self, n: int = 3, answer: Answer | None = None, bodies: list[str] | None = None):
        self.nodes = [101 + i for i in range(n)]
        self.answer = answer or (lambda pid, msg: None)
        self.bodies = bodies  # None: the bodies the run config gives each partition (set by engine_for)
        self.sent: list[Message] = []
        self.timeouts: list[float] = []
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        self.timeouts.append(timeout)
        out, asked = [], 0
        for msg in messages:
            asked += 1
            self.sent.append(msg)
            pid = msg.metadata.dst_node_id - 101
            if msg.metadata.message_type == MessageType.QUERY:
                content: RecordDict | Error | None = RecordDict(
                    {
                        "metrics": MetricRecord({"partition-id": pid}),
                        "config": ConfigRecord({"body": self.bodies[pid] if self.bodies else "mnist-cnn"}),
                    }
                )
            else:
                content = self.answer(pid, msg)
            if isinstance(content, Error):
                out.append(Message(content, reply_to=msg))
            elif content is not None:
                out.append(Message(content=content, reply_to=msg))
        if len(out) < asked:  # someone stayed silent: Flower's grid waits out the whole timeout
            self.now += timeout or 0.0
        return out


def smuggle(record: MetricRecord, key: str, value: object) -> None:
    """Put ``value`` in ``record`` past MetricRecord's own type check: what a client that
    builds its own Message can send."""
    record._data[key] = value  # type: ignore[attr-defined]  # the private store, on purpose


def reply(arrays: dict[str, np.ndarray], n: int | None, pid: int, **metrics) -> RecordDict:
    """A training reply as a client sends it."""
    met = {"partition-id": pid, **({} if n is None else {"num-examples": n}), **metrics}
    return RecordDict(
        {"arrays": ArrayRecord({k: Array(np.asarray(v, order="C")) for k, v in arrays.items()}), "metrics": MetricRecord(met)}
    )


def make_strategy(algorithm: str, **cfg):
    """A strategy on MNIST's spec, 3 clients, no waiting for nodes."""
    settings = resolve_settings({"algorithm": algorithm, "num-clients": 3, "sample-timeout": 0.0, "round-timeout": 5.0, **cfg})
    return STRATEGIES[algorithm](settings, input_spec(settings), Services(settings))


def engine_for(strategy, grid: FakeGrid, server_round: int = 1) -> Engine:
    """An engine on ``grid`` whose nodes have registered, in ``server_round``; nodes
    register with the bodies the run config gives them unless ``grid`` names others."""
    if grid.bodies is None:
        grid.bodies = [body_for(strategy.settings, pid) for pid in range(len(grid.nodes))]
    engine = Engine(grid, strategy.settings, strategy.services, clock=grid.clock, admit=strategy.body_problem)
    engine.begin_round(server_round)
    return engine
