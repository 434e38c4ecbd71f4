"""FedProf (Wu et al., Alg. 1): FedAvg whose clients are sampled with probability λ_k/Λ,
λ_k = exp(−α · div(RP_k, RP^B)), the divergence of a client's representation profile from
the server's baseline profile of the same global model version on its validation set D^V.

Before round 1 every client profiles the initial model (line 4). Each round K clients are
drawn without replacement by score (:mod:`headway.core.sampling`); only they refresh their
profiles, an unselected client keeps its last score. Aggregation is ``full`` (an
unselected client counts with the current global model), ``full-cache`` (with its last
local model, which the server keeps: N models in server memory) or ``partial``. The maths
lives in :mod:`headway.core.profiles`.

What a client cannot game (issue 23, item 4):

- D^V is a private draw. The rows the server holds out (``fedprof-val-size``, drawn by
  the run seed before partitioning, so every client computes its own partition without
  them) are public knowledge to anyone with the run config; D^V is a uniformly random
  half of them, drawn once from OS entropy (or, for reproducible benchmarks, from
  ``$HEADWAY_FEDPROF_SECRET`` in the server's environment, never from the run config), so
  no client can rebuild the baseline exactly. summary.json names the source, not the draw.
- A client without a valid profile scores 0, the lowest score: it is drawn only when
  fewer than K clients have a profile. A client that has never been asked (it joined
  after the profiling before round 1) is asked for a profile of the current model before
  the round's draw (Alg. 1 line 4 for late joiners); one that was asked and gave none, or
  was selected and returned no valid reply, loses its profile and is asked again after 1,
  2, 4, … rounds.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, MessageType, RecordDict
from headway.core import protocol as P
from headway.core.config import ConfigError
from headway.core.data import DatasetSpec
from headway.core.models import build_model
from headway.core.profiles import (
    PRE_ACTIVATION,
    cached_aggregate,
    divergence,
    full_aggregate,
    model_profile,
    partial_aggregate,
    private_validation_rows,
    profile_problem,
    score,
)
from headway.core.settings import Settings
from headway.strategies.arrays import to_numpy, to_record
from headway.strategies.base import Step, TrainRound, mean_finite
from headway.strategies.engine import Engine
from headway.strategies.fedavg import ModelAveraging
from headway.strategies.replies import ArraySpec, Layout, Rejection, Reply
from headway.strategies.state import ServerState

log = logging.getLogger("headway")

SECRET_ENV = "HEADWAY_FEDPROF_SECRET"  # server-side only: makes the private draw of D^V reproducible


def validation_stream(seed: int, secret: str | None) -> tuple[np.random.Generator, str]:
    """The stream D^V is drawn from, and its name for summary.json: OS entropy, or, when the
    server's environment holds ``secret``, a stream of (run seed, SHA-256 of the secret)."""
    if not secret:
        return np.random.default_rng(), "os-entropy"
    digest = hashlib.sha256(secret.encode()).digest()
    return np.random.default_rng([int(seed), *(int.from_bytes(digest[i : i + 4], "little") for i in range(0, 32, 4))]), f"${SECRET_ENV}"


