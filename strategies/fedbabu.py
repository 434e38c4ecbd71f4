"""FedBABU (Oh, Kim, Yun, ICLR 2022): FedAvg on the body alone. The head (the last linear
layer) keeps its seeded random initialization on every client and is never sent or
averaged; clients fine-tune before they score (client/procedures/fedbabu.py), so the
reported ``accuracy`` is the personalized one and ``accuracy_initial`` the global
model's. Secure aggregation and robust rules apply to the body as for FedPer."""

from __future__ import annotations

from headway.core import protocol as P
from headway.core.layers import layer_names
from headway.core.models import Net
from headway.strategies.layer_sharing import LayerSharing

HEAD = "head"  # the Net's head module


def body_layers(model: Net) -> list[str]:
    """Every layer of ``model`` but its head."""
    body = [name for name in layer_names(model) if name != HEAD]
    if not body:
        raise ValueError(f"a model with layers {layer_names(model)} has no body layer to share")
    return body


class FedBABU(LayerSharing):
    """FedBABU's server (this module's docstring): averages the bodies; the fixed head stays out of every exchange."""

    name = "fedbabu"
    eval_metrics = (f"{P.CORRECT}-initial",)  # -> accuracy_initial

    def shared_layers(self, model: Net, server_round: int) -> list[str] | None:
        """The body, every round."""
        return body_layers(model)
