"""The Fleet proxy of Flower 1.40+ (headway/fleet_proxy.py): real nginx, as the launcher configures
it, in front of a stand-in for the SuperLink's one HTTP port (which serves Fleet, Control and the
runtime API alike). Only POST /v1/fleet/NAME may reach it, byte for byte as sent, with the SuperNode
authentication headers; everything else gets 404 from nginx. Runs on any Flower: the proxy is nginx's
job. Needs nginx (skipped without it, failed under HEADWAY_REQUIRE_NGINX=1, as CI sets)."""

from __future__ import annotations

import argparse
import http.client
import http.server
import os
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from headway.credentials import make_certs, names_host
from headway.deploy import fleet_proxy_plan, fleet_transport, free_port
from headway.fleet_proxy import ProxyPlan, find_nginx, nginx_command, upstream_address, write_config
from headway.processes import Companion, supervise

AUTH = {"flwr-public-key": "cHVibGlj", "flwr-signature": "c2lnbmF0dXJl", "flwr-timestamp": "2026-11-28T10:00:00+00:00"}


def nginx() -> str:
    found = find_nginx()
    if found is None:
        if os.environ.get("HEADWAY_REQUIRE_NGINX", "") not in ("", "0"):
            pytest.fail("nginx is not installed (HEADWAY_REQUIRE_NGINX=1): apt-get install nginx", pytrace=False)
        pytest.skip("nginx is not installed (apt-get install nginx)")
    return found


class Upstream(http.server.ThreadingHTTPServer):
    """The SuperLink's stand-in: answers every POST with 200 and notes (path, headers) of each."""

    def __init__(self, certs: Path | None):
        self.seen: list[tuple[str, dict[str, str]]] = []
        super().__init__(("127.0.0.1", 0), Handler)
        if certs is not None:
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(certs / "server.crt", certs / "server.key")
            self.socket = context.wrap_socket(self.socket, server_side=True)


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)  # echoed: the body crossed both ways whole

    def log_message(self, *args: object) -> None:
        pass


def ask(
    port: int, path: str, cafile: Path | None, method: str = "POST", body: bytes = b"\x08\x01", headers: dict | None = None
) -> tuple[int, bytes]:
    """(status, body) of one request to the proxy, the path sent exactly as written."""
    if cafile is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ssl.create_default_context(cafile=str(cafile)), timeout=10)
    conn.request(method, path, body=body, headers={"content-type": "application/protobuf", **AUTH, **(headers or {})})
    response = conn.getresponse()
    return response.status, response.read()


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_the_proxy_passes_fleet_calls_only(tmp_path, tls):
    exe = nginx()
    certs = None
    if tls:
        certs = tmp_path / "certs"
        make_certs(certs, ["127.0.0.1"])
    upstream = Upstream(certs)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    port = free_port()
    plan = ProxyPlan(listen=f"127.0.0.1:{port}", upstream=f"127.0.0.1:{upstream.server_address[1]}", certs=certs, max_body_mib=1)
    work = tmp_path / "proxy"
    work.mkdir()
    write_config(plan, work)
    proxy = subprocess.Popen(nginx_command(exe, work), stderr=subprocess.PIPE, start_new_session=True)
    try:
        cafile = certs / "ca.crt" if certs else None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                status, echoed = ask(port, "/v1/fleet/pull-messages", cafile, body=b"\x00\x01" * 5000)
                break
            except OSError:
                time.sleep(0.05)
        assert (status, echoed) == (200, b"\x00\x01" * 5000)
        path, headers = upstream.seen[-1]
        assert path == "/v1/fleet/pull-messages" and all(headers[k] == v for k, v in AUTH.items())
        # the client's own forwarding headers are replaced by its real address (the SuperLink logs that one)
        assert ask(port, "/v1/fleet/get-run", cafile, headers={"X-Forwarded-For": "6.6.6.6", "Forwarded": "for=6.6.6.6"})[0] == 200
        headers = upstream.seen[-1][1]
        assert headers["x-forwarded-for"] == "127.0.0.1" and "forwarded" not in headers
        refused = [
            "/v1/control/start-run",
            "/v1/control/list-runs",
            "/v1/runtime/get-run",
            "/health",
            "/docs",
            "/openapi.json",
            "/v1/fleet/../control/start-run",
            "/v1/fleet/%2e%2e/control/start-run",
            "/v1/fleet/..%2fcontrol/start-run",
            "/v1/fleet/get-run/../../control/start-run",
            "/v1/fleet//get-run",
            "/v1/fleet/get-run?next=/v1/control",
            "/v1/fleet/Get-Run",
            "/v1/fleet/",
        ]
        seen = len(upstream.seen)
        answers = {path: ask(port, path, cafile)[0] for path in refused}
        too_big = ask(port, "/v1/fleet/push-object", cafile, body=bytes(2**20 + 1))[0]
        assert too_big == 413  # over the plan's 1 MiB: refused before the SuperLink reads it
        answers["GET /v1/fleet/get-run"] = ask(port, "/v1/fleet/get-run", cafile, method="GET")[0]
        assert set(answers.values()) == {404}, answers
        assert len(upstream.seen) == seen  # nothing of it reached the SuperLink
    finally:
        proxy.terminate()
        proxy.wait(timeout=10)
        upstream.shutdown()


