"""FedDBE client (Zhang et al., NeurIPS 2023): train the whole received model with the head reading
body(x) + b, where b (the personalized representation bias, PRBM) is this client's own trainable
vector kept in its state and never sent, and the loss adds κ·MR, the pull of the running mean of the
body's features towards the server's global mean (core/dbe.py).

While the server has no global mean (round 1) the client trains as FedAvg, with neither b nor MR,
as the authors' initialization period does. A round whose reply the server asks a mean of (the
first, or every one under ``feddbe-global-mean=every-round``) also sends the mean body feature over
the client's training rows, computed in eval mode after training. Deviations from the authors'
code: b is trained by the run's optimizer with the model (theirs: its own SGD at the same rate), and
the mean sent is over all training rows (theirs: the running mean, the last batch's with μ = 1).
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from headway.client.env import ClientEnv
from headway.client.procedures.base import round_of, test_metrics, train_metrics
from headway.client.procedures.layer_sharing import SharedLayersClient
from headway.core import protocol as P
from headway.core.dbe import mean_regularization, running_mean
from headway.core.methods import FEDDBE_RECORDS
from headway.core.models import Net, body_width, feature_pair
from headway.core.training import predict, task_loss, train_epochs

BIAS = "feddbe-bias"  # the PRBM vector in the node's state
FEATURE_MEAN = FEDDBE_RECORDS.feature_mean
GLOBAL_MEAN = FEDDBE_RECORDS.global_mean


def received_global_mean(content: RecordDict, width: int) -> torch.Tensor | None:
    """The server's global mean feature from a message (None: it sent none); ValueError for one of the wrong width or not finite."""
    arrays = content.array_records[P.ARRAYS]
    if GLOBAL_MEAN not in arrays:
        return None
    mean = torch.as_tensor(np.asarray(arrays[GLOBAL_MEAN].numpy(), np.float32))
    if tuple(mean.shape) != (width,) or not bool(torch.isfinite(mean).all()):
        raise ValueError(
            f"the server sent a global mean of shape {tuple(mean.shape)} (finite: {bool(torch.isfinite(mean).all())}), expected {width} finite values"
        )
    return mean


def bias_of(state: RecordDict, width: int) -> torch.Tensor:
    """This client's PRBM vector from its state (zeros before its first DBE round, or when the state's is not ``width`` long)."""
    if BIAS in state.array_records:
        kept = state.array_records[BIAS][BIAS].numpy()
        if kept.shape == (width,):
            return torch.as_tensor(kept.copy())
    return torch.zeros(width)


def without_global_mean(content: RecordDict) -> RecordDict:
    """``content`` with only the model's arrays (what the layer-sharing loader expects)."""
    arrays = content.array_records[P.ARRAYS]
    model = ArrayRecord({k: arrays[k] for k in arrays if k != GLOBAL_MEAN})
    out = RecordDict({P.ARRAYS: model})
    for name, record in content.config_records.items():
        out[name] = record
    return out


class FedDBEClient(SharedLayersClient):
    """FedDBE's client (this module's docstring): whole-model training with the local bias and MR."""

    methods = ("feddbe",)
    keeps_state = False  # the model comes from the server every round; only the bias vector is kept (under BIAS)

    def width(self, model: Net) -> int:
        """m, the body's feature width (what b and the means are long)."""
        return body_width(model.body)

    def train(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Train with b and κ·MR once the server has a global mean; keep b; send the model, and the mean feature when asked."""
        model, shared = self.model(env, without_global_mean(content), state)
        m, rnd = self.width(model), round_of(content)
        target = received_global_mean(content, m)
        if target is None:
            loss = self.train_all(env, model, list(model.parameters()), rnd)  # the initialization period: plain FedAvg
        else:
            loss = self.train_dbe(env, model, state, target.to(env.device), rnd)
        weights = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        reply = ArrayRecord({k: weights[k] for k in shared})
        if target is None or env.cfg.feddbe.global_mean == "every-round":
            features = predict(model.eval().body, env.x_train, device=env.device).double()
            mean = features.mean(dim=0) if len(features) else torch.zeros(m, dtype=torch.float64)
            reply[FEATURE_MEAN] = Array(mean.numpy().astype(np.float32))
        return RecordDict({P.ARRAYS: reply, P.METRICS: train_metrics(env, loss)})

    def train_dbe(self, env: ClientEnv, model: Net, state: RecordDict, target: torch.Tensor, rnd: int) -> float:
        """``local-epochs`` on task loss + κ·MR with the head reading features + b; b is stored back in ``state``."""
        cfg = env.cfg.feddbe
        bias = torch.nn.Parameter(bias_of(state, self.width(model)).to(env.device))
        base = task_loss(env.data.task)
        run: list[torch.Tensor | None] = [None]  # the running mean, reset every round as the authors do

        def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            dropped, kept = feature_pair(model.body, x)
            return kept, model.head(dropped + bias)

        def objective(out: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
            features, logits = out
            local = running_mean(run[0], features, cfg.momentum)
            run[0] = local.detach()
            return base(logits, y) + cfg.kappa * mean_regularization(local, target)

        cfg_run = env.cfg
        loss = train_epochs(
            forward,
            [*model.parameters(), bias],
            env.x_train,
            env.y_train,
            epochs=cfg_run.local_epochs,
            batch_size=cfg_run.batch_size,
            lr=env.lr(rnd),
            optimizer=cfg_run.optimizer,
            loss_fn=objective,
            augment=env.data.augment,
            seed=env.seed_for(rnd),
            device=env.device,
            modules=[model],
        )
        state[BIAS] = ArrayRecord({BIAS: Array(bias.detach().cpu().numpy())})
        return loss

    def evaluate(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Score the received model with this client's b added to its features."""
        model, _ = self.model(env, without_global_mean(content), state)
        model.eval()
        bias = bias_of(state, self.width(model)).to(env.device)
        return RecordDict({P.METRICS: test_metrics(env, lambda x: model.head(model.body(x) + bias))})
