"""What a run prints (issue 38, items 4, 8 and 11): headway's lines, not Flower's HTTP client's
request lines, its deprecation banner, Ray's FutureWarning or Flower's DEBUG lines (--verbose
brings those back); figures at the end of a run to 4 significant digits; `headway run --help`."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import warnings

import pytest
from flwr.supercore.logger import warn_deprecated_feature
from headway.core.console import figure, show_headway_log, significant
from headway.simulation.runner import RAY_GPU_TIP, quiet_engine

from headway import cli
from tests.conftest import ROOT

NOISE = ("httpx", "DEPRECATED FEATURE", "FutureWarning", "DEBUG flwr", "ServerApp finished running")


class Kept(logging.Handler):
    """The messages that reach a logger's handlers (after the logger's own filters)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_figures_at_the_end_of_a_run_have_four_significant_digits():
    summary = {"final_accuracy": 0.9722222222222222, "total_bytes": 744728, "wall_seconds": 16.21533554400048, "per": [0.123456]}
    assert significant(summary) == {"final_accuracy": 0.9722, "total_bytes": 744728, "wall_seconds": 16.22, "per": [0.1235]}
    assert figure(0.9722222222222222) == "0.9722" and figure(None) == "none"


def test_the_http_client_is_quiet_even_when_the_root_logger_is_at_info(capsys, monkeypatch):
    """Flower's runtime API client (httpx) logs a line per request at INFO; in a deployment those
    lines were uploaded by the next request (push-logs), 1,268 of a stream's 1,286 lines."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", logging.INFO)  # a basicConfig(level=INFO) somewhere in the process
    for name in ("httpx", "httpcore", "headway"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.NOTSET)
    show_headway_log()
    show_headway_log()  # twice in a process (a simulation's ServerApp, then another): one line per record still
    assert not logging.getLogger("httpx").isEnabledFor(logging.INFO)
    assert not logging.getLogger("httpcore").isEnabledFor(logging.INFO)
    assert logging.getLogger("httpx").isEnabledFor(logging.WARNING)
    logging.getLogger("headway").info("round 1  accuracy 0.5")
    err = capsys.readouterr().err
    assert err.count("INFO headway: round 1  accuracy 0.5") == 1, err


def test_the_deprecation_banner_and_the_ray_tip_are_hidden_and_nothing_else(monkeypatch):
    kept = Kept()
    flwr_log = logging.getLogger("flwr")
    flwr_log.addHandler(kept)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # what the run's filter lets through is recorded
            with quiet_engine(verbose=False):
                warn_deprecated_feature("The `run_simulation` function is deprecated and will be removed in a future version of Flower.")
                warn_deprecated_feature("The `start_client` function is deprecated.")  # another feature: kept
                flwr_log.warning("a client failed")
                warnings.warn(f"{RAY_GPU_TIP} env var if num_gpus=0", FutureWarning, stacklevel=1)
                warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)
        with quiet_engine(verbose=True):
            warn_deprecated_feature("The `run_simulation` function is deprecated.")
        warn_deprecated_feature("The `run_simulation` function is deprecated.")  # the filter is gone after the run
    finally:
        flwr_log.removeHandler(kept)
    banners = [m for m in kept.messages if "`run_simulation` function is deprecated" in m]
    assert len(banners) == 2, kept.messages  # the verbose one and the one after the run
    assert any("`start_client`" in m for m in kept.messages) and "a client failed" in kept.messages
    assert [str(w.message) for w in caught] == ["another FutureWarning"]


def test_run_help_says_what_the_command_does_and_every_option_has_help(capsys):
    assert cli.main(["run", "--help"]) == 0
    out = capsys.readouterr().out
    assert "This package is the one place" not in out and "Run one experiment" in out
    assert "--set KEY=VALUE" in out and "docs/results.md" in out and "summary.json" in out
    options = out.split("options:\n", 1)[1].split("\n\n", 1)[0]
    flags = re.findall(r"^  (--?\w[\w-]*)(?: \S+)?(.*)$", options, re.MULTILINE)
    assert {f for f, _ in flags} >= {"-h", "--out", "--set", "--overwrite", "--verbose"}
    assert all(text.strip() for _, text in flags), options  # each has its help on its own line


TINY = {
    "algorithm": "fedavg",
    "dataset": "mnist",
    "num-clients": 2,
    "num-server-rounds": 2,
    "train-fraction": 0.01,
    "partition": "iid",
    "local-epochs": 1,
    "seed": 0,
}


def headway_run(tmp_path, data_dir: str, name: str, *extra: str) -> subprocess.CompletedProcess:
    sets = [a for k, v in {**TINY, "data-dir": data_dir}.items() for a in ("--set", f"{k}={v}")]
    cmd = [sys.executable, "-m", "headway", "run", "--out", str(tmp_path / name), *sets, *extra]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.system  # whole real runs: make test-system keeps make test under 15 minutes
@pytest.mark.integration
@pytest.mark.slow  # two real simulations, ~25 s each on 2 cores
def test_a_default_run_prints_headways_lines_and_verbose_brings_flowers_back(tmp_path, data_dir):
    done = headway_run(tmp_path, data_dir, "default")
    printed = done.stdout + done.stderr
    for n in (1, 2):
        assert re.search(rf"^INFO headway: round {n}\b.*accuracy", done.stderr, re.MULTILINE), done.stderr
    assert re.search(r"^INFO headway: final accuracy \d\.\d{4}, best \d\.\d{4}, ", done.stderr, re.MULTILINE), done.stderr
    assert [noise for noise in NOISE if noise in printed] == [], done.stderr
    shown = json.loads(done.stdout)  # the summary at the end, figures to 4 significant digits; the file keeps them whole
    whole = json.loads((tmp_path / "default" / "summary.json").read_text())
    assert shown["status"] == "complete" and shown["final_accuracy"] == float(f"{whole['final_accuracy']:.4g}")
    assert all(len(re.sub(r"[^0-9]", "", f"{v:g}").lstrip("0")) <= 4 for v in shown.values() if isinstance(v, float))
    assert isinstance(whole["wall_seconds"], float) and whole["wall_seconds"] != shown["wall_seconds"]  # more digits in the file

    verbose = headway_run(tmp_path, data_dir, "verbose", "--verbose", "--set", "num-server-rounds=1")
    assert re.search(r"DEBUG .*ServerApp finished running", verbose.stderr) and "DEPRECATED FEATURE" in verbose.stderr
    assert "INFO headway: round 1" in verbose.stderr


def comment_minutes(makefile: str, target: str) -> str:
    """The 'N–M minutes' of the comment block just above ``target:`` in the Makefile."""
    block = makefile[: makefile.index(f"\n{target}: ")].rsplit("\n\n", 1)[-1]
    found = re.findall(r"(\d+–\d+) minutes", block)
    assert found, f"no time in the comment above `{target}:`"
    return found[-1]


def test_the_makefile_and_the_readme_give_the_same_test_times():
    makefile, readme = (ROOT / "Makefile").read_text(), (ROOT / "README.md").read_text()
    for target in ("test", "test-system"):
        line = next(x for x in readme.splitlines() if x.startswith(f"make {target} "))
        assert re.findall(r"(\d+–\d+) minutes", line) == [comment_minutes(makefile, target)], (target, line)
