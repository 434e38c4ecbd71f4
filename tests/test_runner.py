"""The simulation runner and the results folder, without Flower's engine: results folders
that already hold files, pre-flight errors (one line, exit code 2, before Ray), the status
fields of summary.json, and the summary a run that stops early still leaves."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import flwr.simulation
import headway.client.app
import headway.server.app
import headway.simulation as simulation
import headway.simulation.runner
import pytest
from headway.core.config import ConfigError, check_against_spec, resolve_settings
from headway.core.data import SPECS
from headway.core.settings import Settings
from headway.server.results import Recorder, ResultsFolderError
from headway.strategies.engine import RoundFailed

BASE = {"dataset": "mnist", "num-clients": 2, "num-server-rounds": 2}


def cfg_of(**overrides) -> Settings:
    return resolve_settings({**BASE, **overrides})


def a_round(n: int, accuracy: float | None = 0.5, down: int = 100, up: int = 50) -> dict:
    return {"round": n, "accuracy": accuracy, "bytes_down": down, "bytes_up": up, "clients": 2, "failures": 0, "absent": 0, "seconds": 0.1}


def write_earlier_run(out: Path) -> None:
    rec = Recorder(out, cfg_of())
    rec.round(a_round(1, 0.4))
    rec.finish()


def summary_of(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


# ----------------------------------------------------------------- results folders


def test_recorder_writes_into_a_new_or_empty_folder(tmp_path):
    Recorder(tmp_path / "new" / "run", cfg_of())
    (tmp_path / "empty").mkdir()
    Recorder(tmp_path / "empty", cfg_of())
    assert (tmp_path / "empty" / "config.json").exists() and (tmp_path / "new" / "run" / "rounds.jsonl").exists()


def test_recorder_refuses_a_folder_that_holds_files(tmp_path):
    write_earlier_run(tmp_path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(ResultsFolderError) as err:
        Recorder(tmp_path, cfg_of(algorithm="fedavg"))
    msg = str(err.value)
    assert str(tmp_path) in msg and "--overwrite" in msg and "another folder" in msg and "\n" not in msg
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # nothing touched


def test_recorder_refuses_a_folder_holding_any_file(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ResultsFolderError, match="notes.txt"):
        Recorder(tmp_path, cfg_of())


def test_recorder_refuses_a_file_as_folder(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ResultsFolderError, match="not a folder"):
        Recorder(tmp_path / "f", cfg_of(), overwrite=True)


def test_overwrite_clears_the_earlier_runs_result_files_only(tmp_path):
    write_earlier_run(tmp_path)
    assert {"summary.json", "accuracy_vs_round.png", "accuracy_vs_bytes.png"} <= {p.name for p in tmp_path.iterdir()}
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "sub").mkdir()
    (old_events,) = tmp_path.glob("events.out.tfevents.*")
    Recorder(tmp_path, cfg_of(algorithm="fedavg"), overwrite=True)
    names = {p.name for p in tmp_path.iterdir() if not p.name.startswith("events.out.tfevents.")}
    assert names == {"config.json", "rounds.jsonl", "notes.txt", "sub"}  # no summary, no plots of the old run
    assert [p.name for p in tmp_path.glob("events.out.tfevents.*")] != [
        old_events.name
    ]  # the old run's TensorBoard file gone, the new run's own
    assert (tmp_path / "rounds.jsonl").read_text() == ""
    assert json.loads((tmp_path / "config.json").read_text())["algorithm"] == "fedavg"


# ----------------------------------------------------------------- summary status


def test_finish_complete_has_status_and_null_reason(tmp_path):
    rec = Recorder(tmp_path, cfg_of())
    rec.round(a_round(1, 0.4))
    rec.round(a_round(2, 0.6))
    summary = rec.finish({"m": 51}, reason="ignored when complete")
    assert summary_of(tmp_path) == json.loads(json.dumps(summary))
    assert summary["status"] == "complete" and summary["reason"] is None
    assert summary["rounds"] == 2 and summary["final_accuracy"] == 0.6 and summary["m"] == 51
    assert (tmp_path / "accuracy_vs_round.png").exists() and (tmp_path / "accuracy_vs_bytes.png").exists()


@pytest.mark.parametrize("status", ["failed", "interrupted"])
def test_finish_stopped_run_keeps_its_rounds_and_reason(tmp_path, status):
    rec = Recorder(tmp_path, cfg_of())
    rec.round(a_round(1, 0.4))
    summary = rec.finish({"status": "complete", "reason": None}, status=status, reason="ValueError: boom")
    assert summary_of(tmp_path)["status"] == status and summary_of(tmp_path)["reason"] == "ValueError: boom"  # extra cannot override
    assert summary["rounds"] == 1 and summary["final_accuracy"] == 0.4 and summary["total_bytes"] == 150
    assert (tmp_path / "accuracy_vs_round.png").exists()


def test_finish_rejects_an_unknown_status(tmp_path):
    with pytest.raises(ValueError, match="status"):
        Recorder(tmp_path, cfg_of()).finish(status="done")


def test_finish_after_zero_rounds(tmp_path):
    summary = Recorder(tmp_path, cfg_of()).finish(status="failed", reason="RuntimeError: no valid reply in round 1")
    assert summary_of(tmp_path)["status"] == "failed" and summary["reason"] == "RuntimeError: no valid reply in round 1"
    assert summary["rounds"] == 0 and summary["final_accuracy"] is None and summary["best_accuracy"] is None
    assert summary["total_bytes"] == 0 and summary["failures"] == 0 and "bytes_to_best" not in summary
    assert not (tmp_path / "accuracy_vs_round.png").exists()  # no plots of nothing


def test_finish_after_rounds_without_accuracy(tmp_path):
    rec = Recorder(tmp_path, cfg_of())
    rec.round(a_round(1, None))
    summary = rec.finish(status="failed", reason="x")
    assert summary["rounds"] == 1 and summary["final_accuracy"] is None and summary["total_bytes"] == 150


def test_reopen_reads_back_the_rounds_written(tmp_path):
    rec = Recorder(tmp_path, cfg_of(**{"target-accuracy": 0.5}))
    rec.round(a_round(1, 0.4))
    rec.round(a_round(2, 0.6))
    with open(tmp_path / "rounds.jsonl", "a") as fh:
        fh.write('{"round": 3, "accu')  # torn by the stop
    summary = Recorder.reopen(tmp_path, cfg_of(**{"target-accuracy": 0.5})).finish(status="interrupted", reason="Ctrl-C")
    assert (
        summary["rounds"] == 2 and summary["total_bytes"] == 300 and summary["bytes_to_target"] == 300 and summary["round_to_target"] == 2
    )


# ----------------------------------------------------------------- pre-flight: exit 2, one line


@pytest.fixture
def no_engine(monkeypatch):
    """Fail the test if anything starts Flower's simulation engine."""

    def started(**kwargs):
        raise AssertionError("the simulation engine started")

    monkeypatch.setattr(flwr.simulation, "run_simulation", started)


