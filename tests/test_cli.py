"""The `headway` command: one entry point that lists every subcommand, hands each its own
arguments (its --help, its exit codes), and is installed as a console script."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from headway import cli
from tests.conftest import ROOT

SUBCOMMANDS = ("run", "superlink", "supernode", "connect", "certs", "keys", "register", "split", "stop", "submit", "generate", "bench")


def test_help_lists_every_subcommand(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [line.split()[0] for line in out.split("commands:\n", 1)[1].splitlines() if line.startswith("  ")]
    assert listed == list(SUBCOMMANDS)


def test_no_command_and_an_unknown_one_are_usage_errors(capsys):
    assert cli.main([]) == 2
    assert cli.main(["simulate"]) == 2
    err = capsys.readouterr().err
    assert "usage: headway" in err and "unknown command 'simulate'" in err


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_has_its_own_help(capsys, name):
    assert cli.main([name, "--help"]) == 0
    assert capsys.readouterr().out.startswith(f"usage: headway {name}")


def test_run_refuses_a_bad_config_key_with_one_error_line(capsys, tmp_path):
    assert cli.main(["run", "--out", str(tmp_path / "out"), "--set", "no-such-key=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "'no-such-key'" in err
    assert not (tmp_path / "out").exists()


def test_a_message_exit_keeps_its_code_and_message(capsys):
    """`raise SystemExit("error: ...")` in a subcommand exits 1 with the message, as the interpreter does."""
    assert cli.main(["supernode", "--superlink", "h:9092", "--insecure", "--dry-run"]) == 1
    assert capsys.readouterr().err.startswith("error: give the node its own data")


def test_bench_runs_a_benchmark_of_the_checkout_with_its_arguments(capsys):
    assert cli.main(["bench", "summarize", "--help"]) == 0  # a main() that reads sys.argv
    assert capsys.readouterr().out.startswith("usage: headway bench summarize")
    assert cli.main(["bench", "no_such_benchmark"]) == 2
    assert "no benchmark 'no_such_benchmark'" in capsys.readouterr().err


def test_bench_outside_a_source_checkout_fails_with_one_line(capsys, monkeypatch):
    monkeypatch.setattr(cli, "checkout", lambda: None)
    assert cli.main(["bench", "summarize"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "source checkout" in err


@pytest.mark.slow
def test_the_console_script_is_installed_and_keeps_exit_codes(tmp_path):
    """`pip install -e .` puts `headway` beside the venv's python; its exit code is the subcommand's."""
    script = Path(sys.executable).parent / "headway"
    assert script.is_file(), f"no {script}: run `pip install -e .` to install the console script"
    shown = subprocess.run([str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "superlink" in shown.stdout
    refused = subprocess.run(
        [str(script), "run", "--out", str(tmp_path / "out"), "--set", "no-such-key=1"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and refused.stderr.startswith("error: ")


@pytest.mark.slow
def test_python_m_simulation_is_still_the_run_command():
    done = subprocess.run([sys.executable, "-m", "headway.simulation", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("usage: python -m headway.simulation") and "--overwrite" in done.stdout
