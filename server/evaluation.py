"""Server-side evaluation of a single global model on the whole test set."""

from __future__ import annotations

import logging
from typing import Any, Callable

from flwr.app import ArrayRecord

from core.data import DatasetMissingError, load_dataset, to_tensors
from core.models import build_model
from core.training import predict, score

log = logging.getLogger("headway")


def global_model_evaluator(cfg: dict[str, Any]) -> Callable[[int, ArrayRecord], dict[str, float] | None] | None:
    """A function scoring the global model on the full test set, or None when the
    server has no copy of the data (deployment servers need not hold it)."""
    try:
        ds = load_dataset(cfg["dataset"], cfg["data-dir"], cfg["seed"])
    except DatasetMissingError as exc:
        log.warning("no global test-set evaluation: %s", exc)
        return None
    x, y = to_tensors(ds, ds.x_test, ds.y_test)

    def evaluate(server_round: int, arrays: ArrayRecord) -> dict[str, float] | None:
        model = build_model(cfg["body"], ds.input_shape, cfg["feature-dim"], ds.num_classes, cfg["seed"])
        model.load_state_dict(arrays.to_torch_state_dict())
        model.eval()
        s = score(ds.task, predict(model, x), y)
        return s

    return evaluate
