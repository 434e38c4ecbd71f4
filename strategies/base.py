"""The shape every headway strategy shares: a method's round hooks, driven by the round
engine (:mod:`strategies.engine`).

A strategy is built with the resolved config, the data set's spec and its
:class:`~strategies.services.Services`, and fails at construction (``ConfigError``) when
the config cannot work. Each hook takes what it needs as arguments and returns what it
made; what one round's later hooks need from its first is the :class:`TrainRound` that
``configure_train`` returns, never a field of the strategy:

- ``configure_train(rnd, arrays, engine)`` → ``(TrainRound, {node id: RecordDict})`` (content may differ per client);
- ``train_layout(ctx)`` → the :class:`~strategies.replies.Layout` a training reply must match;
- ``aggregate_train(ctx, replies)`` → :class:`Step` (new arrays or None, clients used, metrics);
- ``configure_evaluate`` / ``aggregate_evaluate`` likewise, for clients' local test scores;
- ``prepare(arrays, engine)`` for work before round 1 (its bytes count in round 1) and
  ``train_round`` for rounds shaped differently (several exchanges, relays).

Fields a strategy keeps across rounds (a model, a head, FedProf's baselines) are set in
``__init__`` and changed by ``prepare``/``aggregate_*``; what it keeps per client lives in
the engine's registry, one dataclass per method (:meth:`~strategies.engine.ClientRegistry.state`).

Why this is not a subclass of Flower's ``flwr.serverapp.strategy.Strategy``: a headway
round is run by the strategy itself through the engine (metered exchanges, reply layouts
checked per client, deadlines per exchange and per relay hop, registration of nodes as
partitions), so its hooks take and return headway's types, not the Messages Flower's
loop builds for a Grid. Subclassing Flower's class while changing every hook signature
and ignoring ``start``'s ``timeout``/``evaluate_fn`` would promise a contract the class
does not keep; honouring it would put the engine back inside Flower's loop. So
:class:`HeadwayStrategy` is a plain class, and :meth:`HeadwayStrategy.start` takes only
what it honours: the grid, the initial arrays, the number of rounds and a per-round callback.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType, RecordDict
from flwr.serverapp import Grid

from core import protocol as P
from core.config import body_names, fit_body, scores_with_train
from core.data import DatasetSpec
from core.methods import METHODS
from core.models import BODIES, build_model, common_width, is_custom_body
from core.partition import counts_line, empty_note
from core.training import predict, task_metrics
from strategies.engine import Engine, RoundFailed, RoundMeter
from strategies.replies import Layout, Reply
from strategies.secure_aggregation import SecureSum, SumSpec, secure_sum
from strategies.services import Services

log = logging.getLogger("headway")

RoundCallback = Callable[[dict[str, Any]], None]

# rounds.jsonl figures that are counts: written as whole numbers, though method metrics arrive as floats
COUNT_FIELDS = ("prepare_clients", "eval_clients", "test_examples", "chain_hops", "synthetic_examples")


@dataclass
class Step:
    """What one step of a round produced: the new server arrays (None: keep the old),
    how many clients' replies went into them, and figures for rounds.jsonl."""

    arrays: ArrayRecord | None
    clients: int
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)  # non-scalar figures, e.g. FedProf's scores by partition id
    scores: list[Reply] = field(default_factory=list)  # the previous round's model's test scores the train replies carried
    kept: bool = False  # a quorum came but the step kept the previous state (too few replies for the aggregation rule)


@dataclass(frozen=True)
class TrainRound:
    """One training round as ``configure_train`` set it up, passed to the round's later hooks
    (``train_layout``, the reply check, ``aggregate_train``): the round, its engine, the
    arrays sent (as numpy, what replies are checked and averaged against) and, under
    ``client-sampling=data-ratio``, how many times each node id was drawn."""

    server_round: int
    engine: Engine
    sent: dict[str, np.ndarray] = field(default_factory=dict)
    draws: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Pending:
    """A finished round waiting for its record (client-evaluation=with-next-train: for the
    scores the next round's train replies carry): what :meth:`HeadwayStrategy._round_record` takes."""

    round: int
    step: Step
    figures: dict[str, Any]
    meter: RoundMeter
    seconds: float
    elapsed: float
    aggregated: bool
    expected: list[int] = field(default_factory=list)  # partitions the evaluation exchange would have asked


