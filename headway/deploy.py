"""The deployment commands of `headway`: a SuperLink (server machine), SuperNodes (client
machines), the `flwr` connection to submit runs, TLS certificates, SuperNode keys, per-node
data folders, and stopping what was launched.

Server machine (TLS and SuperNode authentication are the defaults):
    headway certs certs --host SERVER_HOST              # CA + SuperLink certificate
    headway superlink --certs certs                     # Fleet API :9092, Control API 127.0.0.1:8000
    headway connect lab --address 127.0.0.1:8000 --root-cert certs/ca.crt
    headway register keys/node0.pub lab                 # once per SuperNode key (the .pub from the client)
    headway submit lab --run-config "algorithm='fedlog' num-clients=2"   # exits with the run's status
Client machine:
    headway keys keys --name node0                      # send keys/node0.pub to the server
    headway supernode --superlink SERVER_HOST:9092 --root-cert ca.crt --auth-key keys/node0 \
        --data /srv/site-a [--body mlp] [--state-dir state]   # its own data; runs with dataset='local'
    (a demo instead: --partition-id 0 --num-partitions 2, its share of one data set every node holds)
On a trusted network, `--insecure` on both sides drops TLS and authentication.

`superlink` and `supernode` run Flower's own command (flower-superlink, flower-supernode;
see --dry-run) under a supervisor that stops it and every process it spawned on SIGTERM,
SIGINT or `headway stop --pid-file F` (see :mod:`headway.processes`).
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

from headway.core.config import SCHEMA
from headway.core.labels import DEFAULT_MAX_LABEL_VALUES, DEFAULT_MAX_NUMERIC_LABEL_VALUES, NODE_LABEL_KEYS
from headway.core.secagg import NODE_PINS
from headway.core.sources import DEFAULT_MAX_ARRAY_BYTES, DEFAULT_MAX_IMAGE_PIXELS, NODE_LIMIT_KEYS
from headway.fleet_proxy import (
    MAX_BODY_MIB,
    NGINX_HINT,
    UPSTREAM_TLS_NAME,
    ProxyPlan,
    find_nginx,
    nginx_command,
    upstream_address,
    upstream_ready,
    write_config,
)
from headway.processes import Companion, stop_pid, supervise

FLEET_PORT = 9092  # the Fleet API, where SuperNodes connect (Flower 1.39: the SuperLink's gRPC; 1.40+: the Fleet proxy)
CONTROL_PORT = 8000  # SuperLink Control API, where `flwr run` submits runs (1.40+: its one HTTP port)
HTTP_FLEET_FROM = (1, 40)  # the first Flower whose Fleet API is HTTP on the SuperLink's one port


def fleet_transport(flower_version: str | None = None) -> str:
    """How SuperNodes reach the SuperLink with the installed Flower (or ``flower_version``): "grpc"
    (1.39: a Fleet port of its own) or "http" (1.40+: the SuperLink's one port, behind the Fleet proxy)."""
    if flower_version is None:
        from importlib.metadata import version

        flower_version = version("flwr")
    major, minor = (int(part) for part in re.findall(r"\d+", flower_version)[:2])
    return "http" if (major, minor) >= HTTP_FLEET_FROM else "grpc"


def flwr_home() -> Path:
    """Flower's home folder ($FLWR_HOME, else ~/.flwr), where connections and keys live, read as Flower reads it."""
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr")


def unresolved_binds(args: argparse.Namespace) -> list[str]:
    """What is wrong with each SuperLink bind address that names no address here (a name that does
    not resolve): checked where the SuperLink starts, not by a dry run, whose command may be for
    another host (docker/compose.yml binds a name only the SuperLink's container resolves)."""
    fleet = fleet_address(args.bind, args.fleet_port)
    found = [(flag, host, unresolved(host)) for flag, host in (("--bind", fleet.rpartition(":")[0]), ("--control-bind", args.control_bind))]
    return [f"{flag} {host}: {problem}" for flag, host, problem in found if problem]


def superlink_command(args: argparse.Namespace, transport: str = "grpc") -> list[str]:
    """flower-superlink with the Control API on ``--control-bind`` (127.0.0.1 unless asked: it
    accepts code to run) and, over gRPC (Flower 1.39), the Fleet API on ``--bind``, where SuperNodes
    dial in. Over HTTP (1.40+) the SuperLink serves every API on the Control address, and the
    Fleet proxy (:func:`fleet_proxy_plan`) listens on ``--bind``."""
    fleet = fleet_address(args.bind, args.fleet_port)
    cmd = ["flower-superlink", "--fleet-api-address", fleet] if transport == "grpc" else ["flower-superlink"]
    cmd += [
        "--host",
        args.control_bind,
        "--port",
        str(args.control_port),
        "--isolation",
        "subprocess",
        "--disable-runtime-dependency-installation",
    ]
    if args.insecure:
        cmd.append("--insecure")
    else:
        d = Path(args.certs)
        cmd += ["--ssl-ca-certfile", str(d / "ca.crt"), "--ssl-certfile", str(d / "server.crt"), "--ssl-keyfile", str(d / "server.key")]
        if not args.no_supernode_auth:
            cmd.append("--enable-supernode-auth")
    if args.database:
        cmd += ["--database", args.database]
    return cmd


def fleet_proxy_plan(args: argparse.Namespace) -> ProxyPlan:
    """The Fleet proxy of a SuperLink on Flower 1.40+: on ``--bind`` (the Fleet address), forwarding
    the Fleet API to the SuperLink's one port on the Control address; ValueError when the two clash."""
    fleet = fleet_address(args.bind, args.fleet_port)
    host, _, port = fleet.rpartition(":")
    if int(port) == args.control_port and (host == args.control_bind or wildcard(host) or wildcard(args.control_bind)):
        raise ValueError(
            f"the Fleet port ({port}, --bind/--fleet-port) and the Control port (--control-port {args.control_port}) "
            "must differ: with Flower 1.40+ the SuperLink serves every API on the Control port and the Fleet proxy listens on the Fleet port"
        )
    return ProxyPlan(
        listen=fleet,
        upstream=upstream_address(args.control_bind, args.control_port),
        certs=None if args.insecure else Path(args.certs).absolute(),
        max_body_mib=args.fleet_max_body_mib,
    )


def wildcard(host: str) -> bool:
    """Whether ``host`` is a wildcard address (every interface: 0.0.0.0, ::)."""
    return host.removeprefix("[").removesuffix("]") in ("0.0.0.0", "::")


NODE_LIMITS = (*NODE_LIMIT_KEYS, *NODE_LABEL_KEYS[1:])  # the node-config keys of core/sources.py and core/labels.py ("label-column": above)


def _positive(text: str) -> int:
    """A whole number > 0 (an argparse type)."""
    if not text.isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"must be a whole number > 0, got {text!r}")
    return int(text)


