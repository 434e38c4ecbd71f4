"""A real deployment on 127.0.0.1: one SuperLink and two SuperNodes as separate
processes talking gRPC, a run submitted with `flwr run`, and every process stopped
by PID afterwards, even when the test fails."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.deployment


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """Start ``python -m server.launch ARGS`` in its own process group, logging to ``log``."""
    fh = open(log, "w")
    return subprocess.Popen([sys.executable, "-m", "server.launch", *args], cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def stop(proc: subprocess.Popen) -> None:
    """Stop a process and everything it spawned (its process group), by PID."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=5)


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited early:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"port {port} not open after {timeout} s:\n{log.read_text()[-3000:]}")


def test_fedavg_over_grpc_with_a_superlink_and_two_supernodes(tmp_path, data_dir):
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr-home"), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
           "HEADWAY_DATA_DIR": data_dir, "PYTHONPATH": str(ROOT)}
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    fleet, control = free_port(), free_port()
    results = tmp_path / "results"
    procs: list[subprocess.Popen] = []
    try:
        link_log = tmp_path / "superlink.log"
        link = launch(["superlink", "--insecure", "--bind", "127.0.0.1", "--fleet-port", str(fleet), "--control-port", str(control)], env, link_log)
        procs.append(link)
        wait_for_port(fleet, link, link_log)
        wait_for_port(control, link, link_log)
        for pid in range(2):
            log = tmp_path / f"supernode{pid}.log"
            procs.append(launch(["supernode", "--insecure", "--superlink", f"127.0.0.1:{fleet}", "--partition-id", str(pid),
                                 "--num-partitions", "2", "--port", str(free_port())], env, log))
        subprocess.run([sys.executable, "-m", "server.launch", "connect", "test", "--address", f"127.0.0.1:{control}", "--insecure"],
                       cwd=ROOT, env=env, check=True, capture_output=True)
        run_config = (f"algorithm='fedavg' dataset='mnist' num-clients=2 num-server-rounds=2 train-fraction=0.01 local-epochs=1 "
                      f"batch-size=10 partition='iid' results-dir='{results}' sample-timeout=60.0 round-timeout=120.0")
        out = subprocess.run(["flwr", "run", ".", "test", "--stream", "--run-config", run_config], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=400)
        summaries = list(results.glob("*/summary.json"))
        assert summaries, f"no results written.\nflwr run said:\n{out.stdout[-4000:]}\n{out.stderr[-2000:]}\nsuperlink log:\n{link_log.read_text()[-3000:]}"
        folder = summaries[0].parent
        summary = json.loads(summaries[0].read_text())
        rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
        assert summary["rounds"] == 2 and summary["failures"] == 0
        assert all(r["clients"] == 2 for r in rounds)
        assert rounds[-1]["accuracy"] > 0.3  # iid MNIST slice; chance is 0.1
        assert rounds[0]["bytes_down"] > 2 * 21840 * 4 and rounds[0]["bytes_up"] > 2 * 21840 * 4
        assert (folder / "config.json").exists() and (folder / "accuracy_vs_bytes.png").exists()
    finally:
        for proc in reversed(procs):
            stop(proc)
    assert all(p.poll() is not None for p in procs)
