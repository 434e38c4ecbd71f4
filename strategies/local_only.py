"""The "local only" arm of LG-FedAvg's Table 1 (Liang et al. 2020): every client trains its whole
model on its own data and nothing is averaged; the server sends only config (no arrays) and gets
back only counts and a loss. A layer-sharing method that shares no layer.

Clients are scored on their own test splits with their own models (*local test*); after the last
round every client uploads its model once and the server scores the ensemble (mean logits) on the
whole test set (*new test*), as for LG-FedAvg, counting those bytes in the ``upload`` phase.
"""

from __future__ import annotations

import logging

import torch
from flwr.app import ArrayRecord, MessageType

from core import protocol as P
from core.models import Net
from core.training import ensemble_logits, task_metrics
from strategies.base import Step, TrainRound, mean_finite
from strategies.engine import Engine
from strategies.fedavg import FedAvgState
from strategies.layer_sharing import LayerSharing
from strategies.replies import ArraySpec, Layout, Reply
from strategies.state import ServerState

log = logging.getLogger("headway")


class LocalOnly(LayerSharing):
    """Local only (this module's docstring): no layer is shared; bodies may differ freely."""

    name = "local-only"
    mixed_bodies = True  # nothing is averaged, so any known body will do

    def shared_layers(self, model: Net, server_round: int) -> list[str] | None:
        """No layer, in every round."""
        return []

    def aggregate_train(self, ctx: TrainRound[FedAvgState], replies: list[Reply]) -> Step[FedAvgState]:
        """Nothing to average: the server keeps no arrays and the round counts the clients whose replies came valid, and their mean loss."""
        return Step(ArrayRecord(), len(replies), {"loss": mean_finite([r.metrics.get(P.LOSS, float("nan")) for r in replies])})

    def upload_layout(self, engine: Engine, node: int) -> Layout:
        """A client's whole model, shaped as its registered body's."""
        model = self._model(engine.registry.clients[node].body)
        specs = {k: ArraySpec(tuple(v.shape), str(v.numpy().dtype)) for k, v in model.state_dict().items()}
        return Layout(specs, count=False, check=lambda arrays, reply: (arrays, None))

    def final_evaluation(self, state: ServerState[FedAvgState], engine: Engine) -> dict[str, float]:
        """New test: collect every client's model once and score their logit ensemble on the whole test set."""
        test = self.services.data.test_tensors()
        if test is None:
            return {}
        content = self.content(self.settings.num_server_rounds, state.arrays, **{P.PHASE: P.PHASE_UPLOAD})
        replies = engine.exchange(
            P.PHASE_UPLOAD, {n: content for n in engine.nodes()}, MessageType.EVALUATE, lambda node: self.upload_layout(engine, node)
        )
        models = [self._uploaded(engine, r) for r in replies]
        if not models:
            return {}
        s = task_metrics(self.spec.task, ensemble_logits(models, test[0]), test[1])
        log.info("local-only new test: ensemble of %d local models, accuracy %.4f", len(models), s["accuracy"])
        return {"new_test_accuracy": s["accuracy"], "new_test_models": float(len(models))}

    def _uploaded(self, engine: Engine, reply: Reply) -> Net:
        model = self._model(engine.registry.clients[reply.node_id].body)
        model.load_state_dict({k: torch.as_tensor(v) for k, v in reply.arrays.items()})
        return model.eval()