def supernode_command(args: argparse.Namespace) -> list[str]:
    """flower-supernode with this machine's own data (or its partition of one data set), body, and data and state folders."""
    if args.data:
        node_config = ""
        data = str(Path(args.data).expanduser().absolute())  # the ClientApp process may start elsewhere
    elif args.partition_id is not None and args.num_partitions is not None:
        node_config, data = f"partition-id={args.partition_id} num-partitions={args.num_partitions}", ""
    else:
        raise SystemExit(
            "error: give the node its own data (--data PATH, for runs with dataset='local'), "
            "or its share of one data set (--partition-id N --num-partitions M)"
        )
    pinned = ("label-column", getattr(args, "label_column", "") if data else "")  # the node's own pin (core/labels.py)
    for key, value in (("data", data), ("body", args.body), ("data-dir", args.data_dir), ("state-dir", args.state_dir), pinned):
        if value:
            if "'" in value or '"' in value:
                raise SystemExit(f"error: --{key} must not contain quotes: {value!r}")
            node_config += f"{' ' if node_config else ''}{key}='{value}'"
    for key in (*NODE_LIMITS, *NODE_PINS):  # the node's own limits and pins: whoever submits the run cannot change them
        value = getattr(args, key.replace("-", "_"), None)
        if value is not None:
            text = str(value).lower() if isinstance(value, bool) else f"'{value}'" if isinstance(value, str) else value
            node_config += f"{' ' if node_config else ''}{key}={text}"
    cmd = [
        "flower-supernode",
        "--superlink",
        args.superlink,
        "--host",
        "127.0.0.1",
        "--port",
        str(args.port),
        "--node-config",
        node_config,
        "--isolation",
        "subprocess",
    ]
    cmd += ["--insecure"] if args.insecure else ["--root-certificates", args.root_cert]
    if args.auth_key:
        cmd += ["--auth-supernode-private-key", args.auth_key]
    if args.max_retries is not None:
        cmd += ["--max-retries", str(args.max_retries)]
    if args.max_wait_time > 0:
        cmd += ["--max-wait-time", str(args.max_wait_time)]
    return cmd


