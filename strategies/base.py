"""The shape every headway strategy shares: a method's round hooks, driven by the round
loop (:mod:`headway.strategies.round_loop`) on the round engine (:mod:`headway.strategies.engine`).

A strategy is built with the run's :class:`~headway.core.settings.Settings`, the data set's spec and its
:class:`~headway.strategies.services.Services`, and fails at construction (``ConfigError``) when
the config cannot work; it keeps only what the config fixes. What the server holds between
rounds is one frozen :class:`~headway.strategies.state.ServerState` (arrays and the method's own
state): each hook takes the current state and returns what it made, and the loop keeps the
next state. What one round's later hooks need from its first is the :class:`TrainRound` that
``configure_train`` returns:

- ``initial_state(arrays=None)`` → the :class:`ServerState` before round 1;
- ``prepare(state, engine)`` → ``(state, Step | None)``: work before round 1 (its bytes count in round 1);
- ``configure_train(rnd, state, engine)`` → ``(TrainRound, {node id: RecordDict})`` (content may differ per client);
- ``train_layout(ctx)`` → the :class:`~headway.strategies.replies.Layout` a training reply must match;
- ``aggregate_train(ctx, replies)`` → :class:`Step`: new arrays and method state (None: keep), clients used, metrics;
- ``train_round(rnd, state, engine)`` → :class:`Step`, for rounds shaped differently (several exchanges, relays);
- ``configure_evaluate`` / ``aggregate_evaluate`` likewise, for clients' local test scores;
- ``summary_extra(engine, state)`` → method figures for summary.json.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Generic

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, MessageType, RecordDict
from flwr.serverapp import Grid
from headway.core import protocol as P
from headway.core.config import body_names, fit_body
from headway.core.data import DatasetSpec
from headway.core.goal import reached
from headway.core.joining import parse_partition_ids
from headway.core.methods import METHODS
from headway.core.models import BODIES, build_model, common_width, is_custom_body
from headway.core.settings import Settings
from headway.core.training import predict, task_metrics
from headway.strategies.aggregation import Aggregation, aggregation_for
from headway.strategies.arrays import same_arrays
from headway.strategies.engine import Engine
from headway.strategies.evaluation import evaluation_figures, group_accuracies
from headway.strategies.participants import participants, train_counts
from headway.strategies.replies import Layout, Reply
from headway.strategies.services import Services
from headway.strategies.state import M, ServerState

log = logging.getLogger("headway")

RoundCallback = Callable[[dict[str, Any]], None]


@dataclass
class Step(Generic[M]):
    """What one step of a round produced: the new server arrays and method state (None: keep
    the old), how many clients' replies went into them, and figures for rounds.jsonl."""

    arrays: ArrayRecord | None
    clients: int
    metrics: dict[str, float] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)  # non-scalar figures, e.g. FedProf's scores by partition id
    scores: list[Reply] = field(default_factory=list)  # the previous round's model's test scores the train replies carried
    kept: bool = False  # a quorum came but the step kept the previous state (too few replies for the aggregation rule)
    method: M | None = None  # the method's next state (:attr:`ServerState.method`); None: unchanged


@dataclass(frozen=True)
class TrainRound(Generic[M]):
    """One training round as ``configure_train`` set it up, passed to the round's later hooks
    (``train_layout``, the reply check, ``aggregate_train``): the round, its engine, the
    server's state the round started from, the arrays sent (as numpy, what replies are checked
    and averaged against) and, under ``client-sampling=data-ratio``, how many times each node id was drawn."""

    server_round: int
    engine: Engine
    state: ServerState[M]
    sent: dict[str, np.ndarray] = field(default_factory=dict)
    draws: dict[int, int] = field(default_factory=dict)


def unknown_body(body: str, settings: Settings) -> str | None:
    """Why a node's declared ``body`` is not one this server may build, or None. Registry
    names are admitted; an import path or ``torchvision:`` name only when it is exactly one
    of the run config's own ``body``/``bodies`` (checked, imported, by ``headway.server.app.check_strategy``):
    what a node declares never makes the server import a module."""
    if body in BODIES:
        return None
    own = [b for b in body_names(settings) if is_custom_body(b)]
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


