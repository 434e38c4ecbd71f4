"""FedPer (Arivazhagan et al. 2019): bodies are averaged, the top ``fedper-local-layers``
layers (two in FedLog's comparison) stay on each client; clients train everything jointly."""

from __future__ import annotations

from headway.core.layers import layer_names, top_layers
from headway.core.models import Net
from headway.strategies.layer_sharing import LayerSharing


def all_but_top(model: Net, k: int) -> list[str]:
    """Every layer except the ``k`` nearest the output."""
    local = set(top_layers(model, k))
    shared = [name for name in layer_names(model) if name not in local]
    if not shared:
        raise ValueError(f"keeping {k} top layers local leaves nothing to share in a model with layers {layer_names(model)}")
    return shared


class FedPer(LayerSharing):
    """FedPer's server (this module's docstring): averages everything but the top layers."""

    name = "fedper"

    def shared_layers(self, model: Net, server_round: int) -> list[str] | None:
        """Every layer but the top ``fedper-local-layers``."""
        return all_but_top(model, self.settings.fedper.local_layers)
