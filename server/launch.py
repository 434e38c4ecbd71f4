"""Start the processes of a real deployment: a SuperLink (server machine), SuperNodes
(client machines), the `flwr` connection to submit runs, and TLS certificates.

    python -m server.launch certs DIR --host SERVER_HOST        # CA + server cert/key
    python -m server.launch superlink [--certs DIR | --insecure]
    python -m server.launch supernode --superlink HOST:9092 --partition-id 0 --num-partitions 2 [--body mlp] [--root-cert DIR/ca.crt | --insecure]
    python -m server.launch connect NAME --address HOST:8000 [--root-cert DIR/ca.crt | --insecure]
    python -m server.launch connect NAME --simulation --num-supernodes 50 [--client-gpus 0.25]
    flwr run . NAME --stream --run-config "algorithm='fedavg' num-clients=2"

Each subcommand execs Flower's own command (flower-superlink, flower-supernode), so the
process that runs is Flower's, with the flags shown by --dry-run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import shutil
import sys
import tomllib
from pathlib import Path

FLEET_PORT = 9092  # SuperLink Fleet API (gRPC), where SuperNodes connect
CONTROL_PORT = 8000  # SuperLink Control API, where `flwr run` submits runs


def flwr_home() -> Path:
    return Path(os.environ.get("FLWR_HOME") or Path.home() / ".flwr")


def superlink_command(args: argparse.Namespace) -> list[str]:
    cmd = ["flower-superlink", "--fleet-api-address", f"{args.bind}:{args.fleet_port}", "--host", args.bind, "--port", str(args.control_port),
           "--disable-runtime-dependency-installation"]
    if args.insecure:
        cmd.append("--insecure")
    else:
        d = Path(args.certs)
        cmd += ["--ssl-ca-certfile", str(d / "ca.crt"), "--ssl-certfile", str(d / "server.crt"), "--ssl-keyfile", str(d / "server.key")]
    if args.database:
        cmd += ["--database", args.database]
    return cmd


def supernode_command(args: argparse.Namespace) -> list[str]:
    node_config = f"partition-id={args.partition_id} num-partitions={args.num_partitions}"
    if args.body:
        node_config += f" body='{args.body}'"
    if args.data_dir:
        node_config += f" data-dir='{args.data_dir}'"
    cmd = ["flower-supernode", "--superlink", args.superlink, "--host", "127.0.0.1", "--port", str(args.port), "--node-config", node_config]
    cmd += ["--insecure"] if args.insecure else ["--root-certificates", args.root_cert]
    return cmd


def write_connection(name: str, address: str, insecure: bool, root_cert: str | None, simulation: dict | None = None) -> Path:
    """Add ``[superlink.NAME]`` to $FLWR_HOME/config.toml so `flwr run . NAME` reaches it.

    With ``simulation`` (num-supernodes, client CPUs and GPU share) the connection is
    Flower's local simulation instead of a remote SuperLink.
    """
    path = flwr_home() / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else "[superlink]\n"
    if f"[superlink.{name}]" in text:
        raise SystemExit(f"{path} already defines [superlink.{name}]; pick another name or edit the file")
    if "[superlink]" not in tomllib.loads(text) and not text.startswith("[superlink]"):
        text = "[superlink]\n" + text
    if simulation is not None:
        simulation = {k: int(v) if float(v).is_integer() and k != "num-gpus" else v for k, v in simulation.items()}  # Flower wants whole CPUs
        block = (f'\n[superlink.{name}]\naddress = ":local:"\noptions.num-supernodes = {simulation["num-supernodes"]}\n'
                 f'options.backend.client-resources.num-cpus = {simulation["num-cpus"]}\n'
                 f'options.backend.client-resources.num-gpus = {simulation["num-gpus"]}\n')
    else:
        block = f'\n[superlink.{name}]\naddress = "{address}"\n'
        block += "insecure = true\n" if insecure else f'root-certificates = "{Path(root_cert).resolve()}"\n'
    path.write_text(text + block)
    return path


def make_certs(out: Path, host: str, days: int = 365) -> None:
    """A CA and a server certificate for ``host`` (name or IP), with the `cryptography` package."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.x509.oid import NameOID

    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def key():
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def pem(k):
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())

    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "headway CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now).not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
    srv_key = key()
    try:
        alt = [x509.IPAddress(ipaddress.ip_address(host))]
    except ValueError:
        alt = [x509.DNSName(host)]
    alt += [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    srv = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])).issuer_name(ca_name)
           .public_key(srv_key.public_key()).serial_number(x509.random_serial_number()).not_valid_before(now)
           .not_valid_after(now + dt.timedelta(days=days)).add_extension(x509.SubjectAlternativeName(alt), critical=False)
           .sign(ca_key, hashes.SHA256()))
    (out / "ca.key").write_bytes(pem(ca_key))
    (out / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (out / "server.key").write_bytes(pem(srv_key))
    (out / "server.crt").write_bytes(srv.public_bytes(serialization.Encoding.PEM))
    for name in ("ca.key", "server.key"):
        os.chmod(out / name, 0o600)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m server.launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    link = sub.add_parser("superlink", help="start the SuperLink (server machine)")
    tls = link.add_mutually_exclusive_group(required=True)
    tls.add_argument("--insecure", action="store_true", help="no TLS (trusted networks only)")
    tls.add_argument("--certs", help="folder with ca.crt, server.crt, server.key (see `certs`)")
    link.add_argument("--bind", default="0.0.0.0", help="address to listen on")
    link.add_argument("--fleet-port", type=int, default=FLEET_PORT)
    link.add_argument("--control-port", type=int, default=CONTROL_PORT)
    link.add_argument("--database", default="", help="state file (default: in memory)")
    node = sub.add_parser("supernode", help="start a SuperNode (client machine)")
    node.add_argument("--superlink", required=True, help="HOST:PORT of the SuperLink's Fleet API")
    node.add_argument("--partition-id", type=int, required=True)
    node.add_argument("--num-partitions", type=int, required=True)
    node.add_argument("--body", default="", help="this client's body architecture (overrides the run config)")
    node.add_argument("--data-dir", default="", help="this machine's data directory")
    node.add_argument("--port", type=int, default=9094, help="local port of the SuperNode's ClientApp API")
    ntls = node.add_mutually_exclusive_group(required=True)
    ntls.add_argument("--insecure", action="store_true")
    ntls.add_argument("--root-cert", help="the CA certificate (ca.crt) that signed the SuperLink's")
    conn = sub.add_parser("connect", help="register a SuperLink for `flwr run . NAME`")
    conn.add_argument("name")
    ctls = conn.add_mutually_exclusive_group(required=True)
    ctls.add_argument("--address", help="HOST:PORT of a SuperLink's Control API")
    ctls.add_argument("--simulation", action="store_true", help="Flower's local simulation (`flwr run . NAME`)")
    conn.add_argument("--insecure", action="store_true", help="no TLS to the SuperLink")
    conn.add_argument("--root-cert", help="CA certificate of the SuperLink")
    conn.add_argument("--num-supernodes", type=int, default=50, help="virtual clients (simulation); match num-clients")
    conn.add_argument("--client-cpus", type=float, default=1.0, help="CPUs per virtual client (simulation)")
    conn.add_argument("--client-gpus", type=float, default=0.0, help="GPU share per virtual client (simulation), e.g. 0.25")
    certs = sub.add_parser("certs", help="make a CA and a server certificate")
    certs.add_argument("out", help="folder to write ca.crt, server.crt, server.key")
    certs.add_argument("--host", required=True, help="the SuperLink's host name or IP as clients dial it")
    for sp in (link, node):
        sp.add_argument("--dry-run", action="store_true", help="print the command instead of running it")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.cmd == "certs":
        make_certs(Path(args.out), args.host)
        print(f"wrote ca.crt, server.crt, server.key to {args.out}; copy ca.crt to every client machine")
        return 0
    if args.cmd == "connect":
        if args.address and not (args.insecure or args.root_cert):
            print("error: a remote connection needs --insecure or --root-cert", file=sys.stderr)
            return 2
        sim = {"num-supernodes": args.num_supernodes, "num-cpus": args.client_cpus, "num-gpus": args.client_gpus} if args.simulation else None
        path = write_connection(args.name, args.address, args.insecure, args.root_cert, sim)
        print(f"added [superlink.{args.name}] to {path}; submit runs with: flwr run . {args.name} --stream")
        return 0
    cmd = superlink_command(args) if args.cmd == "superlink" else supernode_command(args)
    if args.dry_run:
        print(" ".join(cmd))
        return 0
    exe = shutil.which(cmd[0])
    if exe is None:
        print(f"error: {cmd[0]} not found on PATH: install headway (pip install -e .) in this environment", file=sys.stderr)
        return 2
    os.execv(exe, cmd)
    return 0  # not reached


if __name__ == "__main__":
    raise SystemExit(main())
