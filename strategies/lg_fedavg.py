"""LG-FedAvg (Liang et al. 2020, Algorithm 1): bodies stay local, the top
``lg-global-layers`` layers are global and averaged with weights n_k/n.

Optionally the first ``lg-warmup-rounds`` rounds are plain FedAvg on the whole model, as
the paper warm-starts from FedAvg. Clients are scored on their own test splits with
their own body (the paper's *local test*); after the last round every client uploads its
model once and the server scores the ensemble (mean logits) on the whole test set (*new
test*), counting those bytes in the ``upload-model`` phase.
"""

from __future__ import annotations

import logging

from flwr.app import ArrayRecord, MessageType, RecordDict
from flwr.serverapp import Grid

from core import protocol as P
from core.config import ConfigError, body_names
from core.aggregate import array_problem
from core.data import DatasetMissingError, load_dataset, to_tensors
from core.layers import top_layers
from core.models import BODIES, Net, build_model
from core.training import ensemble_logits, score
from strategies.exchange import exchange
from strategies.fedavg import to_numpy
from strategies.layer_sharing import LayerSharing

log = logging.getLogger("headway")


class LGFedAvg(LayerSharing):
    name = "lg-fedavg"
    mixed_bodies = True  # only the top layers are shared, so bodies may differ below them

    def check(self, spec) -> None:
        if self.cfg["lg-warmup-rounds"] > 0 and len(body_names(self.cfg)) > 1:
            raise ConfigError("lg-fedavg: warm-up rounds average whole models, so every client must run the same body: set lg-warmup-rounds=0 or leave 'bodies' empty")
        super().check(spec)

    def shared_layers(self, model: Net, server_round: int) -> list[str] | None:
        if server_round <= self.cfg["lg-warmup-rounds"]:
            return None
        return top_layers(model, self.cfg["lg-global-layers"])

    def final_evaluation(self, arrays: ArrayRecord, grid: Grid, timeout: float) -> dict[str, float]:
        """New test: collect every client's model once and score their logit ensemble."""
        if not self.cfg["lg-new-test"]:
            return {}
        try:
            ds = load_dataset(self.cfg["dataset"], self.cfg["data-dir"], self.cfg["seed"])
        except DatasetMissingError as exc:
            log.warning("lg-fedavg: no new test, the server has no test set: %s", exc)
            return {}
        content = RecordDict({P.ARRAYS: arrays, P.CONFIG: self.config(self.cfg["num-server-rounds"], **{P.PHASE: P.PHASE_UPLOAD})})
        msgs = self.messages(grid, self.available_nodes(grid), content, MessageType.EVALUATE)
        models = []
        for reply in exchange(grid, msgs, timeout, self.meter, "upload"):
            model, problem = self._uploaded_model(reply, ds)
            if problem:
                self.reject(reply, problem)
            else:
                models.append(model)
        if not models:
            return {}
        x, y = to_tensors(ds, ds.x_test, ds.y_test)
        logits = ensemble_logits(models, x)
        s = score(ds.task, logits, y)
        log.info("lg-fedavg new test: ensemble of %d local models, accuracy %.4f", len(models), s["accuracy"])
        return {"new_test_accuracy": s["accuracy"], "new_test_models": float(len(models))}

    def _uploaded_model(self, reply, ds) -> tuple[Net | None, str | None]:
        """Rebuild a client's model from its upload, or say why it cannot be used."""
        arrays = reply.content.array_records.get(P.ARRAYS)
        cfg = reply.content.config_records.get(P.CONFIG)
        body = str(cfg.get(P.BODY, "")) if cfg is not None else ""
        if arrays is None or body not in BODIES:
            return None, f"model upload without arrays or with unknown body {body!r}"
        model = build_model(body, ds.input_shape, self.cfg["feature-dim"], ds.num_classes, self.cfg["seed"])
        problem = array_problem(to_numpy(ArrayRecord(model.state_dict())), to_numpy(arrays))
        if problem:
            return None, f"uploaded {body} model does not match its architecture: {problem}"
        model.load_state_dict(arrays.to_torch_state_dict())
        return model.eval(), None
