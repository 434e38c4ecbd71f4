"""FedAvg (McMahan et al. 2017): clients train the whole model; the server takes the
sample-weighted average of the valid replies.

With ``client-sampling=data-ratio`` the round's K clients are instead K draws with
replacement with probability n_k/n, and the server averages the draws with equal weight (a
client drawn twice counts twice): scheme I of Li et al. 2020, FedProx's own sampling.

``aggregation`` other than ``mean`` replaces the average by a robust rule (strategies/robust.py)
for FedAvg and every strategy built on it (the layer-sharing methods among them), which all aggregate here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict
from headway.core import protocol as P
from headway.core.aggregate import float_norm, relative_update_norm
from headway.core.config import ConfigError, body_names
from headway.core.data import DatasetSpec
from headway.core.models import build_model
from headway.core.settings import Settings
from headway.core.sum_bounds import count_problem, update_sum_problem
from headway.strategies.arrays import to_numpy, to_record
from headway.strategies.base import HeadwayStrategy, Step, TrainRound, mean_finite
from headway.strategies.engine import Engine
from headway.strategies.replies import ArraySpec, Layout, Rejection, Reply
from headway.strategies.robust import Averaging, averaging_for
from headway.strategies.secure_aggregation import SecureSum, SumSpec
from headway.strategies.services import Services
from headway.strategies.state import M, ServerState

# to_numpy/to_record: where the layer-sharing methods import them
__all__ = ["FedAvg", "FedAvgState", "ModelAveraging", "to_numpy", "to_record"]


@dataclass(frozen=True)
class FedAvgState:
    """What FedAvg's server keeps across rounds besides the model: under ``client-sampling=data-ratio``
    without server data, the count each client's last accepted training reply gave (partition id -> n)."""

    counts: dict[int, int] = field(default_factory=dict)


class ModelAveraging(HeadwayStrategy[M]):
    """What the servers that average (part of) a model share, whatever state their method keeps:
    the initial model, the body rule, the part sent and the reply check (FedAvg's family and FedProf)."""

    has_global_model = True
    averages = "whole models"  # what the server averages (for the single-body refusal)
    mixed_bodies = False  # whether clients may run different bodies (layer sharing: where the shared layers agree)

    def __init__(self, settings: Settings, spec: DatasetSpec, services: Services):
        super().__init__(settings, spec, services)
        if not self.mixed_bodies and body_names(self.settings) != [self.settings.body]:
            raise ConfigError(f"{self.name} averages {self.averages}, so every client must run the same body: leave 'bodies' empty")
        self.averaging: Averaging = averaging_for(self.settings, self)  # the weighted mean, or the robust rule ``aggregation`` names

    def initial_arrays(self) -> ArrayRecord:
        """The run body's seeded initial model."""
        model = build_model(
            self.settings.body,
            self.spec.input_shape,
            self.settings.feature_dim,
            self.spec.num_classes,
            self.settings.seed,
            self.settings.body_dropout,
        )
        return ArrayRecord(model.state_dict())

    def body_problem(self, body: str) -> str | None:
        """Whole models are averaged: a node must run the run's one body."""
        if body != self.settings.body:
            return f"registration names body {body!r}, but {self.name} averages whole models of body {self.settings.body!r}: every client must run it"
        return None

    def shared(self, server_round: int, arrays: ArrayRecord, method: Any = None) -> ArrayRecord:
        """The part of the server's arrays exchanged in ``server_round`` under method state ``method`` (FedAvg: all)."""
        return arrays

    def train_layout(self, ctx: TrainRound[M]) -> Layout:
        """A reply is the arrays it was sent, same names, shapes and dtypes, with n > 0
        and an update no larger than ``max-update-norm`` allows."""
        specs = {k: ArraySpec(tuple(v.shape), str(v.dtype)) for k, v in ctx.sent.items()}
        return Layout(specs, count=True, optional=(P.LOSS,), check=partial(self.check_update, ctx=ctx))

    def update_bound(self, server_round: int) -> tuple[str, float]:
        """The key and value bounding ``server_round``'s relative update norms. Round 1 starts
        from the seeded random model, and long training moves far from it (measured: 1.0 with
        1,000 examples a client, 2.7 with 20,000): it has its own key, to loosen on its own."""
        if server_round <= 1:
            return "max-first-update-norm", float(self.settings.max_first_update_norm)
        return "max-update-norm", float(self.settings.max_update_norm)

    def check_update(
        self, arrays: dict[str, np.ndarray], reply: Reply, ctx: TrainRound[M]
    ) -> tuple[dict[str, np.ndarray] | None, str | Rejection | None]:
        """``arrays`` when they may be averaged: a count to weigh them by, and an update no
        further from the model sent (``ctx.sent``) than the round's bound allows."""
        if reply.count == 0:
            return None, "num-examples is 0: nothing to weigh the update by"
        norm = relative_update_norm(ctx.sent, arrays)
        key, limit = self.update_bound(ctx.server_round)
        if not norm <= limit:
            return None, Rejection(
                f"update norm {norm:.4g} × max(|w_global|, 1) exceeds {key}={limit:g} (raise it if honest clients move this far)",
                update_norm=norm,
            )
        return arrays, None

    @staticmethod
    def update_norms(sent: dict[str, np.ndarray], replies: list[Reply]) -> dict[str, float]:
        """Largest and mean relative update norm of the accepted replies from ``sent``, for
        rounds.jsonl (beside ``rejected_update_norms``): what honest clients produce, against the bound."""
        norms = [relative_update_norm(sent, r.payload) for r in replies]
        return {"update_norm_max": max(norms), "update_norm_mean": float(np.mean(norms))} if norms else {}