def free_port(host: str = "127.0.0.1") -> int:
    """A port on ``host`` that nothing listens on now, as the system picks one (bind to port
    0): two SuperNodes started side by side get different ones, unlike Flower's fixed 9094."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


LISTEN_HINT = "give an address of this machine (0.0.0.0: every interface, 127.0.0.1: this machine only)"


def unresolved(host: str) -> str | None:
    """Why ``host`` (a name or an address, IPv6 bracketed or not) gives no address to listen on: a name that
    does not resolve; None when it resolves (an address always does)."""
    try:
        socket.getaddrinfo(host.removeprefix("[").removesuffix("]"), None)
    except socket.gaierror as exc:
        return f"the name does not resolve to an address ({exc.strerror}): {LISTEN_HINT}, or a host name that resolves to one"
    return None


def port_problem(host: str, port: int, in_use: str = "stop what holds it, or pick another port") -> str | None:
    """Why a server could not listen on ``host:port`` now, with what to do (in use: ``in_use``; a name that does not
    resolve, an address not on this machine); None if it could. Binds and closes a socket, as Flower will moments later."""
    host = host.removeprefix("[").removesuffix("]")
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Flower's servers: a closed port's TIME_WAIT is no clash
            s.bind((host, port))
    except socket.gaierror:
        return f"cannot listen on {host}:{port}: {unresolved(host) or 'the name does not resolve'}"
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return f"{host}:{port} is already in use (another SuperLink or SuperNode on this machine?): {in_use}"
        if exc.errno == errno.EADDRNOTAVAIL:
            return f"cannot listen on {host}:{port}: {host} is no address of this machine: {LISTEN_HINT}"
        if exc.errno == errno.EACCES:
            return f"cannot listen on {host}:{port}: permission denied (ports below 1024 need root): pick a port above 1023"
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    return None


def check_ports(args: argparse.Namespace) -> str | None:
    """What stands in the way of the ports the launched command will listen on, as one line
    (Flower would die with a traceback), or None. Picks a free ClientApp port for a
    SuperNode given no --port."""
    if args.cmd == "supernode":
        problem = port_problem("127.0.0.1", args.port, in_use="pick another --port, or leave it out for a free one")
        return f"--port {args.port}: {problem}" if problem else None
    host, _, port = fleet_address(args.bind, args.fleet_port).rpartition(":")
    for flag, where in (
        ("--bind/--fleet-port", (host, int(port))),
        ("--control-bind/--control-port", (args.control_bind, args.control_port)),
    ):
        problem = port_problem(*where)
        if problem:
            return f"{flag}: {problem}"
    return None


def os_error_line(exc: OSError, hint: str) -> str:
    """An OSError as one line without Python's "[Errno N]": the path, the system's reason, and what to do (``hint``);
    an OSError we raised with a message of our own (no errno) as that message."""
    if exc.strerror is None:
        return str(exc)
    where = f"{exc.filename}: " if exc.filename else ""
    reason = "a file stands where a folder is needed" if exc.errno == errno.ENOTDIR else exc.strerror
    return f"{where}{reason}: {hint}"


def key_not_found(public_key: str) -> str:
    """The error for `register` given a public key path that is no file: where `keys` puts
    keys, and the public keys found there."""
    name = Path(public_key).name
    found = sorted(str(p) for folder in {Path("keys"), Path(public_key).parent} if folder.is_dir() for p in folder.glob("*.pub"))
    hint = f" (found here: {', '.join(found[:5])})" if found else ""
    return (
        f"{public_key} is not a file: give the path of the public key `headway keys DIR --name NAME` wrote as DIR/NAME.pub, "
        f"e.g. headway register keys/{name if name.endswith('.pub') else 'NAME.pub'} CONNECTION{hint}"
    )


# Flower 1.39 keeps a SuperNode online until HEARTBEAT_PATIENCE (2) x its heartbeat interval
# (30 s, fixed in flower-supernode) after its last heartbeat, sent every ~20 s. One that signs off
# (headway stop, Ctrl-C) frees its key at once; one that crashed holds it for up to this long.
RELEASE_AFTER_S = 2 * 30
REJOIN_WAIT_S = RELEASE_AFTER_S + 5  # the launcher's default --rejoin-wait
REJOIN_STEP_S = 5.0  # seconds between tries
REFUSED = "Failed to activate SuperNode"  # what flower-supernode prints for [code: 2004]

# What flower-supernode prints when the SuperLink refuses it, and what to do (the launcher adds it)
SUPERNODE_HINTS = {
    REFUSED: (
        "the SuperLink refused this SuperNode's key ([code: 2004]){waited}: it is not registered there, or a SuperNode "
        "with the same key is still running. On the server machine: headway register {key}.pub CONNECTION "
        "(see flwr supernode ls CONNECTION), then start this node again"
    ),
    "All SuperNodes must be registered via the CLI": (
        "the SuperLink authenticates SuperNodes and this one has no key: `headway keys keys --name NAME` here, "
        "`headway register keys/NAME.pub CONNECTION` on the server machine, then start with --auth-key keys/NAME"
    ),
}


class Rejoin:
    """Whether to start flower-supernode again after the SuperLink refused its key: a node
    restarted right after a crash is refused until the SuperLink releases its key (up to
    RELEASE_AFTER_S after the last heartbeat), so it is retried every ``step`` s for up to
    ``wait`` s from the first refusal; anything else ends the launcher."""

    def __init__(self, wait: float, step: float = REJOIN_STEP_S, clock: Callable[[], float] = time.monotonic):
        self.wait, self.step, self.clock = wait, step, clock
        self.first: float | None = None  # when the first refusal came

    def __call__(self, rc: int, seen: list[str]) -> float | None:
        """Seconds to wait before the next try after an exit with ``rc`` having printed
        ``seen`` (texts of SUPERNODE_HINTS); None: no more tries. Says so on stderr."""
        if rc == 0 or REFUSED not in seen or self.wait <= 0:
            return None
        now = self.clock()
        if self.first is None:
            self.first = now
            print(
                f"[headway] the SuperLink refuses this SuperNode's key ([code: 2004]): either it is not registered, or the same key "
                f"is still online (a SuperNode that stopped without signing off, e.g. killed or crashed, is released "
                f"{RELEASE_AFTER_S} s after its last heartbeat); retrying every {self.step:g} s for up to {self.wait:g} s "
                "(--rejoin-wait)",
                file=sys.stderr,
                flush=True,
            )
            return min(self.step, self.wait)
        left = self.wait - (now - self.first)
        if left <= 0:
            return None
        print(f"[headway] still refused; next try in {min(self.step, left):g} s ({left:.0f} s left)", file=sys.stderr, flush=True)
        return min(self.step, left)


def check_files(args: argparse.Namespace) -> str | None:
    """What is missing for the TLS or authentication files named on the command line."""
    if args.cmd == "superlink" and not args.insecure:
        missing = [n for n in ("ca.crt", "server.crt", "server.key") if not (Path(args.certs) / n).is_file()]
        if missing:
            return (
                f"TLS is on but {args.certs} lacks {', '.join(missing)}: make them with `headway certs {args.certs} "
                "--host THIS_HOST`, or pass --insecure on a trusted network"
            )
    if args.cmd == "supernode":
        if not args.insecure and not Path(args.root_cert).is_file():
            return (
                f"--root-cert {args.root_cert} is not a file: copy ca.crt from the server machine, or pass --insecure on a trusted network"
            )
        if args.auth_key and not Path(args.auth_key).is_file():
            return f"--auth-key {args.auth_key} is not a file: make one with `headway keys DIR`"
        if args.auth_key and args.insecure:
            return "--auth-key needs TLS (the SuperLink only authenticates SuperNodes over TLS): pass --root-cert instead of --insecure"
    return None


def flower_schema_revisions() -> set[str]:
    """The database schema revisions the installed Flower knows (its alembic migrations, read as text)."""
    import flwr

    versions = Path(flwr.__file__).parent / "supercore" / "state" / "alembic" / "versions"
    found = (re.search(r"^revision\s*(?::\s*str\s*)?=\s*[\"']([0-9a-f]+)[\"']", f.read_text(), re.MULTILINE) for f in versions.glob("*.py"))
    return {m.group(1) for m in found if m}


def database_problem(path: str) -> str | None:
    """Why the SuperLink cannot open its --database ``path``: a schema revision the installed Flower does not
    know, written by a newer Flower (1.42 migrates a 1.39 database on start; there is no way back, and 1.39
    dies with a traceback on it). None when it can, or when there is no such database yet."""
    import sqlite3
    from contextlib import closing
    from importlib.metadata import version

    if not path or path == ":flwr-in-memory:" or not Path(path).is_file():
        return None
    try:
        with closing(sqlite3.connect(f"file:{Path(path).absolute()}?mode=ro", uri=True)) as db:
            row = db.execute("SELECT version_num FROM alembic_version").fetchone()
    except sqlite3.Error:
        return None  # not a versioned Flower database: Flower says what it makes of it
    known = flower_schema_revisions()
    if row is None or not known or row[0] in known:
        return None
    return (
        f"--database {path} was written by a newer Flower (schema revision {row[0]}, unknown to the installed Flower "
        f"{version('flwr')}): start this SuperLink with the Flower that wrote it (make flower FLOWER=1.42), or give "
        "another --database (a database upgraded by a newer Flower cannot go back)"
    )


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
CONNECTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def check_address(address: str) -> str:
    """``address`` if it is HOST:PORT with a host name, an IPv4 address or a bracketed IPv6
    address and a port 1..65535; else ValueError saying what is wrong (it goes into Flower's
    config, where a quote or a newline would add settings of its own)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"--address {address!r} is not HOST:PORT (e.g. 10.0.0.5:8000, lab.example.org:8000, [::1]:8000)")
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        raise ValueError(f"--address {address!r}: the port must be a number from 1 to 65535")
    problem = host_problem(host)
    if problem:
        raise ValueError(f"--address {address!r}: {problem} ([::1]:8000)")
    return address


