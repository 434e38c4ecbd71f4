"""FedLog, FedLog-C and DP-FedLog (fedlog-extended §3.3–3.6): add the clients' sufficient
statistics and set the global head to the exact MAP of Eq. 12."""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from headway.core import protocol as P
from headway.core.aggregate import MIN_MEANS_TO_CLIP
from headway.core.config import ConfigError, body_names
from headway.core.data import DatasetSpec
from headway.core.fedlog import (
    MeansCut,
    StatsCheck,
    class_means,
    clip_class_means,
    dense_statistics,
    downlink_statistics,
    noise_sigma,
    share_sigma,
    solve_head,
    sum_rows,
)
from headway.core.models import common_width, nonnegative_features
from headway.core.settings import Settings
from headway.core.sum_bounds import count_problem
from headway.strategies.base import HeadwayStrategy, Step, TrainRound, mean_finite
from headway.strategies.engine import Engine
from headway.strategies.privacy import Release, fedlog_dp_report, release_for
from headway.strategies.replies import ArraySpec, Layout, Reply
from headway.strategies.secure_aggregation import SecureSum, SumSpec
from headway.strategies.services import Services
from headway.strategies.state import ServerState

log = logging.getLogger("headway")


@dataclass(frozen=True)
class FedLogState:
    """What FedLog's server keeps across rounds: the head η (float64), the last summed statistics Φ
    (FedLog-C sends them; None before the first sum) and the seconds each solve of Eq. 12 took."""

    eta: np.ndarray
    phi_sum: np.ndarray | None = None
    solve_seconds: tuple[float, ...] = ()


