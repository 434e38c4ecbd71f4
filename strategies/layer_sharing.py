"""Methods that average some named layers and keep the others on each client
(the subclasses of :class:`LayerSharing`): FedAvg's aggregation over a chosen part of the model.

The server holds only the shared layers, from the start: each round, kept or not, it sends the
layers shared in that round (:meth:`LayerSharing.shared`), for training, evaluation and LG-FedAvg's
upload alike; the client merges them into its own model (kept in its local state), trains, and
returns exactly the arrays it received; the server averages them with weights n_k/n. (LG-FedAvg
after warm-up rounds holds the warm-up model until a round aggregates its top layers.)
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from typing import Any

from flwr.app import ArrayRecord, RecordDict
from headway.core.config import ConfigError, body_names
from headway.core.data import DatasetSpec
from headway.core.layers import layer_names, select
from headway.core.models import Net, build_model
from headway.core.settings import Settings
from headway.strategies.arrays import to_numpy, to_record
from headway.strategies.base import unknown_body
from headway.strategies.engine import Engine
from headway.strategies.fedavg import FedAvg, FedAvgState
from headway.strategies.services import Services
from headway.strategies.state import ServerState


@lru_cache(maxsize=64)
def _admission(strategy: LayerSharing, body: str) -> str | None:
    """Why known ``body`` cannot take part in ``strategy``'s run (None: it can), worked out once per body and
    strategy (registration asks it for every node) without the strategy keeping it: a strategy holds only its config."""
    try:
        return strategy._mismatch(body)
    except Exception as exc:  # a known body that cannot be built for this data set
        return f"registration names body {body!r}, which cannot be built for this data set: {exc}"


class LayerSharing(FedAvg):
    """Average the layers :meth:`shared_layers` names; the rest stay local."""

    has_global_model = False  # each client predicts with its own mix of local and shared layers
    averages = "body layers"  # without mixed_bodies, FedAvg's one-body rule holds (FedAvg.__init__)

    def __init__(self, settings: Settings, spec: DatasetSpec, services: Services):
        super().__init__(settings, spec, services)
        self.template = self._model(self.settings.body)
        try:
            self.reference = self._shared_shapes(self.template)
        except ValueError as exc:
            raise ConfigError(f"{self.name}: {exc}") from None
        for body in body_names(self.settings):
            if problem := self._mismatch(body):
                raise ConfigError(f"{self.name}: {problem}")

    def _mismatch(self, body: str) -> str | None:
        """Why ``body``'s shared layers differ from the run body's, or None."""
        shapes = self._shared_shapes(self._model(body))
        if shapes != self.reference:
            return (
                f"the shared layers of body {body!r} do not match those of {self.settings.body!r} ({shapes} vs {self.reference}); "
                "use bodies whose shared layers agree"
            )
        return None

    def body_problem(self, body: str) -> str | None:
        """A node may run any known body whose shared layers match the run body's (with
        ``mixed_bodies``), else the run body itself; checked once, at registration."""
        if not self.mixed_bodies:
            if body == self.settings.body:
                return None
            return f"registration names body {body!r}, but {self.name} {self.averaged_part()}: every client must run it"
        if problem := unknown_body(body, self.settings):
            return problem
        return _admission(self, body)

    def averaged_part(self) -> str:
        """What the server averages of the run body after any warm-up, and what stays on each client, in words (for refusals)."""
        layers = self.shared_layers(self.template, self.settings.num_server_rounds)
        if layers is None:
            return f"averages whole models of body {self.settings.body!r}"
        local = [name for name in layer_names(self.template) if name not in layers]
        return f"averages layers {', '.join(layers)} of body {self.settings.body!r} and keeps {', '.join(local) or 'none'} on each client"

    def shared_layers(self, model: Net, server_round: int) -> list[str] | None:
        """Layers averaged in ``server_round``; None means every layer."""
        raise NotImplementedError

    def round_layers(self, model: Net, server_round: int, method: Any) -> list[str] | None:
        """Layers averaged in ``server_round`` given the server's method state (LG-FedAvg: a warm-up that ends at a goal);
        default: :meth:`shared_layers`, decided by the round alone."""
        return self.shared_layers(model, server_round)

    def _model(self, body: str) -> Net:
        return build_model(
            body, self.spec.input_shape, self.settings.feature_dim, self.spec.num_classes, self.settings.seed, self.settings.body_dropout
        )

    def _shared_shapes(self, model: Net) -> dict[str, tuple[int, ...]]:
        """Shapes of the layers shared after any warm-up (the part that must agree across bodies)."""
        layers = self.shared_layers(model, self.settings.num_server_rounds)
        state = model.state_dict()
        part = state if layers is None else select(state, layers)
        return {k: tuple(v.shape) for k, v in part.items()}

    def initial_arrays(self) -> ArrayRecord:
        """The layers of the run body's seeded initial model shared in round 1: a round that keeps the
        model (too few replies for a robust rule) leaves the server holding them, never the local layers."""
        return self.shared(1, ArrayRecord(self.template.state_dict()), self.initial_method_state())

    def configure_evaluate(self, server_round: int, state: ServerState[FedAvgState], engine: Engine) -> dict[int, RecordDict]:
        """As every strategy's, sending only the layers shared in ``server_round``: the local ones are each client's own."""
        return super().configure_evaluate(
            server_round, replace(state, arrays=self.shared(server_round, state.arrays, state.method)), engine
        )

    def shared(self, server_round: int, arrays: ArrayRecord, method: Any = None) -> ArrayRecord:
        """The layers :meth:`round_layers` names for ``server_round`` under method state ``method``."""
        layers = self.round_layers(self.template, server_round, method)
        return arrays if layers is None else to_record(select(to_numpy(arrays), layers))