def host_problem(host: str) -> str | None:
    """What is wrong with ``host`` as a host name, an IPv4 address or a bracketed IPv6
    address; None if nothing."""
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host} is not an IPv6 address"
        return None
    try:
        ipaddress.IPv4Address(host)
        return None
    except ValueError:
        pass
    labels = host.removesuffix(".").split(".")
    if len(host) > 253 or not host.isascii() or not all(_HOST_LABEL.fullmatch(label) for label in labels) or labels[-1].isdigit():
        return f"{host!r} is neither a host name, an IPv4 address nor a bracketed IPv6 address"
    return None


def fleet_address(bind: str, fleet_port: int | None) -> str:
    """The Fleet API's HOST:PORT from ``--bind`` (an address, or ADDRESS:PORT) and
    ``--fleet-port``; ValueError when the address is not one, the port is not 1..65535, or
    the two name different ports (``--bind 127.0.0.1:9092`` once became ``127.0.0.1:9092:9092``)."""
    host, port = bind, None
    if bind.startswith("["):  # [IPv6] or [IPv6]:PORT
        end = bind.find("]")
        host, rest = bind[: end + 1], bind[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            raise ValueError(f"--bind {bind!r} is not ADDRESS or ADDRESS:PORT (e.g. 0.0.0.0, 10.0.0.5:9092, [::]:9092)")
        port = rest[1:] if rest else None
    elif bind.count(":") > 1:  # a bare IPv6 address, or a port given twice (127.0.0.1:9092:9092)
        try:
            host = f"[{ipaddress.IPv6Address(bind)}]"
        except ValueError:
            raise ValueError(f"--bind {bind!r} is not ADDRESS or ADDRESS:PORT (e.g. 0.0.0.0, 10.0.0.5:9092, [::]:9092)") from None
    elif ":" in bind:
        host, port = bind.split(":")
    problem = host_problem(host)
    if problem:
        raise ValueError(f"--bind {bind!r}: {problem} (e.g. 0.0.0.0, 10.0.0.5:9092, [::]:9092)")
    if port is not None:
        if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
            raise ValueError(f"--bind {bind!r}: the port must be a number from 1 to 65535")
        if fleet_port is not None and fleet_port != int(port):
            raise ValueError(f"--bind {bind!r} names port {port} and --fleet-port {fleet_port}: give the port once")
        return f"{host}:{int(port)}"
    port_number = FLEET_PORT if fleet_port is None else fleet_port
    if not 1 <= port_number <= 65535:
        raise ValueError(f"--fleet-port {port_number}: the port must be a number from 1 to 65535")
    return f"{host}:{port_number}"


def toml_string(value: str) -> str:
    """``value`` as a TOML basic string: quotes, backslashes and control characters escaped,
    so that no value can end its line and start a setting of its own."""
    out = []
    for ch in value:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def write_connection(name: str, address: str, insecure: bool, root_cert: str | None, simulation: dict | None = None) -> Path:
    """Add ``[superlink.NAME]`` to $FLWR_HOME/config.toml so `flwr run . NAME` reaches it.

    With ``simulation`` (num-supernodes, client CPUs and GPU share) the connection is
    Flower's local simulation instead of a remote SuperLink. Refuses (ValueError) a name that
    is not a plain TOML key and an address that is not HOST:PORT; every string is escaped,
    and the file is written only if it reads back as exactly the intended connection.
    """
    if not CONNECTION_NAME.fullmatch(name):
        raise ValueError(f"connection name {name!r}: use letters, digits, '_' and '-' only (64 at most)")
    path = flwr_home() / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else "[superlink]\n"
    if f"[superlink.{name}]" in text:
        raise ValueError(
            f"{path} already defines [superlink.{name}]: pick another connection name, or remove that block from the file to redefine it"
        )
    if "[superlink]" not in tomllib.loads(text) and not text.startswith("[superlink]"):
        text = "[superlink]\n" + text
    if simulation is not None:
        simulation = {
            k: int(v) if float(v).is_integer() and k != "num-gpus" else v for k, v in simulation.items()
        }  # Flower wants whole CPUs
        if not all(math.isfinite(v) and v >= 0 for v in simulation.values()) or simulation["num-supernodes"] < 1:
            raise ValueError(f"simulation resources must be finite and >= 0, with at least one SuperNode: {simulation}")
        block = (
            f'\n[superlink.{name}]\naddress = ":local:"\noptions.num-supernodes = {simulation["num-supernodes"]}\n'
            f"options.backend.client-resources.num-cpus = {simulation['num-cpus']}\n"
            f"options.backend.client-resources.num-gpus = {simulation['num-gpus']}\n"
        )
        intended: dict = {
            "address": ":local:",
            "options": {
                "num-supernodes": simulation["num-supernodes"],
                "backend": {"client-resources": {"num-cpus": simulation["num-cpus"], "num-gpus": simulation["num-gpus"]}},
            },
        }
    else:
        intended = {"address": check_address(address)}
        block = f"\n[superlink.{name}]\naddress = {toml_string(address)}\n"
        if insecure:
            block += "insecure = true\n"
            intended["insecure"] = True
        elif root_cert:
            intended["root-certificates"] = str(Path(root_cert).resolve())
            block += f"root-certificates = {toml_string(intended['root-certificates'])}\n"
        else:
            raise ValueError("a remote connection needs insecure=True or a root certificate")
    if tomllib.loads(text + block)["superlink"].get(name) != intended:  # what Flower will read, checked before it is written
        raise ValueError(f"the connection {name!r} would not read back as written; not writing {path}")
    path.write_text(text + block)
    return path


COMMANDS = {  # subcommand: what it does (its --help and `headway --help` say it)
    "superlink": "start the SuperLink (server machine)",
    "supernode": "start a SuperNode (client machine)",
    "connect": "register a SuperLink for `flwr run . NAME`",
    "certs": "make a CA and a SuperLink certificate (TLS)",
    "keys": "make a SuperNode's key pair (SuperNode authentication)",
    "register": "allow a SuperNode's public key on a SuperLink (run where `flwr run` runs)",
    "split": "write a data set's partition as one data folder per node (deployment demo data)",
    "stop": "stop a launched SuperLink or SuperNode and all its processes",
}


class DefaultsHelp(argparse.ArgumentDefaultsHelpFormatter):
    """argparse's help with each option's default, "(default: X)", where there is one to
    show: not for switches that are off, options unset unless given, or help that says it."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        unset = action.default is None or action.default is False or action.default in ("", [], argparse.SUPPRESS)
        if unset or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def parser(prog: str = "headway") -> argparse.ArgumentParser:
    """The deployment subcommands, as `headway SUBCOMMAND` parses them."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def add(name: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=COMMANDS[name], description=COMMANDS[name], formatter_class=DefaultsHelp)

    link = add("superlink")
    tls = link.add_mutually_exclusive_group()
    tls.add_argument("--insecure", action="store_true", help="no TLS and no SuperNode authentication (trusted networks only)")
    tls.add_argument("--certs", default="certs", help="folder with ca.crt, server.crt, server.key (see `certs`)")
    link.add_argument("--no-supernode-auth", action="store_true", help="with TLS, accept any SuperNode (default: only registered keys)")
    link.add_argument(
        "--bind",
        default="0.0.0.0",
        help="address the Fleet API listens on, where SuperNodes connect (0.0.0.0: all interfaces); ADDRESS:PORT sets the port too",
    )
    link.add_argument(
        "--control-bind", default="127.0.0.1", help="address of the Control API, where `flwr run` submits code (keep it local)"
    )
    link.add_argument(
        "--fleet-port", type=int, default=None, help=f"port of the Fleet API, where SuperNodes connect (default: {FLEET_PORT})"
    )
    link.add_argument("--control-port", type=int, default=CONTROL_PORT, help="port of the Control API, where `flwr run` submits runs")
    link.add_argument("--database", default="", help="SQLite state file (default: in memory)")
    link.add_argument(
        "--fleet-max-body-mib",
        type=_positive,
        default=MAX_BODY_MIB,
        help="Flower 1.40+: the largest request the Fleet proxy passes, in MiB (a larger one gets 413; raise it for arrays above this size)",
    )
    link.add_argument(
        "--nginx", default="", help="Flower 1.40+: the nginx executable of the Fleet proxy (default: nginx on PATH or in /usr/sbin)"
    )
    node = add("supernode")
    node.add_argument("--superlink", required=True, help="HOST:PORT of the SuperLink's Fleet API")
    share = node.add_mutually_exclusive_group()
    share.add_argument(
        "--data", default="", help="this node's own data (a folder or file; runs with dataset='local'): it reads nothing else"
    )
    share.add_argument(
        "--partition-id", type=int, default=None, help="a demo: this node's share of one data set every node holds (with --num-partitions)"
    )
    node.add_argument(
        "--num-partitions",
        type=int,
        default=None,
        help="with --partition-id: how many shares the data set is cut into (default: none, required with --partition-id)",
    )
    node.add_argument("--body", default="", help="this client's body architecture (default: the run config's)")
    node.add_argument(
        "--data-dir", default="", help="this machine's folder of built-in data sets (default: $HEADWAY_DATA_DIR, else the user cache)"
    )
    node.add_argument("--state-dir", default="", help="keep the client's local state (bodies, heads) here, so it survives a restart")
    node.add_argument(
        "--label-column", default="", help="with --data: the only label column this node accepts (a run naming another is refused)"
    )
    limits = node.add_argument_group("this node's own limits (with --data; the run config cannot raise them: docs/your-data.md)")
    side = math.isqrt(DEFAULT_MAX_IMAGE_PIXELS)
    limits.add_argument(
        "--max-image-pixels",
        type=_positive,
        default=None,
        help=f"largest image (height x width) it decodes (default: {DEFAULT_MAX_IMAGE_PIXELS}, {side} x {side})",
    )
    limits.add_argument(
        "--max-array-bytes",
        type=_positive,
        default=None,
        help=f"largest array or table it loads, in bytes (default: {DEFAULT_MAX_ARRAY_BYTES}, {DEFAULT_MAX_ARRAY_BYTES // 2**20} MiB)",
    )
    limits.add_argument(
        "--follow-symlinks", action="store_true", default=None, help="follow links that lead out of its data folder (default: off)"
    )
    limits.add_argument(
        "--max-label-values",
        type=_positive,
        default=None,
        help=f"most distinct values a label column may have (default: {DEFAULT_MAX_LABEL_VALUES})",
    )
    limits.add_argument(
        "--max-numeric-label-values",
        type=_positive,
        default=None,
        help=f"most distinct numbers a numeric label column may have (default: {DEFAULT_MAX_NUMERIC_LABEL_VALUES})",
    )
    pins = node.add_argument_group("what this node requires of a run (the run config is the submitter's: docs/secure-aggregation.md)")
    pins.add_argument("--secure-aggregation", choices=("secagg+",), default=None, help="send training replies only under SecAgg+")
    pins.add_argument("--min-replies", type=_positive, default=None, help="hold the server to the SecAgg+ floor of this many clients")
    pins.add_argument("--secagg-shares", type=_positive, default=None, help="least SecAgg+ neighbourhood size it accepts")
    pins.add_argument("--secagg-threshold", type=float, default=None, help="least fraction of its share holders a threshold must exceed")
    node.add_argument(
        "--port",
        type=int,
        default=None,
        help="local port (on 127.0.0.1) of the SuperNode's ClientApp API (default: a free port the system picks, "
        "so several SuperNodes share a machine; a port in use is refused)",
    )
    node.add_argument("--auth-key", default="", help="this SuperNode's private key (see `keys`), when the SuperLink authenticates nodes")
    node.add_argument(
        "--max-retries",
        type=int,
        default=None,
        help="give up after this many failed tries to reach the SuperLink (default: no limit but --max-wait-time)",
    )
    node.add_argument("--max-wait-time", type=float, default=600.0, help="give up after this many seconds without the SuperLink (0: never)")
    node.add_argument(
        "--rejoin-wait",
        type=float,
        default=float(REJOIN_WAIT_S),
        help="when the SuperLink refuses the key ([code: 2004]), as it does for up to "
        f"{RELEASE_AFTER_S} s after a crashed node's last heartbeat, retry for this many seconds (0: exit at once)",
    )
    ntls = node.add_mutually_exclusive_group(required=True)
    ntls.add_argument("--insecure", action="store_true", help="no TLS (trusted networks only)")
    ntls.add_argument(
        "--root-cert", help="the CA certificate (ca.crt) that signed the SuperLink's certificate: copy it from the server machine"
    )
    for sp in (link, node):
        sp.add_argument("--pid-file", default="", help="write this launcher's PID here (for `stop`)")
        sp.add_argument("--grace", type=float, default=10.0, help="seconds Flower's processes get to exit on stop before SIGKILL")
        sp.add_argument("--dry-run", action="store_true", help="print Flower's command instead of running it")
    conn = add("connect")
    conn.add_argument("name", help="the connection's name, as in `flwr run . NAME` (letters, digits, '_', '-')")
    ctls = conn.add_mutually_exclusive_group(required=True)
    ctls.add_argument("--address", help="HOST:PORT of a SuperLink's Control API")
    ctls.add_argument("--simulation", action="store_true", help="Flower's local simulation (`flwr run . NAME`)")
    conn.add_argument("--insecure", action="store_true", help="no TLS to the SuperLink")
    conn.add_argument("--root-cert", help="CA certificate of the SuperLink")
    conn.add_argument("--num-supernodes", type=int, default=50, help="virtual clients (simulation); match num-clients")
    conn.add_argument("--client-cpus", type=float, default=1.0, help="CPUs per virtual client (simulation)")
    conn.add_argument("--client-gpus", type=float, default=0.0, help="GPU share per virtual client (simulation), e.g. 0.25")
    certs = add("certs")
    certs.add_argument("out", help="folder to write ca.crt, ca.key, server.crt, server.key")
    certs.add_argument(
        "--host", required=True, action="append", help="the SuperLink's host name or IP as clients dial it (repeat for several)"
    )
    keys = add("keys")
    keys.add_argument("out", help="folder to write NAME (private key) and NAME.pub")
    keys.add_argument("--name", default="supernode", help="file name of the key: OUT/NAME and OUT/NAME.pub")
    for sp in (certs, keys):
        sp.add_argument(
            "--overwrite", action="store_true", help="replace existing files of ours (default: refuse); symlinks and others' files never"
        )
    reg = add("register")
    reg.add_argument("public_key", help="path of the SuperNode's public key, as `keys` wrote it (e.g. keys/node0.pub)")
    reg.add_argument("connection", help="the connection name given to `connect`")
    spl = add("split")
    spl.add_argument(
        "source", help="a built-in data set (mnist, uci-adult, ...) or a user path (image folder, .csv, .parquet, .npz, HF folder)"
    )
    spl.add_argument("--out", required=True, help="folder to write node-0/, node-1/, ... into")
    spl.add_argument("--format", default="npz", choices=("npz", "images", "csv"), help="npz, images (PNG class folders) or csv")
    spl.add_argument("--partition", help=f"run-config 'partition' (default: {SCHEMA['partition'].default})")
    spl.add_argument(
        "--num-clients", type=int, help=f"run-config 'num-clients': number of node folders (default: {SCHEMA['num-clients'].default})"
    )
    spl.add_argument("--seed", type=int, help=f"run-config 'seed' (default: {SCHEMA['seed'].default})")
    spl.add_argument(
        "--train-fraction",
        type=float,
        help="run-config 'train-fraction': share of the training rows split (default, as in a run: all of a user path's, 0.05 of a built-in's)",
    )
    spl.add_argument("--overwrite", action="store_true", help="empty node-k folders that already hold files first (default: refuse)")
    spl.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="any other run-config key (repeat)")
    stop = add("stop")
    stop.add_argument("--pid-file", required=True, help="the file a launcher's --pid-file wrote")
    stop.add_argument("--timeout", type=float, default=45.0, help="seconds to wait (the launcher may take 2 × --grace + 15)")
    return p


