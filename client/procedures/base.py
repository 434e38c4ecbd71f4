"""The interface every local procedure implements, and helpers they share."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Protocol

import torch
from flwr.app import MetricRecord, RecordDict
from flwr.app.typing import MetricRecordValues
from headway.client.env import ClientEnv
from headway.core import protocol as P
from headway.core.training import predict, task_metrics


class Procedure(Protocol):
    """A method's client side: turn a message's content into a reply's content."""

    methods: tuple[str, ...]  # the declared methods (core/methods.py) it serves; client/registry.py reads it

    def train(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Run the method's local round on a TRAIN message and return what the server aggregates."""

    def evaluate(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Score the model a message (or the node's state) names on the local test split, for the server to pool."""


def round_of(content: RecordDict) -> int:
    """The server round a message names (0 for one that names none, as a discovery query)."""
    cfg = content.config_records.get(P.CONFIG)
    return P.as_int(cfg.get(P.ROUND, 0)) if cfg is not None else 0


def test_metrics(env: ClientEnv, forward: Callable[[torch.Tensor], torch.Tensor]) -> MetricRecord:
    """Local test metrics of ``forward`` (batch -> outputs) in the reply format."""
    return outputs_metrics(env, predict(forward, env.x_test, device=env.device))


def outputs_metrics(env: ClientEnv, out: torch.Tensor, extra: Mapping[str, float] | None = None) -> MetricRecord:
    """Local test metrics of outputs ``out`` (one row per test example) in the reply format."""
    s = task_metrics(env.data.task, out, env.y_test)
    n = len(env.y_test)
    met: dict[str, MetricRecordValues] = {P.NUM_EXAMPLES: n, P.PARTITION_ID: env.partition_id}
    if n and math.isfinite(s["loss"]):
        met[P.LOSS] = float(s["loss"])
    if env.data.task == "classification":
        met[P.CORRECT] = int((out.argmax(1) == env.y_test).sum()) if n else 0
    else:
        met[P.SQUARED_ERROR] = float(((out - env.y_test) ** 2).mean(1).sum()) if n else 0.0
    met.update(extra or {})
    return MetricRecord(met)


def train_metrics(env: ClientEnv, loss: float) -> MetricRecord:
    """A training reply's metrics: count, partition id, and the loss when there is one."""
    met: dict[str, MetricRecordValues] = {P.NUM_EXAMPLES: len(env.y_train), P.PARTITION_ID: env.partition_id}
    if math.isfinite(loss):
        met[P.LOSS] = float(loss)
    return MetricRecord(met)
