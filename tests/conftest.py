"""Shared fixtures: the real data directory (HEADWAY_DATA_DIR, else ../shared/data)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    env = os.environ.get("HEADWAY_DATA_DIR")
    return Path(env) if env else ROOT.parent / "shared" / "data"


@pytest.fixture(scope="session")
def data_dir() -> str:
    root = data_root()
    if not (root / "mnist").exists():
        pytest.fail(f"real data not found at {root}: set HEADWAY_DATA_DIR to the shared data folder")
    return str(root)


@pytest.fixture
def task_identity():
    """Messages built outside a Flower run need an identity for their metadata."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
