"""`headway submit` (issue 38 item 5): `flwr run` exits 0 for a failed run; `headway submit`
exits with the run's status, read from the SuperLink (`flwr ls --format json`) and the run's
summary.json. Unit tests on the readers, and real processes on 127.0.0.1."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from headway.submit import EXIT_COMPLETE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED, RESULTS, STARTED, detached, judge, read_ls
from tests.cluster import Cluster, free_port, run_folder


def _ls(status: str, details: str = "", run_id: int = 7) -> str:
    """What `flwr ls --run-id N --format json` prints (flwr/cli/ls.py's _to_json), trimmed."""
    return json.dumps({"success": True, "runs": [{"run-id": str(run_id), "status": status, "status-details": details}]})


def test_the_verdict_follows_flowers_status_and_the_worse_of_it_and_summary_json():
    assert (
        judge(7, read_ls(_ls("finished:completed"), 7), {"status": "complete", "final_accuracy": 0.9722, "rounds": 3}).code == EXIT_COMPLETE
    )
    failed = judge(7, read_ls(_ls("finished:failed", "ServerApp failed with exception: boom"), 7), None)
    assert failed.code == EXIT_FAILED and "run 7 failed (finished:failed): ServerApp failed with exception: boom" in failed.line
    # a ServerApp of an older headway returned normally from a failed run: its summary decides
    old = judge(7, read_ls(_ls("finished:completed"), 7), {"status": "failed", "reason": "no round aggregated"}, "results/x")
    assert old.code == EXIT_FAILED and "no round aggregated" in old.line and "results/x" in old.line
    assert judge(7, read_ls(_ls("finished:stopped"), 7), None).code == EXIT_TERMINATED
    assert judge(7, read_ls(_ls("running"), 7), None).code == EXIT_FAILED  # the log ended, the run did not: not a success
    unknown = judge(7, read_ls('{"success": false, "error-message": "connection refused"}', 7), None)
    assert unknown.code == EXIT_FAILED and "connection refused" in unknown.line
    assert "lists no run 7" in judge(7, read_ls(_ls("finished:completed", run_id=8), 7), None).line
    assert detached(7, "lab", signal.SIGINT).code == EXIT_INTERRUPTED and "flwr stop 7 lab" in detached(7, "lab", signal.SIGINT).line
    assert detached(7, "lab", signal.SIGTERM).code == EXIT_TERMINATED


def test_the_verdict_counts_rounds_in_words():
    done = {"status": "complete", "final_accuracy": 0.5}
    assert "after 1 round" in judge(7, read_ls(_ls("finished:completed"), 7), {**done, "rounds": 1}).line
    assert "after 1 rounds" not in judge(7, read_ls(_ls("finished:completed"), 7), {**done, "rounds": 1}).line
    assert "after 3 rounds" in judge(7, read_ls(_ls("finished:completed"), 7), {**done, "rounds": 3}).line


def test_the_log_lines_it_reads_are_the_ones_flower_and_the_serverapp_print():
    assert STARTED.findall("Successfully started run 4162338123\n")[0] == "4162338123"  # flwr/cli/run/run.py
    line = "INFO headway: fedavg on mnist, 2 clients, 1 round -> /tmp/r/fedavg-mnist-20250101-000000\n"  # server/app.py
    assert RESULTS.findall(line)[0] == "/tmp/r/fedavg-mnist-20250101-000000"
    assert RESULTS.findall("ERROR headway: run failed after 0 rounds: x; results so far are in res/a\n")[0] == "res/a"


@pytest.mark.deployment
@pytest.mark.system  # real processes, three runs (~2-3 min on 2 cores): `make test-system`
def test_headway_submit_exits_1_for_a_failed_run_and_0_for_a_complete_one(tmp_path, data_dir):
    """A SuperLink and two SuperNodes on 127.0.0.1. A run in which no round aggregates (one of
    two clients sends NaN, min-replies=2: the ServerApp returns, summary.json says failed, and
    Flower used to say completed), a run config the ServerApp refuses, and a run that completes."""
    fleet, control = free_port(), free_port()
    base = (
        "dataset='mnist' num-clients=2 num-server-rounds=1 train-fraction=0.01 local-epochs=1 batch-size=10 partition='iid' "
        "sample-timeout=60.0 round-timeout=120.0"
    )
    with Cluster(tmp_path, data_dir) as c:
        c.launch(
            "superlink", ["superlink", "--insecure", "--bind", "127.0.0.1", "--fleet-port", str(fleet), "--control-port", str(control)]
        )
        c.wait_for_port("superlink", control)
        for pid in range(2):
            args = ["supernode", "--insecure", "--superlink", f"127.0.0.1:{fleet}", "--partition-id", str(pid), "--num-partitions", "2"]
            c.launch(f"supernode{pid}", [*args, "--port", str(free_port())])
        c.command(c.launcher("connect", "test", "--address", f"127.0.0.1:{control}", "--insecure"))

        def submit(name: str, run_config: str) -> tuple[subprocess.CompletedProcess, Path]:
            results = tmp_path / name
            cmd = [sys.executable, "-m", "headway", "submit", "test", "--run-config", f"{run_config} results-dir='{results}'"]
            return c.command(cmd, timeout=400, check=False), results

        nan, nan_results = submit("nan", f"algorithm='fedavg' {base} fault-clients='0' fault-mode='nan' min-replies=2")
        bad, _ = submit("bad", f"algorithm='fedavgg' {base}")
        good, good_results = submit("good", f"algorithm='fedavg' {base}")

    said = {k: f"{p.stdout[-3000:]}\n{p.stderr[-2000:]}" for k, p in (("nan", nan), ("bad", bad), ("good", good))}
    assert json.loads((run_folder(nan_results, nan) / "summary.json").read_text())["status"] == "failed", said["nan"]
    assert nan.returncode == EXIT_FAILED, said["nan"]
    [verdict] = [line for line in nan.stderr.splitlines() if line.startswith("headway: run ")]
    assert "failed (finished:failed)" in verdict and "no round aggregated" in verdict, verdict  # Flower's status says it too
    assert bad.returncode == EXIT_FAILED and "failed (finished:failed)" in bad.stderr and "fedavgg" in bad.stderr, said["bad"]
    assert json.loads((run_folder(good_results, good) / "summary.json").read_text())["status"] == "complete", said["good"]
    assert good.returncode == EXIT_COMPLETE, said["good"]
    assert "Successfully started run" in good.stdout and good.stdout.rstrip().splitlines()[-1].startswith("headway: run "), said["good"]
    assert " complete: final accuracy " in good.stdout.splitlines()[-1]