class FedAvg(ModelAveraging[FedAvgState]):
    """Whole-model averaging weighted by each client's number of training examples."""

    name = "fedavg"

    def initial_method_state(self) -> FedAvgState:
        """A :class:`FedAvgState` with no client's count heard yet."""
        return FedAvgState()

    def configure_train(
        self, server_round: int, state: ServerState[FedAvgState], engine: Engine
    ) -> tuple[TrainRound[FedAvgState], dict[int, RecordDict]]:
        """The shared part of the model to ``fraction-train`` of the clients (data-ratio: drawn ∝ n_k)."""
        sent = self.shared(server_round, state.arrays, state.method)
        content = self.content(server_round, sent)
        if self.settings.client_sampling == "data-ratio":
            draws = engine.draw(self.settings.fraction_train, self.data_ratio(engine, state.method))
            return TrainRound(server_round, engine, state, to_numpy(sent), draws), {node: content for node in draws}
        nodes = engine.sample(self.settings.fraction_train)
        return TrainRound(server_round, engine, state, to_numpy(sent)), {node: content for node in nodes}

    def data_ratio(self, engine: Engine, method: FedAvgState) -> dict[int, float]:
        """n_k of every available node, for draws ∝ n_k/n: the partition's size where the
        server holds the data, else the count its last accepted reply gave (capped like
        every count), and the mean of the known ones for a node not yet heard from."""
        sizes = self.services.data.partition_sizes
        nodes = engine.nodes()
        if sizes is not None:
            return {n: float(sizes[engine.partition_of(n)][0]) for n in nodes}
        counts = {n: method.counts.get(engine.partition_of(n)) for n in nodes}
        known = {n: float(c) for n, c in counts.items() if c is not None}
        fill = float(np.mean(list(known.values()))) if known else 1.0
        return {n: known.get(n, fill) for n in nodes}

    def update_weights(self, ctx: TrainRound[FedAvgState], replies: list[Reply]) -> list[float]:
        """Each reply's weight in the average: its n_k, or under data-ratio sampling the times its
        node was drawn (scheme I: every draw weighs the same)."""
        if self.settings.client_sampling == "data-ratio":
            return [ctx.draws.get(r.node_id, 0) for r in replies]
        return [r.examples for r in replies]

    def aggregate_train(self, ctx: TrainRound[FedAvgState], replies: list[Reply]) -> Step[FedAvgState]:
        """The run's averaging (:mod:`headway.strategies.robust`) of the replies, weighted by :meth:`update_weights`;
        under data-ratio sampling the state also keeps each reply's count for the next draws."""
        losses = [r.metrics.get(P.LOSS, float("nan")) for r in replies]
        metrics = {"loss": mean_finite(losses), **self.update_norms(ctx.sent, replies)}
        step = self.averaging.step(ctx, replies, self.update_weights(ctx, replies), metrics)
        if self.settings.client_sampling != "data-ratio":
            return step
        method = ctx.state.method
        heard = {r.partition_id: r.examples for r in replies}
        # replace, not a new FedAvgState: a subclass's state (its own fields beside the counts) keeps them
        return replace(step, method=replace(method, counts={**method.counts, **heard}))

    def sum_spec(self, ctx: TrainRound[FedAvgState], nodes: list[int]) -> SumSpec:
        """Under secure-aggregation: n_k·(w_k − w) of the float arrays, each update L2-clipped to
        the round's update bound (what the reply check would enforce), and n_k."""
        names = [k for k, v in ctx.sent.items() if np.issubdtype(v.dtype, np.floating)]
        _, limit = self.update_bound(ctx.server_round)
        clip = limit * max(float_norm(ctx.sent), 1.0)
        most = float(sum(ctx.engine.most_examples(v) for v in nodes))
        return SumSpec({k: tuple(ctx.sent[k].shape) for k in names}, most * clip, update_norm=clip)

    def aggregate_sum(self, ctx: TrainRound[FedAvgState], total: SecureSum) -> Step[FedAvgState]:
        """w + Σ n_k Δ_k / Σ n_k from the secure sum (integer arrays, e.g. BatchNorm's counters,
        stay as sent). The sum must be one of clients within their bounds (core/sum_bounds.py):
        a count of at least 1 and at most what they can hold together, and ‖Σ n_k Δ_k‖ ≤ clip·Σ n_k;
        otherwise the round keeps the model and the reason is counted."""
        n = float(total.arrays[P.NUM_EXAMPLES][0])
        key, limit = self.update_bound(ctx.server_round)
        clip = limit * max(float_norm(ctx.sent), 1.0)
        summed = {k: v for k, v in total.arrays.items() if k != P.NUM_EXAMPLES}
        norm = math.sqrt(sum(float(np.sum(np.square(v))) for v in summed.values()))
        problem = count_problem(n, total.max_examples, least=1.0) or update_sum_problem(n, norm, clip)
        if problem:
            ctx.engine.meter.fail(
                f"secure sum of {len(total)} clients is not a sum of bounded updates ({problem}; {key}={limit:g}); keeping the model"
            )
            return Step(None, 0)
        new = {k: (v.astype(np.float64) + summed[k] / n).astype(v.dtype) if k in summed else v for k, v in ctx.sent.items()}
        cpu = {f"secagg_server_cpu_{stage}": sec for stage, sec in total.cpu.items()}
        figures = {"update_norm_of_mean": relative_update_norm(ctx.sent, new), "sum_examples": n, "sum_examples_bound": total.max_examples}
        return Step(to_record(new), len(total), {**figures, **cpu})
