"""What a run prints when it goes wrong or is slow to start (issue 38, outside testers): an
expected failure ends with headway's one-line reason, not a traceback (a simulation's
`headway run`, and a deployed ServerApp's stream, where Flower logs the exception); each
node's missing description once; one wait for clients and a node-local header that says how
many joined; no time left from round 1; accuracies to 4 decimals."""

from __future__ import annotations

import csv
import logging
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict
from flwr.common.logger import log as flower_log
from headway.core.console import plural, score
from headway.core.settings import Settings
from headway.server.app import build_server_app, header
from headway.strategies.discovery import DiscoveryFailed
from headway.strategies.engine import RoundFailed

from tests.conftest import ROOT
from tests.test_user_data import LocalGrid, local_cfg, profile_json, write_npz


class Kept(logging.Handler):
    """The records that reach a logger's handlers (after the logger's own filters)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def flower_ends_the_serverapp(exc: BaseException) -> None:
    """What Flower 1.39's flwr-serverapp logs when the ServerApp raised ``exc``
    (flwr/superlink/runtime/run_serverapp.py, then flwr_exit's message), and after a run that
    succeeded (flwr_exit(0) logs an empty INFO line)."""
    flower_log(logging.ERROR, "%s raised an exception", "ServerApp", exc_info=exc)
    flower_log(logging.ERROR, "Exit Code: 201\n\nAn unhandled exception occurred in the ServerApp.\n\nFor more information, visit: <x>")


class SilentGrid(LocalGrid):
    """Nodes that never answer."""

    def send_and_receive(self, messages, *, timeout=None):
        self.sent.extend(messages)
        return []


def deployed_serverapp(grid, run_config: dict, tmp_path) -> None:
    """The ServerApp a deployment runs (strict: Flower's status follows summary.json), called as Flower calls it."""
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    build_server_app({"results-dir": str(tmp_path)}, tmp_path / "out", strict=True)(grid=grid, context=context)


def test_a_deployed_serverapps_expected_failure_ends_with_one_line_and_still_fails(tmp_path, caplog, task_identity):
    """round-timeout=1 and nodes that never describe their data: the run fails (the exception still
    reaches Flower, which sets finished:failed from it), headway says why in one line, each node's
    missing reply is said once, and Flower's traceback and 'Exit Code: 201' stay out of the stream."""
    flwr_log = logging.getLogger("flwr")
    kept = Kept()
    flwr_log.addHandler(kept)
    before = list(flwr_log.filters)
    try:
        with caplog.at_level(logging.INFO, logger="headway"), pytest.raises(DiscoveryFailed) as failed:
            deployed_serverapp(SilentGrid(["{}", "{}"]), {"dataset": "local", "num-clients": 2, "round-timeout": 1.0}, tmp_path)
        flower_ends_the_serverapp(failed.value)
        flower_log(logging.INFO, "")  # flwr_exit(0) after a run that succeeded: an empty 'INFO :' line
        try:
            raise TypeError("a bug")
        except TypeError as bug:  # not an expected failure: its traceback stays
            flower_ends_the_serverapp(bug)
    finally:
        flwr_log.removeHandler(kept)
        flwr_log.filters[:] = before
    shown = [r for r in kept.records if not r.exc_info]
    assert [r.getMessage().splitlines()[0] for r in kept.records] == ["ServerApp raised an exception", "Exit Code: 201"], kept.records
    raised = kept.records[0].exc_info
    assert raised is not None and raised[1] is not None and raised[1].args == ("a bug",) and not shown[1:]  # only the bug's lines remain
    lines = [r.getMessage() for r in caplog.records if r.name == "headway"]
    assert [x for x in lines if x.startswith("run failed")] == [f"run failed before round 1: {failed.value}"], lines
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for node in (201, 202):
        assert sum(f"node {node}: no reply" in x for x in warnings) == 1, warnings  # not again as "discovery: describe: ..."
    assert not any(x.startswith("headway:") for x in lines), lines  # "INFO headway: headway: ..." no more


def test_a_config_the_deployed_serverapp_refuses_is_one_line(tmp_path, caplog, task_identity):
    flwr_log = logging.getLogger("flwr")
    kept, before = Kept(), list(flwr_log.filters)
    flwr_log.addHandler(kept)
    try:
        with caplog.at_level(logging.INFO, logger="headway"), pytest.raises(Exception) as refused:  # noqa: PT011 - which one Flower raises is flower_ends_the_serverapp's check
            deployed_serverapp(SilentGrid([]), {"dataset": "local", "num-clients": 0}, tmp_path)
        flower_ends_the_serverapp(refused.value)
    finally:
        flwr_log.removeHandler(kept)
        flwr_log.filters[:] = before
    assert kept.records == []
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [f"run refused: {refused.value}"]


def test_a_node_local_run_waits_for_clients_once_and_says_how_many_joined(tmp_path, caplog, task_identity):
    """num-clients=3 and two nodes: discovery waits sample-timeout and says so once; the run
    then goes on with the two (no second wait, no second warning) and its header names node-local
    data and the two that joined."""
    cfg = local_cfg()
    good = [profile_json(write_npz(tmp_path / name, ["0", "1"]), cfg) for name in ("a", "b")]
    run_config = {"dataset": "local", "num-clients": 3, "sample-timeout": 0.0, "round-timeout": 1.0, "feature-dim": 8}
    run_config.update({"num-server-rounds": 1, "algorithm": "fedlog"})
    with caplog.at_level(logging.INFO, logger="headway"), pytest.raises(RoundFailed):  # the nodes never train: round 1 fails
        deployed_serverapp(LocalGrid(good), run_config, tmp_path)
    lines = [r.getMessage() for r in caplog.records if r.name == "headway"]
    assert sum(x.startswith("only 2 of 3 clients") for x in lines) == 1, lines
    assert sum(x.startswith("clients: ") for x in lines) == 0, lines
    assert f"fedlog on node-local data, clients: 2 of num-clients=3 joined, 1 round -> {tmp_path / 'out'}" in lines, lines
    assert not any(x.startswith("strategy fedlog:") for x in lines), lines  # the method's settings: DEBUG (--verbose), config.json


def test_header_and_figures():
    cfg = Settings(algorithm="fedavg", dataset="mnist", num_clients=1, num_server_rounds=2)
    assert header(cfg, Path("r")) == "fedavg on mnist, 1 client, 2 rounds -> r"
    assert (
        header(replace(cfg, dataset="local", num_clients=5), Path("r"))
        == "fedavg on node-local data, clients: num-clients=5, 2 rounds -> r"
    )
    assert score(1.0) == "1.0000" and score(0.675) == "0.6750" and score(None) == "none"
    assert plural(1, "round") == "1 round" and plural(0, "round") == "0 rounds"


# ----- headway run: a failed simulation ------------------------------------------------------


@pytest.mark.system  # whole real runs: make test-system keeps make test under 15 minutes
@pytest.mark.integration
@pytest.mark.slow  # a real simulation (~25 s on 2 cores)
def test_a_failed_simulation_ends_with_one_error_line(tmp_path):
    """Every client fails on purpose (the testers' repro): exit 1, summary.json failed, and the
    run ends with headway's one line: no traceback, no Ray colour codes or log folding, no
    client actor lines (the server names each client's failure itself)."""
    from sklearn.datasets import load_wine

    wine = load_wine()
    path = tmp_path / "wine.csv"
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow([*wine.feature_names, "cultivar"])
        writer.writerows([*row, int(y)] for row, y in zip(wine.data.tolist(), wine.target))
    sets = {
        "dataset": str(path),
        "label-column": "cultivar",
        "algorithm": "fedavg",
        "num-clients": 3,
        "num-server-rounds": 2,
        "fault-clients": "0,1,2",
        "fault-mode": "error",
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    done = subprocess.run(
        [sys.executable, "-m", "headway", "run", "--out", str(tmp_path / "out"), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 1, printed[-3000:]
    assert done.stderr.strip().splitlines()[-1].startswith("error: the run failed after 0 rounds: RoundFailed: every client failed"), (
        printed
    )
    for noise in ("Traceback", "\x1b[", "repeated", "ClientAppActor", "SIGTERM received"):
        assert noise not in printed, (noise, printed[-3000:])
    assert len(re.findall(r"^WARNING headway: failure: train: node \d+ \(partition \d\): error", done.stderr, re.MULTILINE)) == 3


# ----- headway run: stopped by a signal ------------------------------------------------------


def test_a_stop_by_signal_leaves_no_process_that_ignores_sigterm():
    """Ray's agents outlived a SIGTERMed run by 60-70 s: the runner sends SIGTERM and leaves a
    detached helper that SIGKILLs what is left after the grace (here a process that ignores SIGTERM)."""
    from headway.simulation.runner import stop_processes

    stubborn = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == b"1"  # its SIGTERM is ignored from here on
        helper = stop_processes([stubborn.pid], grace=0.5)
        assert helper is not None and stubborn.poll() is None  # the caller does not wait: SIGTERM alone did nothing
        assert stubborn.wait(timeout=20) == -9  # SIGKILLed by the helper
        assert helper.wait(timeout=20) == 0
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait()
