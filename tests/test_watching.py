"""Watching runs: the two plots (readable byte ticks, whole rounds, the target line, marked rounds
with failed or missing clients, honest labels and titles), the progress line's time left, and
the trackers (TensorBoard event files by default, MLflow at a tracking URI) fed by the Recorder
with the records of a real run (tests/fixtures/rounds-fedavg-mnist.jsonl: FedAvg on MNIST, 6
clients, half sampled each round, partition 1 sending NaN), read back by their own readers."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
from headway.core.config import ConfigError, resolve_settings
from headway.server.results import ACCURACY_LABEL, Recorder, clear_results, plot_curves, plot_title, progress, troubled_rounds
from headway.server.tracking import Trackers, round_scalars

FIXTURE = Path(__file__).parent / "fixtures" / "rounds-fedavg-mnist.jsonl"
CFG = {"dataset": "mnist", "algorithm": "fedavg", "num-clients": 6, "num-server-rounds": 8, "target-accuracy": 0.8}


def real_rounds() -> list[dict]:
    """The rounds of the real run, as the strategy hands them to the Recorder (before it adds cumulative_bytes)."""
    rounds = [json.loads(line) for line in FIXTURE.read_text().splitlines()]
    for r in rounds:
        r.pop("cumulative_bytes")
    return rounds


def recorded(tmp_path: Path, **overrides) -> Recorder:
    rec = Recorder(tmp_path, resolve_settings({**CFG, **overrides}))
    for record in real_rounds():
        rec.round(record)
    return rec


def visible_tick_labels(axis) -> list:
    """The tick labels drawn on ``axis`` (major and minor) inside the view, with text."""
    lo, hi = sorted(axis.get_view_interval())
    ticks = [(t, loc) for t, loc in zip(axis.get_majorticklabels(), axis.get_majorticklocs())]
    ticks += [(t, loc) for t, loc in zip(axis.get_minorticklabels(), axis.get_minorticklocs())]
    return [t for t, loc in ticks if lo <= loc <= hi and t.get_visible() and t.get_text()]


def assert_no_overlap(fig, axis) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # plot_curves closed the figure: draw it again as it was saved
    canvas.draw()
    renderer = canvas.get_renderer()
    labels = visible_tick_labels(axis)
    assert len(labels) >= 2, [t.get_text() for t in labels]
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    for a, b in zip(boxes, boxes[1:]):
        assert a.x1 + 2 <= b.x0, f"tick labels overlap or touch: {[t.get_text() for t in labels]}"


def series(xs: list[float]) -> list[dict]:
    return [{"round": i + 1, "accuracy": 0.5 + i / 100, "cumulative_bytes": x, "failures": 0} for i, x in enumerate(xs)]


# -- plots --------------------------------------------------------------------------------------


def test_plots_of_a_real_run_have_whole_rounds_target_line_marked_failures_and_labels(tmp_path):
    rec = recorded(tmp_path)
    figs = plot_curves({"fedavg": rec.rounds}, tmp_path, plot_title(rec.cfg.algorithm, rec.cfg.dataset), target=0.8)
    failed = [r["round"] for r in rec.rounds if r["failures"] or r["absent"]]
    assert failed == [4, 5, 6, 8]  # partition 1's NaN replies, in the rounds it was sampled
    for name, fig in figs.items():
        ax = fig.axes[0]
        assert ax.get_ylabel() == ACCURACY_LABEL and "sample-weighted" in ACCURACY_LABEL and "mean client" not in ACCURACY_LABEL
        assert ax.get_title() == "fedavg on mnist"
        target = [line for line in ax.get_lines() if line.get_gid() == "target"]
        assert len(target) == 1 and list(target[0].get_ydata()) == [0.8, 0.8] and target[0].get_label() == "target 0.8"
        marks = [line for line in ax.get_lines() if line.get_gid() == "troubled"]
        assert len(marks) == 1 and marks[0].get_label() == "client failed or missing"
        key = "round" if name == "accuracy_vs_round.png" else "cumulative_bytes"
        assert list(marks[0].get_xdata()) == [r[key] for r in rec.rounds if r["round"] in failed]
        assert "client failed or missing" in [t.get_text() for t in ax.get_legend().get_texts()]
        assert_no_overlap(fig, ax.xaxis)
        assert (tmp_path / name).stat().st_size > 10_000
    rounds_axis = figs["accuracy_vs_round.png"].axes[0].xaxis
    assert all(float(t.get_text()) == int(float(t.get_text())) for t in visible_tick_labels(rounds_axis))


@pytest.mark.parametrize("n", [2, 3, 5, 40])
def test_round_axis_shows_whole_rounds_only(tmp_path, n):
    from matplotlib.ticker import MaxNLocator

    axis = plot_curves({"a": series([1e5 * (i + 1) for i in range(n)])}, tmp_path, "t")["accuracy_vs_round.png"].axes[0].xaxis
    assert isinstance(axis.get_major_locator(), MaxNLocator)
    assert_no_overlap(axis.get_figure(), axis)
    texts = [t.get_text().replace("\u2212", "-") for t in visible_tick_labels(axis)]
    assert texts and all(float(t).is_integer() for t in texts), texts


def test_no_target_no_line_and_no_failures_no_marks(tmp_path):
    figs = plot_curves({"a": series([1e5, 2e5, 3e5])}, tmp_path, "t")
    ax = figs["accuracy_vs_round.png"].axes[0]
    assert not [line for line in ax.get_lines() if line.get_gid() in ("target", "troubled")]
    assert ax.get_legend() is None  # one series, nothing else to name


@pytest.mark.parametrize(
    "xs",
    [
        [2.0e5 + 5e3 * i for i in range(8)],  # the "2×10⁵2.1×10⁵…": within one decade
        [2e5 * k for k in range(1, 101)],  # FedLog's 100 rounds: two decades
        [1e4, 1e6, 1e8, 1e10],  # methods six decades apart on one plot (benchmarks/summarize.py)
    ],
)
def test_byte_axis_labels_never_run_together(tmp_path, xs):
    from matplotlib.ticker import EngFormatter, NullFormatter

    fig = plot_curves({"a": series(xs)}, tmp_path, "t")["accuracy_vs_bytes.png"]
    axis = fig.axes[0].xaxis
    assert_no_overlap(fig, axis)
    assert isinstance(axis.get_major_formatter(), EngFormatter)
    if fig.axes[0].get_xscale() == "log":
        assert isinstance(axis.get_minor_formatter(), NullFormatter)
    assert all(t.get_text().endswith("B") for t in visible_tick_labels(axis))  # 200 kB, 1 MB: bytes, not 2×10⁵


@pytest.mark.parametrize(
    "dataset, title",
    [("mnist", "fedlog on mnist"), ("local", "fedlog on node-local data"), ("some/where/my-photos", "fedlog on my-photos")],
)
def test_title_says_what_the_user_ran(dataset, title):
    assert plot_title("fedlog", dataset) == title


def test_troubled_rounds_count_missing_clients_too():
    rounds = [{"round": 1, "accuracy": 0.5, "failures": 0, "absent": 1}, {"round": 2, "accuracy": 0.6, "failures": 0, "absent": 0}]
    assert [r["round"] for r in troubled_rounds(rounds)] == [1]


# -- progress -----------------------------------------------------------------------------------


def test_progress_gives_elapsed_and_time_left_at_the_pace_after_round_one():
    rounds = [{"seconds": 50.0}, {"seconds": 4.0}, {"seconds": 2.0}]
    assert progress(rounds, 8, 56.0) == "elapsed 56 s, about 15 s left"  # 5 rounds x 3 s: round 1's start-up left out
    assert progress(rounds[:1], 3, 50.0) == "elapsed 50 s"  # round 1 alone: its start-up is no pace, so no estimate
    assert progress(rounds[:2], 3, 54.0) == "elapsed 54 s, about 4 s left"  # round 2's own 4 s
    assert progress(rounds, 3, 3725.0) == "elapsed 1 h 02 min"  # done: no time left shown


def test_the_round_line_shows_progress(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="headway"):
        recorded(tmp_path, tensorboard=False)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("round ")]
    assert lines[0].startswith("round 1/8  accuracy 0.1313") and "elapsed" in lines[0] and "left" not in lines[0]
    assert "left" in lines[1]
    assert lines[-1].startswith("round 8/8") and "left" not in lines[-1]


# -- trackers -----------------------------------------------------------------------------------


def events(folder: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    acc.Reload()
    return acc


def test_tensorboard_event_files_hold_every_rounds_figures(tmp_path):
    rec = recorded(tmp_path)
    summary = rec.finish({"dp": {"epsilon": 1.0, "epsilon_rdp": 0.8, "delta": 0.01}})
    acc = events(tmp_path)
    tags = set(acc.Tags()["scalars"])
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]  # one source of truth
    for tag, key in (
        ("accuracy/accuracy", "accuracy"),
        ("loss/loss", "loss"),
        ("loss/train_loss", "train_loss"),
        ("bytes/bytes_up", "bytes_up"),
        ("bytes/eval_bytes_down", "eval_bytes_down"),
        ("clients/failures", "failures"),
        ("time/seconds", "seconds"),
    ):
        assert tag in tags
        assert [(e.step, pytest.approx(e.value)) for e in acc.Scalars(tag)] == [(r["round"], r[key]) for r in rounds]
    assert [e.value for e in acc.Scalars("clients/selected")] == [len(r["selected"]) for r in rounds]
    assert [e.value for e in acc.Scalars("bytes/register_bytes_up")] == [rounds[0]["register_bytes_up"]]  # round 1 only
    assert acc.Scalars("summary/final_accuracy")[0].value == pytest.approx(summary["final_accuracy"])
    assert acc.Scalars("privacy/epsilon_rdp")[0].value == pytest.approx(0.8)


def test_fedprof_scores_become_a_histogram(tmp_path):
    rec = Recorder(tmp_path, resolve_settings({**CFG, "algorithm": "fedprof"}))
    record = {**real_rounds()[0], "fedprof_scores": {"0": 0.9, "1": 0.1, "2": 0.85, "3": 0.8}}
    rec.round(record)
    rec.finish()
    hist = events(tmp_path).Histograms("fedprof/scores")
    assert [h.step for h in hist] == [1]
    assert hist[0].histogram_value.num == 4 and hist[0].histogram_value.min == pytest.approx(0.1)


def test_tensorboard_off_writes_no_event_files(tmp_path):
    recorded(tmp_path, tensorboard=False).finish()
    assert not list(tmp_path.glob("events.out.tfevents.*"))


def test_overwrite_removes_the_earlier_runs_event_files(tmp_path):
    recorded(tmp_path).finish()
    assert list(tmp_path.glob("events.out.tfevents.*"))
    assert any(name.startswith("events.out.tfevents.") for name in clear_results(tmp_path))
    assert not list(tmp_path.glob("events.out.tfevents.*"))


class Broken:
    name = "broken"

    def __init__(self):
        self.calls = 0

    def round(self, record):
        self.calls += 1
        raise OSError("disk full")

    def finish(self, summary):
        raise AssertionError("a dropped tracker is not called again")


def test_a_failing_tracker_warns_once_and_the_run_goes_on(tmp_path, caplog):
    rec = Recorder(tmp_path, resolve_settings({**CFG, "tensorboard": False}))
    broken = Broken()
    rec.trackers = Trackers([broken])
    with caplog.at_level(logging.WARNING, logger="headway"):
        for record in real_rounds():
            rec.round(record)
        summary = rec.finish()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert broken.calls == 1 and len(warnings) == 1 and "broken: writing failed (OSError: disk full)" in warnings[0]
    assert summary["rounds"] == 8 and len((tmp_path / "rounds.jsonl").read_text().splitlines()) == 8


def test_mlflow_uri_without_mlflow_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # import mlflow raises ImportError, as where it is not installed
    with pytest.raises(ConfigError, match=r"mlflow-tracking-uri.*pip install -e '\.\[mlflow\]' in headway's checkout"):
        Recorder(tmp_path, resolve_settings({**CFG, "mlflow-tracking-uri": "http://127.0.0.1:5000"}))


def test_headway_run_refuses_an_mlflow_uri_without_mlflow_before_the_engine(tmp_path, capsys, monkeypatch, data_dir):
    import flwr.simulation
    import headway.simulation as simulation

    monkeypatch.setitem(sys.modules, "mlflow", None)
    monkeypatch.setattr(flwr.simulation, "run_simulation", lambda **kw: pytest.fail("the simulation engine started"))
    out = tmp_path / "out"
    code = simulation.main(["--out", str(out), "--set", f"data-dir={data_dir}", "--set", "mlflow-tracking-uri=sqlite:///m.db"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert err.splitlines() == [
        "error: run-config key 'mlflow-tracking-uri' is set, but mlflow is not installed: pip install -e '.[mlflow]' in headway's "
        "checkout (or pip install mlflow-skinny), or leave the key empty"
    ]


def test_mlflow_run_holds_every_rounds_figures(tmp_path):
    pytest.importorskip("mlflow", reason="mlflow is an optional extra: pip install 'headway[mlflow]' (or mlflow-skinny)")
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"  # MLflow 3 keeps file: stores read-only unless opted in; a SQLite file is its local store
    rec = recorded(tmp_path / "run", **{"mlflow-tracking-uri": uri, "tensorboard": False})
    rec.finish()
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("headway")
    assert experiment is not None, "no experiment named headway"
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED" and run.data.tags["status"] == "complete"
    assert run.data.params["algorithm"] == "fedavg" and run.data.params["target-accuracy"] == "0.8"
    rounds = [json.loads(line) for line in (tmp_path / "run" / "rounds.jsonl").read_text().splitlines()]
    history = client.get_metric_history(run.info.run_id, "accuracy/accuracy")
    assert sorted((m.step, m.value) for m in history) == [(r["round"], r["accuracy"]) for r in rounds]
    failures = client.get_metric_history(run.info.run_id, "clients/failures")
    assert sorted((m.step, m.value) for m in failures) == [(r["round"], r["failures"]) for r in rounds]
    assert run.data.metrics["summary/rounds"] == 8


def test_round_scalars_group_and_skip_what_is_not_a_number():
    record = {
        "round": 3,
        "accuracy": None,
        "aggregated": True,
        "failure_reasons": ["x"],
        "fedprof_scores": {"0": 1.0},
        "solve_seconds": 0.2,
    }
    assert round_scalars(record) == {"clients/aggregated": 1.0, "time/solve_seconds": 0.2}


# -- a real run -----------------------------------------------------------------------------------


@pytest.mark.integration
@pytest.mark.slow
def test_a_real_fedprof_run_writes_event_files_tensorboard_reads_back(tmp_path, data_dir):
    """FedProf on MNIST through Flower's simulation, partition 1 sending NaN: TensorBoard reads
    back every round's figures from the results folder, its scores as a histogram, and the
    failures the plots mark."""
    from headway.simulation import simulate

    cfg = resolve_settings(
        {
            "algorithm": "fedprof",
            "dataset": "mnist",
            "data-dir": data_dir,
            "num-clients": 4,
            "num-server-rounds": 3,
            "fraction-train": 0.5,
            "train-fraction": 0.02,
            "local-epochs": 1,
            "fedprof-val-size": 200,
            "fault-clients": "1",
            "target-accuracy": 0.5,
            "sample-timeout": 30.0,
        }
    )
    summary = simulate(cfg, tmp_path)
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    assert summary["rounds"] == 3 and len(rounds) == 3
    acc = events(tmp_path)
    assert [(e.step, pytest.approx(e.value)) for e in acc.Scalars("accuracy/accuracy")] == [(r["round"], r["accuracy"]) for r in rounds]
    assert [e.value for e in acc.Scalars("clients/failures")] == [r["failures"] for r in rounds]
    assert [e.value for e in acc.Scalars("bytes/bytes_up")] == [r["bytes_up"] for r in rounds]
    assert [h.step for h in acc.Histograms("fedprof/scores")] == [1, 2, 3]
    assert [h.histogram_value.num for h in acc.Histograms("fedprof/scores")] == [len(r["fedprof_scores"]) for r in rounds]
    assert acc.Scalars("summary/rounds")[0].value == 3
    assert (tmp_path / "accuracy_vs_round.png").exists() and (tmp_path / "accuracy_vs_bytes.png").exists()