class HeadwayStrategy(Generic[M]):
    """Base strategy: subclasses set ``name`` (the method's name in :data:`headway.core.methods.METHODS`)
    and implement the hooks above, over their method state ``M`` (``FedLog(HeadwayStrategy[FedLogState])``;
    ``HeadwayStrategy[None]`` for a method that keeps none)."""

    name = "base"
    has_global_model = False  # one model for everyone: the server also scores it on the test set
    eval_metrics: tuple[str, ...] = ()  # extra "correct-<how>" counts an evaluation reply may carry
    arrays_from_method = False  # the arrays are what the method state makes (FedLog's η, FedProto's prototypes): no other may be given

    def __init__(self, settings: Settings, spec: DatasetSpec, services: Services):
        # body=auto: the body that fits these inputs (headway.server.app.build_strategy did it already)
        self.settings = fit_body(settings, spec.input_shape)
        self.spec = spec
        self.services = services
        self.aggregation: Aggregation = aggregation_for(self.settings.secure_aggregation, self)  # plain, or SecAgg+ around aggregate_sum

    # ----- set-up ---------------------------------------------------------------
    @classmethod
    def check_config(cls, settings: Settings, spec: DatasetSpec) -> None:
        """ConfigError when this method cannot run ``settings`` on data of ``spec``, checked before
        the strategy is built and any client asked (``headway.server.app.check_strategy``); default: nothing."""

    def initial_arrays(self) -> ArrayRecord:
        """What the server sends before round 1 (a model, a head, or nothing)."""
        return ArrayRecord()

    def initial_method_state(self) -> M:
        """The method's own state before round 1."""
        raise NotImplementedError

    def initial_state(self, arrays: ArrayRecord | None = None) -> ServerState[M]:
        """The server's state before round 1: ``arrays`` (default :meth:`initial_arrays`) and the method's initial state.
        ValueError when the method makes its arrays from its state (:attr:`arrays_from_method`) and ``arrays`` are not those:
        the arrays and the state would then disagree on what the server holds."""
        own = self.initial_arrays()
        if arrays is not None and self.arrays_from_method and not same_arrays(arrays, own):
            raise ValueError(
                f"{self.name} sends what its method state makes ({', '.join(own) or 'nothing'} before round 1): no other initial arrays may be given"
            )
        return ServerState(own if arrays is None else arrays, self.initial_method_state())

    def body_problem(self, body: str) -> str | None:
        """Why a node that registers with ``body`` cannot take part in this run, or None.
        Default: the body must be one this server can build (a typo in a SuperNode's
        ``--node-config body=...`` is refused for that node, not fatal to the run)."""
        return unknown_body(body, self.settings)

    def width_problem(self, body: str, width: int) -> str | None:
        """Why ``body`` (a known one) cannot send ``width`` features in this run, or None;
        for methods whose replies are sized by the feature width (FedLog, FedProto)."""
        if (problem := unknown_body(body, self.settings)) is not None:
            return problem
        try:
            got = _body_width(body, tuple(self.spec.input_shape), self.settings.feature_dim)
        except Exception as exc:
            return f"registration names body {body!r}, which cannot be built for this data set: {exc}"
        if got != width:
            return f"registration names body {body!r} with {got} features, but this run's replies carry {width}: set feature-dim or run a body of that width"
        return None

    def summary_extra(self, engine: Engine, state: ServerState[M] | None) -> dict[str, Any]:
        """Method-specific figures for summary.json, from the run on ``engine`` and its last ``state``
        (None: the run stopped before it had one)."""
        return {}

    def train_counts(self, engine: Engine) -> dict[int, int]:
        """Training rows of every client (partition id -> rows): the partition's sizes where the server
        holds the data, else what the registered nodes declared (dataset=local); empty when neither is known."""
        return train_counts(self.services, engine)

    def participants(self, engine: Engine) -> dict[str, Any]:
        """Who took part, for summary.json (:func:`headway.strategies.participants.participants`)."""
        return participants(engine, self.train_counts(engine))

    def config(self, server_round: int, **fields: Any) -> ConfigRecord:
        """The config record of a message of ``server_round``, with ``fields``."""
        return ConfigRecord({P.ROUND: server_round, **fields})

    def content(self, server_round: int, arrays: ArrayRecord, **fields: Any) -> RecordDict:
        """A message's content: ``arrays`` and the config record (:meth:`config`)."""
        return RecordDict({P.ARRAYS: arrays, P.CONFIG: self.config(server_round, **fields)})

    # ----- hooks ----------------------------------------------------------------
    def prepare(self, state: ServerState[M], engine: Engine) -> tuple[ServerState[M], Step[M] | None]:
        """Work before round 1 (default: none): the state round 1 starts from, and what the work did."""
        return state, None

    def configure_train(self, server_round: int, state: ServerState[M], engine: Engine) -> tuple[TrainRound[M], dict[int, RecordDict]]:
        """The round's context and what each chosen node is sent. Default: ``fraction-train``
        of the clients, all sent the state's arrays."""
        content = self.content(server_round, state.arrays)
        return TrainRound(server_round, engine, state), {node: content for node in engine.sample(self.settings.fraction_train)}

    def train_layout(self, ctx: TrainRound[M]) -> Layout:
        """The layout a training reply of round ``ctx`` must match."""
        raise NotImplementedError

    def aggregate_train(self, ctx: TrainRound[M], replies: list[Reply]) -> Step[M]:
        """The step from the round's valid training replies (a quorum of them)."""
        raise NotImplementedError

    def received(self, ctx: TrainRound[M], contents: Mapping[int, RecordDict], replies: list[Reply]) -> TrainRound[M]:
        """What the method learns from a round's valid ``replies`` to ``contents``, quorum or not (e.g.
        FedProf's fresh profiles): the context, with the state, its later hooks see (default: unchanged)."""
        return ctx

    def train_round(self, server_round: int, state: ServerState[M], engine: Engine) -> Step[M]:
        """Configure, then the run's aggregation (:mod:`headway.strategies.aggregation`): exchange, quorum,
        aggregate; a failed round's step keeps the state."""
        ctx, contents = self.configure_train(server_round, state, engine)
        return self.aggregation.step(self, P.PHASE_TRAIN, ctx, contents)

    def evaluate_arrays(self, state: ServerState[M]) -> ArrayRecord:
        """What clients need to score themselves (default: the server's arrays)."""
        return state.arrays

    def configure_evaluate(self, server_round: int, state: ServerState[M], engine: Engine) -> dict[int, RecordDict]:
        """Every available client scores itself on its own test split."""
        content = self.content(server_round, self.evaluate_arrays(state), **{P.PHASE: P.PHASE_EVALUATE})
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
        """Sample-weighted mean of clients' local test metrics: Σ correct / Σ examples (join-clients: also per group)."""
        out = evaluation_figures(replies, self.spec.task, self.eval_metrics)
        if self.settings.join_clients and self.spec.task == "classification":
            out.update(group_accuracies(replies, parse_partition_ids(self.settings.join_clients)))
        return out

    def evaluate_round(self, server_round: int, state: ServerState[M], engine: Engine) -> dict[str, float]:
        """Every available client scores the server's ``state`` on its own test split: the round's figures."""
        contents = self.configure_evaluate(server_round, state, engine)
        replies = engine.exchange(P.PHASE_EVALUATE, contents, MessageType.EVALUATE, self.eval_layout(), split="test")
        return self.aggregate_evaluate(server_round, replies)

    def evaluated(self, server_round: int, state: ServerState[M], figures: Mapping[str, Any]) -> tuple[ServerState[M], dict[str, Any]]:
        """After round ``server_round``'s evaluation ``figures`` (empty when it was not scored): the state the next round starts
        from and what the round's record adds; ``stop`` among them ends the run after this round (here: ``goal-accuracy`` reached)."""
        return state, ({"stop": "goal-accuracy"} if reached(figures, self.settings.goal_accuracy) else {})

    def final_evaluation(self, state: ServerState[M], engine: Engine) -> dict[str, float]:
        """Extra evaluation after the last round (default: none), such as LG-FedAvg's new test."""
        return {}

    def global_evaluation(self, state: ServerState[M]) -> dict[str, float]:
        """The single global model scored on the whole test set, where one exists and the
        server holds the data (``global-eval``)."""
        if not (self.has_global_model and self.settings.global_eval):
            return {}
        test = self.services.data.test_tensors()
        if test is None:
            return {}
        model = build_model(
            self.settings.body,
            self.spec.input_shape,
            self.settings.feature_dim,
            self.spec.num_classes,
            self.settings.seed,
            self.settings.body_dropout,
        )
        model.load_state_dict(state.arrays.to_torch_state_dict())
        s = task_metrics(self.spec.task, predict(model.eval(), test[0]), test[1])
        return {f"global_{k}": v for k, v in s.items()}

    # ----- the run ----------------------------------------------------------------
    def connect(self, grid: Grid) -> Engine:
        """The run's engine on ``grid``, made once per run: a node registers only with a body
        :meth:`body_problem` admits. Every hook that needs it is given it."""
        return Engine(grid, self.settings, self.services, admit=self.body_problem)

    def start(self, grid: Grid, initial_arrays: ArrayRecord, num_rounds: int, on_round: RoundCallback | None = None) -> Engine:
        """Run ``num_rounds`` rounds on ``grid`` from ``initial_arrays`` (see :meth:`run`); returns the
        run's engine (its registry says who took part: :meth:`participants`). A caller that needs the
        engine or the last state when the run raises (the ServerApp, for summary.json) runs a
        :class:`~headway.strategies.round_loop.RoundLoop` itself."""
        engine = self.connect(grid)
        self.run(engine, self.initial_state(initial_arrays), num_rounds, on_round)
        return engine

    def run(self, engine: Engine, state: ServerState[M], num_rounds: int, on_round: RoundCallback | None = None) -> ServerState[M]:
        """Run ``num_rounds`` rounds on ``engine`` from ``state`` (:class:`~headway.strategies.round_loop.RoundLoop`);
        after each, call ``on_round`` with the round's record. Returns the server's last state."""
        from headway.strategies.round_loop import RoundLoop  # the loop drives strategies: it imports this module

        return RoundLoop(self, engine, on_round).run(state, num_rounds)

    def summary(self) -> None:
        """Log the method's own run-config keys (those its declaration in :data:`headway.core.methods.METHODS` names),
        at DEBUG (``headway run --verbose``): config.json holds them for every run."""
        keys = METHODS[self.name].keys if self.name in METHODS else {}
        log.debug("strategy %s: %s", self.name, {k: self.settings.value(k) for k in keys})
