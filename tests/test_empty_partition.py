"""A client whose partition is empty (Dirichlet splits with small alpha leave some) replies
with a valid, empty contribution instead of crashing."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from headway.client.env import client_env
from headway.client.registry import PROCEDURES
from headway.core.config import resolve_settings
from headway.core.data import load_dataset
from headway.core.partition import make_partition
from headway.core.protocol import as_int


def empty_client(algorithm: str, data_dir: str):
    cfg = resolve_settings(
        {
            "algorithm": algorithm,
            "partition": "dirichlet",
            "dirichlet-alpha": 0.05,
            "num-clients": 100,
            "data-dir": data_dir,
            "local-epochs": 1,
        }
    )
    part = make_partition(load_dataset("mnist", data_dir, cfg.seed), cfg)
    empty = [k for k, rows in enumerate(part.train) if len(rows) == 0]
    assert empty, "this split is expected to leave some clients without training data"
    return client_env(cfg.to_config(), {"partition-id": empty[0], "num-partitions": 100})


@pytest.mark.parametrize("algorithm", ["fedlog", "fedproto"])
def test_an_empty_partition_sends_zero_statistics_with_count_zero(data_dir, algorithm):
    env = empty_client(algorithm, data_dir)
    assert len(env.y_train) == 0
    if algorithm == "fedlog":
        arrays = ArrayRecord({"eta": Array(np.zeros((10, 51), np.float32))})
    else:
        arrays = ArrayRecord({})
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": 1, "phase": "train"})})
    procedure, state = PROCEDURES[algorithm], RecordDict()
    reply = procedure.train(env, content, state)
    assert reply["metrics"]["num-examples"] == 0
    for name, array in reply.array_records["arrays"].items():
        values = array.numpy()
        assert values.ndim >= 1 and values.size > 0 and not values.any(), name  # right shape, all zero
    if algorithm == "fedlog":
        assert reply.array_records["arrays"]["stats"].numpy().shape == (10, 51)
    scores = procedure.evaluate(env, content, state).metric_records["metrics"]
    assert as_int(scores["correct"]) <= as_int(scores["num-examples"])
