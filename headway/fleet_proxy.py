"""The Fleet proxy of Flower 1.40+: nginx in front of the SuperLink's one HTTP port.

From Flower 1.40 the SuperLink serves the Fleet API (SuperNodes), the Control API (`flwr run`
submits code) and the ServerApp runtime API on one host and port, and open-source Flower does
not authenticate the Control API. headway keeps that port on the Control address (127.0.0.1 by
default) and puts nginx, a maintained proxy from the distribution's packages, on the Fleet
address: it forwards the Fleet API's own calls (POST /v1/fleet/NAME, the raw request line
checked before any decoding) and answers 404 to everything else, so whoever reaches the Fleet
port reaches nothing but the Fleet API. With TLS, nginx terminates the SuperNodes' TLS with the
SuperLink's certificate and speaks TLS again to the SuperLink, checking its certificate against
the CA (as ``localhost``, a name ``headway certs`` always writes). SuperNode authentication
travels in request headers (a signed timestamp), which pass through unchanged.
"""

from __future__ import annotations

import ipaddress
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

NGINX_HINT = (
    "Flower 1.40+ serves the Fleet API on the same port as the Control API, so headway puts nginx in front of it "
    "and lets only the Fleet API through: install it (Debian/Ubuntu: apt-get install nginx; macOS: brew install nginx), "
    "or pass --nginx PATH"
)
UPSTREAM_TLS_NAME = "localhost"  # the name nginx checks on the SuperLink's certificate (make_certs always adds it)
# The Fleet API's calls: POST /v1/fleet/<lower-case name> and nothing else (no query, no
# percent-encoding, no dot segments), matched against the raw request line.
FLEET_CALL = r"^POST:/v1/fleet/[a-z][a-z-]*$"


MAX_BODY_MIB = 128  # the largest Fleet request body (Flower 1.42 reads a body whole, before it checks the node's key)
CONNECTIONS_PER_ADDRESS = 64  # requests in flight from one client address (a SuperNode holds one or two)
WORKER_CONNECTIONS = 4096  # nginx's connections in all; each proxied request holds two


@dataclass(frozen=True)
class ProxyPlan:
    """Where the proxy listens (``listen``: HOST:PORT, IPv6 bracketed), the SuperLink's own
    HTTP address it forwards to (``upstream``), its TLS files (None: plain HTTP both ways), and
    the largest request body it passes (MiB)."""

    listen: str
    upstream: str
    certs: Path | None
    max_body_mib: int = MAX_BODY_MIB


def upstream_address(control_host: str, control_port: int) -> str:
    """Where the proxy reaches the SuperLink that listens on ``control_host``: loopback when that
    is a wildcard (0.0.0.0, ::), else the address or name itself."""
    bare = control_host.removeprefix("[").removesuffix("]")
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        return f"{control_host}:{control_port}"  # a name, e.g. compose's superlink-control
    if ip.is_unspecified:
        return f"[::1]:{control_port}" if ip.version == 6 else f"127.0.0.1:{control_port}"
    return f"[{ip}]:{control_port}" if ip.version == 6 else f"{ip}:{control_port}"


def nginx_config(plan: ProxyPlan, workdir: Path) -> str:
    """nginx's configuration for ``plan``, with its pid file and temporary folders in ``workdir``
    (it runs unprivileged there, in the foreground, logging errors to stderr)."""
    scheme = "https" if plan.certs else "http"
    tls = ""
    upstream_tls = ""
    if plan.certs:
        tls = (
            f"    ssl_certificate {plan.certs / 'server.crt'};\n"
            f"    ssl_certificate_key {plan.certs / 'server.key'};\n"
            "    ssl_protocols TLSv1.2 TLSv1.3;\n"
        )
        upstream_tls = (
            "      proxy_ssl_verify on;\n"
            f"      proxy_ssl_trusted_certificate {plan.certs / 'ca.crt'};\n"
            f"      proxy_ssl_name {UPSTREAM_TLS_NAME};\n"
            "      proxy_ssl_server_name on;\n"
            "      proxy_ssl_session_reuse on;\n"
        )
    temp = "".join(f"  {kind}_temp_path {workdir / kind};\n" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return (
        "# Written by `headway superlink` (headway/fleet_proxy.py): only the Fleet API passes.\n"
        "daemon off;\n"
        "worker_processes 1;\n"
        f"worker_rlimit_nofile {2 * WORKER_CONNECTIONS + 64};\n"
        f"pid {workdir / 'nginx.pid'};\n"
        "error_log stderr warn;\n"
        f"events {{ worker_connections {WORKER_CONNECTIONS}; }}\n"
        "http {\n"
        "  access_log off;\n"
        "  server_tokens off;\n"
        f"{temp}"
        f'  map "$request_method:$request_uri" $fleet_call {{ default 0; "~{FLEET_CALL}" 1; }}\n'
        f"  upstream superlink {{ server {plan.upstream}; keepalive 16; }}\n"
        "  limit_conn_zone $binary_remote_addr zone=per_address:10m;\n"
        "  client_header_timeout 10s;  # a request that trickles in is dropped, not held\n"
        "  client_body_timeout 30s;\n"
        "  send_timeout 30s;\n"
        "  keepalive_timeout 30s;\n"
        "  server {\n"
        f"    listen {plan.listen}{' ssl' if plan.certs else ''};\n"
        f"{tls}"
        f"    client_max_body_size {plan.max_body_mib}m;  # larger: 413, before Flower reads it whole\n"
        f"    limit_conn per_address {CONNECTIONS_PER_ADDRESS};\n"
        "    limit_conn_status 429;\n"
        "    location / {\n"
        "      if ($fleet_call = 0) { return 404; }\n"
        f"      proxy_pass {scheme}://superlink;\n"
        "      proxy_http_version 1.1;\n"
        '      proxy_set_header Connection "";\n'
        "      proxy_set_header X-Forwarded-For $remote_addr;  # the SuperLink logs the real client, not what it claims\n"
        "      proxy_set_header X-Forwarded-Proto $scheme;\n"
        '      proxy_set_header Forwarded "";\n'
        "      proxy_request_buffering off;\n"
        "      proxy_buffering off;\n"
        "      proxy_read_timeout 300s;\n"
        "      proxy_send_timeout 300s;\n"
        f"{upstream_tls}"
        "    }\n"
        "  }\n"
        "}\n"
    )


def find_nginx(given: str = "") -> str | None:
    """The nginx executable: ``given`` if it names one, else nginx on PATH or in /usr/sbin; None if none."""
    if given:
        return shutil.which(given)
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin:/opt/homebrew/bin")


def nginx_command(nginx: str, workdir: Path) -> list[str]:
    """nginx in the foreground on ``workdir``/nginx.conf, its start-up errors on stderr."""
    return [nginx, "-e", "stderr", "-p", str(workdir), "-c", str(workdir / "nginx.conf")]


def write_config(plan: ProxyPlan, workdir: Path) -> Path:
    """Write nginx.conf for ``plan`` into ``workdir`` (made readable to nginx's workers, which run as
    another user when started by root) and return its path."""
    workdir.chmod(0o755)
    path = workdir / "nginx.conf"
    path.write_text(nginx_config(plan, workdir))
    return path


def upstream_ready(upstream: str, timeout: float = 0.5) -> bool:
    """Whether the SuperLink's HTTP port (``upstream``, HOST:PORT) accepts a connection yet."""
    host, _, port = upstream.rpartition(":")
    try:
        with socket.create_connection((host.removeprefix("[").removesuffix("]"), int(port)), timeout=timeout):
            return True
    except OSError:
        return False
