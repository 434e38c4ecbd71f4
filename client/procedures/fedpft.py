"""FedPFT client (Beitollahi et al., Alg. 1 lines 5–10 and §4.2): extract features with
the shared frozen extractor, fit one Gaussian mixture per class, send them in float16.

- ``train`` phase (centralized): send the mixtures; the server trains the head.
- ``chain`` phase (decentralized): the message holds the previous client's mixtures (none
  for the first); sample them, fit the mixtures anew on the own features plus the samples,
  train the own head on the same union (and a local-only head for comparison), keep both
  in the node's state and send the new mixtures on.
- ``evaluate``: the head the server sent, or under ``chain`` the own heads.

Under ``fedpft-dp=on`` each class's Gaussian is released by :func:`headway.core.fedpft.privatize`
with noise from OS entropy, never from the run seed.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict
from headway.client.env import ClientEnv
from headway.client.procedures.base import outputs_metrics, train_metrics
from headway.core import protocol as P
from headway.core import seeds
from headway.core.extractors import feature_dim
from headway.core.fedpft import (
    ClassMixture,
    PayloadCheck,
    capped_counts,
    encode,
    features,
    fit_class_mixtures,
    head_logits,
    normalize,
    privatize,
    synthesize,
    train_head,
)

HEAD_STATE = "fedpft-head"
LOCAL_HEAD_STATE = "fedpft-local-head"
CORRECT_LOCAL = P.CORRECT + "-local"


class FedPFTClient:
    """FedPFT's client procedures (this module's docstring): class mixtures of frozen features, centralized or chained."""

    methods = ("fedpft",)

    def _features(self, env: ClientEnv, split: str) -> torch.Tensor:
        x = env.x_train if split == "train" else env.x_test
        return features(env.cfg, env.data.name, x, env.device)

    def _mixtures(self, env: ClientEnv, f: torch.Tensor, y: np.ndarray) -> list[ClassMixture]:
        cfg = env.cfg
        if cfg.fedpft.dp == "on":
            rng = np.random.default_rng()  # OS entropy: the noise must not follow from the run config
            return [
                privatize(f[torch.as_tensor(y == c)], int(c), cfg.fedpft.covariance, cfg.fedpft.epsilon, cfg.fedpft.delta, rng)[0]
                for c in np.unique(y)
                if int(np.sum(y == c)) >= cfg.fedpft.min_class_examples
            ]
        mixtures, _ = fit_class_mixtures(
            f,
            y,
            cfg.fedpft.components,
            cfg.fedpft.covariance,
            cfg.fedpft.min_class_examples,
            cfg.fedpft.reg_covar,
            cfg.fedpft.em_tol,
            cfg.fedpft.em_max_iter,
            cfg.fedpft.em_init,
            env.seed_for(0, seeds.FEDPFT_MIXTURES),
            env.device,
            cfg.fedpft.em_restarts,
        )
        return mixtures

    def _head(self, env: ClientEnv, x: torch.Tensor, y: torch.Tensor, salt: int) -> tuple[np.ndarray, np.ndarray]:
        cfg = env.cfg
        return train_head(
            x,
            y,
            env.outputs,
            cfg.fedpft.head_optimizer,
            cfg.fedpft.head_lr,
            cfg.fedpft.head_epochs,
            cfg.fedpft.head_batch_size,
            env.seed_for(0, salt),
            env.device,
        )

    def train(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Send this client's per-class mixtures (centralized), or refit them on the relayed ones and pass them on (chain)."""
        cfg = env.cfg
        phase = str(content[P.CONFIG].get(P.PHASE, P.PHASE_TRAIN))
        f, y = self._features(env, "train"), env.y_train.numpy()
        dim = f.shape[1]
        if phase == P.PHASE_CHAIN:
            received = self._received(env, content, dim)
            local = self._head(env, f, env.y_train, seeds.FEDPFT_LOCAL_HEAD)
            if received:
                counts = capped_counts(received, cfg.fedpft.max_synthetic)
                xs, ys = synthesize(received, torch.Generator().manual_seed(env.seed_for(0, seeds.FEDPFT_SYNTHESIS)), counts)
                if cfg.fedpft.dp == "on":
                    xs = normalize(xs)  # the union must stay in the unit ball for Theorem 4.1
                f, y = torch.cat([f, xs.to(f.dtype)]), np.concatenate([y, ys.numpy()])
            head = self._head(env, f, torch.as_tensor(y), seeds.FEDPFT_CHAIN_HEAD)
            state[HEAD_STATE] = ArrayRecord({P.HEAD_WEIGHT: Array(head[0]), P.HEAD_BIAS: Array(head[1])})
            state[LOCAL_HEAD_STATE] = ArrayRecord({P.HEAD_WEIGHT: Array(local[0]), P.HEAD_BIAS: Array(local[1])})
        elif phase != P.PHASE_TRAIN:
            raise ValueError(f"fedpft client: unknown phase {phase!r}")
        payload = encode(self._mixtures(env, f, y), dim, cfg.fedpft.covariance)
        return RecordDict({P.ARRAYS: ArrayRecord({k: Array(v) for k, v in payload.items()}), P.METRICS: train_metrics(env, float("nan"))})

    def _received(self, env: ClientEnv, content: RecordDict, dim: int) -> list[ClassMixture]:
        """The previous client's mixtures, checked again here: relayed data is untrusted too."""
        arrays = content.array_records.get(P.ARRAYS)
        if arrays is None or P.GMM_CLASSES not in arrays:
            return []
        cfg = env.cfg
        check = PayloadCheck(
            env.outputs, dim, cfg.fedpft.components, cfg.fedpft.covariance, cfg.max_feature_value, cfg.fedpft.min_class_examples
        )
        decoded = {k: arrays[k].numpy() for k in arrays}
        mixtures, problem = check.decode(decoded, None)
        if mixtures is None:
            raise ValueError(f"relayed mixtures rejected: {problem}")
        return mixtures

    def evaluate(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Score the head the server sent, or under the chain the heads trained here, on the local test features."""
        f = self._features(env, "test")
        arrays = content.array_records.get(P.ARRAYS, ArrayRecord())
        extra: dict[str, float] = {}
        if P.HEAD_WEIGHT in arrays:  # centralized: the server's head
            head = arrays
        elif HEAD_STATE in state.array_records:  # chain: the head trained here
            head = state.array_records[HEAD_STATE]
            local = state.array_records[LOCAL_HEAD_STATE]
            pred = head_logits(f, local[P.HEAD_WEIGHT].numpy(), local[P.HEAD_BIAS].numpy()).argmax(1)
            extra[CORRECT_LOCAL] = int((pred == env.y_test).sum())
        else:
            raise ValueError("fedpft client: no head to evaluate (none sent, none trained here)")
        weight, bias = head[P.HEAD_WEIGHT].numpy(), head[P.HEAD_BIAS].numpy()
        if weight.shape != (env.outputs, feature_dim(env.cfg.fedpft.extractor, env.data.input_shape)) or bias.shape != (env.outputs,):
            raise ValueError(
                f"fedpft client: head of shape {weight.shape}/{bias.shape} does not fit {env.outputs} classes × {f.shape[1]} features"
            )
        return RecordDict({P.METRICS: outputs_metrics(env, head_logits(f, weight, bias), extra)})
