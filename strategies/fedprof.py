"""FedProf (Wu et al., Alg. 1): FedAvg whose clients are sampled with probability λ_k/Λ,
λ_k = exp(−α · div(RP_k, RP^B)), the divergence of a client's representation profile from
the server's baseline profile of the same global model version on its validation set D^V.

Before round 1 every client profiles the initial model (line 4). Each round K clients are
drawn without replacement by score (:mod:`core.sampling`); only they refresh their
profiles, an unselected client keeps its last score. Aggregation is ``full`` (an
unselected client counts with the current global model), ``full-cache`` (with its last
local model, which the server keeps: N models in server memory) or ``partial``. The maths
lives in :mod:`core.profiles`.

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
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, MessageType, RecordDict

from core import protocol as P
from core.config import ConfigError
from core.data import DatasetSpec
from core.models import build_model
from core.profiles import (
    cached_aggregate,
    divergence,
    full_aggregate,
    model_profile,
    partial_aggregate,
    private_validation_rows,
    profile_problem,
    score,
)
from strategies.base import Step, TrainRound, mean_finite
from strategies.engine import Engine
from strategies.fedavg import FedAvg, to_numpy, to_record
from strategies.replies import ArraySpec, Layout, Rejection, Reply
from strategies.services import Services

log = logging.getLogger("headway")

SECRET_ENV = "HEADWAY_FEDPROF_SECRET"  # server-side only: makes the private draw of D^V reproducible


def validation_stream(seed: int, secret: str | None) -> tuple[np.random.Generator, str]:
    """The stream D^V is drawn from, and its name for summary.json: OS entropy, or, when the
    server's environment holds ``secret``, a stream of (run seed, SHA-256 of the secret)."""
    if not secret:
        return np.random.default_rng(), "os-entropy"
    digest = hashlib.sha256(secret.encode()).digest()
    return np.random.default_rng([int(seed), *(int.from_bytes(digest[i : i + 4], "little") for i in range(0, 32, 4))]), f"${SECRET_ENV}"


def profiled_layers(cfg: Mapping[str, Any], spec: DatasetSpec) -> list[str]:
    """Modules of the run's model whose output is a tensor in a forward pass (what FedProf
    can profile), found on a 2-row zero input in eval mode: no training, no data."""
    model = build_model(cfg["body"], spec.input_shape, cfg["feature-dim"], spec.num_classes, cfg["seed"], cfg["body-dropout"])
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
            f"run-config key 'body' is {cfg['body']!r}, which cannot run on data set '{cfg['dataset']}' inputs of shape "
            f"{tuple(spec.input_shape)}: {type(exc).__name__}: {' '.join(str(exc).split())}"
        ) from None
    finally:
        for hook in hooks:
            hook.remove()
    return list(dict.fromkeys(seen))


@dataclass
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
class ProfileRound(TrainRound):
    """A FedProf training round: :class:`TrainRound` plus the global version the sent model is
    and the scores λ (by partition id) its draw used."""

    version: int = 0
    scores: dict[int, float] = field(default_factory=dict)


