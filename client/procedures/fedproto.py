"""FedProto client: train the whole local model on the task loss plus
λ·mean squared distance between each feature vector and its class's global prototype,
then send per-class mean features and class counts. It predicts with its local head
and, where prototypes exist, with the nearest global prototype (both are reported)."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from headway.client.env import ClientEnv
from headway.client.procedures.base import round_of, test_metrics, train_metrics
from headway.client.procedures.layer_sharing import PERSONAL, local_model
from headway.core import protocol as P
from headway.core.models import feature_pair
from headway.core.prototypes import class_prototypes, nearest_prototype
from headway.core.training import predict, train_epochs


def global_prototypes(content: RecordDict, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(prototypes, known-class mask) from the server's message, or None in round 1."""
    arrays = content.array_records[P.ARRAYS]
    if P.PROTOTYPES not in arrays:
        return None
    protos = torch.as_tensor(arrays[P.PROTOTYPES].numpy(), dtype=torch.float32, device=device)
    known = torch.as_tensor(arrays[P.CLASS_COUNTS].numpy() > 0, device=device)
    return protos, known


def prototype_loss(features: torch.Tensor, y: torch.Tensor, protos: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """Mean squared distance (per feature) of features to their class's prototype, over
    the batch rows whose class has a global prototype."""
    mask = known[y]
    if not bool(mask.any()):
        return features.sum() * 0.0
    return ((features[mask] - protos[y[mask]]) ** 2).mean() * (mask.sum() / len(y))


class FedProtoClient:
    """FedProto's client procedures (this module's docstring): class prototypes up, global prototypes down."""

    methods = ("fedproto",)

    def train(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Train the local model with the pull towards the global prototypes and send this client's class prototypes."""
        cfg, rnd = env.cfg, round_of(content)
        model = local_model(env, state)
        glob = global_prototypes(content, env.device)
        lam = cfg.fedproto.lambda_

        def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            dropped, kept = feature_pair(model.body, x)  # prototypes are of the features before dropout
            return kept, model.head(dropped)

        def objective(out: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
            f, logits = out
            loss = torch.nn.functional.cross_entropy(logits, y)
            if glob is not None and lam > 0:
                loss = loss + lam * prototype_loss(f, y, *glob)
            return loss

        loss = train_epochs(
            forward,
            list(model.parameters()),
            env.x_train,
            env.y_train,
            epochs=cfg.local_epochs,
            batch_size=cfg.batch_size,
            lr=env.lr(rnd),
            optimizer=cfg.optimizer,
            loss_fn=objective,
            augment=env.data.augment,
            seed=env.seed_for(rnd),
            device=env.device,
            modules=[model],
        )
        state[PERSONAL] = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
        features = predict(model.body, env.x_train, device=env.device).double().numpy()
        protos, counts = class_prototypes(features, env.y_train.numpy(), env.outputs)
        reply = ArrayRecord({P.PROTOTYPES: Array(protos.astype(np.float32)), P.CLASS_COUNTS: Array(counts.astype(np.float32))})
        return RecordDict({P.ARRAYS: reply, P.METRICS: train_metrics(env, loss)})

    def evaluate(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Score both predictors, the local head and the nearest global prototype, so the server can report either."""
        model = local_model(env, state).eval()
        metrics = test_metrics(env, model)
        head_correct = P.as_int(metrics[P.CORRECT])
        glob = global_prototypes(content, torch.device("cpu"))
        proto_correct = head_correct  # no prototypes yet: the head is the only predictor
        if glob is not None and len(env.y_test):
            features = predict(model.body, env.x_test, device=env.device).numpy()
            pred = nearest_prototype(features, glob[0].numpy(), glob[1].numpy())
            proto_correct = int((pred == env.y_test.numpy()).sum())
        metrics[f"{P.CORRECT}-head"] = head_correct
        metrics[f"{P.CORRECT}-prototype"] = proto_correct
        if env.cfg.fedproto.predict == "prototype":
            metrics[P.CORRECT] = proto_correct
        return RecordDict({P.METRICS: metrics})
