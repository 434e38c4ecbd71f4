"""A harness for tests that run a real deployment: launcher processes (SuperLink,
SuperNodes) started in their own sessions, optionally inside network namespaces that the
test builds, runs submitted with `flwr run`, and everything stopped by PID afterwards."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc: subprocess.Popen, timeout: float = 30) -> None:
    """Stop a launcher (its supervisor ends Flower's whole process tree), then its group."""
    if proc.poll() is None:
        try:
            os.kill(proc.pid, signal.SIGTERM)
            proc.wait(timeout=timeout)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:  # whatever is left in the launcher's session
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if proc.poll() is None:
        proc.wait(timeout=5)


class Netns:
    """Hosts on one private switch, each in a network namespace of its own: host i has
    address 10.213.0.(i+1)/24 on its eth0 and its own loopback (so default ports do not
    clash). Traffic stays inside the namespaces; :meth:`close` deletes them all."""

    SUBNET = "10.213.0"

    def __init__(self, hosts: list[str]):
        if shutil.which("ip") is None:
            pytest.skip("`ip` (iproute2) is not installed: this test needs network namespaces")
        tag = uuid.uuid4().hex[:6]
        self.switch = f"hw{tag}-sw"
        self.names = {h: f"hw{tag}-{h}" for h in hosts}
        self.addresses = {h: f"{self.SUBNET}.{i + 1}" for i, h in enumerate(hosts)}
        probe = subprocess.run(["ip", "netns", "add", self.switch], capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip(f"`ip netns add` is not permitted here ({probe.stderr.strip()}): run as root on Linux")
        try:
            self._ip(self.switch, "link", "set", "lo", "up")
            self._ip(self.switch, "link", "add", "br0", "type", "bridge")
            self._ip(self.switch, "link", "set", "br0", "up")
            for i, (host, ns) in enumerate(self.names.items()):
                self._run("ip", "netns", "add", ns)
                self._ip(self.switch, "link", "add", f"p{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                self._ip(self.switch, "link", "set", f"p{i}", "master", "br0", "up")
                self._ip(ns, "addr", "add", f"{self.addresses[host]}/24", "dev", "eth0")
                self._ip(ns, "link", "set", "eth0", "up")
                self._ip(ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _run(*cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True)

    def _ip(self, ns: str, *args: str) -> None:
        self._run("ip", "-n", ns, *args)

    def prefix(self, host: str) -> list[str]:
        """The command prefix that runs a program on ``host``."""
        return ["ip", "netns", "exec", self.names[host]]

    def reachable(self, host: str, address: str, port: int) -> bool:
        """Whether a TCP connection from ``host`` to ``address:port`` opens."""
        probe = subprocess.run([*self.prefix(host), "bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"], capture_output=True, timeout=10)
        return probe.returncode == 0

    def http_status(self, host: str, url: str, cafile: Path, method: str = "POST") -> int:
        """The HTTP status a request from ``host`` to ``url`` gets (TLS checked against ``cafile``), the
        path sent as written (no normalisation); 0 when no answer comes."""
        probe = (
            "import http.client, ssl, sys, urllib.parse\n"
            "u = urllib.parse.urlsplit(sys.argv[1])\n"
            "c = http.client.HTTPSConnection(u.hostname, u.port, context=ssl.create_default_context(cafile=sys.argv[2]), timeout=10)\n"
            "c.request(sys.argv[3], sys.argv[1].split(u.netloc, 1)[1], body=b'', headers={'content-type': 'application/protobuf'})\n"
            "print(c.getresponse().status)\n"
        )
        out = subprocess.run(
            [*self.prefix(host), sys.executable, "-c", probe, url, str(cafile), method], capture_output=True, text=True, timeout=30
        )
        return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip().isdigit() else 0

    def close(self) -> None:
        for ns in [*self.names.values(), self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


class Cluster:
    """Launcher processes of one deployment test, their logs under ``tmp``, and `flwr`
    commands with the test's own FLWR_HOME. Use as a context manager: every process it
    started is stopped on exit, and the exit asserts that none is left running."""

    def __init__(self, tmp: Path, data_dir: str, netns: Netns | None = None, path: list[str] | None = None):
        self.tmp, self.netns = tmp, netns
        self.env = {
            **os.environ,
            "FLWR_HOME": str(tmp / "flwr-home"),
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "HEADWAY_DATA_DIR": data_dir,
            "PYTHONPATH": str(ROOT),
        }
        self.env["PATH"] = os.pathsep.join([*(path or []), str(Path(sys.executable).parent), self.env.get("PATH", "")])
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: list = []

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        for proc in reversed(list(self.procs.values())):
            stop(proc)
        for fh in self.logs:
            fh.close()
        assert all(p.poll() is not None for p in self.procs.values())

    def _prefix(self, host: str | None) -> list[str]:
        return self.netns.prefix(host) if self.netns and host else []

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    def launch(self, name: str, args: list[str], host: str | None = None, env: dict | None = None) -> subprocess.Popen:
        """Start ``python -m headway ARGS`` (on ``host``) in its own session."""
        fh = open(self.log(name), "a")  # noqa: SIM115 - the child process writes it while it runs; closed when it is stopped
        self.logs.append(fh)
        proc = subprocess.Popen(
            [*self._prefix(host), sys.executable, "-m", "headway", *args],
            cwd=ROOT,
            env={**self.env, **(env or {})},
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def wait_for_port(self, name: str, port: int, host: str | None = None, address: str = "127.0.0.1", timeout: float = 60) -> None:
        proc, deadline = self.procs[name], time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited early ({proc.returncode}):\n{self.log(name).read_text()[-3000:]}")
            if self.netns and host:
                if self.netns.reachable(host, address, port):
                    return
            else:
                with socket.socket() as s:
                    if s.connect_ex((address, port)) == 0:
                        return
            time.sleep(0.3)
        raise TimeoutError(f"port {port} of {name} not open after {timeout} s:\n{self.log(name).read_text()[-3000:]}")

    def wait_for_log(self, name: str, text: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log(name).exists() and text in self.log(name).read_text():
                return
            time.sleep(0.3)
        raise TimeoutError(f"{name} did not log {text!r} within {timeout} s:\n{self.log(name).read_text()[-3000:]}")

    def command(self, args: list[str], host: str | None = None, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        """Run a short command (``python -m headway …`` or ``flwr …``) on ``host``."""
        out = subprocess.run([*self._prefix(host), *args], cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"{args} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        return out

    def launcher(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "headway", *args]

    def submit(
        self, connection: str, run_config: str, results: Path, host: str | None = None, timeout: float = 400
    ) -> subprocess.CompletedProcess:
        """`flwr run . CONNECTION --stream` with ``run_config`` writing under ``results``."""
        return self.command(
            ["flwr", "run", ".", connection, "--stream", "--run-config", f"{run_config} results-dir='{results}'"],
            host=host,
            timeout=timeout,
            check=False,
        )


def run_folder(results: Path, out: subprocess.CompletedProcess | None = None, *logs: Path) -> Path:
    """The one run folder under ``results`` that has a summary; what went wrong if none."""
    summaries = list(results.glob("*/summary.json"))
    if not summaries:
        said = "" if out is None else f"flwr run said:\n{out.stdout[-4000:]}\n{out.stderr[-2000:]}\n"
        said += "".join(f"{p.name}:\n{p.read_text()[-3000:]}\n" for p in logs if p.exists())
        raise AssertionError(f"no summary written.\n{said}")
    return summaries[0].parent


def read_rounds(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines()]