def flower_path() -> str:
    """PATH for Flower's commands: the folder of the Python this launcher runs under first
    (a virtual environment's bin/, where pip put flwr, flower-superlink, flower-superexec,
    flower-supernode, flwr-serverapp, flwr-clientapp), then the caller's PATH. Flower's own
    commands start the others by bare name, so they need it too: ``.venv/bin/headway
    superlink`` must work without an activated environment.
    ``$HEADWAY_FLOWER_PATH`` (folders) comes before both: wrappers of Flower's commands,
    such as the tests' byte probe around flower-supernode."""
    here = str(Path(sys.executable).parent)
    first = [p for p in os.environ.get("HEADWAY_FLOWER_PATH", "").split(os.pathsep) if p]
    parts = [*first, here, *(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != here and p not in first)]
    return os.pathsep.join(parts)


def flower_env() -> dict[str, str]:
    """This process's environment with PATH from :func:`flower_path`."""
    return {**os.environ, "PATH": flower_path()}


def _flwr(args: list[str]) -> int:
    """Run the `flwr` command line next to this Python; its exit code."""
    exe = shutil.which("flwr", path=flower_path())
    if exe is None:
        print("error: flwr not found: install headway (pip install -e .) in this environment", file=sys.stderr)
        return 2
    return subprocess.run([exe, *args], env=flower_env()).returncode


