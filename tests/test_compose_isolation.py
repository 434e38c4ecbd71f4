"""Issue 37 item 6: in docker/compose.yml only the SuperLink's Fleet API may be reachable from
SuperNode containers; the Control API (where `flwr run` submits code) and the ServerApp
runtime API, which share Flower's one HTTP port, must not be. Checked twice: on the compose
model (networks, aliases, binds, parsed as YAML and through the launcher's own parser), and
for real: the SuperLink command compose runs is started in network namespaces wired as
compose's networks (one bridge per network, names that resolve per network, no gateway on an
internal network), and a namespace standing in for a SuperNode container tries every port."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from headway.deploy import fleet_proxy_plan, fleet_transport, parser, superlink_command
from headway.fleet_proxy import ProxyPlan
from tests.conftest import ROOT

yaml = pytest.importorskip("yaml")

DOCKER = ROOT / "docker"
OVERLAYS = sorted(p.name for p in DOCKER.glob("compose.*.yml"))
FLEET, CONTROL = 9092, 8000
FLOWER_INTERNAL = (9091, 9093)  # Flower's older ServerAppIo / Control gRPC ports: nothing may listen there for nodes


def compose(name: str = "compose.yml") -> dict:
    return yaml.safe_load((DOCKER / name).read_text())


def with_default_network(spec: dict) -> dict:
    """``spec`` as compose runs it: services that name no network join ``default`` (a plain,
    non-internal bridge), as in the compose file before issue 37 item 6."""
    spec = {**spec, "networks": dict(spec.get("networks") or {}), "services": dict(spec["services"])}
    for name, svc in spec["services"].items():
        if not svc.get("networks"):
            spec["services"][name] = {**svc, "networks": ["default"]}
            spec["networks"].setdefault("default", {})
    return spec


def _expand(command: str, env: dict[str, str]) -> str:
    """The shell's view of a compose entrypoint: ``$$`` is compose's escaped ``$``, and
    ``${VAR:-default}`` takes ``env[VAR]`` or the default (what `sh -c` does at start)."""
    command = command.replace("$$", "$")
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: env.get(m.group(1)) or m.group(2), command)


def launcher_args(service: dict) -> list[str]:
    """The `headway ...` arguments a service's entrypoint runs."""
    entry = service["entrypoint"]
    assert entry[:2] == ["/bin/sh", "-c"], entry
    words = shlex.split(_expand(entry[2], {k: str(v) for k, v in (service.get("environment") or {}).items()}))
    assert words[:2] == ["exec", "headway"], words
    return words[2:]


def flower_flag(cmd: list[str], flag: str) -> str:
    return cmd[cmd.index(flag) + 1]


def networks_of(service: dict) -> dict[str, dict]:
    nets = service.get("networks") or {}
    return {n: {} for n in nets} if isinstance(nets, list) else {n: (v or {}) for n, v in nets.items()}


def test_nodes_share_only_the_fleet_network_and_control_binds_elsewhere():
    """The compose model: the SuperLink's HTTP API binds a name that resolves only on a
    network no SuperNode joins; nodes sit on an internal network (no gateway) with the
    SuperLink; only the SuperLink publishes ports, the Control port on the host's loopback."""
    spec = compose()
    services, networks = spec["services"], spec["networks"]
    nodes = {name: svc for name, svc in services.items() if name.startswith("supernode")}
    link = services["superlink"]
    assert nodes and set(services) == {"superlink", *nodes}
    node_nets = {n for svc in nodes.values() for n in networks_of(svc)}
    link_nets = networks_of(link)
    assert node_nets == {"fleet"} and networks["fleet"].get("internal") is True
    args = parser().parse_args(launcher_args(link))
    cmd = superlink_command(args, "grpc")  # Flower 1.39: the SuperLink's own gRPC Fleet server on every address
    host = flower_flag(cmd, "--host")
    assert flower_flag(cmd, "--port") == str(CONTROL)
    assert flower_flag(cmd, "--fleet-api-address") == f"0.0.0.0:{FLEET}"
    http = superlink_command(args, "http")  # Flower 1.40+: every API on the control name; the Fleet proxy on every address
    assert "--fleet-api-address" not in http and flower_flag(http, "--host") == host and flower_flag(http, "--port") == str(CONTROL)
    assert fleet_proxy_plan(args) == ProxyPlan(f"0.0.0.0:{FLEET}", f"{host}:{CONTROL}", None)
    bound_on = [n for n, conf in link_nets.items() if host in (conf.get("aliases") or [])]
    assert bound_on and not set(bound_on) & node_nets, f"the Control/runtime API binds {host!r}, which SuperNodes can resolve"
    assert host not in services and host not in {"0.0.0.0", "::", ""}
    for svc in nodes.values():  # no node publishes a port or leaves the fleet network
        assert "ports" not in svc and "network_mode" not in svc
    control_ports = [p for p in link["ports"] if p.split("#")[0].strip().endswith(f":{CONTROL}")]
    assert control_ports and all(p.startswith("127.0.0.1:") for p in control_ports)