class FedLog(HeadwayStrategy[FedLogState]):
    """Bodies stay on the clients; the server turns summed statistics into the head η."""

    name = "fedlog"
    arrays_from_method = True  # η and FedLog-C's Φ as sent: head_record of the method state

    @classmethod
    def check_config(cls, settings: Settings, spec: DatasetSpec) -> None:
        """ConfigError when fedlog-beta leaves the loss without a minimum: Eq. 15's quadratic in φ has
        the coefficient α − β·(classes − 1) at worst, so unclipped features need β·(classes − 1) < α."""
        opts = settings.fedlog
        if opts.beta > 0 and opts.clip <= 0 and not opts.beta * (spec.num_classes - 1) < opts.alpha:
            raise ConfigError(
                f"run-config key 'fedlog-beta' is {opts.beta:g}: with {spec.num_classes} classes and unclipped features the loss "
                f"falls without bound unless beta x {spec.num_classes - 1} < fedlog-alpha ({opts.alpha:g}); "
                "lower fedlog-beta, raise fedlog-alpha, or set fedlog-clip > 0"
            )

    def __init__(self, settings: Settings, spec: DatasetSpec, services: Services):
        super().__init__(settings, spec, services)
        self.opts = self.settings.fedlog  # FedLog's own keys (fedlog-*)
        self.send_stats = self.opts.alpha > 0 or self.opts.beta > 0  # FedLog-C: clients need Φ's class means
        self.stats_only = self.opts.c_downlink == "stats"  # clients solve η from Φ themselves
        if spec.task != "classification":
            raise ConfigError(f"fedlog needs a classification data set; '{self.settings.dataset}' is {spec.task}")
        try:
            self.m = common_width(body_names(self.settings), spec.input_shape, self.settings.feature_dim) + 1  # plus the constant 1
        except ValueError as exc:
            raise ConfigError(f"fedlog: {exc}") from None
        self.classes = spec.num_classes
        self.local_dp = self.opts.dp == "local"
        self.sigma = noise_sigma(self.settings, self.m)
        self.dp_report = fedlog_dp_report(self.settings, self.m)  # at the start: a missing accountant stops the run before it trains
        bound = self.opts.clip if self.opts.clip > 0 else self.settings.max_feature_value
        self.half_up = self.opts.uplink_dtype == "float16"  # statistics come up as [count, means] rows
        precision = 2.0**-11 if self.half_up else 0.0  # float16's relative rounding of a mean
        self.nonnegative = all(nonnegative_features(b, spec.input_shape, self.settings.feature_dim) for b in body_names(self.settings))
        self.checker = StatsCheck(
            self.classes,
            self.m,
            bound,
            self.sigma if self.local_dp else 0.0,
            count_known=not self.local_dp,
            precision=precision,
            nonnegative=self.nonnegative,
        )
        # the sum as released: exact, or with central DP's noise
        self.release: Release = release_for(self.opts.dp, self.sigma, services.private)

    def body_problem(self, body: str) -> str | None:
        """A node's body must send this run's feature width (and non-negative features where the checks assume them)."""
        if problem := self.width_problem(body, self.m - 1):
            return problem
        if self.nonnegative and not nonnegative_features(body, self.spec.input_shape, self.settings.feature_dim):
            return f"registration names body {body!r}, whose features can be negative, but this run checks statistics for the non-negative features of {body_names(self.settings)}"
        return None

    def initial_method_state(self) -> FedLogState:
        """The seeded random η, no statistics yet."""
        eta = np.random.default_rng(self.settings.seed).normal(0.0, 1.0 / np.sqrt(self.m), size=(self.classes, self.m))
        return FedLogState(eta)

    def initial_arrays(self) -> ArrayRecord:
        """The initial η as sent."""
        return self.head_record(self.initial_method_state())

    def head_record(self, method: FedLogState) -> ArrayRecord:
        """η (and FedLog-C's Φ) of ``method`` as sent, in ``fedlog-wire-dtype``. Under float16, Φ goes as
        its class means (rows [1, Φ̄_y]: bounded like the features, where sums could overflow),
        which is all a client computes from it. Under fedlog-c-downlink=stats, once there is a sum:
        Φ (float32) alone, from which each client solves η (n is Φ's count column)."""
        if self.stats_only and method.phi_sum is not None:
            return ArrayRecord({P.STATS_SUM: Array(method.phi_sum.astype(np.float32))})
        arrays = {P.ETA: Array(self._wire(method.eta))}
        if self.send_stats and method.phi_sum is not None:
            phi = class_means(method.phi_sum) if self.opts.wire_dtype == "float16" else method.phi_sum
            arrays[P.STATS_SUM] = Array(self._wire(phi))
        return ArrayRecord(arrays)

    def _wire(self, values: np.ndarray) -> np.ndarray:
        """``values`` in the wire dtype; float32 where float16 would overflow (never silently inf)."""
        if self.opts.wire_dtype == "float16":
            half = values.astype(np.float16)
            if np.all(np.isfinite(half)):
                return half
            log.warning("fedlog: values beyond float16's range; sending this array as float32")
        return values.astype(np.float32)

    # ----- rounds ---------------------------------------------------------------
    def prepare(self, state: ServerState[FedLogState], engine: Engine) -> tuple[ServerState[FedLogState], Step[FedLogState] | None]:
        """fedlog-init=stats: one statistics round on the untrained bodies sets the first η."""
        if self.opts.init != "stats":
            return state, None
        ctx = TrainRound(0, engine, state)
        content = self.content(0, state.arrays, **{P.PHASE: P.PHASE_STATS})
        step = self.aggregation.step(self, P.PHASE_STATS, ctx, {n: content for n in engine.nodes()})
        if step.arrays is None:
            return state, step
        log.info("fedlog: first head from %d clients' statistics", step.clients)
        return state.advance(step), Step(step.arrays, step.clients, {"clients": float(step.clients)})

    def configure_train(
        self, server_round: int, state: ServerState[FedLogState], engine: Engine
    ) -> tuple[TrainRound[FedLogState], dict[int, RecordDict]]:
        """The state's arrays (η, and FedLog-C's Φ: :meth:`head_record` of its method state) to ``fraction-train`` of the clients."""
        content = self.content(server_round, state.arrays, **{P.PHASE: P.PHASE_TRAIN})
        return TrainRound(server_round, engine, state), {node: content for node in engine.sample(self.settings.fraction_train)}

    def train_layout(self, ctx: TrainRound[FedLogState]) -> Layout:
        """Statistics (classes × m; or, with fedlog-uplink=sparse, the rows of the classes a
        client holds, each after its class index; float32 sums, or with fedlog-uplink-dtype=float16
        [count, means] rows in float16 or, where a count needs it, float32) and, unless under local DP, the count
        and loss (under local DP a client releases nothing but its noised statistics)."""
        dtype = ("float16", "float32") if self.half_up else "float32"  # float16, or float32 where a count needs it
        if self.opts.uplink == "sparse":  # [class index, row of T] for the classes held
            sparse = {P.STATS_ROWS: ArraySpec(("rows", self.m + 1), dtype)}
            return Layout(sparse, count=True, optional=(P.LOSS,), check=self.check_statistics, dims={"rows": self.classes})
        arrays = {P.STATS: ArraySpec((self.classes, self.m), dtype)}
        if self.local_dp:
            return Layout(arrays, count=False, check=self.check_statistics)
        return Layout(arrays, count=True, optional=(P.LOSS,), check=self.check_statistics)

    def check_statistics(self, arrays: dict[str, np.ndarray], reply: Reply) -> tuple[np.ndarray | None, str | None]:
        """A reply's statistics as float64 sums (dense), or why they cannot be a client's real statistics."""
        if P.STATS_ROWS in arrays:
            stats, problem = dense_statistics(arrays[P.STATS_ROWS].astype(np.float64), self.classes)
            if stats is None:
                return None, problem
        else:
            stats = arrays[P.STATS].astype(np.float64)
        if self.half_up:  # rows are [count, feature means]: back to sums
            if np.any((stats[:, 0] == 0) & np.any(stats[:, 1:] != 0, axis=1)):
                return None, "a class with no examples has non-zero feature means"
            stats = sum_rows(stats)
        count = float(reply.count) if reply.count is not None else float(np.sum(stats[:, 0]))
        return stats, self.checker.problem(stats, count, reply.max_count)

    def aggregate_train(self, ctx: TrainRound[FedLogState], replies: list[Reply]) -> Step[FedLogState]:
        """Eq. 11's sum of the replies' statistics (each client's class means cut to honest scale first,
        outside DP: :meth:`bounded`), and the head it gives."""
        stats, cut = self.bounded(ctx.server_round, [r.payload for r in replies])
        phi = np.sum(stats, axis=0)  # Eq. 11
        if self.local_dp:
            n = max(float(np.sum(phi[:, 0])), 0.0)  # the noised count row: post-processing, no privacy cost
        else:
            n = float(sum(r.examples for r in replies))
        metrics = {} if self.local_dp else {"loss": mean_finite([r.metrics.get(P.LOSS, float("nan")) for r in replies])}
        if cut is not None:
            metrics |= {"fedlog_means_cut": float(cut.cut), "fedlog_mean_norm_ratio": cut.largest_ratio}
        return self.head_step(ctx, phi, n, len(replies), metrics)

    def bounded(self, server_round: int, stats: list[np.ndarray]) -> tuple[list[np.ndarray], MeansCut | None]:
        """``stats`` with each client's class means cut to fedlog's factor × an honest reference
        (core/fedlog.py: clip_class_means), logged; untouched under fedlog-dp (None), where a cut that
        depends on the other clients' data would void the noise's calibration and fedlog-clip bounds
        every feature, and under local DP the noised counts make no means."""
        if self.opts.dp != "off" or self.opts.mean_cut == 0:
            return stats, None
        kept, cut = clip_class_means(stats, self.opts.mean_cut)
        if cut.cut:
            log.warning(
                "fedlog round %d: cut %d of %d client class means to %g x their reference norm (largest %.3g x): a client far above the others (fedlog-mean-cut)",
                server_round,
                cut.cut,
                cut.bounded,
                self.opts.mean_cut,
                cut.largest_ratio,
            )
        if cut.unbounded:
            log.warning(
                "fedlog round %d: %d class(es) left uncut: fewer than %d clients replied, so no median can tell an honest mean from a lying one",
                server_round,
                cut.unbounded,
                MIN_MEANS_TO_CLIP,
            )
        return kept, cut

    def sum_spec(self, ctx: TrainRound[FedLogState], nodes: list[int]) -> SumSpec:
        """T (classes × m) of every client; |a sum| ≤ the examples the clients can hold times max(b, 1)
        (plus 16 std of the clients' noise under fedlog-dp=distributed)."""
        most = sum(ctx.engine.most_examples(v) for v in nodes)
        noise = 16.0 * share_sigma(self.settings, self.m) * math.sqrt(len(nodes))
        return SumSpec({P.STATS: (self.classes, self.m)}, float(most) * max(self.opts.clip, 1.0) + noise)

    def aggregate_sum(self, ctx: TrainRound[FedLogState], total: SecureSum) -> Step[FedLogState]:
        """The head from the securely summed T: the count row gives n (noised under fedlog-dp=distributed:
        post-processing); the sum must obey the bounds any real sum of these clients obeys (StatsCheck's
        per-class rules and, summed, the examples they can hold), or the round keeps the previous head."""
        phi = total.arrays[P.STATS]
        n = float(np.sum(phi[:, 0]))
        most = total.max_examples  # what the clients in the sum can hold together: a bound on its count row
        if self.opts.dp == "distributed":  # the sum carries every client's noise share: σ_share·√clients on each entry
            checker = replace(self.checker, noise_sigma=share_sigma(self.settings, self.m) * math.sqrt(len(total)), count_known=False)
            problem = checker.problem(phi, max(n, 0.0), most)  # the noised count row within 8 std of [0, most]
            n = max(n, 0.0)
        else:  # whole class counts, |T_cj| <= b·T_c0 (and >= 0 for ReLU bodies), and no more examples than the clients hold
            problem = self.checker.problem(phi, n) or count_problem(n, most)
        if problem:
            ctx.engine.meter.fail(
                f"secure sum of {len(total)} clients is not a sum of real statistics ({problem}); keeping the previous head"
            )
            return Step(None, 0)
        return self.head_step(ctx, phi, n, len(total), {f"secagg_server_cpu_{stage}": sec for stage, sec in total.cpu.items()})

    def head_step(
        self, ctx: TrainRound[FedLogState], phi: np.ndarray, n: float, clients: int, metrics: dict[str, float]
    ) -> Step[FedLogState]:
        """Eq. 12's head from the summed statistics ``phi`` of ``n`` examples, as released by the
        run's :attr:`release` (under central DP: noised once, n read from the noised count row)."""
        phi, n = self.release(phi, n)
        if self.stats_only:  # solve from the float32 Φ the clients get and its count column, so their η is this one
            phi, n = downlink_statistics(phi)
        t0 = time.perf_counter()
        eta = solve_head(phi, n, chi=self.opts.prior_chi, nu=self.opts.prior_nu)  # Eq. 12
        dt = time.perf_counter() - t0
        method = FedLogState(eta, phi, (*ctx.state.method.solve_seconds, dt))
        return Step(self.head_record(method), clients, {"solve_seconds": dt, **metrics}, method=method)

    def evaluate_arrays(self, state: ServerState[FedLogState]) -> ArrayRecord:
        """η alone (as the state's arrays hold it): what a client scores itself with; under
        fedlog-c-downlink=stats, once the arrays hold Φ instead, Φ (the client solves η)."""
        if P.ETA not in state.arrays:
            return ArrayRecord({P.STATS_SUM: state.arrays[P.STATS_SUM]})
        return ArrayRecord({P.ETA: state.arrays[P.ETA]})

    def summary_extra(self, engine: Engine, state: ServerState[FedLogState] | None) -> dict[str, Any]:
        """The variant, m, the prior, init, clip, the mean solve time and the DP report."""
        solves = state.method.solve_seconds if state is not None else ()
        extra: dict[str, Any] = {
            "variant": "fedlog-c" if self.send_stats else "fedlog",
            "m": self.m,
            "prior_nu": self.opts.prior_nu,
            "prior_chi": self.opts.prior_chi,
            "init": self.opts.init,
            "clip": self.opts.clip,
            "solve_seconds_mean": float(np.mean(solves)) if solves else None,
        }
        if self.dp_report is not None:
            extra["dp"] = {**self.dp_report, "noise": "OS entropy"}
        return extra
