"""FedAvg (McMahan et al. 2017): clients train the whole model; the server takes the
sample-weighted average."""

from __future__ import annotations

from typing import Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid

from core import protocol as P
from core.aggregate import array_problem, weighted_average
from core.config import ConfigError, body_names
from core.data import DatasetSpec
from core.models import build_model
from strategies.base import HeadwayStrategy


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in arrays.items()})


class FedAvg(HeadwayStrategy):
    """Whole-model averaging weighted by each client's number of training examples."""

    name = "fedavg"
    has_global_model = True

    def __init__(self, cfg: dict):
        super().__init__(cfg)
        self.current: dict[str, np.ndarray] = {}

    def check(self, spec: DatasetSpec) -> None:
        if body_names(self.cfg) != [self.cfg["body"]]:
            raise ConfigError(f"{self.name} averages whole models, so every client must run the same body: leave 'bodies' empty")

    def initial_arrays(self, spec: DatasetSpec) -> ArrayRecord:
        model = build_model(self.cfg["body"], spec.input_shape, self.cfg["feature-dim"], spec.num_classes, self.cfg["seed"])
        return ArrayRecord(model.state_dict())

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self.current = to_numpy(arrays)
        nodes = self.sample(grid, self.cfg["fraction-train"])
        content = RecordDict({P.ARRAYS: arrays, P.CONFIG: self.config(server_round)})
        return self.messages(grid, nodes, content, MessageType.TRAIN)

    def check_update(self, arrays: ArrayRecord, n: float) -> tuple[dict[str, np.ndarray], str | None]:
        """A model update is averageable when it matches the global model and has examples."""
        update = to_numpy(arrays)
        return update, ("num-examples is 0" if n == 0 else array_problem(self.current, update))

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        good = self.screen(replies, self.check_update)
        if not good:
            return None, MetricRecord({"clients": 0})
        updates, counts, losses = zip(*good)
        avg = weighted_average(updates, counts)
        return to_record(avg), MetricRecord({"clients": len(updates), "loss": float(np.average(losses, weights=counts))})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self.evaluate_messages(server_round, arrays, grid)
