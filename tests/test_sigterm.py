"""SIGTERM (what `timeout`, `docker stop` and job schedulers send) to a real
``headway run`` while its first round runs: the run is recorded as interrupted,
with the rounds done and a summary.json, the process exits 143 (not by abort), without Ray's
C++ "*** SIGTERM received" dump, and none of Ray's processes (its agents included) outlives it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from headway.simulation.runner import STOP_GRACE

from headway.processes import descendants, running
from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.system]  # a real process sent a signal: make test-system


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_sigterm_during_round_1_leaves_an_interrupted_summary_and_exits_143(tmp_path, data_dir):
    out = tmp_path / "out"
    env = {**os.environ, "HEADWAY_DATA_DIR": data_dir, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "headway",
        "run",
        "--out",
        str(out),
        "--set",
        "algorithm=fedavg",
        "--set",
        "dataset=mnist",
        "--set",
        "partition=iid",
        "--set",
        "num-clients=2",
        "--set",
        "train-fraction=0.02",
        "--set",
        "num-server-rounds=3",
        "--set",
        "local-epochs=50",
    ]
    log = open(tmp_path / "run.log", "w")  # noqa: SIM115 - the child process writes it while it runs; closed when it is stopped
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # its own group
    tree: list[int] = []
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None and not (out / "rounds.jsonl").exists():
            time.sleep(0.2)  # the ServerApp's Recorder writes config.json and an empty rounds.jsonl before round 1
        while (
            time.monotonic() < deadline and proc.poll() is None and not any("ClientAppActor" in _cmdline(p) for p in descendants(proc.pid))
        ):
            time.sleep(0.2)  # Ray is up (ray.init has run in the runner) and its client actors exist
        assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
        time.sleep(1.0)  # well inside round 1: 50 local epochs take far longer
        assert (out / "rounds.jsonl").read_text() == "" and not (out / "summary.json").exists()
        tree = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)  # by PID, as `timeout` does
        rc = proc.wait(timeout=60)
        said = (tmp_path / "run.log").read_text()[-3000:]
        assert rc == 128 + signal.SIGTERM, f"exit {rc}:\n{said}"
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "interrupted" and summary["rounds"] == 0 and "SIGTERM" in summary["reason"], summary
        assert "interrupted" in said and "Traceback" not in said
        assert "SIGTERM received" not in said and "PC: @" not in said, said  # Ray's C++ failure-signal dump: --verbose only
        gone = time.monotonic() + STOP_GRACE + 2.0  # the runner's helper SIGKILLs what is left STOP_GRACE s after the signal
        while time.monotonic() < gone and any(running(p) for p in tree):
            time.sleep(0.2)
        left = [(p, _cmdline(p)[:80]) for p in tree if running(p)]
        assert not left, left  # Ray's agents included: they outlived the run by 60-70 s
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of its group
        except (ProcessLookupError, PermissionError):
            pass
        deadline = time.monotonic() + 20  # Ray's processes were sent SIGTERM by the runner: give them a moment, then SIGKILL
        while time.monotonic() < deadline and any(running(p) for p in tree):
            time.sleep(0.2)
        for pid in tree:
            if running(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        log.close()