def unknown_body(body: str, cfg: Mapping[str, Any]) -> str | None:
    """Why a node's declared ``body`` is not one this server may build, or None. Registry
    names are admitted; an import path or ``torchvision:`` name only when it is exactly one
    of the run config's own ``body``/``bodies`` (checked, imported, by ``server.app.check_strategy``):
    what a node declares never makes the server import a module."""
    if body in BODIES:
        return None
    own = [b for b in body_names(cfg) if is_custom_body(b)]
    if is_custom_body(body):
        if body in own:
            return None
        return (
            f"registration names body {body!r}, an import path or torchvision body that is not one of this run config's own "
            f"body/bodies ({', '.join(own) or 'none'}): the server builds only those, and imports nothing a node names"
        )
    return f"registration names body {body!r}, which this server does not know; known bodies: {', '.join(sorted(BODIES) + own)}"


@lru_cache(maxsize=64)
def _body_width(body: str, input_shape: tuple[int, ...], m: int) -> int:
    """The feature width of ``body`` on ``input_shape``, building each body once per process
    (registration asks it for every node)."""
    return common_width([body], input_shape, m)


def mean_finite(values: list[float]) -> float:
    """Mean of the finite values (NaN when there are none): one NaN loss cannot poison it."""
    finite = [v for v in values if np.isfinite(v)]
    return float(np.mean(finite)) if finite else float("nan")


