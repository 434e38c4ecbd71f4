"""FedLog §4.1 synthetic experiment, run through the real client procedure and the
server's head solver (no Flower engine: one round, two clients, in process)."""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from headway.client.env import ClientEnv
from headway.client.procedures.fedlog import FedLogClient
from headway.core import protocol as P
from headway.core.config import resolve_settings
from headway.core.data import make_circle, to_tensors
from headway.core.fedlog import solve_head


def circle_round(seed: int, iterations: int = 30, lr: float = 0.01):
    """One FedLog round on 80 circle points split by ordered x1 between a three-layer
    (client 0) and a two-layer (client 1) body; a local iteration is one epoch
    (4 batches of 10). Returns (train accuracy under the new
    global head, per-client accuracies, features per client, labels per client, η)."""
    cfg = resolve_settings(
        {
            "dataset": "circle",
            "num-clients": 2,
            "local-epochs": iterations,
            "batch-size": 10,
            "lr": lr,
            "feature-dim": 2,
            "seed": seed,
            "fedlog-init": "random",
            "bodies": "mlp-deep,mlp",
            "body": "mlp",
        }
    )
    ds = make_circle(80, 1000, seed=seed)
    order = np.argsort(ds.x_train[:, 0])
    halves = [order[:40], order[40:]]
    rng = np.random.default_rng(seed)
    eta0 = rng.normal(0, 1 / np.sqrt(3), size=(2, 3))
    client, envs, states, stats = FedLogClient(), [], [], []
    for pid, (rows, body) in enumerate(zip(halves, ("mlp-deep", "mlp"))):
        x, y = to_tensors(ds, ds.x_train[rows], ds.y_train[rows])
        env = ClientEnv(cfg, pid, body, ds, x, y, x, y, torch.device("cpu"))
        state = RecordDict()
        content = RecordDict(
            {P.ARRAYS: ArrayRecord({"eta": Array(eta0.astype(np.float32))}), P.CONFIG: ConfigRecord({P.ROUND: 1, P.PHASE: "train"})}
        )
        reply = client.train(env, content, state)
        stats.append(reply.array_records[P.ARRAYS]["stats"].numpy().astype(np.float64))
        envs.append(env)
        states.append(state)
    eta = solve_head(stats[0] + stats[1], 80)
    feats, labels, accs = [], [], []
    for env, state in zip(envs, states):
        fmap = client._features(env, state).eval()
        with torch.no_grad():
            phi = fmap(env.x_train).numpy()
        feats.append(phi)
        labels.append(env.y_train.numpy())
        accs.append(float(((phi @ eta.T).argmax(1) == labels[-1]).mean()))
    total = float(np.mean(np.concatenate([(f @ eta.T).argmax(1) == y for f, y in zip(feats, labels)])))
    return total, accs, feats, labels, eta
