"""FedProf (Wu et al., Alg. 1): FedAvg whose clients are sampled with probability λ_k/Λ,
λ_k = exp(−α · div(RP_k, RP^B)), the divergence of a client's representation profile from
the server's baseline profile of the same global model version on its validation set D^V.

Before round 1 every client profiles the initial model (line 4). Each round K clients are
drawn without replacement by score (:mod:`core.sampling`); only they refresh their
profiles, an unselected client keeps its last score. Aggregation is ``full`` (an
unselected client counts with the current global model), ``full-cache`` (with its last
local model, which the server keeps: N models in server memory) or ``partial``. The maths
lives in :mod:`core.profiles`.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, MessageType

from core import protocol as P
from core.config import ConfigError
from core.data import DatasetSpec
from core.models import build_model
from core.profiles import cached_aggregate, divergence, full_aggregate, model_profile, partial_aggregate, profile_problem, score
from strategies.base import Step, mean_finite
from strategies.engine import Engine
from strategies.fedavg import FedAvg, to_numpy, to_record
from strategies.replies import ArraySpec, Layout, Reply
from strategies.services import Services

log = logging.getLogger("headway")


class FedProf(FedAvg):
    """Score-weighted client selection by representation profiles (see the module docstring)."""

    name = "fedprof"

    def __init__(self, cfg: dict[str, Any], spec: DatasetSpec, services: Services):
        super().__init__(cfg, spec, services)
        self.version = 0  # the global model's version: the last round that changed it
        self.baselines: dict[int, np.ndarray] = {}  # version -> RP^B on D^V
        self.units = 0  # q, the profiled layer's width
        self.selections: dict[int, int] = {}  # partition id -> rounds selected
        self.round_scores: dict[int, float] = {}  # partition id -> λ this round's sampling used

    # ----- the baseline -------------------------------------------------------------
    def baseline(self, arrays: ArrayRecord) -> np.ndarray:
        """RP^B of the global model ``arrays`` on the server's validation set."""
        val = self.services.data.validation_tensors()
        if val is None:
            raise ConfigError("fedprof needs the server to hold the data set for its validation set D^V (fedprof-val-size rows); "
                              "give the server a data-dir with the data")
        model = build_model(self.cfg["body"], self.spec.input_shape, self.cfg["feature-dim"], self.spec.num_classes, self.cfg["seed"], self.cfg["body-dropout"])
        model.load_state_dict(arrays.to_torch_state_dict())
        return model_profile(model, self.cfg["fedprof-layer"], val[0])

    def new_version(self, version: int, arrays: ArrayRecord) -> None:
        """Record global version ``version`` and its baseline; drop baselines no client's profile refers to."""
        self.version = version
        self.baselines[version] = self.baseline(arrays)
        self.units = len(self.baselines[version])
        in_use = {c.state["version"] for c in self.engine.registry.clients.values() if "version" in c.state} | {version}
        self.baselines = {v: b for v, b in self.baselines.items() if v in in_use}

    # ----- scores -------------------------------------------------------------------
    def scores(self, engine: Engine) -> dict[int, float]:
        """λ_k of every available node (Alg. 1 lines 8-9). A node with no profile yet scores
        1, as if it matched the baseline, so that it is sampled and profiled."""
        alpha = self.cfg["fedprof-alpha"]
        out = {}
        for node in engine.nodes():
            state = engine.registry.clients[node].state
            if "profile" in state:
                state["div"] = divergence(state["profile"], self.baselines[state["version"]])
                out[node] = score(state["div"], alpha)
            else:
                out[node] = 1.0
        return out

    def remember(self, engine: Engine, reply: Reply, version: int) -> None:
        state = engine.registry.clients[reply.node_id].state
        state["profile"], state["version"] = reply.payload[P.PROFILE].astype(np.float64), version
        if reply.count is not None:
            state["n"] = int(reply.count)

    # ----- rounds ---------------------------------------------------------------------
    def prepare(self, arrays: ArrayRecord, engine: Engine) -> tuple[ArrayRecord, Step | None]:
        """Alg. 1 lines 4-6: every client's profile of the initial model, and its baseline."""
        self.engine = engine
        self.new_version(0, arrays)
        self.sent = to_numpy(arrays)
        self.initial = self.sent  # what a client never trained holds (full-cache)
        content = self.content(0, arrays, **{P.PHASE: P.PHASE_PROFILE})
        replies = engine.exchange(P.PHASE_PROFILE, {n: content for n in engine.nodes()}, MessageType.TRAIN, self.profile_layout())
        for reply in replies:
            self.remember(engine, reply, 0)
        return arrays, Step(None, len(replies), {"clients": float(len(replies))})

    def configure_train(self, server_round: int, arrays: ArrayRecord, engine: Engine):
        self.engine = engine
        if self.version not in self.baselines:  # no profiling round ran (e.g. a round driven on its own)
            self.new_version(self.version, arrays)
        self.sent = to_numpy(arrays)
        if not hasattr(self, "initial"):
            self.initial = self.sent
        content = self.content(server_round, arrays, **{P.PHASE: P.PHASE_TRAIN})
        scores = self.scores(engine)
        self.round_scores = {engine.partition_of(n): v for n, v in scores.items()}  # λ the sampler used, for rounds.jsonl
        chosen = engine.sample(self.cfg["fraction-train"], scores)
        for node in chosen:
            pid = engine.partition_of(node)
            self.selections[pid] = self.selections.get(pid, 0) + 1
        return {node: content for node in chosen}

    def profile_layout(self) -> Layout:
        return Layout({P.PROFILE: ArraySpec((self.units, 2))}, count=True, optional=(P.LOSS,), check=self.check_profile)

    def train_layout(self, server_round: int) -> Layout:
        """The model it was sent (as FedAvg) plus its (q, 2) profile."""
        specs = {k: ArraySpec(tuple(v.shape), str(v.dtype)) for k, v in self.sent.items()}
        specs[P.PROFILE] = ArraySpec((self.units, 2))
        return Layout(specs, count=True, optional=(P.LOSS,), check=self.check_update_and_profile)

    def check_profile(self, arrays: dict[str, np.ndarray], reply: Reply):
        problem = profile_problem(arrays[P.PROFILE], self.units)
        return (None, problem) if problem else (arrays, None)

    def check_update_and_profile(self, arrays: dict[str, np.ndarray], reply: Reply):
        _, problem = self.check_profile(arrays, reply)
        if problem:
            return None, problem
        model = {k: v for k, v in arrays.items() if k != P.PROFILE}
        checked, problem = self.check_update(model, reply)
        return (None, problem) if problem else ({**checked, P.PROFILE: arrays[P.PROFILE]}, None)

    def aggregate_train(self, server_round: int, replies: list[Reply]) -> Step:
        engine = self.engine
        for reply in replies:  # line 15: selected clients' fresh profiles, of the version they were sent
            self.remember(engine, reply, self.version)
        models = [{k: v for k, v in r.payload.items() if k != P.PROFILE} for r in replies]
        sizes = [r.count for r in replies]
        known = {n: c.state["n"] for n, c in engine.registry.clients.items() if "n" in c.state}
        total = float(sum(known.values()))
        mode = self.cfg["fedprof-aggregation"]
        if mode == "full":
            new = full_aggregate(self.sent, models, sizes, total)
        elif mode == "full-cache":
            for reply, model in zip(replies, models):
                engine.registry.clients[reply.node_id].state["model"] = model
            cached = [c.state for n, c in engine.registry.clients.items() if n in known and "model" in c.state]
            new = cached_aggregate(self.initial, [s["model"] for s in cached], [s["n"] for s in cached], total)
        else:
            new = partial_aggregate(models, sizes, total, len(known), like=self.sent)
        arrays = to_record(new)
        self.new_version(server_round, arrays)  # line 18: the baseline of the new version
        divs = [c.state["div"] for c in engine.registry.clients.values() if "div" in c.state]
        metrics = {"loss": mean_finite([r.metrics.get(P.LOSS, float("nan")) for r in replies])}
        if divs:
            metrics["fedprof_div_mean"] = float(np.mean(divs))
        details = {"fedprof_scores": {str(p): round(v, 6) for p, v in sorted(self.round_scores.items())}}
        return Step(arrays, len(replies), metrics, details)

    def summary_extra(self) -> dict[str, Any]:
        clients = getattr(self, "engine", None)
        divs = {} if clients is None else {str(c.partition_id): c.state["div"] for c in clients.registry.clients.values() if "div" in c.state}
        return {
            "fedprof_alpha": self.cfg["fedprof-alpha"],
            "fedprof_aggregation": self.cfg["fedprof-aggregation"],
            "fedprof_selections": {str(k): v for k, v in sorted(self.selections.items())},
            "fedprof_last_divergence": divs,
        }
