"""FedRep (Collins et al. 2021): the body is averaged, the top ``fedrep-local-layers``
layers (the head) stay local. Clients first fit their head with the body fixed
(``fedrep-head-epochs``), then the body with the head fixed (``local-epochs``)."""

from __future__ import annotations

from headway.core.models import Net
from headway.strategies.fedper import all_but_top
from headway.strategies.layer_sharing import LayerSharing


class FedRep(LayerSharing):
    """FedRep's server (this module's docstring): averages the bodies; the heads stay local."""

    name = "fedrep"

    def shared_layers(self, model: Net, server_round: int) -> list[str] | None:
        """Every layer but the top ``fedrep-local-layers``."""
        return all_but_top(model, self.settings.fedrep.local_layers)
