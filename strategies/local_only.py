"""The "local only" arm of LG-FedAvg's Table 1 (Liang et al. 2020): every client trains its whole
model on its own data and nothing is averaged; the server sends only config (no arrays) and gets
back only counts and a loss. A layer-sharing method that shares no layer.

Clients are scored on their own test splits with their own models (*local test*); after the last
round every client uploads its model once and the server scores the ensemble (``lg-ensemble``) on the
whole test set (*new test*, :mod:`headway.strategies.new_test`), as for LG-FedAvg, counting those bytes in the ``upload`` phase.
"""

from __future__ import annotations

import logging

from flwr.app import ArrayRecord
from headway.core import protocol as P
from headway.core.models import Net
from headway.strategies.base import Step, TrainRound, mean_finite
from headway.strategies.engine import Engine
from headway.strategies.fedavg import FedAvgState
from headway.strategies.layer_sharing import LayerSharing
from headway.strategies.new_test import new_test
from headway.strategies.replies import Reply
from headway.strategies.state import ServerState

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

    def final_evaluation(self, state: ServerState[FedAvgState], engine: Engine) -> dict[str, float]:
        """New test (:mod:`headway.strategies.new_test`): every client's model once, their outputs combined by ``lg-ensemble``."""
        last = self.settings.num_server_rounds if state.end is None else state.end  # the round the run stopped at
        return new_test(self, engine, state.arrays, last, self.settings.lg_fedavg.ensemble)
