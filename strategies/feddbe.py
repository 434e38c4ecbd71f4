"""FedDBE (Zhang et al., NeurIPS 2023; FedLog's Table 1 baseline): FedAvg on the whole model (body
and head), with two additions on the clients (client/procedures/feddbe.py): a personalized
representation bias (PRBM), a trainable vector added to the body's features that never leaves its
client, and the mean regularization (MR), a pull of the client's mean feature towards a global mean
feature. The server forms that global mean as the count-weighted average of the clients' mean
features (core/dbe.py): once, from round 1's replies (``feddbe-global-mean=first-round``, the
authors' initialization period), or every round; it lives in the method state so a resumed run
sends what an unbroken one would.

A client's mean feature is checked (shape, finite, within ``max-feature-value``) with its model
update; a reply whose mean fails is refused whole. Each mean is then cut to twice the round's median mean
norm (core/aggregate.py: clipped_means) from 3 means on; with fewer the cut is off, and every such round
logs a warning. Robust ``aggregation`` rules apply to the model;
secure aggregation is refused (the mean would need its own sum)."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from headway.core.aggregate import MEAN_NORM_FACTOR, MIN_MEANS_TO_CLIP, clipped_means
from headway.core.config import ConfigError
from headway.core.data import DatasetSpec
from headway.core.dbe import global_mean, mean_problem
from headway.core.methods import FEDDBE_RECORDS
from headway.core.models import common_width
from headway.core.settings import Settings
from headway.strategies.base import Step, TrainRound
from headway.strategies.engine import Engine
from headway.strategies.fedavg import FedAvg, FedAvgState
from headway.strategies.replies import ArraySpec, Layout, Rejection, Reply
from headway.strategies.services import Services
from headway.strategies.state import ServerState

FEATURE_MEAN = FEDDBE_RECORDS.feature_mean
GLOBAL_MEAN = FEDDBE_RECORDS.global_mean

log = logging.getLogger("headway")


@dataclass(frozen=True)
class FedDBEState(FedAvgState):
    """FedAvg's state and the global mean feature (float64, length m); None until a round's replies gave one."""

    global_mean: np.ndarray | None = None


def mean_of(method: FedAvgState) -> np.ndarray | None:
    """The global mean feature a FedDBE state holds (None: not formed yet)."""
    return method.global_mean if isinstance(method, FedDBEState) else None


def asks_for_mean(mode: str, method: FedAvgState) -> bool:
    """Whether this round's training replies must carry the client's mean feature (the client applies the same rule)."""
    return mode == "every-round" or mean_of(method) is None


class FedDBE(FedAvg):
    """FedDBE's server (this module's docstring): FedAvg of whole models plus the global mean feature."""

    hides_sum_on_purpose = True  # the global mean needs each client's own mean: FedAvg's secure sum is left unused, not forgotten

    name = "feddbe"

    def __init__(self, settings: Settings, spec: DatasetSpec, services: Services):
        super().__init__(settings, spec, services)
        try:
            self.m = common_width([self.settings.body], spec.input_shape, self.settings.feature_dim)
        except ValueError as exc:
            raise ConfigError(f"feddbe: {exc}") from None

    def initial_method_state(self) -> FedAvgState:
        """No client counts and no global mean yet."""
        return FedDBEState()

    def configure_train(
        self, server_round: int, state: ServerState[FedAvgState], engine: Engine
    ) -> tuple[TrainRound[FedAvgState], dict[int, RecordDict]]:
        """FedAvg's round, its message carrying the global mean beside the model once there is one."""
        ctx, contents = super().configure_train(server_round, state, engine)
        mean = mean_of(state.method)
        if mean is None:
            return ctx, contents
        sent = self.shared(server_round, state.arrays, state.method)
        content = self.content(server_round, ArrayRecord({**dict(sent.items()), GLOBAL_MEAN: Array(mean.astype(np.float32))}))
        return ctx, {node: content for node in contents}

    def train_layout(self, ctx: TrainRound[FedAvgState]) -> Layout:
        """FedAvg's layout (the model sent, back), plus the client's mean feature (m,) in the rounds that ask for it."""
        layout = super().train_layout(ctx)
        if not asks_for_mean(self.settings.feddbe.global_mean, ctx.state.method):
            return layout
        arrays = {**(layout.arrays or {}), FEATURE_MEAN: ArraySpec((self.m,))}
        return replace(layout, arrays=arrays, check=partial(self.check_reply, ctx=ctx))

    def check_reply(
        self, arrays: dict[str, np.ndarray], reply: Reply, ctx: TrainRound[FedAvgState]
    ) -> tuple[dict[str, np.ndarray] | None, str | Rejection | None]:
        """The model arrays when the mean feature is one a client can have and the update passes FedAvg's check."""
        problem = mean_problem(arrays[FEATURE_MEAN], self.m, float(self.settings.max_feature_value))
        if problem is not None:
            return None, problem
        model = {k: v for k, v in arrays.items() if k != FEATURE_MEAN}
        return self.check_update(model, reply, ctx)

    def update_weights(self, ctx: TrainRound[FedAvgState], replies: list[Reply]) -> list[float]:
        """FedAvg's weights, restated so the robust rules (strategies/capabilities.py) still replace this class's model average."""
        return super().update_weights(ctx, replies)

    def aggregate_train(self, ctx: TrainRound[FedAvgState], replies: list[Reply]) -> Step[FedAvgState]:
        """FedAvg's step for the model; in a round that asked for means, the new global mean from the same replies."""
        step = super().aggregate_train(ctx, replies)
        means = [(r.arrays[FEATURE_MEAN], float(r.examples)) for r in replies if FEATURE_MEAN in r.arrays]
        if not means or step.kept or step.arrays is None:
            return step
        method = step.method if step.method is not None else ctx.state.method
        kept, cut = clipped_means([m for m, _ in means])
        log_cut(ctx.server_round, len(means), cut)
        new = global_mean(kept, [n for _, n in means])
        state = FedDBEState(counts=method.counts, global_mean=new)
        metrics = {**step.metrics, "global_mean_norm": float(np.linalg.norm(new)), "feddbe_means_clipped": float(cut)}
        return replace(step, method=state, metrics=metrics)

    def summary_extra(self, engine: Engine, state: ServerState[FedAvgState] | None) -> dict[str, Any]:
        """m, κ, μ and when the global mean is formed."""
        cfg = self.settings.feddbe
        return {"m": self.m, "kappa": cfg.kappa, "momentum": cfg.momentum, "global_mean": cfg.global_mean}


def log_cut(server_round: int, means: int, cut: int) -> None:
    """One line when the global mean's cut acted, or could not: below 3 means no median tells an honest one from a lie."""
    if means < MIN_MEANS_TO_CLIP:
        log.warning(
            "feddbe round %d: only %d client mean(s): the cut of outlying means is off (it needs %d for a median an honest "
            "majority sets), so one client can move the global mean by up to max-feature-value per feature",
            server_round,
            means,
            MIN_MEANS_TO_CLIP,
        )
    elif cut:
        log.warning("feddbe round %d: cut %d of %d client means to %g x their median norm", server_round, cut, means, MEAN_NORM_FACTOR)
