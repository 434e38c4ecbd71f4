"""FedAvg (McMahan et al. 2017): clients train the whole model; the server takes the
sample-weighted average of the valid replies.

With ``client-sampling=data-ratio`` the round's K clients are instead K draws with
replacement with probability n_k/n, and the server averages the draws with equal weight (a
client drawn twice counts twice): scheme I of Li et al. 2020, FedProx's own sampling."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from core import protocol as P
from core.aggregate import relative_update_norm, weighted_average
from core.config import ConfigError, body_names
from core.data import DatasetSpec
from core.models import build_model
from strategies.base import HeadwayStrategy, Step, mean_finite
from strategies.engine import Engine
from strategies.replies import ArraySpec, Layout, Rejection, Reply
from strategies.services import Services


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord(
        {k: Array(np.asarray(v, order="C")) for k, v in arrays.items()}
    )  # order="C" keeps 0-d arrays 0-d (BatchNorm counters); ascontiguousarray makes them (1,)


class FedAvg(HeadwayStrategy):
    """Whole-model averaging weighted by each client's number of training examples."""

    name = "fedavg"
    has_global_model = True

    def __init__(self, cfg: dict[str, Any], spec: DatasetSpec, services: Services):
        super().__init__(cfg, spec, services)
        if body_names(cfg) != [cfg["body"]]:
            raise ConfigError(f"{self.name} averages whole models, so every client must run the same body: leave 'bodies' empty")
        self.sent: dict[str, np.ndarray] = {}  # what this round's clients were sent
        self.draws: dict[int, int] = {}  # client-sampling=data-ratio: node id -> times drawn this round

    def initial_arrays(self) -> ArrayRecord:
        model = build_model(
            self.cfg["body"],
            self.spec.input_shape,
            self.cfg["feature-dim"],
            self.spec.num_classes,
            self.cfg["seed"],
            self.cfg["body-dropout"],
        )
        return ArrayRecord(model.state_dict())

    def body_problem(self, body: str) -> str | None:
        """Whole models are averaged: a node must run the run's one body."""
        if body != self.cfg["body"]:
            return f"registration names body {body!r}, but {self.name} averages whole models of body {self.cfg['body']!r}: every client must run it"
        return None

    def shared(self, server_round: int, arrays: ArrayRecord) -> ArrayRecord:
        """The part of the server's arrays exchanged in ``server_round`` (FedAvg: all)."""
        return arrays

    def configure_train(self, server_round: int, arrays: ArrayRecord, engine: Engine) -> dict[int, RecordDict]:
        sent = self.shared(server_round, arrays)
        self.sent = to_numpy(sent)
        content = self.content(server_round, sent)
        if self.cfg["client-sampling"] == "data-ratio":
            self.engine = engine  # aggregate_train records the counts replies give
            self.draws = engine.draw(self.cfg["fraction-train"], self.data_ratio(engine))
            return {node: content for node in self.draws}
        return {node: content for node in engine.sample(self.cfg["fraction-train"])}

    def data_ratio(self, engine: Engine) -> dict[int, float]:
        """n_k of every available node, for draws ∝ n_k/n: the partition's size where the
        server holds the data, else the count its last accepted reply gave (capped like
        every count), and the mean of the known ones for a node not yet heard from."""
        sizes = self.services.data.partition_sizes
        nodes = engine.nodes()
        if sizes is not None:
            return {n: float(sizes[engine.partition_of(n)][0]) for n in nodes}
        known = {n: float(engine.registry.clients[n].state["n"]) for n in nodes if "n" in engine.registry.clients[n].state}
        fill = float(np.mean(list(known.values()))) if known else 1.0
        return {n: known.get(n, fill) for n in nodes}

    def train_layout(self, server_round: int) -> Layout:
        """A reply is the arrays it was sent, same names, shapes and dtypes, with n > 0
        and an update no larger than ``max-update-norm`` allows."""
        specs = {k: ArraySpec(tuple(v.shape), str(v.dtype)) for k, v in self.sent.items()}
        return Layout(specs, count=True, optional=(P.LOSS,), check=partial(self.check_update, bound=self.update_bound(server_round)))

    def update_bound(self, server_round: int) -> tuple[str, float]:
        """The key and value bounding ``server_round``'s relative update norms. Round 1 starts
        from the seeded random model, and long training moves far from it (measured: 1.0 with
        1,000 examples a client, 2.7 with 20,000): it has its own key, to loosen on its own."""
        key = "max-first-update-norm" if server_round <= 1 else "max-update-norm"
        return key, float(self.cfg[key])

    def check_update(
        self, arrays: dict[str, np.ndarray], reply: Reply, bound: tuple[str, float]
    ) -> tuple[dict[str, np.ndarray] | None, str | None]:
        """``arrays`` when they may be averaged: a count to weigh them by, and an update no
        further from the model sent than ``bound`` (key, value) allows."""
        if reply.count == 0:
            return None, "num-examples is 0: nothing to weigh the update by"
        norm = relative_update_norm(self.sent, arrays)
        key, limit = bound
        if not norm <= limit:
            return None, Rejection(
                f"update norm {norm:.4g} × max(|w_global|, 1) exceeds {key}={limit:g} (raise it if honest clients move this far)",
                update_norm=norm,
            )
        return arrays, None

    def update_norms(self, replies: list[Reply]) -> dict[str, float]:
        """Largest and mean relative update norm of the accepted replies, for rounds.jsonl
        (beside ``rejected_update_norms``): what honest clients produce, against the bound."""
        norms = [relative_update_norm(self.sent, r.payload) for r in replies]
        return {"update_norm_max": max(norms), "update_norm_mean": float(np.mean(norms))} if norms else {}

    def aggregate_train(self, server_round: int, replies: list[Reply]) -> Step:
        if self.cfg["client-sampling"] == "data-ratio":  # scheme I: every draw weighs the same
            for r in replies:
                self.engine.registry.clients[r.node_id].state["n"] = int(r.count)
            weights = [self.draws.get(r.node_id, 0) for r in replies]
        else:
            weights = [r.count for r in replies]
        avg = weighted_average([r.payload for r in replies], weights, like=self.sent)
        losses = [r.metrics.get(P.LOSS, float("nan")) for r in replies]
        return Step(to_record(avg), len(replies), {"loss": mean_finite(losses), **self.update_norms(replies)})
