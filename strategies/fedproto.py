"""FedProto (Tan et al. 2022): whole models stay local; clients send per-class mean
features (prototypes) with class counts, and the server averages them per class
weighted by the counts. Clients pull their features towards the global prototypes."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from headway.core import protocol as P
from headway.core.config import ConfigError, body_names
from headway.core.data import DatasetSpec
from headway.core.models import common_width
from headway.core.prototypes import average_prototypes, prototype_problem
from headway.core.settings import Settings
from headway.core.sum_bounds import count_problem
from headway.strategies.base import HeadwayStrategy, Step, TrainRound, mean_finite
from headway.strategies.engine import Engine
from headway.strategies.replies import ArraySpec, Layout, Reply
from headway.strategies.secure_aggregation import SecureSum, SumSpec
from headway.strategies.services import Services
from headway.strategies.state import ServerState

log = logging.getLogger("headway")


@dataclass(frozen=True)
class FedProtoState:
    """The global prototypes (classes × m) and their class counts; None before the first aggregation."""

    protos: np.ndarray | None = None
    counts: np.ndarray | None = None


class FedProto(HeadwayStrategy[FedProtoState]):
    """FedProto's server: count-weighted averages of the clients' class prototypes."""

    name = "fedproto"
    arrays_from_method = True  # the global prototypes and counts as sent: global_record of the method state
    eval_metrics = (f"{P.CORRECT}-head", f"{P.CORRECT}-prototype")

    def __init__(self, settings: Settings, spec: DatasetSpec, services: Services):
        super().__init__(settings, spec, services)
        if spec.task != "classification":
            raise ConfigError(f"fedproto needs a classification data set; '{self.settings.dataset}' is {spec.task}")
        try:
            self.m = common_width(body_names(self.settings), spec.input_shape, self.settings.feature_dim)
        except ValueError as exc:
            raise ConfigError(f"fedproto: {exc}") from None
        self.classes = spec.num_classes

    def body_problem(self, body: str) -> str | None:
        """A node's body must send this run's feature width."""
        return self.width_problem(body, self.m)

    def initial_method_state(self) -> FedProtoState:
        """No prototypes yet."""
        return FedProtoState()

    def global_record(self, method: FedProtoState) -> ArrayRecord:
        """The global prototypes and counts of ``method`` (empty before the first aggregation)."""
        if method.protos is None or method.counts is None:  # set together, by aggregate_train
            return ArrayRecord()
        return ArrayRecord({P.PROTOTYPES: Array(method.protos.astype(np.float32)), P.CLASS_COUNTS: Array(method.counts.astype(np.float32))})

    def configure_train(
        self, server_round: int, state: ServerState[FedProtoState], engine: Engine
    ) -> tuple[TrainRound[FedProtoState], dict[int, RecordDict]]:
        """The state's arrays (its global prototypes: :meth:`global_record`) to ``fraction-train`` of the clients."""
        content = self.content(server_round, state.arrays)
        return TrainRound(server_round, engine, state), {node: content for node in engine.sample(self.settings.fraction_train)}

    def train_layout(self, ctx: TrainRound[FedProtoState]) -> Layout:
        """Prototypes (classes × m) and class counts, with n and an optional loss."""
        arrays = {P.PROTOTYPES: ArraySpec((self.classes, self.m)), P.CLASS_COUNTS: ArraySpec((self.classes,))}
        return Layout(arrays, count=True, optional=(P.LOSS,), check=self.check_prototypes)

    def check_prototypes(self, arrays: dict[str, np.ndarray], reply: Reply) -> tuple[tuple[np.ndarray, np.ndarray] | None, str | None]:
        """A reply's (prototypes, counts) as float64, or why they cannot be a client's."""
        protos, counts = arrays[P.PROTOTYPES].astype(np.float64), arrays[P.CLASS_COUNTS].astype(np.float64)
        problem = prototype_problem(protos, counts, float(reply.examples), (self.classes, self.m))
        if problem is None and np.max(np.abs(protos), initial=0.0) > self.settings.max_feature_value:
            problem = f"a prototype entry exceeds max-feature-value={self.settings.max_feature_value:g}"
        return (protos, counts), problem

    def aggregate_train(self, ctx: TrainRound[FedProtoState], replies: list[Reply]) -> Step[FedProtoState]:
        """The count-weighted average prototypes of the replies."""
        method = FedProtoState(*average_prototypes([r.payload[0] for r in replies], [r.payload[1] for r in replies]))
        loss = mean_finite([r.metrics.get(P.LOSS, float("nan")) for r in replies])
        return Step(self.global_record(method), len(replies), {"loss": loss}, method=method)

    def sum_spec(self, ctx: TrainRound[FedProtoState], nodes: list[int]) -> SumSpec:
        """Under secure-aggregation: Σ n_kc·P_kc and Σ n_kc; an entry of a sum is at most the
        examples the clients hold times max-feature-value."""
        most = float(sum(ctx.engine.most_examples(v) for v in nodes))
        arrays = {P.PROTOTYPES: (self.classes, self.m), P.CLASS_COUNTS: (self.classes,)}
        return SumSpec(arrays, most * max(self.settings.max_feature_value, 1.0), row_weights=P.CLASS_COUNTS)

    def aggregate_sum(self, ctx: TrainRound[FedProtoState], total: SecureSum) -> Step[FedProtoState]:
        """The count-weighted prototypes from the secure sums; sums no honest clients could send keep the previous ones."""
        weighted, counts = total.arrays[P.PROTOTYPES], total.arrays[P.CLASS_COUNTS]
        protos = np.divide(weighted, counts[:, None], out=np.zeros_like(weighted), where=counts[:, None] > 0)
        problem = prototype_problem(protos, counts, float(np.sum(counts)), (self.classes, self.m))
        if problem is None and np.max(np.abs(protos), initial=0.0) > self.settings.max_feature_value * (1 + 1e-6):
            problem = f"a prototype entry exceeds max-feature-value={self.settings.max_feature_value:g}"
        if problem is None:  # whole counts are checked above; their total within what these clients hold
            problem = count_problem(float(np.sum(counts)), total.max_examples)
        if problem is not None:
            ctx.engine.meter.fail(f"secure sum of {len(total)} clients is not a sum of prototypes ({problem}); keeping the previous ones")
            return Step(None, 0)
        method = FedProtoState(protos, counts)
        cpu = {f"secagg_server_cpu_{stage}": sec for stage, sec in total.cpu.items()}
        return Step(self.global_record(method), len(total), cpu, method=method)

    def summary_extra(self, engine: Engine, state: ServerState[FedProtoState] | None) -> dict[str, Any]:
        """m, λ and the prediction rule."""
        return {"m": self.m, "lambda": self.settings.fedproto.lambda_, "predict": self.settings.fedproto.predict}
