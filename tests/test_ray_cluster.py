"""A simulation on an existing Ray cluster (run-config key ``ray-address``): the test starts a
head node and a worker node with `ray start` on this machine, runs FedLog through
`headway run` against it, reads from the cluster's GCS which job and actors the run made and
on which nodes, and stops both nodes by process group, leaving no Ray process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from headway.core.config import ConfigError
from headway.simulation.runner import ray_address

from tests.cluster import free_port
from tests.conftest import ROOT

RAY = str(Path(sys.executable).with_name("ray"))
OBJECT_STORE = 100 * 1024 * 1024  # bytes per node: Ray's minimum is ~75 MiB, its default a third of the memory

# Run in a child process (the test process stays no Ray driver): waits until the cluster at
# argv[1] has argv[2] live nodes, then prints its nodes, jobs and actors as one JSON line.
QUERY = """
import json, sys, time
import ray
from ray._private import state
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
deadline = time.monotonic() + 90
while sum(n["Alive"] for n in ray.nodes()) < int(sys.argv[2]) and time.monotonic() < deadline:
    time.sleep(0.5)
nodes = [{"id": n["NodeID"], "alive": n["Alive"], "resources": n["Resources"]} for n in ray.nodes()]
jobs = [{"id": j["JobID"], "entrypoint": j.get("Entrypoint", "")} for j in state.jobs()]
actors = [{"class": a["ActorClassName"], "job": a["JobID"], "node": a["Address"]["NodeID"]} for a in state.actors().values()]
print(json.dumps({"nodes": nodes, "jobs": jobs, "actors": actors}))
ray.shutdown()
"""

RUN = {  # FedLog on MNIST slices: 4 clients, 2 rounds
    "algorithm": "fedlog",
    "dataset": "mnist",
    "num-clients": 4,
    "num-server-rounds": 2,
    "partition": "pathological",
    "train-fraction": 0.02,
    "batch-size": 10,
    "seed": 0,
}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_DISABLE_USAGE_STATS"] = "1"
    return env


def _tree(leaders: list[int]) -> set[int]:
    """The leaders, their descendants and every process in their process groups."""
    pids = set(leaders)
    for pid in leaders:
        try:
            pids.update(c.pid for c in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) in leaders:
                pids.add(proc.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def _alive(pids: set[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


class RayCluster:
    """A head node (1 CPU, no GPU) and a worker node (1 CPU and 1 declared GPU: Ray counts a
    GPU it is told of, card or not), each `ray start --block` in a process group of its own."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.seen: set[int] = set()

    def _start(self, name: str, args: list[str]) -> None:
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - the child process writes it while it runs; closed when it is stopped
        common = ["--block", "--node-ip-address=127.0.0.1", f"--temp-dir={self.tmp / 'r'}", "--disable-usage-stats"]
        ports = [f"--dashboard-agent-listen-port={free_port()}", f"--object-store-memory={OBJECT_STORE}"]
        self.procs.append(
            subprocess.Popen(
                [RAY, "start", *args, *common, *ports], stdout=log, stderr=subprocess.STDOUT, env=_env(), start_new_session=True
            )
        )
        log.close()

    def start(self) -> dict:
        self._start(
            "head",
            [
                "--head",
                f"--port={self.port}",
                "--num-cpus=1",
                "--num-gpus=0",
                "--include-dashboard=false",
                f"--ray-client-server-port={free_port()}",
            ],
        )
        time.sleep(3)  # the worker node needs the head's GCS up
        self._start("worker", [f"--address={self.address}", "--num-cpus=1", "--num-gpus=1"])
        state = self.query(nodes=2)
        assert sum(n["alive"] for n in state["nodes"]) == 2, (state, self.logs())
        return state

    def query(self, nodes: int = 1) -> dict:
        self.seen |= _tree([p.pid for p in self.procs])
        done = subprocess.run(
            [sys.executable, "-c", QUERY, self.address, str(nodes)], capture_output=True, text=True, timeout=150, env=_env(), cwd=ROOT
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def logs(self) -> str:
        return "\n".join(
            (self.tmp / f"{n}.log").read_text(errors="replace")[-2000:] for n in ("head", "worker") if (self.tmp / f"{n}.log").exists()
        )

    def stop(self) -> list[int]:
        """SIGTERM to each `ray start` (it ends its node's processes), SIGKILL to what is left
        of their process groups and trees; returns the PIDs still alive (none expected)."""
        leaders = [p.pid for p in self.procs]
        self.seen |= _tree(leaders)
        for proc in reversed(self.procs):  # worker first
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        self.seen |= _tree(leaders)
        for pid in leaders:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for pid in _alive(self.seen):
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for proc in self.procs:
            if proc.poll() is None:
                proc.wait(timeout=10)
        psutil.wait_procs([psutil.Process(p) for p in _alive(self.seen)], timeout=10)
        return _alive(self.seen)


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[RayCluster, dict]]:
    with tempfile.TemporaryDirectory(
        prefix="hwray", dir="/tmp" if os.path.isdir("/tmp") else None
    ) as tmp:  # short: Ray's socket paths are limited to ~107 characters
        ray = RayCluster(Path(tmp))
        try:
            yield ray, ray.start()
        finally:
            left = ray.stop()
            stray = [p.info["pid"] for p in psutil.process_iter(["pid", "cmdline"]) if tmp in " ".join(p.info["cmdline"] or [])]
            assert not left and not stray, f"Ray processes left behind: {left} {stray}"


