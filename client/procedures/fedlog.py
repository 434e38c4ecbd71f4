"""FedLog client (fedlog-extended Alg. 1): with the global head η fixed, train the local
body on the cross-entropy of softmax(η·φ) (Eq. 10; FedLog-C adds Eq. 13's pull towards
the global class means, and with fedlog-beta AAAI Eq. 15's push away from the other classes'
means), then send the sufficient statistic Σ φ⊗e_y and the count. Under
fedlog-c-downlink=stats the server sends Φ instead of η, and the client solves η.

Under ``fedlog-dp=local`` the reply holds the noised statistic and the partition id only:
no count (the server reads it from the noised count row) and no training loss. The
noise comes from OS entropy, never from the run seed."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from headway.client.env import ClientEnv
from headway.client.procedures.base import round_of, test_metrics, train_metrics
from headway.core import protocol as P
from headway.core.fedlog import add_noise, class_means, head_from_downlink, noise_sigma, share_sigma, sufficient_statistics, uplink_array
from headway.core.models import body_width, build_body, feature_pair
from headway.core.training import predict, train_epochs

BODY_STATE = "fedlog-body"


class FeatureMap(torch.nn.Module):
    """φ(x) = [1, clip(body(x))]: the body's features with the constant first feature."""

    def __init__(self, body: torch.nn.Module, clip: float):
        super().__init__()
        self.body = body
        self.clip = clip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """φ(x) for a batch, with the body's dropout as its mode sets it."""
        return self._phi(self.body(x))

    def pair(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(φ with the body's feature dropout, φ without it) from one pass; the same φ twice
        for a body without feature dropout."""
        dropped, kept = feature_pair(self.body, x)
        if dropped is kept:
            phi = self._phi(kept)
            return phi, phi
        return self._phi(dropped), self._phi(kept)

    def _phi(self, f: torch.Tensor) -> torch.Tensor:
        if self.clip > 0:
            f = torch.clamp(f, -self.clip, self.clip)  # App. C, Eq. 14
        return torch.cat([torch.ones(len(f), 1, device=f.device, dtype=f.dtype), f], dim=1)


def fedlog_c_loss(phi: torch.Tensor, y: torch.Tensor, means: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """Eq. 13's auxiliary term: mean over the batch of ‖φ_i − Φ̄_{y_i}‖² (classes the
    server has seen only)."""
    mask = known[y]
    if not bool(mask.any()):
        return phi.sum() * 0.0
    diff = phi[mask] - means[y[mask]]
    return (diff**2).sum(1).sum() / len(y)


def fedlog_c_repulsion(phi: torch.Tensor, y: torch.Tensor, means: torch.Tensor, known: torch.Tensor) -> torch.Tensor:
    """AAAI Eq. 15's β term, before its minus sign: Σ_i Σ_{y'≠y_i} ‖φ_i − Φ̄_{y'}‖² over the batch,
    divided by its size, for the classes y' the server has seen only. It grows without bound in
    ‖φ‖, so the loss −β·this has a minimum only while α's pull outweighs it (β·(classes − 1) < α,
    the quadratic's coefficient) or the features are clipped (FedLog.check_config holds a run to that)."""
    d2 = ((phi[:, None, :] - means[None, :, :]) ** 2).sum(2)  # batch × classes
    other = known[None, :] & (torch.arange(means.shape[0], device=phi.device)[None, :] != y[:, None])
    return (d2 * other).sum() / len(y)


def feature_map(env: ClientEnv, body_state: Mapping[str, torch.Tensor] | None) -> FeatureMap:
    """This client's seeded body, loaded with the state it kept (if any), as φ."""
    body = build_body(env.body, env.data.input_shape, env.cfg.feature_dim, env.init_seed, env.cfg.body_dropout)
    if body_state is not None:
        body.load_state_dict(body_state)
    return FeatureMap(body, env.cfg.fedlog.clip).to(env.device)


def train_body(env: ClientEnv, fmap: FeatureMap, eta: np.ndarray, phi_sum: np.ndarray | None, server_round: int) -> float:
    """FedLog's local step: train the body under the fixed head η on Eq. 10's cross-entropy,
    plus Eq. 13's pull towards the global class means of ``phi_sum`` under FedLog-C
    (``fedlog-alpha`` > 0) and Eq. 15's push from the other classes' means (``fedlog-beta`` > 0).
    Returns the training loss."""
    cfg = env.cfg
    head = torch.as_tensor(eta, dtype=torch.float32, device=env.device)
    alpha, beta = cfg.fedlog.alpha, cfg.fedlog.beta
    means = known = None
    if (alpha > 0 or beta > 0) and phi_sum is not None:
        means = torch.as_tensor(class_means(phi_sum), dtype=torch.float32, device=env.device)
        known = torch.as_tensor(phi_sum[:, 0] > 0, device=env.device)

    def objective(pair: tuple[torch.Tensor, torch.Tensor], y: torch.Tensor) -> torch.Tensor:
        phi, kept = pair
        out = torch.nn.functional.cross_entropy(phi @ head.T, y)  # Eq. 10, on the dropped-out features
        if means is not None and known is not None:  # Eq. 13 on the features before feature dropout: on dropped-out
            # ones it would add a hidden (p/(1-p))·‖φ‖² penalty that shrinks the features
            if alpha > 0:
                out = out + alpha * fedlog_c_loss(kept, y, means, known)
            if beta > 0:  # Eq. 15, on the same features as α's term
                out = out - beta * fedlog_c_repulsion(kept, y, means, known)
        return out

    return train_epochs(
        fmap.pair,
        list(fmap.parameters()),
        env.x_train,
        env.y_train,
        epochs=cfg.local_epochs,
        batch_size=cfg.batch_size,
        lr=env.lr(server_round),
        optimizer=cfg.optimizer,
        loss_fn=objective,
        augment=env.data.augment,
        seed=env.seed_for(server_round),
        device=env.device,
        fresh_optimizer_each_epoch=True,
        modules=[fmap],
    )


def local_statistics(env: ClientEnv, fmap: FeatureMap) -> np.ndarray:
    """Σ φ⊗e_y over the local training set, in eval mode, noised under local or distributed DP."""
    fmap.eval()
    phi = predict(fmap, env.x_train, device=env.device).double().numpy()
    stats = sufficient_statistics(phi, env.y_train.numpy(), env.outputs)
    if env.cfg.fedlog.dp == "local":
        stats = add_noise(stats, noise_sigma(env.cfg, stats.shape[1]), np.random.default_rng())  # OS entropy
    elif env.cfg.fedlog.dp == "distributed":  # this client's share of the sum's noise; sent only masked (secure-aggregation)
        stats = add_noise(stats, share_sigma(env.cfg, stats.shape[1]), np.random.default_rng())
    return stats


class FedLogClient:
    """FedLog's client procedures (this module's docstring): the body's training and the statistics it sends."""

    methods = ("fedlog",)

    def _features(self, env: ClientEnv, state: RecordDict) -> FeatureMap:
        kept = state.array_records[BODY_STATE].to_torch_state_dict() if BODY_STATE in state.array_records else None
        return feature_map(env, kept)

    @staticmethod
    def head(env: ClientEnv, arrays: ArrayRecord, fmap: FeatureMap) -> np.ndarray:
        """The global head η: as the server sent it, or (fedlog-c-downlink=stats) solved here from the
        server's Φ with the run's prior, as the server solved it; ValueError when it did not come whole."""
        if P.ETA in arrays:
            return arrays[P.ETA].numpy()
        stats = arrays[P.STATS_SUM].numpy() if P.STATS_SUM in arrays else None
        shape = (env.outputs, body_width(fmap.body) + 1)  # φ's width: the body's features and the constant 1
        return head_from_downlink(stats, shape, env.cfg.fedlog.prior_chi, env.cfg.fedlog.prior_nu)

    def train(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Train the body against the server's η (in the train phase) and send the local statistics the server's MAP solve needs."""
        cfg, rnd = env.cfg, round_of(content)
        fmap = self._features(env, state)
        arrays = content.array_records[P.ARRAYS]
        phase = str(content.config_records[P.CONFIG].get(P.PHASE, P.PHASE_TRAIN))
        loss = float("nan")
        if phase == P.PHASE_TRAIN:
            phi_sum = arrays[P.STATS_SUM].numpy() if P.STATS_SUM in arrays else None
            loss = train_body(env, fmap, self.head(env, arrays, fmap), phi_sum, rnd)
            state[BODY_STATE] = ArrayRecord({k: v.detach().cpu() for k, v in fmap.body.state_dict().items()})
        stats = local_statistics(env, fmap)
        sparse = cfg.fedlog.uplink == "sparse"  # only the rows of the classes held (never under local DP)
        sent = uplink_array(stats, sparse, cfg.fedlog.uplink_dtype)
        reply = ArrayRecord({P.STATS_ROWS if sparse else P.STATS: Array(sent)})
        if cfg.fedlog.dp == "local":  # release nothing private beside the noised statistic
            return RecordDict({P.ARRAYS: reply, P.METRICS: MetricRecord({P.PARTITION_ID: env.partition_id})})
        return RecordDict({P.ARRAYS: reply, P.METRICS: train_metrics(env, loss)})

    def evaluate(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Score the global head η on this client's own features, since bodies stay local."""
        fmap = self._features(env, state).eval()
        eta = torch.as_tensor(self.head(env, content.array_records[P.ARRAYS], fmap), dtype=torch.float32, device=env.device)
        return RecordDict({P.METRICS: test_metrics(env, lambda x: fmap(x) @ eta.T)})