class FedProf(FedAvg):
    """Score-weighted client selection by representation profiles (see the module docstring).

    Kept across rounds (set here, changed by ``prepare`` and ``aggregate_train``): the global
    version and the baselines of the versions in use, the profiled width q, the initial model
    and D^V; ``selections`` counts each client's selections for summary.json."""

    name = "fedprof"

    def __init__(self, cfg: dict[str, Any], spec: DatasetSpec, services: Services):
        super().__init__(cfg, spec, services)
        self.version = 0  # the global model's version: the last round that changed it
        self.baselines: dict[int, np.ndarray] = {}  # version -> RP^B on D^V
        self.units = 0  # q, the profiled layer's width
        self.initial: dict[str, np.ndarray] = {}  # the model before round 1: what a client never trained holds (full-cache)
        self.selections: dict[int, int] = {}  # partition id -> rounds selected
        self.validation: tuple[Any, str, int] | None = None  # (D^V inputs, the draw's source, rows held out)

    @classmethod
    def check_config(cls, cfg: Mapping[str, Any], spec: DatasetSpec) -> None:
        """ConfigError unless ``fedprof-layer`` names a module of the run's model that outputs a tensor."""
        layer = cfg["fedprof-layer"]
        names = profiled_layers(cfg, spec)
        if layer not in names:
            raise ConfigError(
                f"run-config key 'fedprof-layer' is {layer!r}, which is not a layer with an output in body {cfg['body']!r}; "
                f"choose one of: {', '.join(names)}"
            )

    # ----- the baseline -------------------------------------------------------------
    def validation_inputs(self) -> torch.Tensor:
        """D^V's inputs: a private half of the rows the server holds out (drawn once)."""
        if self.validation is None:
            held = self.services.data.validation_tensors()
            if held is None:
                raise ConfigError(
                    "fedprof needs the server to hold the data set for its validation set D^V (fedprof-val-size rows); "
                    "give the server a data-dir with the data"
                )
            rng, source = validation_stream(self.cfg["seed"], os.environ.get(SECRET_ENV))
            rows = private_validation_rows(len(held[0]), rng)
            self.validation = (held[0][rows], source, len(held[0]))
        return self.validation[0]

    def baseline(self, arrays: ArrayRecord) -> np.ndarray:
        """RP^B of the global model ``arrays`` on the server's validation set."""
        val = self.validation_inputs()
        model = build_model(
            self.cfg["body"],
            self.spec.input_shape,
            self.cfg["feature-dim"],
            self.spec.num_classes,
            self.cfg["seed"],
            self.cfg["body-dropout"],
        )
        model.load_state_dict(arrays.to_torch_state_dict())
        return model_profile(model, self.cfg["fedprof-layer"], val)

    def new_version(self, version: int, arrays: ArrayRecord, engine: Engine) -> None:
        """Record global version ``version`` and its baseline; drop baselines no client's profile refers to."""
        self.version = version
        self.baselines[version] = self.baseline(arrays)
        self.units = len(self.baselines[version])
        in_use = {s.version for s in engine.registry.states(FedProfClientState).values() if s.version is not None} | {version}
        self.baselines = {v: b for v, b in self.baselines.items() if v in in_use}

    def start_from(self, arrays: ArrayRecord, engine: Engine) -> None:
        """The model before round 1: version 0, its baseline, and what an untrained client holds."""
        self.new_version(0, arrays, engine)
        self.initial = to_numpy(arrays)

    # ----- scores -------------------------------------------------------------------
    def scores(self, engine: Engine) -> dict[int, float]:
        """λ_k of every available node (Alg. 1 lines 8-9). A node without a valid profile
        scores 0, the lowest: the sampler takes it only when fewer than K nodes score above
        0 (a node never asked is profiled before the draw: :meth:`profile_missing`)."""
        alpha = self.cfg["fedprof-alpha"]
        out = {}
        for node in engine.nodes():
            state = engine.registry.state(node, FedProfClientState)
            if state.profile is not None and state.version is not None:  # set together (remember)
                state.div = divergence(state.profile, self.baselines[state.version])
                out[node] = score(state.div, alpha)
            else:
                out[node] = 0.0
        return out

    def remember(self, engine: Engine, reply: Reply, version: int) -> None:
        state = engine.registry.state(reply.node_id, FedProfClientState)
        state.profile, state.version = reply.payload[P.PROFILE].astype(np.float64), version
        state.asked, state.misses = engine.round, 0
        if reply.count is not None:
            state.n = int(reply.count)

    def forget(self, engine: Engine, node: int) -> None:
        """``node`` was asked for a profile and gave no valid one: it has none until it does."""
        state = engine.registry.state(node, FedProfClientState)
        state.profile = state.version = state.div = None
        state.asked, state.misses = engine.round, state.misses + 1

    def due(self, engine: Engine, node: int) -> bool:
        """Whether ``node`` is to be asked for a profile before this round's draw: never asked,
        or without a profile since its last ask 2^(misses-1) or more rounds ago."""
        state = engine.registry.state(node, FedProfClientState)
        if state.asked is None:
            return True
        return state.profile is None and engine.round - state.asked >= 2 ** max(state.misses - 1, 0)

    def ask_profiles(self, engine: Engine, nodes: list[int], server_round: int, arrays: ArrayRecord, version: int) -> list[Reply]:
        """A profile-only exchange (no training) with ``nodes``: who answers validly is
        remembered, who does not is forgotten."""
        if not nodes:
            return []
        content = self.content(server_round, arrays, **{P.PHASE: P.PHASE_PROFILE})
        replies = engine.exchange(P.PHASE_PROFILE, {n: content for n in nodes}, MessageType.TRAIN, self.profile_layout())
        for reply in replies:
            self.remember(engine, reply, version)
        answered = {r.node_id for r in replies}
        for node in nodes:
            if node not in answered and node in engine.registry.clients:
                self.forget(engine, node)
        return replies

    def profile_missing(self, engine: Engine, server_round: int, arrays: ArrayRecord) -> None:
        """Alg. 1 line 4 for nodes that were not there before round 1 (and the retries of
        nodes that gave no valid profile): profile the current global model before the draw."""
        self.ask_profiles(engine, [n for n in engine.nodes() if self.due(engine, n)], server_round, arrays, self.version)

    # ----- rounds ---------------------------------------------------------------------
    def prepare(self, arrays: ArrayRecord, engine: Engine) -> tuple[ArrayRecord, Step | None]:
        """Alg. 1 lines 4-6: every client's profile of the initial model, and its baseline."""
        self.start_from(arrays, engine)
        replies = self.ask_profiles(engine, engine.nodes(), 0, arrays, 0)
        return arrays, Step(None, len(replies), {"clients": float(len(replies))})

    def configure_train(self, server_round: int, arrays: ArrayRecord, engine: Engine) -> tuple[ProfileRound, dict[int, RecordDict]]:
        if self.version not in self.baselines:  # no profiling round ran (e.g. a round driven on its own)
            self.start_from(arrays, engine)
        self.profile_missing(engine, server_round, arrays)
        content = self.content(server_round, arrays, **{P.PHASE: P.PHASE_TRAIN})
        scores = self.scores(engine)
        chosen = engine.sample(self.cfg["fraction-train"], scores)
        by_partition = {engine.partition_of(n): v for n, v in scores.items()}  # λ the sampler used, for rounds.jsonl
        ctx = ProfileRound(server_round, engine, to_numpy(arrays), version=self.version, scores=by_partition)
        return ctx, {node: content for node in chosen}

    def train_round(self, server_round: int, arrays: ArrayRecord, engine: Engine) -> Step:
        """As every strategy's round, and then: a selected node whose reply was missing or
        refused has no valid profile of this version, so it loses its score (line 15 takes
        only the profiles that arrived), even when too few replies came to aggregate."""
        ctx, contents = self.configure_train(server_round, arrays, engine)
        for node in contents:
            pid = engine.partition_of(node)
            self.selections[pid] = self.selections.get(pid, 0) + 1
        replies = engine.exchange(P.PHASE_TRAIN, contents, MessageType.TRAIN, self.train_layout(ctx))
        answered = {r.node_id for r in replies}
        for reply in replies:  # line 15: selected clients' fresh profiles, of the version they were sent
            self.remember(engine, reply, ctx.version)
        for node in contents:
            if node not in answered and node in engine.registry.clients:
                self.forget(engine, node)
        if not engine.quorum(P.PHASE_TRAIN, replies):
            return Step(None, len(replies))
        return self.aggregate_train(ctx, replies)

    def profile_layout(self) -> Layout:
        return Layout({P.PROFILE: ArraySpec((self.units, 2))}, count=True, optional=(P.LOSS,), check=self.check_profile)

    def train_layout(self, ctx: TrainRound) -> Layout:
        """The model it was sent (as FedAvg) plus its (q, 2) profile."""
        specs = {k: ArraySpec(tuple(v.shape), str(v.dtype)) for k, v in ctx.sent.items()}
        specs[P.PROFILE] = ArraySpec((self.units, 2))
        return Layout(specs, count=True, optional=(P.LOSS,), check=partial(self.check_update_and_profile, ctx=ctx))

    def check_profile(self, arrays: dict[str, np.ndarray], reply: Reply) -> tuple[dict[str, np.ndarray] | None, str | None]:
        problem = profile_problem(arrays[P.PROFILE], self.units)
        return (None, problem) if problem else (arrays, None)

    def check_update_and_profile(
        self, arrays: dict[str, np.ndarray], reply: Reply, ctx: TrainRound
    ) -> tuple[dict[str, np.ndarray] | None, str | Rejection | None]:
        problem: str | Rejection | None
        _, problem = self.check_profile(arrays, reply)
        if problem:
            return None, problem
        model = {k: v for k, v in arrays.items() if k != P.PROFILE}
        checked, problem = self.check_update(model, reply, ctx)
        if checked is None:  # check_update gives the arrays or a problem, never both
            return None, problem
        return {**checked, P.PROFILE: arrays[P.PROFILE]}, None

    def aggregate_train(self, ctx: TrainRound, replies: list[Reply]) -> Step:
        assert isinstance(ctx, ProfileRound), "a FedProf round is set up by FedProf.configure_train"
        engine = ctx.engine  # line 15 (selected clients' fresh profiles) ran in train_round, quorum or not
        states = engine.registry.states(FedProfClientState)
        models = [{k: v for k, v in r.payload.items() if k != P.PROFILE} for r in replies]
        sizes = [r.examples for r in replies]
        known = {n: s.n for n, s in states.items() if s.n is not None}
        total = float(sum(known.values()))
        mode = self.cfg["fedprof-aggregation"]
        if mode == "full":
            new = full_aggregate(ctx.sent, models, sizes, total)
        elif mode == "full-cache":
            for reply, model in zip(replies, models, strict=True):
                states[reply.node_id].model = model
            cached = [(s.model, s.n) for s in states.values() if s.model is not None and s.n is not None]  # the known clients' models
            new = cached_aggregate(self.initial, [m for m, _ in cached], [n for _, n in cached], total)
        else:
            new = partial_aggregate(models, sizes, total, len(known), like=ctx.sent)
        arrays = to_record(new)
        self.new_version(ctx.server_round, arrays, engine)  # line 18: the baseline of the new version
        divs = [s.div for s in states.values() if s.div is not None]
        metrics = {"loss": mean_finite([r.metrics.get(P.LOSS, float("nan")) for r in replies])}
        if divs:
            metrics["fedprof_div_mean"] = float(np.mean(divs))
        details = {"fedprof_scores": {str(p): round(v, 6) for p, v in sorted(ctx.scores.items())}}
        return Step(arrays, len(replies), metrics, details)

    def summary_extra(self, engine: Engine) -> dict[str, Any]:
        states = engine.registry.states(FedProfClientState)
        divs = {str(engine.partition_of(n)): s.div for n, s in states.items() if s.div is not None}
        return {
            "fedprof_alpha": self.cfg["fedprof-alpha"],
            "fedprof_aggregation": self.cfg["fedprof-aggregation"],
            "fedprof_selections": {str(k): v for k, v in sorted(self.selections.items())},
            "fedprof_last_divergence": divs,
            # where D^V came from, never the draw itself: a client must not be able to rebuild it
            "fedprof_validation": None
            if self.validation is None
            else {"rows": int(len(self.validation[0])), "held_out": self.validation[2], "drawn_from": self.validation[1]},
        }
