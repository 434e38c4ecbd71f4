"""A real deployment on 127.0.0.1: one SuperLink and two SuperNodes as separate
processes talking gRPC, a run submitted with `flwr run`, and every process stopped
by PID afterwards, even when the test fails (:mod:`tests.cluster`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster import Cluster, free_port, read_rounds, run_folder

pytestmark = pytest.mark.deployment


def deploy(
    tmp_path: Path, data_dir: str, run_config: str, num_nodes: int = 2, probe: bool = False, node_args: dict[int, list[str]] | None = None
) -> tuple[Path, subprocess.CompletedProcess]:
    """A SuperLink and ``num_nodes`` SuperNodes on 127.0.0.1 (insecure), one ``flwr run`` with
    ``run_config``; returns the run's results folder and what ``flwr run`` printed. With
    ``probe``, each SuperNode runs under :mod:`tests.wire_probe` and logs its Fleet bytes to
    ``tmp_path/wire-<partition>.jsonl``. ``node_args`` adds launcher options to chosen
    SuperNodes (by partition id). Every process is stopped by the harness."""
    path = []
    if probe:  # `headway supernode` runs the flower-supernode found first on $HEADWAY_FLOWER_PATH: this one
        shim = tmp_path / "probe-bin"
        shim.mkdir()
        (shim / "flower-supernode").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m tests.wire_probe "$@"\n')
        (shim / "flower-supernode").chmod(0o755)
        path.append(str(shim))
    fleet, control = free_port(), free_port()
    results = tmp_path / "results"
    with Cluster(tmp_path, data_dir, path=path) as c:
        c.env["HEADWAY_FLOWER_PATH"] = os.pathsep.join(path)  # before the launcher's own interpreter folder
        c.launch(
            "superlink", ["superlink", "--insecure", "--bind", "127.0.0.1", "--fleet-port", str(fleet), "--control-port", str(control)]
        )
        c.wait_for_port("superlink", fleet)
        c.wait_for_port("superlink", control)
        for pid in range(num_nodes):
            c.launch(
                f"supernode{pid}",
                [
                    "supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{fleet}",
                    "--partition-id",
                    str(pid),
                    "--num-partitions",
                    str(num_nodes),
                    "--port",
                    str(free_port()),
                    *(node_args or {}).get(pid, []),
                ],
                env={"HEADWAY_WIRE_LOG": str(tmp_path / f"wire-{pid}.jsonl")},
            )
        c.command(c.launcher("connect", "test", "--address", f"127.0.0.1:{control}", "--insecure"))
        out = c.submit("test", run_config, results)
        return run_folder(results, out, c.log("superlink")), out


def test_fedavg_over_grpc_with_a_superlink_and_two_supernodes(tmp_path, data_dir):
    run_config = (
        "algorithm='fedavg' dataset='mnist' num-clients=2 num-server-rounds=2 train-fraction=0.01 local-epochs=1 "
        "batch-size=10 partition='iid' sample-timeout=60.0 round-timeout=120.0"
    )
    folder, streamed = deploy(tmp_path, data_dir, run_config)
    summary = json.loads((folder / "summary.json").read_text())
    rounds = read_rounds(folder)
    assert summary["rounds"] == 2 and summary["failures"] == 0 and summary["status"] == "complete"
    # what `flwr run --stream` shows: headway's round lines, not a line per HTTP request (httpx) nor Flower's DEBUG
    shown = streamed.stdout + streamed.stderr
    assert "httpx" not in shown and "DEBUG flwr" not in shown, shown[-3000:]
    assert all(re.search(rf"^INFO headway: round {n}\b", streamed.stdout, re.MULTILINE) for n in (1, 2)), shown[-3000:]
    assert all(r["clients"] == 2 for r in rounds)
    assert rounds[-1]["accuracy"] > 0.3  # iid MNIST slice; chance is 0.1
    assert rounds[0]["bytes_down"] > 2 * 21840 * 4 and rounds[0]["bytes_up"] > 2 * 21840 * 4
    assert (folder / "config.json").exists() and (folder / "accuracy_vs_bytes.png").exists()


@pytest.mark.system  # real processes, ~100 s: `make test-system` (make test keeps the FedAvg, TLS-across-hosts and node-local runs)
def test_metered_bytes_are_the_bytes_the_supernodes_move(tmp_path, data_dir):
    """The meter's total, every phase and both directions, against what the two SuperNodes
    pulled and pushed on their Fleet channels (headers, object trees, object contents)."""
    run_config = (
        "algorithm='fedlog' dataset='mnist' num-clients=2 num-server-rounds=2 train-fraction=0.01 local-epochs=1 "
        "batch-size=10 partition='pathological' sample-timeout=60.0 round-timeout=120.0"
    )
    folder, _ = deploy(tmp_path, data_dir, run_config, probe=True)
    rounds = read_rounds(folder)
    assert len(rounds) == 2 and all(r["failures"] == 0 and r["clients"] == 2 for r in rounds)
    # bytes_down/up hold the method's own phases (stats and train here); measurement phases apart
    metered = {
        way: sum(r[f"bytes_{way}"] + r.get(f"eval_bytes_{way}", 0) + r.get(f"register_bytes_{way}", 0) for r in rounds)
        for way in ("down", "up")
    }
    moved = {"down": 0, "up": 0}
    calls = 0
    for pid in range(2):
        for line in (tmp_path / f"wire-{pid}.jsonl").read_text().splitlines():
            entry = json.loads(line)
            moved["down"] += entry["down"]
            moved["up"] += entry["up"]
            calls += 1
    # register, stats, train and evaluate in round 1; train and evaluate in round 2: 6 exchanges × 2 nodes
    messages = 12
    assert calls > 2 * messages  # each message is a header call plus its objects
    for way in ("down", "up"):  # a few bytes a message: ids and task ids the SuperLink fills in
        assert abs(metered[way] - moved[way]) <= 4 * messages, (way, metered, moved)
    assert rounds[0]["stats_bytes_down"] > 0 and rounds[0]["bytes_down"] > rounds[0]["stats_bytes_down"]


@pytest.mark.system  # real processes, ~120 s: `make test-system`
def test_fedpft_chain_over_grpc_keeps_each_clients_head_between_messages(tmp_path, data_dir):
    """FedPFT's decentralized chain across two SuperNodes: the SuperLink relays node 0's
    mixtures to node 1; each node trains its head in the chain message and scores it in the
    evaluation message, a fresh ClientApp process, from its node state."""
    pytest.importorskip("efficientnet_lite_pytorch")
    run_config = (
        "algorithm='fedpft' dataset='mnist' num-clients=2 num-server-rounds=1 train-fraction=0.01 partition='iid' "
        f"fedpft-topology='chain' fedpft-resolution=32 fedpft-head-epochs=20 fedpft-head-lr=0.001 fedpft-cache-dir='{tmp_path / 'cache'}' "
        "sample-timeout=60.0 round-timeout=300.0"
    )
    folder, _ = deploy(tmp_path, data_dir, run_config)
    summary = json.loads((folder / "summary.json").read_text())
    r = read_rounds(folder)[0]
    assert summary["status"] == "complete" and summary["failures"] == 0, summary
    assert r["chain_order"] == [0, 1] and r["chain_bytes_up"] > 0 and r["chain_bytes_down"] > 0
    assert r["eval_clients"] == 2 and r["accuracy_p0"] > 0.3 and r["accuracy_p1"] > 0.3  # chance is 0.1


@pytest.mark.system  # a fault through real processes: `make test-system`, as the other deployment faults
def test_a_supernode_with_an_unknown_body_is_refused_and_lg_fedavg_runs_on(tmp_path, data_dir):
    """Issue 23: a typo in one SuperNode's --body ended an LG-FedAvg run (status failed, 0
    rounds). Its registration is now refused and counted; the other two nodes finish the run,
    the new test included."""
    run_config = (
        "algorithm='lg-fedavg' dataset='mnist' num-clients=3 num-server-rounds=1 train-fraction=0.01 local-epochs=1 "
        "batch-size=10 partition='iid' lg-global-layers=1 sample-timeout=60.0 round-timeout=120.0"
    )
    folder, _ = deploy(tmp_path, data_dir, run_config, num_nodes=3, node_args={1: ["--body", "mnist-cnnn"]})
    summary = json.loads((folder / "summary.json").read_text())
    r = read_rounds(folder)[0]
    assert summary["status"] == "complete", summary
    assert r["clients"] == 2 and r["failures"] == 1 and "mnist-cnnn" in r["failure_reasons"][0]
    assert r["new_test_models"] == 2.0
