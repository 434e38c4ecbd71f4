"""Round figures from clients' evaluation replies: each client scores the server's state on its
own test split, and the round's accuracy is Σ correct / Σ examples (sample-weighted)."""

from __future__ import annotations

import numpy as np
from headway.core import protocol as P
from headway.strategies.replies import Reply


def evaluation_figures(replies: list[Reply], task: str, eval_metrics: tuple[str, ...] = ()) -> dict[str, float]:
    """Sample-weighted means of the replies' test metrics (accuracy, or mse for regression), loss, the
    per-client mean and minimum accuracy, and ``accuracy_<how>`` for each extra ``correct-<how>`` count."""
    counted = [r for r in replies if r.count]
    total = float(sum(r.examples for r in counted))
    if total == 0:
        return {}
    losses = [(r.metrics[P.LOSS], r.examples) for r in counted if P.LOSS in r.metrics]
    out: dict[str, float] = {"eval_clients": len(counted), "test_examples": int(total)}
    if losses:
        out["loss"] = float(sum(v * n for v, n in losses) / sum(n for _, n in losses))
    if task != "classification":
        out["mse"] = sum(r.metrics[P.SQUARED_ERROR] for r in counted) / total
        return out
    per_client = [r.metrics[P.CORRECT] / r.examples for r in counted]
    out["accuracy"] = sum(r.metrics[P.CORRECT] for r in counted) / total
    out["accuracy_client_mean"] = float(np.mean(per_client))
    out["accuracy_client_min"] = float(np.min(per_client))
    for name in eval_metrics:  # e.g. FedProto's correct-head -> accuracy_head
        have = [r for r in counted if name in r.metrics]
        if have:
            out["accuracy_" + name[len(P.CORRECT) + 1 :]] = sum(r.metrics[name] for r in have) / sum(r.examples for r in have)
    return out


def group_accuracies(replies: list[Reply], joining: frozenset[int]) -> dict[str, float]:
    """join-clients runs: the sample-weighted accuracy of the joined clients' replies (``accuracy_joined``) and of
    the others' (``accuracy_old``), each where that group scored (LG-FedAvg Table 3: rotated and normal MNIST)."""
    out: dict[str, float] = {}
    for name, group in (
        ("joined", [r for r in replies if r.partition_id in joining]),
        ("old", [r for r in replies if r.partition_id not in joining]),
    ):
        counted = [r for r in group if r.count and P.CORRECT in r.metrics]
        total = sum(r.examples for r in counted)
        if total:
            out[f"accuracy_{name}"] = sum(r.metrics[P.CORRECT] for r in counted) / total
    return out
