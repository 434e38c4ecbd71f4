"""LG-FedAvg client: train the local body and the received global layers jointly on the
task loss and return the global layers. For the new test it uploads its whole model
once (the server knows its body from its registration)."""

from __future__ import annotations

from flwr.app import ArrayRecord, MetricRecord, RecordDict

from client.env import ClientEnv
from client.procedures.layer_sharing import SharedLayersClient
from core import protocol as P


class LGFedAvgClient(SharedLayersClient):
    """LG-FedAvg's client: the local body and the global top layers trained jointly; the whole model once for the new test."""

    methods = ("lg-fedavg",)

    def evaluate(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Score as the other layer-sharing methods, except in the upload phase, where the whole model goes up for the new-test evaluation."""
        if str(content[P.CONFIG].get(P.PHASE, "")) != P.PHASE_UPLOAD:
            return super().evaluate(env, content, state)
        model, _ = self.model(env, content, state)
        weights = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
        return RecordDict({P.ARRAYS: weights, P.METRICS: MetricRecord({P.PARTITION_ID: env.partition_id})})