def run_main(capsys, args):
    capsys.readouterr()  # only what main says: a test's own set-up (an earlier run's Recorder) may have logged before
    code = simulation.main([str(a) for a in args])
    return code, capsys.readouterr().err


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    "sets, names",
    [
        (["no-such-key=1"], "no-such-key"),
        (["partition=random"], "'partition'"),
        (["num-clients=0"], "'num-clients'"),
        (["classes-per-client=11"], "'classes-per-client'"),
        (["fedlog-dp=local"], "'fedlog-clip'"),
        (["lr"], "--set takes key=value"),
        (["algorithm=fedavg", "bodies=mnist-cnn,mlp"], "'bodies'"),  # headway.server.app.check_strategy: FedAvg with mixed bodies
        (["algorithm=fedlog", "bodies=mnist-cnn,mlp"], "'feature-dim'"),  # bodies of different widths
    ],
)
def test_config_errors_exit_2_with_one_line(tmp_path, capsys, no_engine, data_dir, sets, names):
    out = tmp_path / "out"
    args = ["--out", out, "--set", f"data-dir={data_dir}"]
    for s in sets:
        args += ["--set", s]
    code, err = run_main(capsys, args)
    assert code == 2
    assert names in one_error_line(err)
    assert not out.exists()


def test_classes_per_client_above_the_data_sets_classes_is_a_config_error():
    check_against_spec(cfg_of(**{"classes-per-client": 10}), SPECS["mnist"])
    with pytest.raises(ConfigError, match="'classes-per-client' is 11.*10 classes"):
        check_against_spec(cfg_of(**{"classes-per-client": 11}), SPECS["mnist"])
    check_against_spec(cfg_of(**{"classes-per-client": 11, "partition": "iid"}), SPECS["mnist"])  # only pathological uses it


