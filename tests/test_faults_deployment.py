"""Faults a real deployment survives, through real processes on 127.0.0.1: a SuperNode
killed by PID in the middle of a round and restarted with the same partition, and a
ClientApp that hangs past the deadline."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from headway.client.procedures.fedlog import BODY_STATE
from headway.client.state_store import STORE_RECORD, load_state, versions

from headway.processes import descendants, running
from tests.cluster import Cluster, free_port, read_rounds, run_folder

pytestmark = [pytest.mark.deployment, pytest.mark.system]  # slow: `make test-system`


def _alive(pids: list[int]) -> list[int]:
    return [p for p in pids if running(p)]


def _wait_rounds(results: Path, n: int, run: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = list(results.glob("*/rounds.jsonl"))
        if files and len(files[0].read_text().splitlines()) >= n:
            return
        if run.poll() is not None:
            raise AssertionError(f"the run ended before round {n}:\n{run.stdout.read() if run.stdout else ''}")
        time.sleep(0.5)
    raise TimeoutError(f"round {n} not logged within {timeout} s")


def test_a_killed_supernode_costs_one_deadline_and_rejoins_with_its_state_while_a_hung_client_is_cut_off(tmp_path, data_dir):
    """Three SuperNodes with a state folder each; partition 2's ClientApp hangs in training
    (fault-mode=silent). After round 1, partition 1's launcher is killed by PID (SIGKILL)
    while round 2 trains, and restarted with the same partition: round 2 ends at its
    deadline with partition 0 alone, every process of the killed node is gone, and
    partition 1 comes back under a new node id with the local body it had saved."""
    fleet, control, timeout = free_port(), free_port(), 25
    results, state = tmp_path / "results", tmp_path / "state"
    with Cluster(tmp_path, data_dir) as c:
        c.launch(
            "superlink", ["superlink", "--insecure", "--bind", "127.0.0.1", "--fleet-port", str(fleet), "--control-port", str(control)]
        )
        c.wait_for_port("superlink", control)

        def supernode(pid: int, name: str) -> subprocess.Popen:
            return c.launch(
                name,
                [
                    "supernode",
                    "--insecure",
                    "--superlink",
                    f"127.0.0.1:{fleet}",
                    "--partition-id",
                    str(pid),
                    "--num-partitions",
                    "3",
                    "--port",
                    str(free_port()),
                    "--state-dir",
                    str(state / f"node{pid}"),
                ],
            )

        nodes = [supernode(pid, f"supernode{pid}") for pid in range(3)]
        c.command(c.launcher("connect", "test", "--address", f"127.0.0.1:{control}", "--insecure"))
        run_config = (
            "algorithm='fedlog' dataset='mnist' num-clients=3 num-server-rounds=4 train-fraction=0.01 local-epochs=1 batch-size=10 "
            f"partition='iid' sample-timeout=60.0 round-timeout={float(timeout)} fault-clients='2' fault-mode='silent' "
            f"results-dir='{results}'"
        )
        run = subprocess.Popen(
            ["flwr", "run", ".", "test", "--stream", "--run-config", run_config],
            cwd=c.env["PYTHONPATH"],
            env=c.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            _wait_rounds(results, 1, run)
            tree = descendants(nodes[1].pid)
            assert len(tree) >= 2, tree  # flower-supernode and its SuperExec at least
            os.kill(nodes[1].pid, signal.SIGKILL)  # the launcher, by PID, in round 2's training
            nodes[1].wait(timeout=10)
            deadline = time.monotonic() + 30
            while _alive(tree) and time.monotonic() < deadline:
                time.sleep(0.5)
            assert _alive(tree) == [], f"processes of the killed SuperNode still run: {_alive(tree)}"
            _wait_rounds(results, 2, run)
            supernode(1, "supernode1-restarted")
            out, _ = run.communicate(timeout=400)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
        folder = run_folder(results, None, c.log("superlink"), c.log("supernode1-restarted"))
    summary = json.loads((folder / "summary.json").read_text())
    rounds = read_rounds(folder)
    assert summary["status"] == "complete" and summary["rounds"] == 4, (summary, out[-3000:])
    hung = f"no reply within {timeout} s"
    # round 1: partitions 0 and 1 train; 2 hangs and is cut off at the deadline
    assert rounds[0]["clients"] == 2 and any(hung in f and "partition 2" in f for f in rounds[0]["failure_reasons"])
    # round 2: partition 1 was killed while training: only partition 0 is aggregated, by the deadline
    # (counted as a failure if its training message was out when it died, else reported absent)
    assert rounds[1]["clients"] == 1, rounds[1]
    assert any("partition 1" in f for f in rounds[1]["failure_reasons"]) or 1 in rounds[1].get("absent_partitions", []), rounds[1]
    assert rounds[1]["seconds"] < 3 * timeout + 30
    # the restarted node rejoins (new node id, same partition) and trains again
    assert rounds[-1]["clients"] == 2 and 1 in rounds[-1]["selected"], rounds[-1]
    # its newest saved version: restored once after the restart, and holding the body it trains
    saved = {f.name: load_state(versions(f)[-1][1]) for node in range(3) for f in (state / f"node{node}").glob("run-*/partition-*")}
    assert set(saved) == {"partition-0", "partition-1", "partition-2"}
    assert saved["partition-1"][STORE_RECORD]["restores"] == 1 and BODY_STATE in saved["partition-1"].array_records
    assert STORE_RECORD not in saved["partition-0"]  # never restarted


def test_a_superlink_restarted_on_its_database_ends_the_lost_run_clearly_and_serves_again(tmp_path, data_dir):
    """The SuperLink (with --database) is stopped after round 1 and started again on the
    same file. Flower 1.39 does not resume a run whose ServerApp died: the ServerApp is
    stopped first (Flower's stream says "Task stopped by user."), the results folder holds round 1 and a
    summary with status "interrupted", the SuperNodes reconnect by themselves, and a new run
    on the restarted SuperLink completes."""
    fleet, control = free_port(), free_port()
    results, db = tmp_path / "results", tmp_path / "state.db"
    link_args = [
        "superlink",
        "--insecure",
        "--bind",
        "127.0.0.1",
        "--fleet-port",
        str(fleet),
        "--control-port",
        str(control),
        "--database",
        str(db),
    ]
    with Cluster(tmp_path, data_dir) as c:
        c.launch("superlink", link_args)
        c.wait_for_port("superlink", control)
        for pid in range(2):
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
                    "2",
                    "--port",
                    str(free_port()),
                    "--max-wait-time",
                    "120",
                ],
            )
        c.command(c.launcher("connect", "test", "--address", f"127.0.0.1:{control}", "--insecure"))
        run_config = (
            "algorithm='fedlog' dataset='mnist' num-clients=2 num-server-rounds=5 train-fraction=0.01 local-epochs=1 batch-size=10 "
            "sample-timeout=60.0 round-timeout=60.0"
        )
        run = subprocess.Popen(
            ["flwr", "run", ".", "test", "--stream", "--run-config", f"{run_config} results-dir='{results / 'lost'}'"],
            cwd=c.env["PYTHONPATH"],
            env=c.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            _wait_rounds(results / "lost", 1, run)
            link = c.procs["superlink"]
            server_tree = descendants(link.pid)
            os.kill(link.pid, signal.SIGTERM)
            assert link.wait(timeout=30) == 128 + signal.SIGTERM
            assert _alive(server_tree) == []  # the ServerApp went with it
            said, _ = run.communicate(timeout=60)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
        # what the user sees: Flower's word in `flwr run`'s stream, and headway's summary
        assert "Task stopped by user." in said, said[-2000:]
        lost = run_folder(results / "lost", subprocess.CompletedProcess(run.args, run.returncode, said, ""))
        summary = json.loads((lost / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["rounds"] == 1 and "stop signal" in summary["reason"], summary
        c.launch("superlink-restarted", link_args)
        c.wait_for_port("superlink-restarted", control)
        out = c.submit("test", run_config.replace("num-server-rounds=5", "num-server-rounds=1"), results / "after")
        again = json.loads((run_folder(results / "after", out, c.log("superlink-restarted")) / "summary.json").read_text())
        assert again["status"] == "complete" and again["failures"] == 0 and again["participants"] == {"0": "mnist-cnn", "1": "mnist-cnn"}
