"""Local-only client (LG-FedAvg's "local only" arm): train the whole local model on the task loss and
send no layer back (the server sends none); for the new test it uploads its whole model once."""

from __future__ import annotations

from flwr.app import ArrayRecord, MetricRecord, RecordDict
from headway.client.env import ClientEnv
from headway.client.procedures.layer_sharing import SharedLayersClient
from headway.core import protocol as P


class LocalOnlyClient(SharedLayersClient):
    """Every layer local: trained on the client's own data, never averaged; the whole model once for the new test."""

    methods = ("local-only",)

    def evaluate(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        """Score the local model, except in the upload phase, where the whole model goes up for the new test."""
        if str(content[P.CONFIG].get(P.PHASE, "")) != P.PHASE_UPLOAD:
            return super().evaluate(env, content, state)
        model, _ = self.model(env, content, state)
        weights = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
        return RecordDict({P.ARRAYS: weights, P.METRICS: MetricRecord({P.PARTITION_ID: env.partition_id})})