def test_missing_config_file_exits_2(tmp_path, capsys, no_engine):
    code, err = run_main(capsys, [tmp_path / "nope.toml", "--out", tmp_path / "out"])
    assert code == 2 and "nope.toml" in one_error_line(err)


def test_missing_data_set_exits_2(tmp_path, capsys, no_engine):
    empty = tmp_path / "data"
    empty.mkdir()
    code, err = run_main(capsys, ["--out", tmp_path / "out", "--set", "dataset=uci-adult", "--set", f"data-dir={empty}"])
    assert code == 2
    line = one_error_line(err)
    assert "'uci-adult' not found" in line and str(empty) in line
    assert not (tmp_path / "out").exists()


def test_missing_mnist_lists_each_searched_folder_once(tmp_path, capsys, no_engine, monkeypatch):
    """`make run` without ../shared: one error line naming every folder searched, each once
    (mnist's folder and its underscore spelling are the same folder). Offline, as here."""
    import headway.core.data

    def offline(tv_cls, root, name, searched, expected):
        raise headway.core.data.DatasetMissingError(name, searched, expected, "download failed: URLError")

    monkeypatch.setattr(headway.core.data, "_download", offline)
    missing = tmp_path / "shared" / "data"
    code, err = run_main(capsys, ["--out", tmp_path / "out", "--set", "dataset=mnist", "--set", f"data-dir={missing}"])
    line = one_error_line(err)
    assert code == 2 and "'mnist' not found" in line
    searched = line.split("searched ", 1)[1].split(" for ", 1)[0].split(", ")
    assert searched == [str(missing / "mnist"), str(missing / "MNIST" / "raw"), str(missing)], line


def test_non_empty_out_without_overwrite_exits_2(tmp_path, capsys, no_engine, data_dir):
    out = tmp_path / "out"
    write_earlier_run(out)
    before = sorted(p.name for p in out.iterdir())
    code, err = run_main(capsys, ["--out", out, "--set", f"data-dir={data_dir}"])
    assert code == 2
    line = one_error_line(err)
    assert str(out) in line and "--overwrite" in line and "another folder" in line
    assert sorted(p.name for p in out.iterdir()) == before


def test_a_refused_run_leaves_earlier_results_even_with_overwrite(tmp_path, capsys, no_engine, data_dir):
    out = tmp_path / "out"
    write_earlier_run(out)
    code, err = run_main(capsys, ["--out", out, "--overwrite", "--set", f"data-dir={data_dir}", "--set", "classes-per-client=11"])
    assert code == 2 and "'classes-per-client'" in one_error_line(err)
    assert summary_of(out)["status"] == "complete"  # the earlier run's results are still there


# ----------------------------------------------------------------- the run, with a stand-in engine


class FakeServer:
    """What build_server_app was called with; the stand-in engine plays the ServerApp."""

    def __init__(self, cfg, out_dir, overwrite=False, resume=False):
        # the real ServerApp builds its Settings from the run config it is given
        self.cfg, self.out, self.overwrite, self.resume = resolve_settings(cfg), Path(out_dir), overwrite, resume


@pytest.fixture
def engine(monkeypatch):
    """Replace the engine and both apps; ``engine.play`` is what the 'ServerApp' does."""

    class Engine:
        play: Callable[[FakeServer], None] | None = None
        server: FakeServer | None = None

        def __call__(self, *, server_app, client_app, num_supernodes, backend_config, verbose_logging):
            self.server = server_app
            assert num_supernodes == server_app.cfg.num_clients
            assert self.play is not None, "the test did not say what the ServerApp does"
            self.play(server_app)

    eng = Engine()
    monkeypatch.setattr(flwr.simulation, "run_simulation", eng)
    monkeypatch.setattr(headway.server.app, "build_server_app", FakeServer)
    monkeypatch.setattr(headway.client.app, "build_client_app", lambda cfg, state_dir=None: object())
    return eng


