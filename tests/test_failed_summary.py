"""summary.json of a run that failed in a round counts that round's client failures (issue 38:
a run where every client failed in round 1 said ``failures: 0``, as the round was never recorded)."""

from __future__ import annotations

import json

import pytest
from flwr.app import Error
from headway.server.app import run_server

from tests.fakes import FakeGrid


def test_a_run_whose_every_client_failed_in_round_1_counts_those_failures(task_identity, data_dir, tmp_path):
    cfg = {
        "algorithm": "fedavg",
        "dataset": "mnist",
        "data-dir": data_dir,
        "num-clients": 3,
        "num-server-rounds": 2,
        "partition": "iid",
        "train-fraction": 0.02,
        "sample-timeout": 0.0,
        "round-timeout": 5.0,
        "global-eval": False,
    }
    grid = FakeGrid(3, lambda pid, msg: Error(code=1, reason=f"client {pid} fails on purpose"))
    with pytest.raises(Exception, match="every client failed in round 1"):
        run_server(grid, cfg, tmp_path / "out")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds"] == 0
    assert summary["failures"] == 4, summary  # three clients and the missed quorum, as a recorded round counts them
