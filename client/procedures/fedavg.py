"""FedAvg and FedProx clients: load the global model, train all of it, send it back.

FedProx adds (μ/2)‖w − w_global‖² to the task loss (``fedprox-mu``)."""

from __future__ import annotations

import torch
from headway.client.env import ClientEnv
from headway.client.procedures.layer_sharing import SharedLayersClient
from headway.core.models import Net
from headway.core.training import task_loss


class FedAvgClient(SharedLayersClient):
    """FedAvg's client: train the whole received model on the task loss and send it back."""

    methods = ("fedavg",)
    keeps_state = False  # the server sends every layer each round


class FedProxClient(FedAvgClient):
    """FedProx's client: FedAvg's training plus the proximal term (fedprox-mu)/2·‖w − w_global‖²."""

    methods = ("fedprox",)

    def fit(self, env: ClientEnv, model: Net, shared: list[str], server_round: int) -> float:
        """Train every layer with FedAvg's loss plus the proximal pull towards the layers the server sent."""
        mu = env.cfg.fedprox.mu
        params = list(model.parameters())
        anchor = [p.detach().clone() for p in params]
        base = task_loss(env.data.task)

        def loss_fn(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            prox = sum(((p - a) ** 2).sum() for p, a in zip(params, anchor))
            return base(out, y) + 0.5 * mu * prox

        return self.train_all(env, model, params, server_round, loss_fn=loss_fn)