def complete_run(srv: FakeServer) -> None:
    rec = Recorder(srv.out, srv.cfg, overwrite=srv.overwrite)
    rec.round(a_round(1, 0.7))
    rec.finish()


def test_overwrite_clears_the_folder_and_runs(tmp_path, capsys, engine, data_dir):
    out = tmp_path / "out"
    write_earlier_run(out)
    (out / "accuracy_vs_bytes.png").write_bytes(b"old")

    def play(srv):
        assert not (srv.out / "summary.json").exists() and not (srv.out / "accuracy_vs_bytes.png").exists()
        complete_run(srv)

    engine.play = play
    code = simulation.main(["--out", str(out), "--overwrite", "--set", f"data-dir={data_dir}", "--set", "algorithm=fedavg"])
    assert code == 0 and engine.server.overwrite is True and engine.server.out == out
    assert summary_of(out)["status"] == "complete" and summary_of(out)["algorithm"] == "fedavg"
    assert json.loads(capsys.readouterr().out)["final_accuracy"] == 0.7


def test_a_run_ending_without_summary_gets_a_failed_one(tmp_path, capsys, engine, data_dir):
    def play(srv):
        rec = Recorder(srv.out, srv.cfg)
        rec.round(a_round(1, 0.3))  # then the ServerApp vanishes without finishing

    engine.play = play
    code, err = run_main(capsys, ["--out", tmp_path / "out", "--set", f"data-dir={data_dir}"])
    summary = summary_of(tmp_path / "out")
    assert code == 1 and summary["status"] == "failed" and summary["rounds"] == 1
    assert "without the ServerApp writing summary.json" in summary["reason"]
    assert "error: the run failed" in err


def test_an_exception_in_the_run_leaves_a_failed_summary_with_its_reason(tmp_path, engine, data_dir):
    def play(srv):
        try:
            raise ValueError("no valid reply in round 1")
        except ValueError as exc:  # Flower wraps what the ServerApp raised
            raise RuntimeError("An error was encountered. Ending simulation.") from exc

    engine.play = play
    with pytest.raises(RuntimeError):
        simulation.simulate(cfg_of(**{"data-dir": data_dir}), tmp_path / "out")
    summary = summary_of(tmp_path / "out")
    assert summary["status"] == "failed" and summary["reason"] == "ValueError: no valid reply in round 1" and summary["rounds"] == 0
    assert (tmp_path / "out" / "config.json").exists() and (tmp_path / "out" / "rounds.jsonl").exists()


def test_the_servers_own_failed_summary_is_kept(tmp_path, engine, data_dir):
    def play(srv):
        Recorder(srv.out, srv.cfg).finish({"m": 51}, status="failed", reason="own reason")
        raise RuntimeError("later")

    engine.play = play
    with pytest.raises(RuntimeError):
        simulation.simulate(cfg_of(**{"data-dir": data_dir}), tmp_path / "out")
    assert summary_of(tmp_path / "out")["reason"] == "own reason" and summary_of(tmp_path / "out")["m"] == 51


def test_ctrl_c_leaves_an_interrupted_summary(tmp_path, capsys, engine, data_dir):
    def play(srv):
        rec = Recorder(srv.out, srv.cfg)
        rec.round(a_round(1, 0.3))
        raise KeyboardInterrupt

    engine.play = play
    code, err = run_main(capsys, ["--out", tmp_path / "out", "--set", f"data-dir={data_dir}"])
    summary = summary_of(tmp_path / "out")
    assert code == 130 and summary["status"] == "interrupted" and "Ctrl-C" in summary["reason"] and summary["rounds"] == 1
    assert "interrupted" in err


