import os

import tomllib

from server.launch import main, make_certs
from tests.conftest import ROOT


def test_connect_writes_flower_connections(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    assert main(["connect", "sim", "--simulation", "--num-supernodes", "8", "--client-gpus", "0.25"]) == 0
    assert main(["connect", "lab", "--address", "10.1.2.3:8000", "--insecure"]) == 0
    assert main(["connect", "nossl", "--address", "10.1.2.3:8000"]) == 2  # neither TLS nor --insecure
    cfg = tomllib.loads((tmp_path / "config.toml").read_text())["superlink"]
    assert cfg["sim"]["address"] == ":local:" and cfg["sim"]["options"]["num-supernodes"] == 8
    assert cfg["sim"]["options"]["backend"]["client-resources"] == {"num-cpus": 1, "num-gpus": 0.25}
    assert cfg["lab"] == {"address": "10.1.2.3:8000", "insecure": True} and "nossl" not in cfg


def test_launch_commands_carry_ports_tls_and_node_config(capsys, tmp_path):
    main(["superlink", "--certs", str(tmp_path), "--fleet-port", "9192", "--dry-run"])
    line = capsys.readouterr().out
    assert "--fleet-api-address 0.0.0.0:9192" in line and f"--ssl-certfile {tmp_path}/server.crt" in line and "--insecure" not in line
    main(["supernode", "--superlink", "srv:9092", "--partition-id", "3", "--num-partitions", "8", "--body", "mlp", "--insecure", "--dry-run"])
    line = capsys.readouterr().out
    assert "--node-config partition-id=3 num-partitions=8 body='mlp'" in line and "--superlink srv:9092" in line


def test_certificates_chain_to_the_ca(tmp_path):
    from cryptography import x509

    make_certs(tmp_path, "10.0.0.5")
    ca = x509.load_pem_x509_certificate((tmp_path / "ca.crt").read_bytes())
    srv = x509.load_pem_x509_certificate((tmp_path / "server.crt").read_bytes())
    srv.verify_directly_issued_by(ca)
    names = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "10.0.0.5" in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]


TREE = """
import os, subprocess, sys, time
# a child in our group, and a grandchild that escapes into its own session (as Flower's
# SuperLink starts its ServerApp); both ignore nothing and just sleep
kid = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True); time.sleep(600)"])
open(sys.argv[1], "w").write("ready")
time.sleep(600)
"""


def test_supervisor_stops_the_whole_tree_even_processes_in_other_sessions(tmp_path):
    """SIGTERM to the launcher's supervisor ends Flower's command and everything it spawned,
    including a grandchild in a session of its own (what a PID or group kill misses)."""
    import signal
    import subprocess
    import sys
    import time

    from server.processes import descendants, running

    ready, pid_file = tmp_path / "ready", tmp_path / "sup.pid"
    code = (f"from server.processes import supervise; raise SystemExit(supervise([{sys.executable!r}, '-c', {TREE!r}, {str(ready)!r}], "
            f"grace=5, pid_file={str(pid_file)!r}))")
    sup = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not (ready.exists() and len(descendants(sup.pid)) >= 3):
            time.sleep(0.1)
        tree = descendants(sup.pid)
        assert len(tree) == 3, tree  # command, its child, the escaped grandchild
        assert int(pid_file.read_text()) == sup.pid
        assert main(["stop", "--pid-file", str(pid_file), "--timeout", "20"]) == 0  # SIGTERM, and wait
        assert sup.wait(timeout=5) == 128 + signal.SIGTERM and not pid_file.exists()
        time.sleep(0.5)
        assert [p for p in tree if running(p)] == []
    finally:
        if sup.poll() is None:
            os.killpg(sup.pid, signal.SIGKILL)


def test_launcher_defaults_are_safe_and_missing_files_are_named(capsys, tmp_path):
    main(["superlink", "--dry-run"])
    line = capsys.readouterr().out
    assert "--host 127.0.0.1" in line and "--enable-supernode-auth" in line and "--insecure" not in line and "--ssl-certfile certs/server.crt" in line
    main(["superlink", "--certs", str(tmp_path), "--no-supernode-auth", "--control-bind", "0.0.0.0", "--dry-run"])
    line = capsys.readouterr().out
    assert "--enable-supernode-auth" not in line and "--host 0.0.0.0" in line
    assert main(["superlink", "--certs", str(tmp_path / "none")]) == 2
    assert "lacks ca.crt, server.crt, server.key" in capsys.readouterr().err
    assert main(["supernode", "--superlink", "h:9092", "--partition-id", "0", "--num-partitions", "2", "--insecure", "--auth-key", str(tmp_path)]) == 2
    assert "is not a file" in capsys.readouterr().err


def test_node_keys_are_openssh_ec_keys_and_never_overwritten(tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import (
        load_ssh_private_key,
        load_ssh_public_key,
    )

    assert main(["keys", str(tmp_path), "--name", "node0"]) == 0
    private = load_ssh_private_key((tmp_path / "node0").read_bytes(), None)
    public = load_ssh_public_key((tmp_path / "node0.pub").read_bytes())
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.public_key().public_numbers() == public.public_numbers()
    assert oct((tmp_path / "node0").stat().st_mode & 0o777) == "0o600"
    assert main(["keys", str(tmp_path), "--name", "node0"]) == 2
