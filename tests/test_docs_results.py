"""docs/results.md's "Watching runs" commands, run as printed (tests/doc_commands.py extracts them
from the page): TensorBoard reads a run's results folder under results/, and the MLflow example
run logs its rounds to the SQLite store it names."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.doc_commands import commands

PAGE = ROOT / "docs" / "results.md"
BIN = Path(sys.executable).parent


def section_commands(title: str = "## Watching runs"):
    text = PAGE.read_text()
    start = text.index(title)
    end = text.find("\n## ", start + len(title))
    first_line = text[:start].count("\n")
    last_line = first_line + text[start : len(text) if end < 0 else end].count("\n")
    return [c for c in commands(PAGE) if first_line < c.line <= last_line]


def test_the_section_prints_the_commands_this_file_runs():
    programs = [(c.program, c.argv[1]) for c in section_commands()]
    assert programs == [("tensorboard", "--logdir"), ("pip", "install"), ("headway", "run")]


def test_tensorboard_logdir_results_shows_a_recorded_run(tmp_path):
    from headway.core.config import resolve_settings
    from headway.server.results import Recorder

    from tests.test_watching import CFG, real_rounds

    rec = Recorder(tmp_path / "results" / "fedavg-mnist-demo", resolve_settings(CFG))
    for record in real_rounds():
        rec.round(record)
    rec.finish()
    (cmd,) = [c for c in section_commands() if c.program == "tensorboard"]
    tensorboard = shutil.which("tensorboard", path=str(BIN)) or "tensorboard"
    out = subprocess.run([tensorboard, *cmd.argv[1:], "--inspect"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "fedavg-mnist-demo" in out.stdout and "num_steps            8" in out.stdout, out.stdout


@pytest.mark.system  # whole real runs: make test-system keeps make test under 15 minutes
@pytest.mark.integration
@pytest.mark.slow
def test_the_mlflow_example_run_logs_its_rounds(tmp_path, data_dir):
    pytest.importorskip("mlflow", reason="mlflow is an optional extra: pip install -e '.[mlflow]'")
    from mlflow.tracking import MlflowClient

    (cmd,) = [c for c in section_commands() if c.program == "headway"]  # pip install: the extra is installed here already
    env = {**os.environ, "HEADWAY_DATA_DIR": data_dir, "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    out = subprocess.run([str(BIN / "headway"), *cmd.argv[1:]], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not (tmp_path / "mlflow.db").exists()  # the store lies in results/ (ignored by git), not loose in the checkout
    noise = [line for line in out.stderr.splitlines() if "SADeprecationWarning" in line or "mlflow.store.db.utils" in line]
    assert not noise, noise  # MLflow's SQLAlchemy deprecation warning and its table-creation INFO lines
    from headway.server.tracking import quiet_mlflow

    quiet_mlflow()  # this reader's own store set-up, as the run's
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("headway")
    assert experiment is not None, "no experiment named headway"
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "mlflow-demo" and run.info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "accuracy/accuracy")] == [1, 2, 3]
