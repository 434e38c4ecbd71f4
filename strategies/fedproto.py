"""FedProto (Tan et al. 2022): whole models stay local; clients send per-class mean
features (prototypes) with class counts, and the server averages them per class
weighted by the counts. Clients pull their features towards the global prototypes."""

from __future__ import annotations

import logging
from typing import Any, Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid

from core import protocol as P
from core.config import ConfigError, body_names
from core.data import DatasetSpec
from core.models import common_width
from core.prototypes import average_prototypes, prototype_problem
from strategies.base import HeadwayStrategy

log = logging.getLogger("headway")



class FedProto(HeadwayStrategy):
    name = "fedproto"

    def __init__(self, cfg: dict):
        super().__init__(cfg)
        self.protos: np.ndarray | None = None
        self.counts: np.ndarray | None = None

    def check(self, spec: DatasetSpec) -> None:
        if spec.task != "classification":
            raise ConfigError(f"fedproto needs a classification data set; '{self.cfg['dataset']}' is {spec.task}")
        try:
            self.m = common_width(body_names(self.cfg), spec.input_shape, self.cfg["feature-dim"])
        except ValueError as exc:
            raise ConfigError(f"fedproto: {exc}") from None
        self.classes = spec.num_classes

    def global_record(self) -> ArrayRecord:
        """The global prototypes and counts (empty before the first aggregation)."""
        if self.protos is None:
            return ArrayRecord()
        return ArrayRecord({P.PROTOTYPES: Array(self.protos.astype(np.float32)), P.CLASS_COUNTS: Array(self.counts.astype(np.float32))})

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        nodes = self.sample(grid, self.cfg["fraction-train"])
        content = RecordDict({P.ARRAYS: self.global_record(), P.CONFIG: self.config(server_round)})
        return self.messages(grid, nodes, content, MessageType.TRAIN)

    def check_prototypes(self, arrays: ArrayRecord, n: float) -> tuple[tuple[np.ndarray, np.ndarray] | None, str | None]:
        if P.PROTOTYPES not in arrays or P.CLASS_COUNTS not in arrays:
            return None, "reply without prototypes and class counts"
        protos, counts = arrays[P.PROTOTYPES].numpy().astype(np.float64), arrays[P.CLASS_COUNTS].numpy().astype(np.float64)
        return (protos, counts), prototype_problem(protos, counts, n, (self.classes, self.m))

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        good = self.screen(replies, self.check_prototypes)
        if not good:
            log.warning("fedproto round %d: no valid prototypes; keeping the previous ones", server_round)
            return None, MetricRecord({"clients": 0})
        payloads, counts, losses = zip(*good)
        self.protos, self.counts = average_prototypes([p for p, _ in payloads], [c for _, c in payloads])
        finite = [v for v in losses if np.isfinite(v)]
        return self.global_record(), MetricRecord({"clients": len(payloads), "loss": float(np.mean(finite)) if finite else float("nan")})

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self.evaluate_messages(server_round, self.global_record(), grid)

    def summary_extra(self) -> dict[str, Any]:
        return {"m": self.m, "lambda": self.cfg["fedproto-lambda"], "predict": self.cfg["fedproto-predict"]}