def test_every_container_runs_unprivileged():
    spec = compose()
    for name, svc in spec["services"].items():
        user = _expand(str(svc.get("user", "")), {})
        assert user and user.split(":")[0] not in ("0", "root"), f"{name} runs as {user!r}"
        assert svc.get("cap_drop") == ["ALL"] and "no-new-privileges:true" in svc.get("security_opt", []), name
        assert not svc.get("privileged") and not svc.get("cap_add"), name
    steps = [line.split(None, 1) for line in (DOCKER / "Dockerfile").read_text().splitlines() if line and not line.startswith("#")]
    users = [arg.strip() for word, *rest in steps if word == "USER" for arg in rest]
    assert users and users[-1].split(":")[0] not in ("0", "root"), users  # the image's last USER is not root


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_keep_the_networks_and_the_user(overlay):
    """An overlay may add flags, volumes and devices, but never networks, ports, entrypoints,
    users or capabilities (compose merges them into the isolated model above)."""
    spec = compose(overlay)
    assert "networks" not in spec
    for name, svc in spec["services"].items():
        assert not {"networks", "network_mode", "ports", "entrypoint", "user", "cap_add", "privileged"} & set(svc), (overlay, name)
        for flag in (svc.get("environment") or {}).values():
            assert "--control-bind" not in str(flag) and "--bind" not in str(flag), (overlay, name, flag)


