"""FedAvg client: load the global model, train all of it locally, send it back."""

from __future__ import annotations

from flwr.app import ArrayRecord, RecordDict

from client.env import ClientEnv
from client.procedures.base import round_of, test_metrics, train_metrics
from core import protocol as P
from core.training import task_loss, train_epochs


class FedAvgClient:
    def _model(self, env: ClientEnv, content: RecordDict):
        model = env.build_model()
        model.load_state_dict(content[P.ARRAYS].to_torch_state_dict())
        return model

    def train(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        model = self._model(env, content)
        cfg = env.cfg
        loss = train_epochs(
            model, list(model.parameters()), env.x_train, env.y_train,
            epochs=cfg["local-epochs"], batch_size=cfg["batch-size"], lr=cfg["lr"], optimizer=cfg["optimizer"],
            loss_fn=task_loss(env.data.task), augment=env.data.augment, seed=env.seed_for(round_of(content)),
            device=env.device, modules=[model],
        )
        arrays = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
        return RecordDict({P.ARRAYS: arrays, P.METRICS: train_metrics(env, loss)})

    def evaluate(self, env: ClientEnv, content: RecordDict, state: RecordDict) -> RecordDict:
        model = self._model(env, content).eval()
        return RecordDict({P.METRICS: test_metrics(env, model)})