class HeadwayStrategy:
    """Base strategy: subclasses set ``name`` (the method's name in :data:`core.methods.METHODS`)
    and implement the hooks above."""

    name = "base"
    has_global_model = False  # one model for everyone: the server also scores it on the test set
    eval_metrics: tuple[str, ...] = ()  # extra "correct-<how>" counts an evaluation reply may carry

    def __init__(self, cfg: dict[str, Any], spec: DatasetSpec, services: Services):
        fit_body(cfg, spec.input_shape)  # body=auto: the body that fits these inputs (server.app.build_strategy did it already)
        self.cfg = cfg
        self.spec = spec
        self.services = services
        self._counts: dict[int, int] = {}  # partition id -> training rows, refreshed each round (train_counts)

    # ----- set-up ---------------------------------------------------------------
    @classmethod
    def check_config(cls, cfg: Mapping[str, Any], spec: DatasetSpec) -> None:
        """ConfigError when this method cannot run ``cfg`` on data of ``spec``, checked before
        the strategy is built and any client asked (``server.app.check_strategy``); default: nothing."""

    def initial_arrays(self) -> ArrayRecord:
        """What the server holds before round 1 (a model, a head, or nothing)."""
        return ArrayRecord()

    def body_problem(self, body: str) -> str | None:
        """Why a node that registers with ``body`` cannot take part in this run, or None.
        Default: the body must be one this server can build (a typo in a SuperNode's
        ``--node-config body=...`` is refused for that node, not fatal to the run)."""
        return unknown_body(body, self.cfg)

    def width_problem(self, body: str, width: int) -> str | None:
        """Why ``body`` (a known one) cannot send ``width`` features in this run, or None;
        for methods whose replies are sized by the feature width (FedLog, FedProto)."""
        if (problem := unknown_body(body, self.cfg)) is not None:
            return problem
        try:
            got = _body_width(body, tuple(self.spec.input_shape), self.cfg["feature-dim"])
        except Exception as exc:
            return f"registration names body {body!r}, which cannot be built for this data set: {exc}"
        if got != width:
            return f"registration names body {body!r} with {got} features, but this run's replies carry {width}: set feature-dim or run a body of that width"
        return None

    def summary_extra(self, engine: Engine) -> dict[str, Any]:
        """Method-specific figures for summary.json, after (or part of) the run on ``engine``."""
        return {}

    def train_counts(self, engine: Engine) -> dict[int, int]:
        """Training rows of every client (partition id -> rows): the partition's sizes where the server
        holds the data, else what the registered nodes declared (dataset=local); empty when neither is known."""
        sizes = self.services.data.partition_sizes
        if sizes is not None:
            return {pid: train for pid, (train, _) in enumerate(sizes)}
        counts = {c.partition_id: c.declared_count("train") for c in engine.registry.clients.values()}
        return {pid: n for pid, n in sorted(counts.items()) if n is not None}

    def participants(self, engine: Engine) -> dict[str, Any]:
        """Who took part, for summary.json: partition id -> body, refused nodes' reasons, and every
        client's training rows (``train_examples``, partition id -> rows, where known)."""
        clients = sorted(engine.registry.clients.values(), key=lambda c: c.partition_id)
        out: dict[str, Any] = {
            "participants": {str(c.partition_id): c.body for c in clients},
            "refused_nodes": sorted(engine.registry.refused.values()),
            "train_examples": {str(pid): n for pid, n in self.train_counts(engine).items()},
        }
        declared = {
            str(c.partition_id): {
                "classes": c.declared,
                "train_examples": c.declared_count("train"),
                "test_examples": c.declared_count("test"),
            }
            for c in clients
            if c.declared is not None
        }
        if declared:  # dataset=local: what each node said its own data holds (class -> [train, test])
            out["declared_data"] = declared
        return out

    def config(self, server_round: int, **fields: Any) -> ConfigRecord:
        return ConfigRecord({P.ROUND: server_round, **fields})

    def content(self, server_round: int, arrays: ArrayRecord, **fields: Any) -> RecordDict:
        return RecordDict({P.ARRAYS: arrays, P.CONFIG: self.config(server_round, **fields)})

    # ----- hooks ----------------------------------------------------------------
    def prepare(self, arrays: ArrayRecord, engine: Engine) -> tuple[ArrayRecord, Step | None]:
        """Work before round 1 (default: none)."""
        return arrays, None

    def configure_train(self, server_round: int, arrays: ArrayRecord, engine: Engine) -> tuple[TrainRound, dict[int, RecordDict]]:
        """The round's context and what each chosen node is sent. Default: ``fraction-train``
        of the clients, all sent ``arrays``."""
        content = self.content(server_round, arrays)
        return TrainRound(server_round, engine), {node: content for node in engine.sample(self.cfg["fraction-train"])}

    def train_layout(self, ctx: TrainRound) -> Layout:
        raise NotImplementedError

    def aggregate_train(self, ctx: TrainRound, replies: list[Reply]) -> Step:
        raise NotImplementedError

    def sum_spec(self, ctx: TrainRound, nodes: list[int]) -> SumSpec:
        """What the clients add up under secure-aggregation (a method declared ``secure_sum``), and the bound on the sum."""
        raise NotImplementedError

    def aggregate_sum(self, ctx: TrainRound, total: SecureSum) -> Step:
        """The step from the securely summed replies (a method declared ``secure_sum``)."""
        raise NotImplementedError

    def secure_step(self, phase: str, ctx: TrainRound, contents: Mapping[int, RecordDict]) -> Step:
        """One exchange under secure-aggregation: SecAgg+ over ``contents``, quorum on the clients in the sum, aggregate."""
        total = secure_sum(ctx.engine, phase, contents, self.sum_spec(ctx, sorted(contents)))
        if total is None or not ctx.engine.quorum(phase, total):
            return Step(None, len(total) if total is not None else 0)
        return self.aggregate_sum(ctx, total)

    def train_round(self, server_round: int, arrays: ArrayRecord, engine: Engine) -> Step:
        """Configure, exchange, check quorum, aggregate (a failed round keeps ``arrays``)."""
        ctx, contents = self.configure_train(server_round, arrays, engine)
        if self.cfg["secure-aggregation"] != "off":
            return self.secure_step(P.PHASE_TRAIN, ctx, contents)
        layout = self.train_layout(ctx)
        if scores_with_train(self.cfg, server_round):  # each reply also scores the model it received, as an evaluation reply would
            layout = replace(layout, scores=self.eval_layout())
        replies = engine.exchange(P.PHASE_TRAIN, contents, MessageType.TRAIN, layout)
        scores = [r.scores for r in replies if r.scores is not None]
        if not engine.quorum(P.PHASE_TRAIN, replies):
            return Step(None, len(replies), scores=scores)
        return replace(self.aggregate_train(ctx, replies), scores=scores)

    def evaluate_arrays(self, arrays: ArrayRecord) -> ArrayRecord:
        """What clients need to score themselves (default: the server's arrays)."""
        return arrays

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, engine: Engine) -> dict[int, RecordDict]:
        """Every available client scores itself on its own test split."""
        content = self.content(server_round, self.evaluate_arrays(arrays), **{P.PHASE: P.PHASE_EVALUATE})
        return {node: content for node in engine.nodes()}

    def eval_layout(self) -> Layout:
        """An evaluation reply: test count, correct predictions (or squared error), loss."""
        scored = P.CORRECT if self.spec.task == "classification" else P.SQUARED_ERROR
        return Layout(None, count=True, metrics=(scored,), optional=(P.LOSS, *self.eval_metrics), check=self._check_scores)

    def _check_scores(self, arrays: dict, reply: Reply) -> tuple[None, str | None]:
        n = reply.count or 0
        for name, value in reply.metrics.items():
            if name == P.CORRECT or name.startswith(P.CORRECT + "-"):
                if value < 0 or value != int(value) or value > n:
                    return None, f"metric {name!r} is {value:g}, not a whole number in [0, num-examples={n}]"
            if name == P.SQUARED_ERROR and value < 0:
                return None, f"metric {name!r} is {value:g}, below 0"
        return None, None

    def aggregate_evaluate(self, server_round: int, replies: list[Reply]) -> dict[str, float]:
        """Sample-weighted mean of clients' local test metrics: Σ correct / Σ examples."""
        counted = [r for r in replies if r.count]
        total = float(sum(r.examples for r in counted))
        if total == 0:
            return {}
        losses = [(r.metrics[P.LOSS], r.examples) for r in counted if P.LOSS in r.metrics]
        out: dict[str, float] = {"eval_clients": len(counted), "test_examples": int(total)}
        if losses:
            out["loss"] = float(sum(v * n for v, n in losses) / sum(n for _, n in losses))
        if self.spec.task != "classification":
            out["mse"] = sum(r.metrics[P.SQUARED_ERROR] for r in counted) / total
            return out
        per_client = [r.metrics[P.CORRECT] / r.examples for r in counted]
        out["accuracy"] = sum(r.metrics[P.CORRECT] for r in counted) / total
        out["accuracy_client_mean"] = float(np.mean(per_client))
        out["accuracy_client_min"] = float(np.min(per_client))
        for name in self.eval_metrics:  # e.g. FedProto's correct-head -> accuracy_head
            have = [r for r in counted if name in r.metrics]
            if have:
                out["accuracy_" + name[len(P.CORRECT) + 1 :]] = sum(r.metrics[name] for r in have) / sum(r.examples for r in have)
        return out

    def evaluate_round(self, server_round: int, arrays: ArrayRecord, engine: Engine) -> dict[str, float]:
        contents = self.configure_evaluate(server_round, arrays, engine)
        replies = engine.exchange(P.PHASE_EVALUATE, contents, MessageType.EVALUATE, self.eval_layout(), split="test")
        return self.aggregate_evaluate(server_round, replies)

    def final_evaluation(self, arrays: ArrayRecord, engine: Engine) -> dict[str, float]:
        """Extra evaluation after the last round (default: none), such as LG-FedAvg's new test."""
        return {}

    def global_evaluation(self, arrays: ArrayRecord) -> dict[str, float]:
        """The single global model scored on the whole test set, where one exists and the
        server holds the data (``global-eval``)."""
        if not (self.has_global_model and self.cfg["global-eval"]):
            return {}
        test = self.services.data.test_tensors()
        if test is None:
            return {}
        model = build_model(
            self.cfg["body"],
            self.spec.input_shape,
            self.cfg["feature-dim"],
            self.spec.num_classes,
            self.cfg["seed"],
            self.cfg["body-dropout"],
        )
        model.load_state_dict(arrays.to_torch_state_dict())
        s = task_metrics(self.spec.task, predict(model.eval(), test[0]), test[1])
        return {f"global_{k}": v for k, v in s.items()}

    # ----- the run ----------------------------------------------------------------
    def connect(self, grid: Grid) -> Engine:
        """The run's engine on ``grid``, made once per run: a node registers only with a body
        :meth:`body_problem` admits. Every hook that needs it is given it."""
        return Engine(grid, self.cfg, self.services, admit=self.body_problem)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int, on_round: RoundCallback | None = None) -> Engine:
        """Run ``num_rounds`` rounds on ``grid`` (see :meth:`run`); returns the run's engine
        (its registry says who took part: :meth:`participants`). A caller that needs the
        engine when the run raises (the ServerApp, for summary.json) calls
        :meth:`connect` and :meth:`run` itself."""
        engine = self.connect(grid)
        self.run(engine, initial_arrays, num_rounds, on_round)
        return engine

    def run(self, engine: Engine, initial_arrays: ArrayRecord, num_rounds: int, on_round: RoundCallback | None = None) -> ArrayRecord:
        """Run ``num_rounds`` rounds on ``engine``; after each, call ``on_round`` with the
        round's record. Returns the server's last arrays. Deadlines and settings come from
        the run config. Raises :class:`RoundFailed` when round 1 (or the work before it)
        gets no valid reply."""
        self.summary()
        arrays = initial_arrays
        started = time.monotonic()
        engine.wait_for_clients()
        pending: _Pending | None = None  # a round whose clients' scores come with the next round's train replies
        try:
            for rnd in range(1, num_rounds + 1):
                t0 = time.monotonic()
                engine.begin_round(rnd)
                if not engine.registry.clients:
                    raise RoundFailed(self._first_reason(engine.meter, "no client registered"))
                self._counts = self.train_counts(engine)  # after registration: dataset=local nodes declare theirs there
                if rnd == 1:
                    log.info("%s (train-fraction=%g)", counts_line(list(self._counts.values())), self.cfg["train-fraction"])
                    if empty := empty_note(list(self._counts.values())):  # most empty is refused before the run (core.partition)
                        log.warning("%s", empty)
                extra: dict[str, float] = {}
                prep: Step | None = None
                if rnd == 1:
                    arrays, prep = self.prepare(arrays, engine)
                    if prep is not None:
                        if prep.clients == 0:
                            raise RoundFailed(self._first_reason(engine.meter, "the work before round 1 got no valid reply"))
                        extra.update({f"prepare_{k}": v for k, v in prep.metrics.items()})
                step = self.train_round(rnd, arrays, engine)
                if pending is not None:
                    waiting, pending = pending, None  # emitted once, even if the callback raises
                    self._emit(waiting, self.carried_scores(waiting, step.scores), on_round)
                if rnd == 1 and step.clients == 0:
                    raise RoundFailed(self._first_reason(engine.meter, "every client failed in round 1"))
                if step.arrays is not None:
                    arrays = step.arrays
                every = self.cfg["eval-every"]
                due = rnd == num_rounds or bool(every and rnd % every == 0)
                carried = due and scores_with_train(self.cfg, rnd + 1)
                evaluation = self.evaluate_round(rnd, arrays, engine) if due and not carried else {}
                if rnd == num_rounds:
                    evaluation.update(self.final_evaluation(arrays, engine))
                evaluation.update(self.global_evaluation(arrays))
                # whether the server's state moved this round: new arrays, or (no arrays to return, e.g. FedPFT's chain) a quorum of
                # replies; round 1 also counts a first model built before it (FedLog's statistics round)
                aggregated = bool(
                    step.arrays is not None
                    or (step.clients >= self.cfg["min-replies"] and not step.kept)
                    or (rnd == 1 and prep is not None and prep.arrays is not None)
                )
                done = _Pending(
                    rnd, step, {**extra, **evaluation}, engine.end_round(), time.monotonic() - t0, time.monotonic() - started, aggregated
                )
                if carried:
                    pending = replace(done, expected=sorted(engine.partition_of(n) for n in engine.nodes()))
                else:
                    self._emit(done, {}, on_round)
        except BaseException:
            if pending is not None:  # the round after it failed: its record still goes out, without the scores it waited for
                self._emit(pending, {"eval_missing_partitions": pending.expected}, on_round)  # type: ignore[dict-item]
            raise
        return arrays

    def carried_scores(self, pending: _Pending, scores: list[Reply]) -> dict[str, Any]:
        """Round ``pending.round``'s evaluation figures from the scores the next round's train replies
        carried, and the partitions the evaluation exchange would have asked that sent none."""
        figures: dict[str, Any] = dict(self.aggregate_evaluate(pending.round, scores))
        missing = sorted(set(pending.expected) - {r.partition_id for r in scores})
        if missing:
            figures["eval_missing_partitions"] = missing
        return figures

    def _emit(self, done: _Pending, evaluation: Mapping[str, Any], on_round: RoundCallback | None) -> None:
        record = self._round_record(done.round, done.step, {**done.figures, **evaluation}, done.meter, done.seconds, done.elapsed)
        record["aggregated"] = done.aggregated
        if on_round is not None:
            on_round(record)

    @staticmethod
    def _first_reason(meter: RoundMeter, what: str) -> str:
        return f"{what}; first failure: {meter.failures[0]}" if meter.failures else what

    def _round_record(
        self, rnd: int, step: Step, figures: Mapping[str, float], meter: RoundMeter, seconds: float, elapsed: float
    ) -> dict[str, Any]:
        down, up = meter.cost()
        values_down, values_up = meter.cost(values=True)
        used = meter.selected - set(meter.failed)  # the selected clients whose training replies arrived valid
        missing = {str(p): meter.failed[p] for p in sorted(meter.failed) if p in meter.selected}
        missing.update({str(p): "not connected" for p in meter.absent if p not in meter.selected})
        record: dict[str, Any] = {
            "round": rnd,
            "accuracy": figures.get("accuracy"),
            "bytes_down": down,
            "bytes_up": up,
            "values_bytes_down": values_down,
            "values_bytes_up": values_up,
            "clients": step.clients,
            "selected": sorted(meter.selected),
            # training rows in all (each client's: summary.json's train_examples): of the clients whose replies were used, and of every selected one
            "train_examples": self._rows(used) if self._counts else None,
            "selected_train_examples": self._rows(meter.selected) if self._counts else None,
            "registered_clients": meter.registered,
            "missing_clients": missing,
            "failures": len(meter.failures),
            "failure_reasons": meter.failures[:20],
            "absent": len(meter.absent),
            "absent_partitions": list(meter.absent),
            "seconds": seconds,
            "elapsed_seconds": elapsed,
        }
        for phase in sorted(meter.bytes):
            if phase == P.PHASE_TRAIN:
                continue
            prefix = "eval" if phase == P.PHASE_EVALUATE else phase.replace("-model", "").replace("-", "_")  # secagg-setup: secagg_setup
            record[f"{prefix}_bytes_down"], record[f"{prefix}_bytes_up"] = meter.phase(phase)
        if meter.rejected_bytes_up:
            record["rejected_bytes_up"] = meter.rejected_bytes_up
        record.update({f"rejected_{name}s": values for name, values in meter.rejected_figures.items()})
        record.update({k: v for k, v in figures.items() if k != "accuracy"})
        record.update({f"train_{k}" if k in ("loss",) else k: v for k, v in step.metrics.items()})
        record.update(step.details)
        for key in COUNT_FIELDS:  # whole counts as ints (metrics travel as floats: 10.0 clients)
            value = record.get(key)
            if isinstance(value, float) and value.is_integer():
                record[key] = int(value)
        return record

    def _rows(self, partitions: set[int]) -> int:
        """The training rows of ``partitions`` in all (those whose count is known)."""
        return sum(self._counts[p] for p in partitions if p in self._counts)

    def summary(self) -> None:
        """Log the method's own run-config keys (those its declaration in :data:`core.methods.METHODS` names),
        at DEBUG (``headway run --verbose``): config.json holds them for every run."""
        keys = METHODS[self.name].keys if self.name in METHODS else {}
        log.debug("strategy %s: %s", self.name, {k: self.cfg[k] for k in keys})