def _split(args: argparse.Namespace) -> int:
    """The `split` subcommand: run-config items from --set and the flags, then headway.split."""
    from headway.core.console import show_headway_log
    from headway.split import report, run_config, split_nodes  # local import: loads numpy, torch and the data code

    show_headway_log()  # what reading a user source leaves out (an index column) is said at INFO
    settings = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            print(f"error: --set {item!r} is not KEY=VALUE", file=sys.stderr)
            return 2
        settings[key.strip()] = value.strip().strip("'\"")
    flags = {"partition": args.partition, "num-clients": args.num_clients, "seed": args.seed, "train-fraction": args.train_fraction}
    settings.update({k: v for k, v in flags.items() if v is not None})
    try:
        cfg = run_config(args.source, settings)
        folders, part, available = split_nodes(args.source, cfg, args.out, args.format, args.overwrite)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        writing = exc.filename is not None and Path(str(exc.filename)).is_relative_to(Path(args.out))
        hint = f"give --out a folder this user can create and write ({args.out} is not)" if writing else "check that it can be read"
        print(f"error: {os_error_line(exc, hint)}", file=sys.stderr)
        return 2
    print(
        f"wrote {len(folders)} node folders ({args.format}) to {Path(args.out)}: give each SuperNode its folder "
        f"(supernode --data {Path(args.out) / 'node-K'})"
    )
    print(report(part, cfg, available))
    return 0


