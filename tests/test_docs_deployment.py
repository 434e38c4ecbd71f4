"""docs/deployment.md's "On one machine" block run as printed, from the page's text: a SuperLink
with TLS and SuperNode authentication, two keys registered, MNIST split into two node folders,
two SuperNodes on one host with their default ports, `headway submit` (exit 0 only for a complete run),
and `headway stop` for each.
Launchers ending in `&` run in the background in sessions of their own; the test stops every
one it started by PID. Then a third SuperNode with a key nobody registered must be refused with
the launcher's hint naming `headway register`."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from headway.deploy import port_problem
from tests.cluster import read_rounds, run_folder, stop
from tests.conftest import ROOT
from tests.doc_commands import DocCommand, commands

pytestmark = [pytest.mark.deployment, pytest.mark.system]  # real processes, ~2 minutes: make test-system

PAGE = ROOT / "docs" / "deployment.md"
SECTION = "## On one machine"


def section_commands() -> list[DocCommand]:
    """The commands of the page's "On one machine" section, in page order (lines of the page)."""
    text = PAGE.read_text()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    skipped = text[:start].count("\n")
    return [replace(c, line=c.line + skipped) for c in commands(text[start : end if end > 0 else None])]


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    """Until something listens on 127.0.0.1:``port``; fails if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited early ({proc.returncode}):\n{log.read_text()[-3000:]}"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise TimeoutError(f"port {port} not open after {timeout} s:\n{log.read_text()[-3000:]}")


def test_the_one_machine_walkthrough_runs_as_printed(tmp_path, data_dir):
    cmds = section_commands()
    programs = [(c.program, c.argv[1] if len(c.argv) > 1 else "") for c in cmds]
    assert programs.count(("headway", "supernode")) == 2 and ("headway", "submit") in programs, programs
    busy = [p for p in (8000, 9091, 9092) if port_problem("127.0.0.1", p)]  # the page uses Flower's default ports
    if busy:
        pytest.skip(f"ports {busy} are in use on this machine: the page's SuperLink needs them")
    (tmp_path / ".venv").symlink_to(ROOT / ".venv")  # the page runs .venv/bin/... from the checkout
    env = {
        **os.environ,
        "FLWR_HOME": str(tmp_path / "flwr-home"),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
        "HEADWAY_DATA_DIR": data_dir,
        "PYTHONPATH": str(ROOT),
    }
    background: dict[str, tuple[subprocess.Popen, Path]] = {}
    outputs: list[str] = []
    try:
        for cmd in cmds:
            argv = list(cmd.argv)
            submits = cmd.program == "headway" and argv[1] == "submit"
            if submits:
                argv += ["--app", str(ROOT)]  # the app is the checkout; the test's folder holds only what the page wrote
            if argv[-1] == "&":
                name = cmd.option("--pid-file")[0].removesuffix(".pid")
                log = tmp_path / f"{name}.log"
                with open(log, "w") as fh:
                    proc = subprocess.Popen(argv[:-1], cwd=tmp_path, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
                background[name] = (proc, log)
                if argv[1] == "superlink":
                    wait_for_port(9092, proc, log)
                    wait_for_port(8000, proc, log)
                continue
            assert not cmd.uses_shell, cmd.text
            out = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
            outputs.append(f"$ {cmd.text}\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
            assert out.returncode == 0, f"line {cmd.line}: {cmd.text} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            if submits:
                assert "complete" in out.stdout.splitlines()[-1] + out.stderr, out.stderr[-3000:]  # the verdict line
                folder = run_folder(tmp_path / "results", out, *(log for _, log in background.values()))
                summary = json.loads((folder / "summary.json").read_text())
                rounds = read_rounds(folder)
                assert summary["status"] == "complete" and summary["rounds"] == 1, summary
                assert all(r["clients"] == 2 for r in rounds), rounds  # both SuperNodes of this one machine served
                # a key nobody registered: refused by the SuperLink, and the launcher says what to do
                keys = subprocess.run(
                    [".venv/bin/headway", "keys", "keys", "--name", "node2"], cwd=tmp_path, env=env, capture_output=True, text=True
                )
                assert keys.returncode == 0, keys.stderr
                stranger = subprocess.run(
                    [
                        ".venv/bin/headway",
                        "supernode",
                        "--superlink",
                        "127.0.0.1:9092",
                        "--root-cert",
                        "certs/ca.crt",
                        "--auth-key",
                        "keys/node2",
                        "--data",
                        "nodes/node-0",
                        "--rejoin-wait",
                        "0",  # no key to wait for: refused at once (by default it retries for 65 s, as after a crash)
                    ],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=120,
                )
                said = stranger.stdout + stranger.stderr
                assert stranger.returncode == 1, said[-3000:]  # Flower exits 1 on every error; it prints "Exit Code: 305"
                assert "Exit Code: 305" in said and "[code: 2004]" in said, said[-3000:]
                assert "[headway] the SuperLink refused this SuperNode's key" in said and "headway register keys/node2.pub" in said, said[
                    -3000:
                ]
        for name, (proc, _log) in background.items():  # the page's `headway stop` lines stopped them all
            assert proc.wait(timeout=30) is not None, name
        ports = {
            name: log.read_text().split("ClientApp API on 127.0.0.1:")[1].split()[0]
            for name, (_, log) in background.items()
            if "node" in name
        }
        assert len(set(ports.values())) == 2, ports  # two SuperNodes, two ports picked for them
    finally:
        for proc, _ in background.values():
            stop(proc)
