import os
import re
import shutil
import tomllib

import pytest

from headway.credentials import make_certs
from headway.deploy import main
from tests.conftest import ROOT


def fleet_listen(dry_run: str) -> str:
    """Where a `superlink --dry-run` says the Fleet API listens: Flower 1.39's --fleet-api-address, or
    on 1.40+ the Fleet proxy's line ("nginx (the Fleet proxy): ADDRESS -> ...")."""
    found = re.search(r"--fleet-api-address (\S+)|nginx \(the Fleet proxy\): (\S+) ->", dry_run)
    assert found, dry_run
    return found.group(1) or found.group(2)


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
    assert fleet_listen(line) == "0.0.0.0:9192" and f"--ssl-certfile {tmp_path}/server.crt" in line and "--insecure" not in line
    main(
        ["supernode", "--superlink", "srv:9092", "--partition-id", "3", "--num-partitions", "8", "--body", "mlp", "--insecure", "--dry-run"]
    )
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


@pytest.mark.slow
def test_supervisor_stops_the_whole_tree_even_processes_in_other_sessions(tmp_path):
    """SIGTERM to the launcher's supervisor ends Flower's command and everything it spawned,
    including a grandchild in a session of its own (what a PID or group kill misses)."""
    import signal
    import subprocess
    import sys
    import time

    from headway.processes import descendants, running

    ready, pid_file = tmp_path / "ready", tmp_path / "sup.pid"
    code = (
        f"from headway.processes import supervise; raise SystemExit(supervise([{sys.executable!r}, '-c', {TREE!r}, {str(ready)!r}], "
        f"grace=5, pid_file={str(pid_file)!r}))"
    )
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


