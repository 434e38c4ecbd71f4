"""Who took part in a run, for summary.json: each partition's body, the refused nodes and their
reasons, every client's training rows, and (dataset=local) what each node declared its data holds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headway.strategies.engine import Engine
from headway.strategies.services import Services


def train_counts(services: Services, engine: Engine) -> dict[int, int]:
    """Training rows of every client (partition id -> rows): the partition's sizes where the server
    holds the data, else what the registered nodes declared (dataset=local); empty when neither is known."""
    sizes = services.data.partition_sizes
    if sizes is not None:
        return {pid: train for pid, (train, _) in enumerate(sizes)}
    counts = {c.partition_id: c.declared_count("train") for c in engine.registry.clients.values()}
    return {pid: n for pid, n in sorted(counts.items()) if n is not None}


def participants(engine: Engine, counts: Mapping[int, int]) -> dict[str, Any]:
    """Partition id -> body, refused nodes' reasons, and every client's training rows (``train_examples``,
    partition id -> rows, from ``counts``); with dataset=local, each node's declared data (class -> [train, test])."""
    clients = sorted(engine.registry.clients.values(), key=lambda c: c.partition_id)
    out: dict[str, Any] = {
        "participants": {str(c.partition_id): c.body for c in clients},
        "refused_nodes": sorted(engine.registry.refused.values()),
        "train_examples": {str(pid): n for pid, n in counts.items()},
    }
    declared = {
        str(c.partition_id): {
            "classes": c.declared,
            "train_examples": c.declared_count("train"),
            "test_examples": c.declared_count("test"),
        }
        for c in clients
        if c.declared is not None
    }
    if declared:
        out["declared_data"] = declared
    return out