def main(argv: list[str] | None = None, prog: str = "headway") -> int:
    """Run one deployment subcommand (``argv[0]``); its exit code: 0 done, 2 refused (one
    ``error:`` line on stderr), 1 `stop` timed out, else the supervised command's code
    (128 + the signal that stopped the launcher)."""
    args = parser(prog).parse_args(argv)
    if args.cmd == "certs":
        from headway.credentials import make_certs  # local imports: cryptography, for `certs` and `keys` only

        try:
            make_certs(Path(args.out), args.host, overwrite=args.overwrite)
        except OSError as exc:
            print(f"error: {os_error_line(exc, f'give a folder this user can create and write ({args.out} is not)')}", file=sys.stderr)
            return 2
        print(
            f"wrote ca.crt, server.crt, server.key to {args.out} (for {', '.join(args.host)}); copy ca.crt to every client machine, "
            "keep ca.key offline"
        )
        return 0
    if args.cmd == "keys":
        from headway.credentials import make_node_key

        try:
            private, public = make_node_key(Path(args.out), args.name, overwrite=args.overwrite)
        except OSError as exc:
            print(f"error: {os_error_line(exc, f'give a folder this user can create and write ({args.out} is not)')}", file=sys.stderr)
            return 2
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(
            f"wrote {private} (stays on this SuperNode: --auth-key {private}) and {public} "
            f"(register it: headway register {public} CONNECTION)"
        )
        return 0
    if args.cmd == "split":
        return _split(args)
    if args.cmd == "register":
        if not Path(args.public_key).is_file():
            print(f"error: {key_not_found(args.public_key)}", file=sys.stderr)
            return 2
        return _flwr(["supernode", "register", args.public_key, args.connection])
    if args.cmd == "stop":
        try:
            pid = int(Path(args.pid_file).read_text().strip())
        except OSError as exc:
            print(f"error: cannot read a PID from {os_error_line(exc, 'give the file a launcher wrote')}", file=sys.stderr)
            return 2
        except ValueError:
            print(f"error: {args.pid_file} holds no PID: give the file the launcher wrote with --pid-file", file=sys.stderr)
            return 2
        try:
            stopped = stop_pid(pid, args.timeout)
        except (ValueError, PermissionError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if stopped:
            print(f"stopped {pid}")
            return 0
        print(f"error: {pid} still runs after {args.timeout:.0f} s", file=sys.stderr)
        return 1
    if args.cmd == "connect":
        if args.address and not (args.insecure or args.root_cert):
            print("error: a remote connection needs --insecure or --root-cert", file=sys.stderr)
            return 2
        if args.root_cert and not args.insecure and not Path(args.root_cert).is_file():
            print(
                f"error: --root-cert {args.root_cert} is not a file: copy ca.crt from the SuperLink's machine and name it", file=sys.stderr
            )
            return 2
        sim = (
            {"num-supernodes": args.num_supernodes, "num-cpus": args.client_cpus, "num-gpus": args.client_gpus} if args.simulation else None
        )
        try:
            path = write_connection(args.name, args.address, args.insecure, args.root_cert, sim)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        print(
            f"added [superlink.{args.name}] to {path}; submit runs with: headway submit {args.name} (it exits with the run's status, "
            f"which `flwr run . {args.name} --stream` does not)"
        )
        return 0
    if args.cmd == "supernode" and args.label_column and not args.data:
        print(
            "error: --label-column pins the label column of the node's own data and needs --data PATH; "
            "a --partition-id node reads the run's data set: drop --label-column",
            file=sys.stderr,
        )
        return 2
    if args.cmd == "supernode" and args.port is None:
        args.port = free_port()
    transport = fleet_transport() if args.cmd == "superlink" else "grpc"
    try:
        cmd = superlink_command(args, transport) if args.cmd == "superlink" else supernode_command(args)
        proxy = fleet_proxy_plan(args) if transport == "http" else None
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    names = unresolved_binds(args) if args.cmd == "superlink" else []
    if args.dry_run:
        for problem in names:  # the command may be for another host, where the name resolves
            print(f"warning: {problem} (on this machine)", file=sys.stderr)
        print(" ".join(cmd))
        if proxy is not None:
            print(
                f"nginx (the Fleet proxy): {proxy.listen} -> {proxy.upstream}, POST /v1/fleet/* only{' (TLS both ways)' if proxy.certs else ''}"
            )
        return 0
    database = database_problem(args.database) if args.cmd == "superlink" else None
    refusal = names[0] if names else check_files(args) or database or check_ports(args)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    exe = shutil.which(cmd[0], path=flower_path())
    if exe is None:
        print(
            f"error: {cmd[0]} not found beside {sys.executable} nor on PATH: install headway (pip install -e .) in this environment",
            file=sys.stderr,
        )
        return 2
    if args.cmd == "superlink" and args.control_bind not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: the Control API listens on {args.control_bind}: whoever reaches port {args.control_port} can submit code "
            "that runs on this machine and every SuperNode" + (" (and TLS is off)" if args.insecure else ""),
            file=sys.stderr,
        )
    if args.cmd == "superlink" and proxy is not None:
        return _superlink_behind_proxy([exe, *cmd[1:]], proxy, args)
    if args.cmd == "superlink":
        return supervise([exe, *cmd[1:]], grace=args.grace, pid_file=args.pid_file, env=flower_env())
    return _supernode([exe, *cmd[1:]], args)


