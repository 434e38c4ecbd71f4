"""FedProto (Tan et al. 2022): whole models stay local; clients send per-class mean
features (prototypes) with class counts, and the server averages them per class
weighted by the counts. Clients pull their features towards the global prototypes."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from core import protocol as P
from core.config import ConfigError, body_names
from core.data import DatasetSpec
from core.models import common_width
from core.prototypes import average_prototypes, prototype_problem
from strategies.base import HeadwayStrategy, Step, TrainRound, mean_finite
from strategies.engine import Engine
from strategies.replies import ArraySpec, Layout, Reply
from strategies.services import Services

log = logging.getLogger("headway")


class FedProto(HeadwayStrategy):
    name = "fedproto"
    eval_metrics = (f"{P.CORRECT}-head", f"{P.CORRECT}-prototype")

    def __init__(self, cfg: dict[str, Any], spec: DatasetSpec, services: Services):
        super().__init__(cfg, spec, services)
        if spec.task != "classification":
            raise ConfigError(f"fedproto needs a classification data set; '{cfg['dataset']}' is {spec.task}")
        try:
            self.m = common_width(body_names(cfg), spec.input_shape, cfg["feature-dim"])
        except ValueError as exc:
            raise ConfigError(f"fedproto: {exc}") from None
        self.classes = spec.num_classes
        self.protos: np.ndarray | None = None
        self.counts: np.ndarray | None = None

    def body_problem(self, body: str) -> str | None:
        return self.width_problem(body, self.m)

    def global_record(self) -> ArrayRecord:
        """The global prototypes and counts (empty before the first aggregation)."""
        if self.protos is None or self.counts is None:  # set together, by aggregate_train
            return ArrayRecord()
        return ArrayRecord({P.PROTOTYPES: Array(self.protos.astype(np.float32)), P.CLASS_COUNTS: Array(self.counts.astype(np.float32))})

    def configure_train(self, server_round: int, arrays: ArrayRecord, engine: Engine) -> tuple[TrainRound, dict[int, RecordDict]]:
        content = self.content(server_round, self.global_record())
        return TrainRound(server_round, engine), {node: content for node in engine.sample(self.cfg["fraction-train"])}

    def train_layout(self, ctx: TrainRound) -> Layout:
        arrays = {P.PROTOTYPES: ArraySpec((self.classes, self.m)), P.CLASS_COUNTS: ArraySpec((self.classes,))}
        return Layout(arrays, count=True, optional=(P.LOSS,), check=self.check_prototypes)

    def check_prototypes(self, arrays: dict[str, np.ndarray], reply: Reply) -> tuple[tuple[np.ndarray, np.ndarray] | None, str | None]:
        protos, counts = arrays[P.PROTOTYPES].astype(np.float64), arrays[P.CLASS_COUNTS].astype(np.float64)
        problem = prototype_problem(protos, counts, float(reply.examples), (self.classes, self.m))
        if problem is None and np.max(np.abs(protos), initial=0.0) > self.cfg["max-feature-value"]:
            problem = f"a prototype entry exceeds max-feature-value={self.cfg['max-feature-value']:g}"
        return (protos, counts), problem

    def aggregate_train(self, ctx: TrainRound, replies: list[Reply]) -> Step:
        self.protos, self.counts = average_prototypes([r.payload[0] for r in replies], [r.payload[1] for r in replies])
        return Step(self.global_record(), len(replies), {"loss": mean_finite([r.metrics.get(P.LOSS, float("nan")) for r in replies])})

    def evaluate_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        return self.global_record()

    def summary_extra(self, engine: Engine) -> dict[str, Any]:
        return {"m": self.m, "lambda": self.cfg["fedproto-lambda"], "predict": self.cfg["fedproto-predict"]}