def test_ctrl_c_on_the_command_line_writes_the_summary_and_plots_and_exits_130(tmp_path, capsys, engine, data_dir, monkeypatch):
    class Exited(BaseException):
        pass

    def fake_exit(code):
        raise Exited(code)

    def play(srv):
        rec = Recorder(srv.out, srv.cfg)
        rec.round(a_round(1, 0.3))
        rec.round(a_round(2, 0.4))
        signal.raise_signal(signal.SIGINT)  # Ctrl-C while the engine runs
        raise AssertionError("the SIGINT handler did not stop the run")

    engine.play = play
    monkeypatch.setattr(os, "_exit", fake_exit)
    monkeypatch.setattr(headway.simulation.runner, "_descendants", lambda pid: [])  # signal none of pytest's processes
    # Ctrl-C as a terminal delivers it: a test suite started in the background of a script inherits SIGINT ignored,
    # and main rightly leaves an ignored SIGINT alone
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    before = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(Exited) as exited:
            simulation.main(["--out", str(tmp_path / "out"), "--set", f"data-dir={data_dir}"])
        restored = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert exited.value.args == (130,)
    summary = summary_of(tmp_path / "out")
    assert summary["status"] == "interrupted" and "Ctrl-C" in summary["reason"] and summary["rounds"] == 2
    assert (tmp_path / "out" / "accuracy_vs_round.png").exists()
    assert "interrupted" in capsys.readouterr().err
    assert restored is before  # main put the previous handler back


def test_simulate_runs_preflight_before_the_engine(tmp_path, no_engine, data_dir):
    (tmp_path / "x").write_text("")
    with pytest.raises(ResultsFolderError):
        simulation.simulate(cfg_of(**{"data-dir": data_dir}), tmp_path)


def test_the_runner_exports_its_entry_points():  # which layers import which: tests/test_layering.py
    assert simulation.__all__ == ["simulate", "load_config", "parse_value", "main"]


def test_the_runner_checks_classes_per_client_itself(tmp_path, capsys, no_engine, data_dir, monkeypatch):
    monkeypatch.setattr(headway.server.app, "check_strategy", lambda cfg: None)  # whatever headway.server.app checks or not
    code, err = run_main(capsys, ["--out", tmp_path / "out", "--set", f"data-dir={data_dir}", "--set", "classes-per-client=11"])
    assert code == 2 and "'classes-per-client'" in one_error_line(err)


def test_summary_counts_value_bytes_to_the_target_round_and_none_for_older_rounds(tmp_path):
    rec = Recorder(tmp_path / "a", cfg_of(**{"target-accuracy": 0.9}))
    for n, acc in ((1, 0.5), (2, 0.95), (3, 0.97)):
        rec.round({**a_round(n, acc), "values_bytes_down": 40, "values_bytes_up": 10 * n})
    s = rec.finish()
    assert s["round_to_target"] == 2 and s["bytes_to_target"] == 300
    assert s["values_bytes_to_target"] == 40 + 10 + 40 + 20 and s["total_values_bytes"] == 3 * 40 + 60
    old = Recorder(tmp_path / "b", cfg_of())
    old.round(a_round(1))  # written before value bytes were recorded
    assert old.finish()["total_values_bytes"] is None


def test_a_failed_run_ends_with_one_error_line_and_the_traceback_only_with_verbose(tmp_path, capsys, engine, data_dir):
    """An expected failure (no valid reply in round 1): exit 1, summary.json failed, and headway's
    one line; Flower's wrapped exception's traceback only with --verbose."""

    def play(srv):
        try:
            raise RoundFailed("every client failed in round 1")
        except RoundFailed as exc:  # Flower wraps what the ServerApp raised
            raise RuntimeError("An error was encountered. Ending simulation.") from exc

    engine.play = play
    code, err = run_main(capsys, ["--out", tmp_path / "out", "--set", f"data-dir={data_dir}"])
    assert code == 1 and summary_of(tmp_path / "out")["status"] == "failed"
    assert err.strip().splitlines()[-1] == "error: the run failed after 0 rounds: RoundFailed: every client failed in round 1", err
    assert "Traceback" not in err
    code, err = run_main(capsys, ["--out", tmp_path / "verbose", "--set", f"data-dir={data_dir}", "--verbose"])
    assert code == 1 and "Traceback" in err and "RoundFailed: every client failed in round 1" in err
