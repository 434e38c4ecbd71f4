"""FedProf client (Wu et al., Alg. 1 lines 20-24): profile the received global model's
``fedprof-layer`` on the local training data, then train as FedAvg does.

Before round 1 (phase ``profile``) a client only profiles the initial model and sends
the profile with its count; afterwards it sends its trained model and the profile of the
model it was sent.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from headway.client.env import ClientEnv
from headway.client.procedures.base import round_of, train_metrics
from headway.client.procedures.fedavg import FedAvgClient
from headway.core import protocol as P
from headway.core.profiles import model_profile


class FedProfClient(FedAvgClient):
    """FedProf's client: FedAvg's training, plus the profile of the model it was sent."""

    methods = ("fedprof",)

    def train(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Send the received model's profile (alone in the profile phase), then FedAvg's trained layers with it."""
        model, shared = self.model(env, content, state)
        profile = model_profile(model, env.cfg.fedprof.layer, env.x_train, device=env.device).astype(np.float32)
        phase = str(content[P.CONFIG].get(P.PHASE, P.PHASE_TRAIN))
        if phase == P.PHASE_PROFILE:
            return RecordDict({P.ARRAYS: ArrayRecord({P.PROFILE: Array(profile)}), P.METRICS: train_metrics(env, float("nan"))})
        loss = self.fit(env, model, shared, round_of(content))
        weights = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
        reply = ArrayRecord({**{k: Array(np.asarray(weights[k], order="C")) for k in shared}, P.PROFILE: Array(profile)})
        return RecordDict({P.ARRAYS: reply, P.METRICS: train_metrics(env, loss)})
