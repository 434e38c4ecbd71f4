"""Methods that average some named layers and keep the others on each client
(LG-FedAvg, FedPer, FedRep): FedAvg's aggregation over a chosen part of the model.

The server holds only the shared layers. Each round it sends them, the client merges
them into its own model (kept in its local state), trains, and returns exactly the
arrays it received; the server averages them with weights n_k/n.
"""

from __future__ import annotations

from typing import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message
from flwr.serverapp import Grid

from core.config import ConfigError, body_names
from core.data import DatasetSpec
from core.layers import select
from core.models import Net, build_model
from strategies.fedavg import FedAvg, to_numpy, to_record


class LayerSharing(FedAvg):
    """Average the layers :meth:`shared_layers` names; the rest stay local."""

    has_global_model = False  # each client predicts with its own mix of local and shared layers
    mixed_bodies = False  # whether clients may run different bodies (only if the shared layers agree)

    def shared_layers(self, model: Net, server_round: int) -> list[str] | None:
        """Layers averaged in ``server_round``; None means every layer."""
        raise NotImplementedError

    def check(self, spec: DatasetSpec) -> None:
        bodies = body_names(self.cfg)
        if len(bodies) > 1 and not self.mixed_bodies:
            raise ConfigError(f"{self.name} averages body layers, so every client must run the same body: leave 'bodies' empty")
        self.template = self._model(self.cfg["body"], spec)
        try:
            reference = self._shared_shapes(self.template)
        except ValueError as exc:
            raise ConfigError(f"{self.name}: {exc}") from None
        for body in bodies:
            shapes = self._shared_shapes(self._model(body, spec))
            if shapes != reference:
                raise ConfigError(f"{self.name}: the shared layers of body {body!r} do not match those of {self.cfg['body']!r} ({shapes} vs {reference}); use bodies whose shared layers agree")

    def _model(self, body: str, spec: DatasetSpec) -> Net:
        return build_model(body, spec.input_shape, self.cfg["feature-dim"], spec.num_classes, self.cfg["seed"])

    def _shared_shapes(self, model: Net) -> dict[str, tuple[int, ...]]:
        """Shapes of the layers shared after any warm-up (the part that must agree across bodies)."""
        layers = self.shared_layers(model, self.cfg["num-server-rounds"])
        state = model.state_dict()
        part = state if layers is None else select(state, layers)
        return {k: tuple(v.shape) for k, v in part.items()}

    def initial_arrays(self, spec: DatasetSpec) -> ArrayRecord:
        return ArrayRecord(self.template.state_dict())

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        layers = self.shared_layers(self.template, server_round)
        if layers is not None:
            arrays = to_record(select(to_numpy(arrays), layers))
        return super().configure_train(server_round, arrays, config, grid)
