"""FedRep client: fit the local head with the body fixed (``fedrep-head-epochs``), then
the shared body with the head fixed (``local-epochs``); return the body."""

from __future__ import annotations

from headway.client.env import ClientEnv
from headway.client.procedures.layer_sharing import SharedLayersClient
from headway.core import seeds
from headway.core.models import Net
from headway.core.training import trainable_only


class FedRepClient(SharedLayersClient):
    """FedRep's client: the local head first, then the shared body (this module's docstring)."""

    methods = ("fedrep",)

    def fit(self, env: ClientEnv, model: Net, shared: list[str], server_round: int) -> float:
        """Fit the local head first on the fixed received body, then the shared body, as FedRep alternates them."""
        names = [n for n, _ in model.named_parameters()]
        body = [n for n in names if n in shared]
        head = [n for n in names if n not in shared]
        with trainable_only(model, head) as params:
            self.train_all(env, model, params, server_round, epochs=env.cfg.fedrep.head_epochs, salt=seeds.FEDREP_HEAD)
        with trainable_only(model, body) as params:
            return self.train_all(env, model, params, server_round)