def _superlink_behind_proxy(cmd: list[str], proxy: ProxyPlan, args: argparse.Namespace) -> int:
    """Flower 1.40+: run flower-superlink on the Control address and, once its port answers,
    nginx on the Fleet address as its companion (see :mod:`headway.fleet_proxy`); one error line
    and 2 when nginx is missing, the certificate cannot serve the proxy, or nginx refuses its configuration."""
    nginx = find_nginx(args.nginx)
    if nginx is None:
        print(
            f"error: {'--nginx ' + args.nginx + ' is not an executable' if args.nginx else 'nginx not found'}: {NGINX_HINT}",
            file=sys.stderr,
        )
        return 2
    if proxy.certs is not None:
        from headway.credentials import names_host  # local import: cryptography

        if not names_host(proxy.certs / "server.crt", UPSTREAM_TLS_NAME):
            print(
                f"error: {proxy.certs / 'server.crt'} does not name {UPSTREAM_TLS_NAME}, the name the Fleet proxy checks on the "
                f"SuperLink's certificate: make certificates with `headway certs {args.certs} --host THIS_HOST` (it adds {UPSTREAM_TLS_NAME})",
                file=sys.stderr,
            )
            return 2
    workdir = Path(tempfile.mkdtemp(prefix="headway-fleet-proxy-"))
    try:
        write_config(proxy, workdir)
        test = subprocess.run([*nginx_command(nginx, workdir), "-t", "-q"], capture_output=True, text=True)
        if test.returncode != 0:
            lines = " / ".join(line.strip() for line in test.stderr.splitlines() if line.strip())
            print(f"error: nginx refuses the Fleet proxy's configuration: {lines}", file=sys.stderr)
            return 2
        print(
            f"[headway] Fleet proxy (nginx) on {proxy.listen}: only POST /v1/fleet/* reaches the SuperLink ({proxy.upstream})",
            file=sys.stderr,
            flush=True,
        )
        companion = Companion(nginx_command(nginx, workdir), ready=lambda: upstream_ready(proxy.upstream), name="the Fleet proxy (nginx)")
        return supervise(cmd, grace=args.grace, pid_file=args.pid_file, env=flower_env(), companion=companion)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _supernode(cmd: list[str], args: argparse.Namespace) -> int:
    """Run flower-supernode supervised; while the SuperLink refuses its key, within
    --rejoin-wait, start it again (see :class:`Rejoin`). The last refusal gets the hint."""
    waited = f" for {args.rejoin_wait:g} s (--rejoin-wait)" if args.rejoin_wait > 0 else ""
    hints = {text: hint.format(key=args.auth_key or "keys/NAME", waited=waited) for text, hint in SUPERNODE_HINTS.items()}
    print(f"[headway] SuperNode's ClientApp API on 127.0.0.1:{args.port}", file=sys.stderr, flush=True)
    return supervise(cmd, grace=args.grace, pid_file=args.pid_file, env=flower_env(), hints=hints, again=Rejoin(args.rejoin_wait))