def test_the_configuration_nginx_accepts(tmp_path):
    """nginx -t reads the launcher's configuration for each shape of plan (plain, TLS, an IPv6 or named SuperLink);
    it also binds the listening address, so each gets a free port."""
    exe = nginx()
    certs = tmp_path / "certs"
    make_certs(certs, ["lab.example.org"])
    for n, plan in enumerate(
        [
            ProxyPlan(f"0.0.0.0:{free_port('0.0.0.0')}", "127.0.0.1:8000", None),
            ProxyPlan(f"127.0.0.1:{free_port()}", "[::1]:8000", certs),
            ProxyPlan(f"127.0.0.1:{free_port()}", "localhost:8000", certs),
        ]
    ):
        work = tmp_path / f"w{n}"
        work.mkdir()
        write_config(plan, work)
        test = subprocess.run([*nginx_command(exe, work), "-t"], capture_output=True, text=True)
        assert test.returncode == 0, test.stderr


def test_the_transport_follows_the_installed_flower():
    assert [fleet_transport(v) for v in ("1.39.0", "1.39.1", "1.40.0", "1.42.0", "2.0.0")] == ["grpc", "grpc", "http", "http", "http"]


def test_the_proxy_forwards_to_the_control_address_and_refuses_a_shared_port(tmp_path):
    args = argparse.Namespace(
        bind="0.0.0.0", fleet_port=None, control_bind="127.0.0.1", control_port=8000, insecure=True, certs="c", fleet_max_body_mib=128
    )
    assert fleet_proxy_plan(args) == ProxyPlan("0.0.0.0:9092", "127.0.0.1:8000", None)
    assert upstream_address("0.0.0.0", 8000) == "127.0.0.1:8000" and upstream_address("::", 8000) == "[::1]:8000"
    assert upstream_address("superlink-control", 8000) == "superlink-control:8000"
    with pytest.raises(ValueError, match="must differ"):
        fleet_proxy_plan(argparse.Namespace(**{**vars(args), "bind": "127.0.0.1:8000"}))
    make_certs(tmp_path, ["10.0.0.5"])
    assert names_host(tmp_path / "server.crt", "localhost") and not names_host(tmp_path / "server.crt", "superlink")


def test_a_companion_that_dies_stops_the_command(tmp_path):
    """The supervisor's companion (the Fleet proxy beside the SuperLink): started once ready; when it
    exits, the command and everything else stop, with the companion's code."""
    started = time.monotonic()
    companion = Companion([sys.executable, "-c", "import time; time.sleep(0.3); raise SystemExit(3)"], ready=lambda: True, name="proxy")
    rc = supervise([sys.executable, "-c", "import time; time.sleep(60)"], grace=2, companion=companion)
    assert rc == 3 and time.monotonic() - started < 20
    assert companion.process is not None and companion.process.returncode == 3
    killed = Companion([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"], ready=lambda: True, name="proxy")
    assert supervise([sys.executable, "-c", "import time; time.sleep(60)"], grace=2, companion=killed) == 128 + 9
