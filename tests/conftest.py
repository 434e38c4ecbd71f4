"""Shared fixtures: the real data directory (HEADWAY_DATA_DIR, else ../shared/data). A test
that needs a data set that is not there is skipped with the reason, never failed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    env = os.environ.get("HEADWAY_DATA_DIR")
    return Path(env) if env else ROOT.parent / "shared" / "data"


def needs_data(*names: str) -> pytest.MarkDecorator:
    """Skip the test, saying why, unless the data folder holds every data set in ``names``
    (MNIST, which the ``data_dir`` fixture checks, need not be named)."""
    root = data_root()
    missing = [name for name in names if not (root / name).is_dir()]
    return pytest.mark.skipif(bool(missing), reason=f"data set(s) {missing} not found in {root}: set HEADWAY_DATA_DIR")


@pytest.fixture(scope="session")
def data_dir() -> str:
    root = data_root()
    if not (root / "mnist").is_dir():
        pytest.skip(f"real data not found at {root}: set HEADWAY_DATA_DIR to the shared data folder")
    return str(root)


@pytest.fixture
def task_identity():
    """Messages built outside a Flower run need an identity for their metadata."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