class ComposeNet:
    """Compose's networks as network namespaces: a switch namespace with one bridge per
    network, one namespace per service (one interface per network it joins, address
    10.214.<net>.<k>), a ``host`` namespace on every non-internal network standing for the
    Docker host (its gateway, which the published ports come through), and per-namespace
    /etc/hosts (``ip netns exec`` mounts /etc/netns/NS/hosts) that resolves a service's name
    and aliases only on networks the asking namespace shares with it, as Docker's DNS does."""

    def __init__(self, spec: dict):
        if shutil.which("ip") is None:
            pytest.skip("`ip` (iproute2) is not installed: this test needs network namespaces")
        tag = uuid.uuid4().hex[:6]
        self.switch = f"hw{tag}-sw"
        probe = subprocess.run(["ip", "netns", "add", self.switch], capture_output=True, text=True)
        if probe.returncode != 0:
            pytest.skip(f"`ip netns add` is not permitted here ({probe.stderr.strip()}): run as root on Linux")
        self.names: dict[str, str] = {}
        self.addr: dict[tuple[str, str], str] = {}  # (service, network) -> address
        try:
            self._build(spec, tag)
        except BaseException:
            self.close()
            raise

    def _build(self, spec: dict, tag: str) -> None:
        spec = with_default_network(spec)
        nets = list(spec["networks"])
        members = {s: networks_of(svc) for s, svc in spec["services"].items()}
        members["host"] = {n: {} for n in nets if not (spec["networks"][n] or {}).get("internal")}
        self._ip(self.switch, "link", "set", "lo", "up")
        for i in range(len(nets)):
            self._ip(self.switch, "link", "add", f"br{i}", "type", "bridge")
            self._ip(self.switch, "link", "set", f"br{i}", "up")
        for k, (svc, joined) in enumerate(members.items()):
            ns = self.names[svc] = f"hw{tag}-{k}"
            subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
            self._ip(ns, "link", "set", "lo", "up")
            for net in joined:
                i = nets.index(net)
                self.addr[svc, net] = f"10.214.{i}.{k + 1 if svc != 'host' else 254}"
                self._ip(self.switch, "link", "add", f"v{k}n{i}", "type", "veth", "peer", "name", f"eth{i}", "netns", ns)
                self._ip(self.switch, "link", "set", f"v{k}n{i}", "master", f"br{i}", "up")
                self._ip(ns, "addr", "add", f"{self.addr[svc, net]}/24", "dev", f"eth{i}")
                self._ip(ns, "link", "set", f"eth{i}", "up")
            gateway = next((n for n in joined if n in members["host"]), None)
            if svc != "host" and gateway:  # a non-internal network gives the container its default route
                self._ip(ns, "route", "add", "default", "via", self.addr.get(("host", gateway), f"10.214.{nets.index(gateway)}.254"))
        for svc, joined in members.items():
            lines = ["127.0.0.1 localhost"]
            for other, their in members.items():
                for net in set(joined) & set(their):
                    names = [other, *(their[net].get("aliases") or [])] if other != "host" else ["dockerhost"]
                    lines.append(f"{self.addr[other, net]} {' '.join(names)}")
            folder = Path("/etc/netns") / self.names[svc]
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "hosts").write_text("\n".join(lines) + "\n")

    def _ip(self, ns: str, *args: str) -> None:
        subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True)

    def prefix(self, svc: str) -> list[str]:
        return ["ip", "netns", "exec", self.names[svc]]

    def run_py(self, svc: str, code: str, *args: str) -> str:
        out = subprocess.run([*self.prefix(svc), sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def close(self) -> None:
        for ns in [*self.names.values(), self.switch]:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)


PROBE = """
import socket, sys, urllib.request, urllib.error
def reach(host, port):
    try:
        socket.create_connection((host, int(port)), timeout=3).close()
        return "open"
    except socket.gaierror:
        return "no-name"
    except OSError as exc:
        return type(exc).__name__
def http(url):
    try:
        return str(urllib.request.urlopen(url, data=b"", timeout=5).status)
    except urllib.error.HTTPError as exc:
        return str(exc.code)
    except OSError as exc:
        return type(getattr(exc, "reason", exc)).__name__
print(" ".join(reach(*t.split(":")) if not t.startswith("http") else http(t) for t in sys.argv[1:]))
"""


@pytest.mark.deployment
def test_a_node_namespace_reaches_fleet_but_not_control(tmp_path):
    """The attack: from a SuperNode's place on compose's networks, open the SuperLink's
    Control/runtime API (`/v1/control/list-runs`, by service name, by the control name and
    by address) and Flower's internal ports. Only the Fleet API may open; the host side
    (where the published Control port arrives) must still reach the Control API."""
    spec = compose()
    link = spec["services"]["superlink"]
    net = ComposeNet(spec)
    log = open(tmp_path / "superlink.log", "w")  # noqa: SIM115 - the child process writes it while it runs; closed when it is stopped
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "FLWR_HOME": str(tmp_path / "flwr-home"),
        "HOME": str(tmp_path),
        "PYTHONPATH": str(ROOT),
        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
    }
    cmd = [*net.prefix("superlink"), sys.executable, "-m", "headway", *launcher_args(link), "--grace", "3"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        control_ip = next(net.addr["superlink", n] for n in ("control", "default") if ("superlink", n) in net.addr)
        deadline = time.monotonic() + 60
        while net.run_py("host", PROBE, f"{control_ip}:{CONTROL}", f"{control_ip}:{FLEET}") != "open open":
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "superlink.log").read_text()[-3000:]
            time.sleep(0.5)
        fleet_ip = next(net.addr["superlink", n] for n in ("fleet", "default") if ("superlink", n) in net.addr)
        node_targets = [
            f"superlink:{FLEET}",
            f"superlink:{CONTROL}",
            f"{fleet_ip}:{CONTROL}",
            f"{control_ip}:{CONTROL}",
            f"superlink-control:{CONTROL}",
            *(f"superlink:{p}" for p in FLOWER_INTERNAL),
            f"http://superlink:{CONTROL}/v1/control/list-runs",
        ]
        proxied = f"http://superlink:{FLEET}/v1/control/list-runs"  # Flower 1.40+: the Control API's path at the Fleet proxy
        if fleet_transport() == "http":
            node_targets.append(proxied)
        seen = dict(zip(node_targets, net.run_py("supernode-0", PROBE, *node_targets).split()))
        assert seen[f"superlink:{FLEET}"] == "open", seen
        assert seen.pop(proxied, "404") == "404", seen  # nginx's answer: the path is not a Fleet call
        assert all(v != "open" and not v.isdigit() for k, v in seen.items() if k != f"superlink:{FLEET}"), seen
        # the positive control: the Docker host's side (published ports) gets HTTP answers from the Control API
        answer = net.run_py("host", PROBE, f"http://{control_ip}:{CONTROL}/v1/control/list-runs", f"{control_ip}:{FLEET}")
        assert answer.split()[0].isdigit() and answer.split()[1] == "open", answer
    finally:
        from tests.cluster import stop

        stop(proc)
        log.close()
        net.close()
