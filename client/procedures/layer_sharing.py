"""Client side of every method that trains a whole model and exchanges some of its
layers (the FedAvg family and the layer-sharing methods: the subclasses of :class:`SharedLayersClient`).

The client's own model lives in its local state; the layers the server sends overwrite
their local copies, and after training exactly those layers go back.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, RecordDict
from headway.client.env import ClientEnv
from headway.client.procedures.base import round_of, test_metrics, train_metrics
from headway.core import protocol as P
from headway.core import seeds
from headway.core.models import Net
from headway.core.training import task_loss, train_epochs

PERSONAL = "personal-model"


def local_model(env: ClientEnv, state: RecordDict) -> Net:
    """The model this client kept from its last round, or the seeded initial model."""
    model = env.build_model()
    if PERSONAL in state.array_records:
        model.load_state_dict(state.array_records[PERSONAL].to_torch_state_dict())
    return model


class SharedLayersClient:
    """Merge the received layers into the local model, train it, return those layers."""

    methods = ("fedper",)  # as is: FedPer; the other layer-sharing methods subclass it

    keeps_state = True  # False for FedAvg-like methods, where every layer comes from the server

    def model(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> tuple[Net, list[str]]:
        """This client's model with the received layers in place, and their names."""
        model = local_model(env, state) if self.keeps_state else env.build_model()
        received = content.array_records[P.ARRAYS].to_torch_state_dict()
        own = model.state_dict()
        for name, value in received.items():
            if name not in own or own[name].shape != value.shape:
                raise ValueError(
                    f"the server sent layer {name!r} with shape {tuple(value.shape)}, which this client's {env.body} model does not have"
                )
        model.load_state_dict(received, strict=False)
        return model, list(received)

    def fit(self, env: ClientEnv, model: Net, shared: list[str], server_round: int) -> float:
        """Local training (default: every parameter on the task loss); returns the loss."""
        return self.train_all(env, model, list(model.parameters()), server_round)

    def train_all(
        self,
        env: ClientEnv,
        model: Net,
        params: list[torch.nn.Parameter],
        server_round: int,
        epochs: int | None = None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
        salt: int = seeds.BATCHES,
    ) -> float:
        """Train ``params`` for ``epochs`` (default ``local-epochs``); ``salt`` varies the batch order."""
        cfg = env.cfg
        return train_epochs(
            model,
            params,
            env.x_train,
            env.y_train,
            epochs=cfg.local_epochs if epochs is None else epochs,
            batch_size=cfg.batch_size,
            lr=env.lr(server_round),
            optimizer=cfg.optimizer,
            loss_fn=loss_fn or task_loss(env.data.task),
            augment=env.data.augment,
            seed=env.seed_for(server_round, salt=salt),
            device=env.device,
            modules=[model],
        )

    def train(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Train the merged model and send back exactly the layers the server shares, keeping the rest local."""
        model, shared = self.model(env, content, state)
        loss = self.fit(env, model, shared, round_of(content))
        weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        if self.keeps_state:
            state[PERSONAL] = ArrayRecord(weights)
        reply = ArrayRecord({k: weights[k] for k in shared})
        return RecordDict({P.ARRAYS: reply, P.METRICS: train_metrics(env, loss)})

    def evaluate(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Score the merged model (local layers plus the server's) on the local test split."""
        model, _ = self.model(env, content, state)
        return RecordDict({P.METRICS: test_metrics(env, model.eval())})
