"""The files a secure deployment needs: a CA with a SuperLink certificate (TLS), and an
EC key pair per SuperNode in OpenSSH format (SuperNode authentication)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


def _private(path: Path, data: bytes) -> None:
    """Write a secret readable by its owner only (created 0600, never world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, 0o600)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_certs(out: Path, hosts: list[str] | str, days: int = 365) -> None:
    """A CA and a SuperLink certificate valid for every name or IP in ``hosts`` (and
    localhost): ca.crt goes to every client machine, server.key stays on the server."""
    hosts = [hosts] if isinstance(hosts, str) else list(hosts)
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)

    def key() -> rsa.RSAPrivateKey:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def pem(k: rsa.RSAPrivateKey) -> bytes:
        return k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption())

    ca_key = key()
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "headway CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    srv_key = key()
    names = [_san(h) for h in hosts] + [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    names = list(dict.fromkeys(names))
    srv = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
        .issuer_name(ca_name)
        .public_key(srv_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    _private(out / "ca.key", pem(ca_key))
    (out / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    _private(out / "server.key", pem(srv_key))
    (out / "server.crt").write_bytes(srv.public_bytes(serialization.Encoding.PEM))


def make_node_key(out: Path, name: str = "supernode") -> tuple[Path, Path]:
    """An EC (P-384) key pair for SuperNode authentication, in OpenSSH format as Flower
    reads it: ``NAME`` (private, stays on the client machine) and ``NAME.pub`` (register it
    with the SuperLink). Returns (private, public) paths; refuses to overwrite a key."""
    out.mkdir(parents=True, exist_ok=True)
    private, public = out / name, out / f"{name}.pub"
    for path in (private, public):
        if path.exists():
            raise FileExistsError(f"{path} exists; remove it or pick another --name (a key is never overwritten)")
    key = ec.generate_private_key(ec.SECP384R1())
    _private(private, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
    public.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + f" {name}\n".encode()
    )
    return private, public
