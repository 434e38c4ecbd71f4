"""Issue 37 item 6: the key tooling (`headway certs`, `headway keys`) and `headway connect`
under file-system and input attacks, each done for real in a temporary folder: a second run,
a pre-planted key owned by another user, symlinks at key paths, a planted hard link, and
quotes and newlines that would add settings to Flower's config."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tomllib
from pathlib import Path

import pytest

from headway.deploy import check_address, main, toml_string
from tests.conftest import ROOT

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="planting a file owned by another user needs root")
OTHER_UID = 65534  # nobody


def _certs(out: Path, *extra: str) -> int:
    return main(["certs", str(out), "--host", "superlink", *extra])


def test_certs_twice_into_one_folder_keeps_the_ca_unless_told(tmp_path, capsys):
    out = tmp_path / "certs"
    assert _certs(out) == 0
    first = {n: (out / n).read_bytes() for n in ("ca.key", "ca.crt", "server.key", "server.crt")}
    assert _certs(out) == 2  # the second run: refused, nothing replaced
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "ca.key exists" in err and "--overwrite" in err
    assert {n: (out / n).read_bytes() for n in first} == first
    assert _certs(out, "--overwrite") == 0  # asked for: a new CA, still private
    assert (out / "ca.key").read_bytes() != first["ca.key"] and (out / "ca.crt").read_bytes() != first["ca.crt"]
    for name, mode in (("ca.key", 0o600), ("server.key", 0o600), ("ca.crt", 0o644), ("server.crt", 0o644)):
        assert stat.S_IMODE((out / name).stat().st_mode) == mode, name
    assert sorted(p.name for p in out.iterdir()) == sorted(first)  # no temporary file left behind


def test_keys_are_created_0600_whatever_the_umask(tmp_path):
    old = os.umask(0)
    try:
        assert _certs(tmp_path / "certs") == 0
        assert main(["keys", str(tmp_path / "keys"), "--name", "node0"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "certs" / "ca.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "keys" / "node0").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "certs").stat().st_mode) == 0o700  # a folder we create is ours alone


@pytest.mark.parametrize("target_name", ["ca.key", "server.key", "ca.crt"])
def test_a_symlink_at_a_key_path_is_never_followed(tmp_path, capsys, target_name):
    out, elsewhere = tmp_path / "certs", tmp_path / "elsewhere"
    out.mkdir(mode=0o700)
    elsewhere.write_bytes(b"the attacker's file\n")
    (out / target_name).symlink_to(elsewhere)
    for extra in ((), ("--overwrite",)):
        assert _certs(out, *extra) == 2
        assert "symbolic link" in capsys.readouterr().err
        assert elsewhere.read_bytes() == b"the attacker's file\n"
        assert (out / target_name).is_symlink()
    assert not (out / "ca.key").exists() or target_name == "ca.key"  # refused before anything was written
    dangling = tmp_path / "dangling"
    dangling.mkdir(mode=0o700)
    (dangling / "node0").symlink_to(tmp_path / "created-by-us")  # a dangling link: O_CREAT would make its target
    assert main(["keys", str(dangling), "--name", "node0"]) == 2
    assert not (tmp_path / "created-by-us").exists()


@ROOT_ONLY
def test_a_planted_key_of_another_user_is_refused_even_with_overwrite(tmp_path, capsys):
    out = tmp_path / "certs"
    out.mkdir(mode=0o755)
    planted = out / "ca.key"
    planted.write_bytes(b"")
    os.chmod(planted, 0o666)
    os.chown(planted, OTHER_UID, OTHER_UID)  # another user made it and can read what lands in it
    for extra in ((), ("--overwrite",)):
        assert _certs(out, *extra) == 2
        assert "belongs to another user" in capsys.readouterr().err
        assert planted.read_bytes() == b"" and planted.stat().st_uid == OTHER_UID
    folder = tmp_path / "theirs"
    folder.mkdir()
    os.chown(folder, OTHER_UID, OTHER_UID)  # a folder they own: they could swap our files later
    assert main(["keys", str(folder), "--name", "node0"]) == 2
    assert "belongs to another user" in capsys.readouterr().err and not (folder / "node0").exists()


def test_a_world_writable_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "open"
    out.mkdir()
    os.chmod(out, 0o777)
    assert main(["keys", str(out), "--name", "node0"]) == 2
    assert "writable by every user" in capsys.readouterr().err and not list(out.iterdir())


def test_overwrite_replaces_the_file_and_a_planted_hard_link_learns_nothing(tmp_path):
    out = tmp_path / "keys"
    assert main(["keys", str(out), "--name", "node0"]) == 0
    spy = tmp_path / "spy"
    os.link(out / "node0", spy)  # a second name for the key's inode, kept by someone who could read it
    os.chmod(spy, 0o644)
    old = spy.read_bytes()
    assert main(["keys", str(out), "--name", "node0"]) == 2
    assert main(["keys", str(out), "--name", "node0", "--overwrite"]) == 0
    new = (out / "node0").read_bytes()
    assert new != old and spy.read_bytes() == old  # written to a new file, not through the old inode
    assert stat.S_IMODE((out / "node0").stat().st_mode) == 0o600


@pytest.mark.parametrize("name", ["../escaped", "a/b", "", ".hidden", "x" * 65, "node\n0"])
def test_key_names_that_are_not_plain_file_names_are_refused(tmp_path, capsys, name):
    assert main(["keys", str(tmp_path / "keys"), "--name", name]) == 2
    assert "not a plain file name" in capsys.readouterr().err
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "escaped.pub").exists()


INJECTION = '10.0.0.5:8000"\ninsecure = true\nx = "'


def _connections(home: Path) -> dict:
    path = home / "config.toml"
    return tomllib.loads(path.read_text())["superlink"] if path.exists() else {}


def test_connect_refuses_an_address_that_injects_insecure(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    ca = tmp_path / "ca.crt"
    ca.write_text("-")
    assert main(["connect", "lab", "--address", INJECTION, "--root-cert", str(ca)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: --address")
    assert "lab" not in _connections(tmp_path)
    assert main(["connect", "lab]\ninsecure = true\n[x", "--address", "10.0.0.5:8000", "--root-cert", str(ca)]) == 2
    assert "connection name" in capsys.readouterr().err and not (tmp_path / "config.toml").exists()


def test_connect_escapes_a_root_certificate_path_with_quotes_and_newlines(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "home"))
    folder = tmp_path / 'x"\ninsecure = true\n#'
    folder.mkdir()
    ca = folder / "ca.crt"
    ca.write_text("-")
    assert main(["connect", "lab", "--address", "lab.example.org:8000", "--root-cert", str(ca)]) == 0
    assert _connections(tmp_path / "home")["lab"] == {"address": "lab.example.org:8000", "root-certificates": str(ca.resolve())}


@pytest.mark.parametrize("address", ["10.0.0.5:8000", "localhost:1", "lab.example.org:65535", "[::1]:8000", "[fe80::1]:9093", "srv-1.:80"])
def test_valid_addresses_pass(address):
    assert check_address(address) == address


@pytest.mark.parametrize(
    "address",
    [
        INJECTION,
        "10.0.0.5",
        "10.0.0.5:0",
        "10.0.0.5:65536",
        "10.0.0.5:+80",
        "10.0.0.5: 80",
        "::1:8000",
        "[::1]",
        "[not-v6]:80",
        "300.1.1.1:80",
        "-lab:80",
        "lab_1:80",
        "lab example:80",
        ":8000",
        "l\u00e4b:80",
        "a" * 64 + ":80",
        "lab:8000\n",
    ],
)
def test_bad_addresses_are_refused(address):
    with pytest.raises(ValueError, match="--address"):
        check_address(address)


def test_toml_strings_cannot_end_their_line():
    for value in ['a"b', "a\\b", "a\nb = 1", "\x00\x1f\x7f", "\u00e4\U0001f600"]:
        assert tomllib.loads(f"k = {toml_string(value)}\n") == {"k": value}


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and the repository")
def test_what_the_docs_commands_write_is_git_ignored():
    """`headway certs certs`, `headway keys keys --name node0`, `headway split ... --out nodes/`
    (and the docker/ variants) run from the repository root leave no untracked secrets or data."""
    paths = ["certs/ca.key", "certs/server.key", "keys/node0", "keys/node0.pub", "nodes/node-0/data.npz", "superlink.pid"]
    paths += ["docker/certs/server.key", "docker/nodes/node-1/data.npz", "elsewhere/ca.key"]
    out = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT, capture_output=True, text=True)
    assert sorted(out.stdout.split()) == sorted(paths)


# --- the outside tester's second pass (issue 37 follow-up): key names, connect, supernode, split --------------


def test_a_key_named_like_a_public_key_is_refused(tmp_path, capsys):
    """`headway keys --name node1.pub` wrote the PRIVATE key to node1.pub (the name one hands out)."""
    out = tmp_path / "keys"
    assert main(["keys", str(out), "--name", "node1.pub"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --name 'node1.pub' ends in .pub") and err.count("\n") == 1, err
    assert not out.exists() or not any(out.iterdir())
    assert main(["keys", str(out), "--name", "node1"]) == 0 and sorted(p.name for p in out.iterdir()) == ["node1", "node1.pub"]


def test_connect_refuses_a_root_certificate_that_does_not_exist(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    assert main(["connect", "lab", "--address", "10.0.0.5:8000", "--root-cert", str(tmp_path / "missing.crt")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --root-cert ") and "is not a file" in err and err.count("\n") == 1, err
    assert "lab" not in _connections(tmp_path)


def test_connect_to_a_name_already_defined_is_one_error_line_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path))
    assert main(["connect", "lab", "--address", "10.0.0.5:8000", "--insecure"]) == 0
    before = (tmp_path / "config.toml").read_text()
    capsys.readouterr()
    assert main(["connect", "lab", "--address", "10.0.0.6:8000", "--insecure"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "already defines [superlink.lab]" in err and "pick another connection name" in err, err
    assert err.count("\n") == 1 and (tmp_path / "config.toml").read_text() == before


def test_supernode_refuses_a_label_column_pin_it_would_drop(capsys):
    """With --partition-id the node reads the run's data set: the pin was silently left out of its node config."""
    argv = ["supernode", "--superlink", "h:9092", "--insecure", "--partition-id", "0", "--num-partitions", "2", "--dry-run"]
    assert main([*argv, "--label-column", "income"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --label-column") and "--data" in err and err.count("\n") == 1, err
    assert main(argv) == 0 and "label-column" not in capsys.readouterr().out


def test_split_names_node_folders_without_a_double_slash(tmp_path, capsys):
    rows = [[str(i), f"c{i % 3}", "a" if i % 2 else "b"] for i in range(40)]
    src = tmp_path / "t.csv"
    src.write_text("x,color,label\n" + "".join(",".join(r) + "\n" for r in rows))
    out = f"{tmp_path / 'nodes'}/"
    assert main(["split", str(src), "--num-clients", "2", "--format", "csv", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "//" not in printed and f"--data {tmp_path / 'nodes' / 'node-K'})" in printed, printed
    assert (tmp_path / "nodes" / "node-1" / "train.csv").is_file()