def profiled_layers(settings: Settings, spec: DatasetSpec) -> list[str]:
    """Modules of the run's model whose output is a tensor in a forward pass (what FedProf
    can profile), found on a 2-row zero input in eval mode: no training, no data."""
    model = build_model(settings.body, spec.input_shape, settings.feature_dim, spec.num_classes, settings.seed, settings.body_dropout)
    seen: list[str] = []
    hooks = [
        module.register_forward_hook(lambda _m, _i, out, name=name: seen.append(name) if isinstance(out, torch.Tensor) else None)
        for name, module in model.named_modules()
        if name
    ]
    try:
        with torch.no_grad():
            model(torch.zeros((2, *spec.input_shape)))
    except Exception as exc:  # e.g. a body built for another input shape
        raise ConfigError(
            f"run-config key 'body' is {settings.body!r}, which cannot run on data set '{settings.dataset}' inputs of shape "
            f"{tuple(spec.input_shape)}: {type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from None
    finally:
        for hook in hooks:
            hook.remove()
    return list(dict.fromkeys(seen))


@dataclass(frozen=True)
class FedProfClientState:
    """What FedProf keeps of one client across rounds."""

    profile: np.ndarray | None = None  # its last valid representation profile RP_k (None: it has none)
    version: int | None = None  # the global model version that profile is of
    div: float | None = None  # div(RP_k, RP^B) when it was last scored
    asked: int | None = None  # the last round it was asked for a profile (None: never)
    misses: int = 0  # asks in a row that got no valid profile
    n: int | None = None  # the count its last valid reply gave
    model: dict[str, np.ndarray] | None = None  # full-cache: its last local model


@dataclass(frozen=True)
class Validation:
    """D^V: the inputs of a private half of the rows the server holds out (numpy, as every state field is a plain value),
    where the draw came from, and the rows held out."""

    inputs: np.ndarray
    source: str
    held_out: int


@dataclass(frozen=True)
class FedProfState:
    """What FedProf's server keeps across rounds: the global model's version (the last round that
    changed it) and the baselines RP^B of the versions in use, the profiled width q, the model before
    round 1 (what a client never trained holds, for full-cache), every client's state by partition id,
    the rounds each partition was selected in (summary.json), and D^V (drawn once, before round 1)."""

    version: int = 0
    baselines: dict[int, np.ndarray] = field(default_factory=dict)
    units: int = 0
    initial: dict[str, np.ndarray] = field(default_factory=dict)
    clients: dict[int, FedProfClientState] = field(default_factory=dict)
    selections: dict[int, int] = field(default_factory=dict)
    validation: Validation | None = None


@dataclass(frozen=True)
class ProfileRound(TrainRound[FedProfState]):
    """A FedProf training round: :class:`TrainRound` plus the global version the sent model is
    and the scores λ (by partition id) its draw used."""

    version: int = 0
    scores: dict[int, float] = field(default_factory=dict)


class FedProf(ModelAveraging[FedProfState]):
    """Score-weighted client selection by representation profiles (see the module docstring).

    Its state between rounds is a :class:`FedProfState`; within a hook, per-client states are
    gathered in a fresh dict (partition id -> state) and frozen into the next state.

    Neither secure-aggregation nor a robust ``aggregation`` rule: scoring needs each selected
    client's own profile, full-cache needs each client's own model, and its full/partial rules
    are not the update average a robust rule replaces. So it defines ``aggregate_train`` without
    ``sum_spec``/``aggregate_sum``/``update_weights`` of its own (:mod:`headway.strategies.capabilities`),
    and building it with either setting is a ConfigError."""

    name = "fedprof"

    @classmethod
    def check_config(cls, settings: Settings, spec: DatasetSpec) -> None:
        """ConfigError unless ``fedprof-layer`` is ``pre-activation`` or names a module of the run's model that outputs a tensor."""
        layer = settings.fedprof.layer
        names = profiled_layers(settings, spec)
        if layer not in names and layer != PRE_ACTIVATION:
            raise ConfigError(
                f"run-config key 'fedprof-layer' is {layer!r}, which is not a layer with an output in body {settings.body!r}; "
                f"choose {PRE_ACTIVATION} or one of: {', '.join(names)}"
            )

    def initial_method_state(self) -> FedProfState:
        """Version 0, no baseline, no profile, D^V not drawn yet (:meth:`start_from` draws it)."""
        return FedProfState()

    # ----- the baseline -------------------------------------------------------------
    def draw_validation(self) -> Validation:
        """D^V: a private half of the rows the server holds out (OS entropy, or ``$HEADWAY_FEDPROF_SECRET``)."""
        held = self.services.data.validation_tensors()
        if held is None:
            raise ConfigError(
                "fedprof needs the server to hold the data set for its validation set D^V (fedprof-val-size rows); "
                "give the server a data-dir with the data"
            )
        rng, source = validation_stream(self.settings.seed, os.environ.get(SECRET_ENV))
        rows = private_validation_rows(len(held[0]), rng)
        return Validation(held[0][rows].detach().cpu().numpy(), source, len(held[0]))

    def baseline(self, validation: Validation, arrays: ArrayRecord) -> np.ndarray:
        """RP^B of the global model ``arrays`` on the server's validation set."""
        model = build_model(
            self.settings.body,
            self.spec.input_shape,
            self.settings.feature_dim,
            self.spec.num_classes,
            self.settings.seed,
            self.settings.body_dropout,
        )
        model.load_state_dict(arrays.to_torch_state_dict())
        return model_profile(model, self.settings.fedprof.layer, torch.from_numpy(validation.inputs))

    def new_version(self, method: FedProfState, version: int, arrays: ArrayRecord, engine: Engine) -> FedProfState:
        """``method`` at global version ``version`` with its baseline (on D^V, drawn the first time it is
        needed); baselines no registered client's profile refers to are dropped."""
        validation = method.validation if method.validation is not None else self.draw_validation()
        baseline = self.baseline(validation, arrays)
        baselines = {**method.baselines, version: baseline}
        in_use = {s.version for s in self.client_states(engine, method).values() if s.version is not None} | {version}
        kept = {v: b for v, b in baselines.items() if v in in_use}
        return replace(method, version=version, baselines=kept, units=len(baseline), validation=validation)

    def start_from(self, method: FedProfState, arrays: ArrayRecord, engine: Engine) -> FedProfState:
        """The model before round 1: version 0, its baseline, and what an untrained client holds."""
        return replace(self.new_version(method, 0, arrays, engine), initial=to_numpy(arrays))

    # ----- clients' states -------------------------------------------------------------
    @staticmethod
    def client_states(engine: Engine, method: FedProfState) -> dict[int, FedProfClientState]:
        """Every registered node's state (node id -> state, registration order; a new client's is empty)."""
        return {node: method.clients.get(info.partition_id, FedProfClientState()) for node, info in engine.registry.clients.items()}

    @staticmethod
    def remember(engine: Engine, clients: dict[int, FedProfClientState], reply: Reply, version: int) -> None:
        """``reply``'s profile (of global ``version``) and count into ``clients`` (partition id -> state)."""
        state = clients.get(reply.partition_id, FedProfClientState())
        n = int(reply.count) if reply.count is not None else state.n
        profile = reply.payload[P.PROFILE].astype(np.float64)
        clients[reply.partition_id] = replace(state, profile=profile, version=version, asked=engine.round, misses=0, n=n)

    @staticmethod
    def forget(engine: Engine, clients: dict[int, FedProfClientState], node: int) -> None:
        """``node`` was asked for a profile and gave no valid one: it has none until it does."""
        pid = engine.partition_of(node)
        state = clients.get(pid, FedProfClientState())
        clients[pid] = replace(state, profile=None, version=None, div=None, asked=engine.round, misses=state.misses + 1)

    @staticmethod
    def due(engine: Engine, state: FedProfClientState) -> bool:
        """Whether a client in ``state`` is to be asked for a profile before this round's draw: never asked,
        or without a profile since its last ask 2^(misses-1) or more rounds ago."""
        if state.asked is None:
            return True
        return state.profile is None and engine.round - state.asked >= 2 ** max(state.misses - 1, 0)

    # ----- scores -------------------------------------------------------------------
    def scores(self, engine: Engine, method: FedProfState, clients: dict[int, FedProfClientState]) -> dict[int, float]:
        """λ_k of every available node (Alg. 1 lines 8-9), each scored client's divergence noted in
        ``clients``. A node without a valid profile scores 0, the lowest: the sampler takes it only
        when fewer than K nodes score above 0 (a node never asked is profiled before the draw)."""
        alpha = self.settings.fedprof.alpha
        out = {}
        for node in engine.nodes():
            pid = engine.partition_of(node)
            state = clients.get(pid, FedProfClientState())
            if state.profile is not None and state.version is not None:  # set together (remember)
                div = divergence(state.profile, method.baselines[state.version])
                clients[pid] = replace(state, div=div)
                out[node] = score(div, alpha)
            else:
                out[node] = 0.0
        return out

    def ask_profiles(
        self,
        engine: Engine,
        method: FedProfState,
        clients: dict[int, FedProfClientState],
        nodes: list[int],
        server_round: int,
        arrays: ArrayRecord,
    ) -> list[Reply]:
        """A profile-only exchange (no training) with ``nodes`` on the model of ``method``'s version: who
        answers validly is remembered in ``clients``, who does not is forgotten."""
        if not nodes:
            return []
        content = self.content(server_round, arrays, **{P.PHASE: P.PHASE_PROFILE})
        replies = engine.exchange(P.PHASE_PROFILE, {n: content for n in nodes}, MessageType.TRAIN, self.profile_layout(method.units))
        for reply in replies:
            self.remember(engine, clients, reply, method.version)
        answered = {r.node_id for r in replies}
        for node in nodes:
            if node not in answered and node in engine.registry.clients:
                self.forget(engine, clients, node)
        return replies

    # ----- rounds ---------------------------------------------------------------------
    def prepare(self, state: ServerState[FedProfState], engine: Engine) -> tuple[ServerState[FedProfState], Step[FedProfState] | None]:
        """Alg. 1 lines 4-6: every client's profile of the initial model, and its baseline."""
        method = self.start_from(state.method, state.arrays, engine)
        clients = dict(method.clients)
        replies = self.ask_profiles(engine, method, clients, engine.nodes(), 0, state.arrays)
        return ServerState(state.arrays, replace(method, clients=clients)), Step(None, len(replies), {"clients": float(len(replies))})

    def configure_train(
        self, server_round: int, state: ServerState[FedProfState], engine: Engine
    ) -> tuple[ProfileRound, dict[int, RecordDict]]:
        """Alg. 1 line 4 (late joiners and retries profiled first), lines 8-10 (the draw by score); the
        round's context carries the state with the profiles, divergences and selections this made."""
        method = state.method
        if method.version not in method.baselines:  # no profiling round ran (e.g. a round driven on its own)
            method = self.start_from(method, state.arrays, engine)
        clients = dict(method.clients)
        due = [n for n in engine.nodes() if self.due(engine, clients.get(engine.partition_of(n), FedProfClientState()))]
        self.ask_profiles(engine, method, clients, due, server_round, state.arrays)
        content = self.content(server_round, state.arrays, **{P.PHASE: P.PHASE_TRAIN})
        scores = self.scores(engine, method, clients)
        chosen = engine.sample(self.settings.fraction_train, scores)
        selections = dict(method.selections)
        for node in chosen:
            pid = engine.partition_of(node)
            selections[pid] = selections.get(pid, 0) + 1
        by_partition = {engine.partition_of(n): v for n, v in scores.items()}  # λ the sampler used, for rounds.jsonl
        method = replace(method, clients=clients, selections=selections)
        sent = to_numpy(state.arrays)
        ctx = ProfileRound(server_round, engine, ServerState(state.arrays, method), sent, version=method.version, scores=by_partition)
        return ctx, {node: content for node in chosen}

    def received(self, ctx: TrainRound[FedProfState], contents: Mapping[int, RecordDict], replies: list[Reply]) -> TrainRound[FedProfState]:
        """Alg. 1 line 15, quorum or not: the selected clients' fresh profiles, of the version they were
        sent; a selected node whose reply was missing or refused has no valid profile of it and loses its score."""
        method = ctx.state.method
        clients = dict(method.clients)
        for reply in replies:
            self.remember(ctx.engine, clients, reply, method.version)
        answered = {r.node_id for r in replies}
        for node in contents:
            if node not in answered and node in ctx.engine.registry.clients:
                self.forget(ctx.engine, clients, node)
        return replace(ctx, state=ServerState(ctx.state.arrays, replace(method, clients=clients)))

    def profile_layout(self, units: int) -> Layout:
        """A profile-only reply: the (q, 2) profile of ``units`` = q units, and n."""
        return Layout({P.PROFILE: ArraySpec((units, 2))}, count=True, optional=(P.LOSS,), check=partial(self.check_profile, units=units))

    def train_layout(self, ctx: TrainRound[FedProfState]) -> Layout:
        """The model it was sent (as FedAvg) plus its (q, 2) profile."""
        units = ctx.state.method.units
        specs = {k: ArraySpec(tuple(v.shape), str(v.dtype)) for k, v in ctx.sent.items()}
        specs[P.PROFILE] = ArraySpec((units, 2))
        return Layout(specs, count=True, optional=(P.LOSS,), check=partial(self.check_update_and_profile, ctx=ctx))

    def check_profile(self, arrays: dict[str, np.ndarray], reply: Reply, units: int) -> tuple[dict[str, np.ndarray] | None, str | None]:
        """``arrays`` when their profile is a valid one of ``units`` units, else why not."""
        problem = profile_problem(arrays[P.PROFILE], units)
        return (None, problem) if problem else (arrays, None)

    def check_update_and_profile(
        self, arrays: dict[str, np.ndarray], reply: Reply, ctx: TrainRound[FedProfState]
    ) -> tuple[dict[str, np.ndarray] | None, str | Rejection | None]:
        """A valid profile and a model update FedAvg's check admits (:meth:`ModelAveraging.check_update`)."""
        problem: str | Rejection | None
        _, problem = self.check_profile(arrays, reply, ctx.state.method.units)
        if problem:
            return None, problem
        model = {k: v for k, v in arrays.items() if k != P.PROFILE}
        checked, problem = self.check_update(model, reply, ctx)
        if checked is None:  # check_update gives the arrays or a problem, never both
            return None, problem
        return {**checked, P.PROFILE: arrays[P.PROFILE]}, None

    def aggregate_train(self, ctx: TrainRound[FedProfState], replies: list[Reply]) -> Step[FedProfState]:
        """Alg. 1 lines 16-18: the ``fedprof-aggregation`` rule over the replies, and the new version's baseline."""
        assert isinstance(ctx, ProfileRound), "a FedProf round is set up by FedProf.configure_train"
        engine = ctx.engine  # line 15 (selected clients' fresh profiles) ran in received, quorum or not
        method = ctx.state.method
        states = self.client_states(engine, method)
        models = [{k: v for k, v in r.payload.items() if k != P.PROFILE} for r in replies]
        sizes = [r.examples for r in replies]
        known = {n: s.n for n, s in states.items() if s.n is not None}
        total = float(sum(known.values()))
        mode = self.settings.fedprof.aggregation
        if mode == "full":
            new = full_aggregate(ctx.sent, models, sizes, total)
        elif mode == "full-cache":
            for reply, model in zip(replies, models, strict=True):
                states[reply.node_id] = replace(states[reply.node_id], model=model)
            cached = [(s.model, s.n) for s in states.values() if s.model is not None and s.n is not None]  # the known clients' models
            new = cached_aggregate(method.initial, [m for m, _ in cached], [n for _, n in cached], total)
            clients = dict(method.clients)
            clients.update({engine.partition_of(node): s for node, s in states.items()})
            method = replace(method, clients=clients)
        else:
            new = partial_aggregate(models, sizes, total, len(known), like=ctx.sent)
        arrays = to_record(new)
        method = self.new_version(method, ctx.server_round, arrays, engine)  # line 18: the baseline of the new version
        divs = [s.div for s in states.values() if s.div is not None]
        metrics = {"loss": mean_finite([r.metrics.get(P.LOSS, float("nan")) for r in replies])}
        if divs:
            metrics["fedprof_div_mean"] = float(np.mean(divs))
        details = {"fedprof_scores": {str(p): round(v, 6) for p, v in sorted(ctx.scores.items())}}
        return Step(arrays, len(replies), metrics, details, method=method)

    def summary_extra(self, engine: Engine, state: ServerState[FedProfState] | None) -> dict[str, Any]:
        """α, the aggregation rule, selections by partition, last divergences and where D^V came from."""
        method = state.method if state is not None else FedProfState()
        states = self.client_states(engine, method)
        divs = {str(engine.partition_of(n)): s.div for n, s in states.items() if s.div is not None}
        validation = method.validation
        return {
            "fedprof_alpha": self.settings.fedprof.alpha,
            "fedprof_aggregation": self.settings.fedprof.aggregation,
            "fedprof_selections": {str(k): v for k, v in sorted(method.selections.items())},
            "fedprof_last_divergence": divs,
            # where D^V came from, never the draw itself: a client must not be able to rebuild it
            "fedprof_validation": None
            if validation is None
            else {"rows": int(len(validation.inputs)), "held_out": validation.held_out, "drawn_from": validation.source},
        }
