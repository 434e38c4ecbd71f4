"""Server and clients on separate hosts: network namespaces that the test builds, each with
an address of its own on one private switch, a SuperLink with TLS and SuperNode
authentication (the launcher's defaults), three registered SuperNodes with different bodies,
one whose key was never registered and one with no key; FedLog runs under secure-aggregation
(SecAgg+: the server sees only the sum of the three clients' statistics; a secure sum needs 3). Skipped where `ip netns`
is not permitted."""

from __future__ import annotations

import json
import time

import pytest

from headway.deploy import fleet_transport
from tests.cluster import Cluster, Netns, read_rounds, run_folder

pytestmark = [pytest.mark.deployment, pytest.mark.system]  # network namespaces, TLS and SecAgg+: minutes; make test-system


# what a host that reaches the Fleet port tries: one Fleet call, then the Control API (submits code), the
# ServerApp runtime API, Flower's health and API docs, and Control paths dressed as Fleet ones
PROXY_PROBES = (
    "/v1/fleet/get-run",
    "/v1/control/list-runs",
    "/v1/control/start-run",
    "/v1/runtime/get-run",
    "/health",
    "/docs",
    "/openapi.json",
    "/v1/fleet/../control/list-runs",
    "/v1/fleet/%2e%2e/control/list-runs",
    "/v1/fleet/get-run/../../control/list-runs",
    "/v1/fleet/get-run?x=/v1/control",
)


@pytest.fixture
def hosts():
    net = Netns(["server", "node0", "node1", "node2", "stranger", "keyless"])
    try:
        yield net
    finally:
        net.close()


def test_fedlog_over_tls_with_supernode_authentication_across_hosts(tmp_path, data_dir, hosts):
    server = hosts.addresses["server"]
    certs, keys, results = tmp_path / "certs", tmp_path / "keys", tmp_path / "results"
    with Cluster(tmp_path, data_dir, netns=hosts) as c:
        c.command(c.launcher("certs", str(certs), "--host", server))
        for name in ("node0", "node1", "node2", "stranger"):  # each client machine makes its own key
            c.command(c.launcher("keys", str(keys), "--name", name), host=name)
        c.launch("superlink", ["superlink", "--certs", str(certs)], host="server")  # defaults: TLS, node auth, Control API on 127.0.0.1
        c.wait_for_port("superlink", 9092, host="server")
        c.wait_for_port("superlink", 8000, host="server")
        # the Fleet API is reachable from a client host; the Control API is not (it takes code to run)
        assert hosts.reachable("node0", server, 9092)
        assert not hosts.reachable("node0", server, 8000)
        if fleet_transport() == "http":  # Flower 1.40+: one SuperLink port serves every API; the Fleet proxy passes only Fleet calls
            status = {path: hosts.http_status("node0", f"https://{server}:9092{path}", certs / "ca.crt") for path in PROXY_PROBES}
            assert status.pop("/v1/fleet/get-run") == 401, status  # the SuperLink's own answer: an empty call with no node key
            assert set(status.values()) == {404}, status
            assert hosts.http_status("node0", f"https://{server}:9092/v1/fleet/get-run", certs / "ca.crt", method="GET") == 404
        c.command(c.launcher("connect", "lab", "--address", "127.0.0.1:8000", "--root-cert", str(certs / "ca.crt")), host="server")
        for name in ("node0", "node1", "node2"):
            c.command(c.launcher("register", str(keys / f"{name}.pub"), "lab"), host="server")
        for pid, (name, body) in enumerate([("node0", "mnist-cnn"), ("node1", "mlp"), ("node2", "mnist-cnn")]):
            c.launch(
                name,
                [
                    "supernode",
                    "--superlink",
                    f"{server}:9092",
                    "--root-cert",
                    str(certs / "ca.crt"),
                    "--auth-key",
                    str(keys / name),
                    "--partition-id",
                    str(pid),
                    "--num-partitions",
                    "3",
                    "--body",
                    body,
                ],
                host=name,
            )
        stranger = c.launch(
            "stranger",
            [
                "supernode",
                "--superlink",
                f"{server}:9092",
                "--root-cert",
                str(certs / "ca.crt"),
                "--auth-key",
                str(keys / "stranger"),
                "--partition-id",
                "1",
                "--num-partitions",
                "3",
                "--max-wait-time",
                "30",
            ],
            host="stranger",
        )
        keyless = c.launch(
            "keyless",
            [
                "supernode",
                "--superlink",
                f"{server}:9092",
                "--root-cert",
                str(certs / "ca.crt"),
                "--partition-id",
                "1",
                "--num-partitions",
                "3",
                "--max-wait-time",
                "30",
            ],
            host="keyless",
        )
        run_config = (
            "algorithm='fedlog' dataset='mnist' num-clients=3 num-server-rounds=2 train-fraction=0.01 local-epochs=1 "
            "batch-size=10 partition='pathological' feature-dim=50 sample-timeout=60.0 round-timeout=240.0 "
            "secure-aggregation='secagg+' fedlog-clip=4.0"
        )
        out = c.submit("lab", run_config, results, host="server")
        folder = run_folder(results, out, c.log("superlink"), c.log("node0"), c.log("node1"), c.log("node2"))
        summary = json.loads((folder / "summary.json").read_text())
        rounds = read_rounds(folder)
        assert summary["status"] == "complete" and summary["rounds"] == 2 and summary["failures"] == 0, summary
        assert len(rounds) == 2 and all(r["clients"] == 3 for r in rounds)
        assert all(r["secagg_setup_bytes_up"] > 0 and r["secagg_unmask_bytes_up"] > 0 for r in rounds)  # every SecAgg+ stage ran
        assert summary["participants"] == {"0": "mnist-cnn", "1": "mlp", "2": "mnist-cnn"}
        assert rounds[-1]["accuracy"] > 0.3
        # an unregistered key and no key at all were refused at the door: those SuperNodes gave up
        # (the stranger after the launcher's --rejoin-wait, 65 s by default: a refused key may be one still held online)
        deadline = time.monotonic() + 120
        while (stranger.poll() is None or keyless.poll() is None) and time.monotonic() < deadline:
            time.sleep(0.5)
        for name, proc in (("stranger", stranger), ("keyless", keyless)):
            assert proc.poll() not in (None, 0), f"{name} was not refused:\n{c.log(name).read_text()[-2000:]}"
        assert "No SuperNode found with the given public key" in c.log("superlink").read_text()
        listed = c.command(["flwr", "supernode", "ls", "lab", "--format", "json"], host="server")
        nodes = json.loads(listed.stdout[listed.stdout.index("{") :])["nodes"]
        assert len(nodes) == 3 and all(n["status"] == "online" for n in nodes), nodes
