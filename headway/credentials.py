"""The files a secure deployment needs: a CA with a SuperLink certificate (TLS), and an
EC key pair per SuperNode in OpenSSH format (SuperNode authentication)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import re
import stat
import tempfile
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID


def _check_folder(out: Path) -> None:
    """Refuse a key folder that someone else controls: one owned by another user (root
    aside), or writable by everyone without the sticky bit, where others could swap files."""
    st = out.stat()
    if st.st_uid not in (os.geteuid(), 0):
        raise PermissionError(f"{out} belongs to another user (uid {st.st_uid}): write keys into a folder of your own")
    if st.st_mode & 0o002 and not st.st_mode & stat.S_ISVTX:
        raise PermissionError(f"{out} is writable by every user (mode {oct(st.st_mode & 0o777)}): chmod o-w it or use another folder")


def _obstacle(path: Path) -> tuple[str, bool] | None:
    """What stands at ``path``: None (nothing), else (why, fatal): an existing file of ours
    (not fatal: ``overwrite`` may replace it), or a symlink, a non-file or another user's
    file (fatal: never written to nor replaced)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link: keys are never written through one (remove it)", True
    if not stat.S_ISREG(st.st_mode):
        return f"{path} exists and is not a regular file (remove it)", True
    if st.st_uid != os.geteuid():
        return f"{path} exists and belongs to another user (uid {st.st_uid}): remove it, keys are never written into it", True
    return f"{path} exists", False


def _refuse_existing(paths: list[Path], overwrite: bool, advice: str) -> None:
    """Raise FileExistsError before anything is written if one of ``paths`` is in the way:
    any existing file without ``overwrite``; symlinks, non-files and other users' files always."""
    for path in paths:
        found = _obstacle(path)
        if found and (found[1] or not overwrite):
            raise FileExistsError(found[0] if found[1] else f"{found[0]}; {advice}")


def _write(path: Path, data: bytes, mode: int, overwrite: bool = False) -> None:
    """Create ``path`` with ``mode`` (0600 for secrets): exclusively and never through a
    symlink, or, with ``overwrite``, as a new file renamed over the old one (atomic; the old
    file's owner and links keep nothing of the new content)."""
    if not overwrite:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "wb") as fh:
            os.fchmod(fd, mode)  # exactly ``mode``, whatever the umask
            fh.write(data)
        return
    _refuse_existing([path], True, "")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # O_EXCL, 0600
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)  # replaces the name, never writes through what was there
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _private(path: Path, data: bytes, overwrite: bool = False) -> None:
    """Write a secret readable by its owner only (created 0600, never world-readable)."""
    _write(path, data, 0o600, overwrite)


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


CERT_FILES = ("ca.key", "ca.crt", "server.key", "server.crt")


def _folder(out: Path) -> None:
    """Create the key folder (0700) if missing, and refuse one that another user controls."""
    out.mkdir(mode=0o700, parents=True, exist_ok=True)
    _check_folder(out)


def make_certs(out: Path, hosts: list[str] | str, days: int = 365, overwrite: bool = False) -> None:
    """A CA and a SuperLink certificate valid for every name or IP in ``hosts`` (and
    localhost): ca.crt goes to every client machine, server.key stays on the server.
    Refuses (FileExistsError, before writing anything) a folder that already holds one of
    the files unless ``overwrite``; symlinks and other users' files are refused always."""
    hosts = [hosts] if isinstance(hosts, str) else list(hosts)
    _folder(out)
    _refuse_existing(
        [out / n for n in CERT_FILES],
        overwrite,
        "a second `headway certs` would replace the CA every node trusts: use another folder, or pass --overwrite "
        "(then copy the new ca.crt to every node)",
    )
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
    _private(out / "ca.key", pem(ca_key), overwrite)
    _write(out / "ca.crt", ca.public_bytes(serialization.Encoding.PEM), 0o644, overwrite)
    _private(out / "server.key", pem(srv_key), overwrite)
    _write(out / "server.crt", srv.public_bytes(serialization.Encoding.PEM), 0o644, overwrite)


KEY_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def make_node_key(out: Path, name: str = "supernode", overwrite: bool = False) -> tuple[Path, Path]:
    """An EC (P-384) key pair for SuperNode authentication, in OpenSSH format as Flower
    reads it: ``NAME`` (private, stays on the client machine) and ``NAME.pub`` (register it
    with the SuperLink). Returns (private, public) paths; refuses an existing key unless
    ``overwrite``, and symlinks or other users' files always."""
    if not KEY_NAME.fullmatch(name):
        raise ValueError(f"--name {name!r} is not a plain file name (letters, digits, '.', '_', '-'; 64 at most)")
    if name.lower().endswith(".pub"):  # its private key would be called NAME.pub, the name of a key one may hand out
        raise ValueError(
            f"--name {name!r} ends in .pub, the name a public key has: the private key is written to NAME, give NAME without .pub"
        )
    _folder(out)
    private, public = out / name, out / f"{name}.pub"
    _refuse_existing([private, public], overwrite, "remove it, pick another --name, or pass --overwrite")
    key = ec.generate_private_key(ec.SECP384R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    _private(private, pem, overwrite)
    ssh = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    _write(public, ssh + f" {name}\n".encode(), 0o644, overwrite)
    return private, public


def names_host(cert: Path, host: str) -> bool:
    """Whether the PEM certificate ``cert`` names ``host`` (a DNS name) among its subject alternative names."""
    try:
        sans = x509.load_pem_x509_certificate(cert.read_bytes()).extensions.get_extension_for_class(x509.SubjectAlternativeName)
    except (x509.ExtensionNotFound, ValueError, OSError):
        return False
    return host in sans.value.get_values_for_type(x509.DNSName)