@pytest.mark.slow
def test_stop_refuses_a_pid_that_is_not_a_headway_launcher(tmp_path, capsys):
    """A stale pid file naming some other process: `stop` says so and signals nothing."""
    import subprocess
    import sys

    from headway.processes import is_launcher

    assert is_launcher(["/venv/bin/python", "/venv/bin/headway", "superlink"]) and is_launcher(["python", "-m", "headway", "supernode"])
    assert not is_launcher(["python", "-m", "http.server"]) and not is_launcher(["/usr/bin/headway-viewer"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "stale.pid").write_text(f"{other.pid}\n")
        assert main(["stop", "--pid-file", str(tmp_path / "stale.pid"), "--timeout", "2"]) == 2
        assert "is not a headway launcher" in capsys.readouterr().err
        assert other.poll() is None  # not signalled
    finally:
        other.kill()
        other.wait(timeout=10)


def test_launcher_defaults_are_safe_and_missing_files_are_named(capsys, tmp_path):
    main(["superlink", "--dry-run"])
    line = capsys.readouterr().out
    assert (
        "--host 127.0.0.1" in line
        and "--enable-supernode-auth" in line
        and "--insecure" not in line
        and "--ssl-certfile certs/server.crt" in line
    )
    main(["superlink", "--certs", str(tmp_path), "--no-supernode-auth", "--control-bind", "0.0.0.0", "--dry-run"])
    line = capsys.readouterr().out
    assert "--enable-supernode-auth" not in line and "--host 0.0.0.0" in line
    assert main(["superlink", "--certs", str(tmp_path / "none")]) == 2
    assert "lacks ca.crt, server.crt, server.key" in capsys.readouterr().err
    assert (
        main(
            [
                "supernode",
                "--superlink",
                "h:9092",
                "--partition-id",
                "0",
                "--num-partitions",
                "2",
                "--insecure",
                "--auth-key",
                str(tmp_path),
            ]
        )
        == 2
    )
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
    assert isinstance(private, ec.EllipticCurvePrivateKey) and isinstance(public, ec.EllipticCurvePublicKey)
    assert private.public_key().public_numbers() == public.public_numbers()
    assert oct((tmp_path / "node0").stat().st_mode & 0o777) == "0o600"
    assert main(["keys", str(tmp_path), "--name", "node0"]) == 2


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.deployment
def test_superlink_starts_from_the_venvs_python_with_a_path_that_lacks_the_venv(tmp_path):
    """docs/deployment.md's `headway superlink --certs certs`, as `.venv/bin/python -m headway`, with a
    PATH that has no virtual environment on it (no activate): Flower's SuperLink starts its
    SuperExec by bare name, so the launcher must put its interpreter's folder on the PATH
    it hands Flower. Started for real, then stopped by PID (and its group, if anything is left)."""
    import signal
    import subprocess
    import sys
    import time

    from headway.processes import descendants, running
    from tests.cluster import Netns

    here = os.path.realpath(os.path.dirname(sys.executable))
    path = os.pathsep.join(
        p
        for p in os.environ.get("PATH", "/usr/bin:/bin").split(os.pathsep)
        if p and os.path.realpath(p) != here and not os.path.exists(os.path.join(p, "flower-superexec"))
    )
    assert shutil.which("flower-superexec", path=path) is None and shutil.which("flwr", path=path) is None
    assert main(["certs", str(tmp_path / "certs"), "--host", "127.0.0.1"]) == 0
    try:  # a namespace of its own: Flower's fixed internal ports (9091, 9093) cannot clash with another test's SuperLink
        netns, prefix = Netns(["server"]), None
        prefix = netns.prefix("server")
    except pytest.skip.Exception:
        netns, prefix = None, []
    pid_file, log = tmp_path / "superlink.pid", open(tmp_path / "superlink.log", "w")
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    env.update(PATH=path, FLWR_HOME=str(tmp_path / "flwr-home"), PYTHONPATH=str(ROOT))
    cmd = [
        sys.executable,
        "-m",
        "headway",
        "superlink",
        "--certs",
        str(tmp_path / "certs"),
        "--bind",
        "127.0.0.1",
        "--pid-file",
        str(pid_file),
        "--grace",
        "5",
    ]
    if netns is None:
        import socket

        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        cmd += ["--fleet-port", str(ports[0]), "--control-port", str(ports[1])]
    sup = subprocess.Popen([*prefix, *cmd], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    tree: list[int] = []
    try:
        superexec: list[int] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and sup.poll() is None and not superexec:
            tree = descendants(sup.pid)
            superexec = [p for p in tree if "flower-superexec" in _cmdline(p)]
            time.sleep(0.2)
        time.sleep(1.0)  # a SuperLink that failed at startup exits at once
        said = (tmp_path / "superlink.log").read_text()[-3000:]
        assert sup.poll() is None, f"the launcher exited with {sup.returncode}:\n{said}"
        assert superexec and all(running(p) for p in superexec), f"no flower-superexec started:\n{said}"
        tree = descendants(sup.pid)
        assert main(["stop", "--pid-file", str(pid_file), "--timeout", "30"]) == 0  # SIGTERM by PID, and wait
        assert sup.wait(timeout=10) == 128 + signal.SIGTERM
        time.sleep(0.5)
        assert [p for p in tree if running(p)] == []
    finally:
        if sup.poll() is None:
            os.kill(sup.pid, signal.SIGTERM)
            try:
                sup.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(sup.pid, signal.SIGKILL)  # whatever is left in the launcher's session
        except (ProcessLookupError, PermissionError):
            pass
        for pid in tree:
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        if sup.poll() is None:
            sup.wait(timeout=5)
        log.close()
        if netns is not None:
            netns.close()


def test_bind_takes_an_address_or_an_address_and_port_and_refuses_a_port_twice(capsys):
    """Issue 38 item 7: `--bind 127.0.0.1:9092` became `--fleet-api-address 127.0.0.1:9092:9092`."""
    for bind, extra, address in (
        ("127.0.0.1:9092", [], "127.0.0.1:9092"),
        ("127.0.0.1", ["--fleet-port", "9300"], "127.0.0.1:9300"),
        ("10.0.0.5:9400", ["--fleet-port", "9400"], "10.0.0.5:9400"),
        ("::", [], "[::]:9092"),
        ("[::1]:9300", [], "[::1]:9300"),
    ):
        assert main(["superlink", "--insecure", "--bind", bind, *extra, "--dry-run"]) == 0
        assert fleet_listen(capsys.readouterr().out) == address
    for bind, extra, said in (
        ("127.0.0.1:9092:9092", [], "is not ADDRESS or ADDRESS:PORT"),
        ("127.0.0.1:9092", ["--fleet-port", "9300"], "names port 9092 and --fleet-port 9300"),
        ("127.0.0.1:port", [], "the port must be a number"),
        ("no such host", [], "is neither a host name"),
    ):
        assert main(["superlink", "--insecure", "--bind", bind, *extra, "--dry-run"]) == 2
        captured = capsys.readouterr()
        assert captured.out == "" and said in captured.err and captured.err.count("\n") == 1, captured


def test_every_launcher_option_says_what_it_does_and_shows_its_default():
    """Issue 38 item 11: --fleet-port, --control-port, --grace, --num-partitions, --port and
    connect's name had no help or no default shown."""
    import argparse

    from headway.deploy import parser

    sub = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    for name, sp in sub.choices.items():
        text = " ".join(sp.format_help().split())
        for action in sp._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.dest} has no help"
            # False by identity: 0.0 == False, and a default of 0.0 (connect's --client-gpus) is one to show
            unset = action.default is None or action.default is False or action.default in ("", [], argparse.SUPPRESS)
            if not unset:
                assert f"(default: {action.default})" in text, f"{name} {action.option_strings} hides its default {action.default!r}"
            elif action.option_strings and not action.required and action.nargs != 0 and (name, action.dest) not in UNSET_MEANS_NOTHING:
                # an option that takes a value and is left unset: its help says what then (tester: split's --num-clients, --seed;
                # supernode's --num-partitions and node limits showed nothing)
                assert "default" in (action.help or ""), f"{name} {action.option_strings}: help names no default"
            if action.option_strings == ["--follow-symlinks"]:
                assert "(default: off)" in (action.help or ""), action.help
            assert not (action.help or "").endswith("'s"), f"{name} {action.option_strings}: help stops short: {action.help!r}"
    link = " ".join(sub.choices["superlink"].format_help().split())
    node = " ".join(sub.choices["supernode"].format_help().split())
    split = " ".join(sub.choices["split"].format_help().split())
    assert "(default: 9092)" in link and "(default: 8000)" in link and "(default: 10.0)" in link
    assert "default: a free port the system picks" in node
    assert "signed the SuperLink's certificate" in node and "(default: 67108864, 8192 x 8192)" in node and "(default: 100)" in node
    from headway.core.config import resolve

    defaults = resolve({})  # split's flags default to the run config's defaults: shown as values, not "the run config's"
    for flag, key in (("--partition PARTITION", "partition"), ("--num-clients NUM_CLIENTS", "num-clients"), ("--seed SEED", "seed")):
        assert f"(default: {defaults[key]})" in split.split(flag, 2)[2].split(" --")[0], (flag, split)


# options whose absence means "not given", nothing to default to (files, pins the node adds only when named)
UNSET_MEANS_NOTHING = {
    ("superlink", "pid_file"),
    ("supernode", "data"),
    ("supernode", "partition_id"),
    ("supernode", "state_dir"),
    ("supernode", "label_column"),
    ("supernode", "secure_aggregation"),
    ("supernode", "min_replies"),
    ("supernode", "secagg_shares"),
    ("supernode", "secagg_threshold"),
    ("supernode", "auth_key"),
    ("supernode", "root_cert"),
    ("supernode", "pid_file"),
    ("connect", "address"),
    ("connect", "root_cert"),
    ("split", "set"),
}


def test_a_bind_name_that_does_not_resolve_is_refused_with_what_to_do(capsys):
    """Tester: `--bind foo` said "Name or service not known: stop what holds it, or pick another port" (advice for a
    port in use), and `--dry-run --bind foo` printed a command Flower would die on, without a word. A dry run's
    command may be for another host (docker/compose.yml binds a name only its container resolves): it warns."""
    assert main(["superlink", "--insecure", "--bind", "no-such-host.invalid", "--fleet-port", "9301"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured
    assert captured.err.startswith("error: --bind no-such-host.invalid: the name does not resolve") and "0.0.0.0" in captured.err
    assert "stop what holds it" not in captured.err
    assert main(["superlink", "--insecure", "--bind", "no-such-host.invalid", "--fleet-port", "9301", "--dry-run"]) == 0
    captured = capsys.readouterr()
    assert (
        captured.err.startswith("warning: --bind no-such-host.invalid: the name does not resolve") and "(on this machine)" in captured.err
    )
    assert fleet_listen(captured.out) == "no-such-host.invalid:9301"
    from headway.deploy import port_problem

    said = port_problem("no-such-host.invalid", 9301) or ""
    assert "does not resolve" in said and "pick another port" not in said, said


def test_os_errors_say_what_was_wrong_and_what_to_do(tmp_path, capsys, data_dir):
    """Tester: a missing config file gave `error: [Errno 2] No such file or directory: 'nosuch.toml'`, and
    `split --out /etc/passwd/x` `error: [Errno 20] Not a directory: ...`."""
    import headway.simulation as simulation

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    argv = ["split", "mnist", "--num-clients", "2", "--train-fraction", "0.01", "--set", f"data-dir={data_dir}", "--out", str(a_file / "x")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {a_file / 'x' / 'node-0'}: a file stands where a folder is needed: give --out a folder this user can create "
        f"and write ({a_file / 'x'} is not)\n"
    )
    assert simulation.main([str(tmp_path / "nosuch.toml"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: config file {tmp_path / 'nosuch.toml'}: No such file or directory: give the path of a TOML file")
    assert "Errno" not in err and not (tmp_path / "out").exists()
    assert main(["certs", str(a_file / "certs"), "--host", "x"]) == 2
    assert "a file stands where a folder is needed" in (err := capsys.readouterr().err) and "Errno" not in err, err
    assert main(["stop", "--pid-file", str(tmp_path / "nosuch.pid")]) == 2
    assert "No such file or directory: give the file a launcher wrote" in (err := capsys.readouterr().err) and "Errno" not in err, err


def test_connect_recommends_headway_submit(tmp_path, monkeypatch, capsys):
    """`flwr run . NAME --stream` exits 0 whatever became of the run; headway submit exits with its status."""
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    assert main(["connect", "local-lab", "--address", "127.0.0.1:8000", "--insecure"]) == 0
    assert "submit runs with: headway submit local-lab " in capsys.readouterr().out


def test_supernode_ports_are_free_by_default_and_a_taken_port_is_one_line(tmp_path):
    """Issue 38 item 3: two SuperNodes on one machine both took 9094, and the second died with
    Flower's traceback. By default each gets a port of its own; a --port in use is refused
    before Flower starts."""
    import re
    import socket
    import subprocess
    import sys

    from tests.cluster import free_port

    node = ["supernode", "--insecure", "--superlink", f"127.0.0.1:{free_port()}", "--partition-id", "0", "--num-partitions", "2"]
    ports = set()
    with socket.socket() as held:  # an earlier SuperNode's port, or anything else listening
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        for _ in range(3):
            out = subprocess.run([sys.executable, "-m", "headway", *node, "--dry-run"], cwd=ROOT, capture_output=True, text=True)
            ports.add(int(re.findall(r"--port (\d+)", out.stdout)[0]))
        assert len(ports) == 3 and taken not in ports and 9094 not in ports, ports
        out = subprocess.run(
            [sys.executable, "-m", "headway", *node, "--port", str(taken), "--max-wait-time", "5"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.startswith(f"error: --port {taken}: 127.0.0.1:{taken} is already in use") and out.stderr.count("\n") == 1, out.stderr


def test_register_names_where_the_keys_are_when_the_file_is_not_there(tmp_path, monkeypatch, capsys):
    """Issue 38 item 7: `headway register node0.pub lab` failed where `keys` had written keys/node0.pub."""
    from headway.credentials import make_node_key

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    make_node_key(tmp_path / "keys", "node0")
    assert main(["register", "node0.pub", "lab"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: node0.pub is not a file") and "headway register keys/node0.pub CONNECTION" in err
    assert "found here: keys/node0.pub" in err and err.count("\n") == 1


def test_a_refused_supernode_gets_a_hint_naming_headway_register(tmp_path, capfd):
    """What flower-supernode prints for a key the SuperLink does not know ([code: 2004]) is
    followed by the launcher's line naming `headway register` and the key; Flower's exit code 1
    is kept. A command that failed otherwise, or was stopped, gets no hint."""
    import sys

    from headway.deploy import SUPERNODE_HINTS
    from headway.processes import supervise

    hints = {text: hint.format(key="keys/node7", waited="") for text, hint in SUPERNODE_HINTS.items()}
    flower = (
        "import sys; print('ERROR :   Exit Code: 305', file=sys.stderr); "
        "print('Failed to initialize the connection to the SuperLink.', file=sys.stderr); "
        "print('[code: 2004] Failed to activate SuperNode.', file=sys.stderr); sys.exit(1)"
    )
    assert supervise([sys.executable, "-c", flower], grace=2, hints=hints) == 1
    err = capfd.readouterr().err
    assert "[code: 2004] Failed to activate SuperNode." in err  # Flower's own lines still pass through
    assert err.rstrip().splitlines()[-1].startswith("[headway] the SuperLink refused this SuperNode's key")
    assert "headway register keys/node7.pub CONNECTION" in err
    assert supervise([sys.executable, "-c", "import sys; print('other trouble', file=sys.stderr); sys.exit(1)"], grace=2, hints=hints) == 1
    assert "[headway]" not in capfd.readouterr().err


REFUSE_TWICE = """
import sys
from pathlib import Path
count = Path(sys.argv[1])
n = int(count.read_text()) + 1 if count.exists() else 1
count.write_text(str(n))
if n <= int(sys.argv[2]):
    print("[code: 2004] Failed to activate SuperNode.", file=sys.stderr)
    sys.exit(1)
print("SuperNode ID: 7", file=sys.stderr)
"""


def test_rejoin_retries_only_a_refused_key_and_only_within_its_wait(capsys):
    """Issue 38: a SuperNode restarted right after a crash was refused ([code: 2004]) while the
    SuperLink still held its key online, and the launcher gave up at once. The decision: a
    refusal is retried every step until `wait` s after the first one; a clean exit, another
    failure, or --rejoin-wait 0 ends it."""
    from headway.deploy import REFUSED, Rejoin

    now = [100.0]
    rejoin = Rejoin(wait=12, step=5, clock=lambda: now[0])
    assert rejoin(1, ["All SuperNodes must be registered via the CLI"]) is None and rejoin(0, []) is None and rejoin(1, []) is None
    assert capsys.readouterr().err == ""
    delays = []
    while (delay := rejoin(1, [REFUSED])) is not None:
        delays.append(delay)
        now[0] += delay + 2.5  # each try takes Flower a while to start
    assert delays == [5, 4.5], delays  # the first refusal at 100, tries at 107.5 and 114.5: none after 112
    err = capsys.readouterr().err
    assert err.startswith("[headway] the SuperLink refuses this SuperNode's key ([code: 2004]): either it is not registered")
    assert "released 60 s after its last heartbeat); retrying every 5 s for up to 12 s (--rejoin-wait)" in err
    assert Rejoin(wait=0)(1, [REFUSED]) is None


def test_release_window_is_flowers():
    """RELEASE_AFTER_S, which --rejoin-wait's default covers, is what the installed Flower's
    SuperLink keeps a silent SuperNode online for: HEARTBEAT_PATIENCE x the interval the
    SuperNode announces."""
    from flwr.common.constant import HEARTBEAT_DEFAULT_INTERVAL, HEARTBEAT_PATIENCE

    from headway.deploy import REJOIN_WAIT_S, RELEASE_AFTER_S

    assert RELEASE_AFTER_S == HEARTBEAT_PATIENCE * HEARTBEAT_DEFAULT_INTERVAL and REJOIN_WAIT_S > RELEASE_AFTER_S


def test_supervisor_starts_a_refused_command_again_until_it_joins_or_the_wait_is_over(tmp_path, capfd):
    """The supervisor with a Rejoin: a command refused twice and then admitted runs three times
    and the launcher exits 0 with no register hint; one refused beyond the wait exits 1 and
    the register hint (saying how long it was tried) comes once, last."""
    import sys

    from headway.deploy import SUPERNODE_HINTS, Rejoin
    from headway.processes import supervise

    hints = {text: hint.format(key="keys/node7", waited=" for 1 s (--rejoin-wait)") for text, hint in SUPERNODE_HINTS.items()}
    count = tmp_path / "count"
    cmd = [sys.executable, "-c", REFUSE_TWICE, str(count)]
    assert supervise([*cmd, "2"], grace=2, hints=hints, again=Rejoin(wait=30, step=0.1)) == 0
    err = capfd.readouterr().err
    assert count.read_text() == "3" and err.count("Failed to activate SuperNode") == 2 and "SuperNode ID: 7" in err
    assert "retrying every 0.1 s" in err and "headway register" not in err
    count.unlink()
    assert supervise([*cmd, "1000"], grace=2, hints=hints, again=Rejoin(wait=1, step=0.2)) == 1
    err = capfd.readouterr().err
    assert int(count.read_text()) >= 2 and err.count("headway register keys/node7.pub") == 1  # retried, then gave up
    assert err.rstrip().splitlines()[-1].startswith("[headway] the SuperLink refused this SuperNode's key ([code: 2004]) for 1 s")


@pytest.mark.system
@pytest.mark.deployment
@pytest.mark.slow
def test_a_supernode_restarted_right_after_a_crash_rejoins(tmp_path):
    """Issue 38: a SuperNode killed hard and started again at once exited 1 with [code: 2004]
    (its key still online at the SuperLink for up to 60 s). A real SuperLink (TLS, node
    authentication) and a SuperNode with a registered key: stopped with `headway stop`, it
    signs off and a restart joins at once; killed with SIGKILL (the whole tree, as a crash),
    a restart is refused at first, retries, and joins as the same node."""
    import re
    import signal
    import time

    from headway.processes import descendants, running
    from tests.cluster import Cluster, Netns

    netns = Netns(["server"])  # Flower's fixed internal ports (9091, 9093) cannot clash with another test's
    try:
        with Cluster(tmp_path, str(tmp_path / "data"), netns=netns) as c:
            certs, keys = tmp_path / "certs", tmp_path / "keys"
            c.command(c.launcher("certs", str(certs), "--host", "127.0.0.1"))
            c.command(c.launcher("keys", str(keys), "--name", "node0"))
            c.launch("superlink", ["superlink", "--certs", str(certs), "--bind", "127.0.0.1"], host="server")
            c.wait_for_port("superlink", 8000, host="server")
            c.command(c.launcher("connect", "lab", "--address", "127.0.0.1:8000", "--root-cert", str(certs / "ca.crt")), host="server")
            c.command(c.launcher("register", str(keys / "node0.pub"), "lab"), host="server")
            node = ["supernode", "--superlink", "127.0.0.1:9092", "--root-cert", str(certs / "ca.crt"), "--auth-key", str(keys / "node0")]
            node += ["--partition-id", "0", "--num-partitions", "2", "--pid-file", str(tmp_path / "node.pid"), "--grace", "5"]

            def start(name: str):
                proc = c.launch(name, node, host="server")
                c.wait_for_log(name, "SuperNode ID:", timeout=120)
                return proc, re.findall(r"SuperNode ID: (\d+)", c.log(name).read_text())[0]

            first, node_id = start("node-a")
            c.command(c.launcher("stop", "--pid-file", str(tmp_path / "node.pid")), host="server")  # signs off: the key is free at once
            assert first.wait(timeout=30) == 128 + signal.SIGTERM
            c.wait_for_log("superlink", f"Deactivated node_id={node_id}", timeout=10)
            second, again = start("node-b")
            assert again == node_id and "refuses" not in c.log("node-b").read_text()
            time.sleep(3)  # past its first heartbeat: the SuperLink holds the key ~40-60 s from here
            tree = descendants(second.pid)
            for pid in [*tree, second.pid]:  # a crash: nothing signs off
                os.kill(pid, signal.SIGKILL)
            second.wait(timeout=10)
            for pid in tree:
                while running(pid):
                    time.sleep(0.1)
            assert c.log("superlink").read_text().count(f"Deactivated node_id={node_id}") == 1
            crashed = time.monotonic()
            third, again = start("node-c")
            said = c.log("node-c").read_text()
            assert again == node_id and third.poll() is None, said[-3000:]
            assert "[headway] the SuperLink refuses this SuperNode's key ([code: 2004])" in said and "headway register" not in said
            assert time.monotonic() - crashed < 90, said[-3000:]
    finally:
        netns.close()


def test_a_database_from_a_newer_flower_is_refused_with_what_to_do(tmp_path, capsys):
    """Flower 1.42 migrates a 1.39 SuperLink database on start; 1.39 then dies on it with an alembic
    traceback. The launcher names the problem first (exit 2); a revision this Flower knows passes."""
    import sqlite3

    from headway.deploy import database_problem, flower_schema_revisions

    def database(revision: str) -> str:
        path = tmp_path / f"{revision}.db"
        db = sqlite3.connect(path)
        db.execute("CREATE TABLE alembic_version (version_num VARCHAR(32) NOT NULL)")
        db.execute("INSERT INTO alembic_version VALUES (?)", (revision,))
        db.commit()
        db.close()
        return str(path)

    newer = database("0123456789ab")
    assert main(["superlink", "--insecure", "--bind", "127.0.0.1:1", "--database", newer]) == 2
    err = capsys.readouterr().err
    assert "written by a newer Flower (schema revision 0123456789ab" in err and "make flower FLOWER=" in err
    assert database_problem(database(sorted(flower_schema_revisions())[0])) is None
    assert database_problem(str(tmp_path / "new.db")) is None  # none yet: Flower creates it
