"""LG-FedAvg's *new test* (Liang et al. 2020, §4.1), shared by ``lg-fedavg`` and ``local-only``: after the last round
every client uploads its whole model once, and the server scores the models' combined outputs on the whole test set.

An upload is checked for shapes and finite values only (a client's local model has no reference to compare it with),
so how the outputs are combined decides what one lying client can do: see :func:`headway.core.training.ensemble_outputs`.
"""

from __future__ import annotations

import logging

import torch
from flwr.app import ArrayRecord, MessageType
from headway.core import protocol as P
from headway.core.models import Net
from headway.core.training import ensemble_outputs, task_metrics
from headway.strategies.engine import Engine
from headway.strategies.layer_sharing import LayerSharing
from headway.strategies.replies import ArraySpec, Layout, Reply

log = logging.getLogger("headway")


def upload_layout(model: Net) -> Layout:
    """What a client's upload must be: the arrays of ``model`` (its registered body's), not counted as training examples."""
    specs = {k: ArraySpec(tuple(v.shape), str(v.numpy().dtype)) for k, v in model.state_dict().items()}
    return Layout(specs, count=False, check=lambda arrays, reply: (arrays, None))


def new_test(strategy: LayerSharing, engine: Engine, content_arrays: ArrayRecord, last_round: int, rule: str) -> dict[str, float]:
    """Collect every available client's model once (the ``upload`` phase, metered apart) and score the ensemble of their
    outputs, combined by ``rule``, on ``strategy``'s whole test set: ``new_test_accuracy`` and ``new_test_models``."""
    test = strategy.services.data.test_tensors()
    if test is None:
        return {}
    content = strategy.content(last_round, content_arrays, **{P.PHASE: P.PHASE_UPLOAD})
    replies = engine.exchange(
        P.PHASE_UPLOAD,
        {n: content for n in engine.nodes()},
        MessageType.EVALUATE,
        lambda node: upload_layout(strategy._model(engine.registry.clients[node].body)),
    )
    models = [uploaded(strategy._model(engine.registry.clients[r.node_id].body), r) for r in replies]
    if not models:
        return {}
    s = task_metrics(strategy.spec.task, ensemble_outputs(models, test[0], rule), test[1])
    log.info("%s new test: %s ensemble of %d local models, accuracy %.4f", strategy.name, rule, len(models), s["accuracy"])
    return {"new_test_accuracy": s["accuracy"], "new_test_models": float(len(models))}


def uploaded(model: Net, reply: Reply) -> Net:
    """``model`` (a fresh one of the client's body) holding the arrays ``reply`` uploaded, ready to score."""
    model.load_state_dict({k: torch.as_tensor(v) for k, v in reply.arrays.items()})
    return model.eval()