def _run(out: Path, data_dir: str, address: str, **overrides) -> subprocess.CompletedProcess:
    sets = {**RUN, "data-dir": data_dir, "ray-address": address, **overrides}
    cmd = [sys.executable, "-m", "headway", "run", "--out", str(out)]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)


def _run_actors(state: dict, out: Path) -> list[dict]:
    """The ClientApp actors of the job whose command line wrote ``out``."""
    jobs = [j["id"] for j in state["jobs"] if str(out) in j["entrypoint"]]
    assert len(jobs) == 1, state["jobs"]
    return [a for a in state["actors"] if a["job"] == jobs[0] and a["class"] == "ClientAppActor"]


def _check_complete(done: subprocess.CompletedProcess, out: Path, address: str, rounds: int = 2) -> dict:
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["rounds"] == rounds and summary["aggregated_rounds"] == rounds
    assert summary["final_accuracy"] > 0.5, summary
    assert json.loads((out / "config.json").read_text())["ray-address"] == address  # the folder names the cluster it ran on
    return summary


def test_ray_address_private_unless_a_cluster_is_named(monkeypatch):
    import ray._private.utils as ray_utils

    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.9:6379")
    assert ray_address("") == "local"  # a private Ray: RAY_ADDRESS is not followed by chance
    assert ray_address("10.0.0.1:6379") == "10.0.0.1:6379"
    assert ray_address("auto") == "10.0.0.9:6379"
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setattr(ray_utils, "read_ray_address", lambda temp_dir=None: "10.0.0.2:6379")  # what `ray start` recorded here
    assert ray_address("auto") == "10.0.0.2:6379"
    monkeypatch.setattr(ray_utils, "read_ray_address", lambda temp_dir=None: None)
    with pytest.raises(ConfigError, match="ray-address"):
        ray_address("auto")


@pytest.mark.system
def test_clients_run_on_both_nodes_of_the_cluster(cluster, tmp_path, data_dir):
    ray, state = cluster
    out = tmp_path / "run"
    _check_complete(_run(out, data_dir, ray.address), out, ray.address)
    after = ray.query()
    actors = _run_actors(after, out)
    # one client (1 CPU) per node: the pool Flower sized from the cluster's 2 CPUs, one actor on each node
    assert len(actors) == 2, actors
    assert {a["node"] for a in actors} == {n["id"] for n in state["nodes"] if n["alive"]}


@pytest.mark.system
def test_two_clients_share_one_gpu(cluster, tmp_path, data_dir):
    ray, state = cluster
    out = tmp_path / "run"
    done = _run(out, data_dir, ray.address, **{"num-server-rounds": 1, "client-num-cpus": 0.5, "client-num-gpus": 0.5})
    _check_complete(done, out, ray.address, rounds=1)  # trained on the CPU: torch sees no CUDA here, whatever Ray declared
    gpu_nodes = [n["id"] for n in state["nodes"] if n["alive"] and n["resources"].get("GPU")]
    actors = _run_actors(ray.query(), out)
    # half a GPU each: the head (no GPU) holds none, the worker's one GPU holds two
    assert len(gpu_nodes) == 1 and len(actors) == 2, (gpu_nodes, actors)
    assert {a["node"] for a in actors} == set(gpu_nodes)
