"""Shared fixtures: the real data directory (HEADWAY_DATA_DIR, else ../shared/data). A test
that needs a data set that is not there is skipped with the reason, or failed where
HEADWAY_REQUIRE_DATA=1 (CI, which has the data: a missing data set must not pass as skips).
The per-test time limits of pytest-timeout: the default in pyproject.toml, longer for
``system`` tests (set here)."""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]
REQUIRE_DATA = "HEADWAY_REQUIRE_DATA"
DATA_HINT = "set HEADWAY_DATA_DIR"  # every data skip names it: pytest_runtest_makereport fails such skips under HEADWAY_REQUIRE_DATA=1
SYSTEM_TIMEOUT_S = 1800  # a system test may start several processes and run minutes of rounds on a loaded machine


def data_required() -> bool:
    """Whether a missing data set fails its tests instead of skipping them (HEADWAY_REQUIRE_DATA=1)."""
    return os.environ.get(REQUIRE_DATA, "") not in ("", "0")


def missing_data(reason: str) -> NoReturn:
    """Skip the test for a missing data set, saying what is missing and what to set; fail it
    under HEADWAY_REQUIRE_DATA=1."""
    message = f"{reason}: {DATA_HINT}"
    if data_required():
        pytest.fail(f"{message} ({REQUIRE_DATA}=1: missing data fails the test)", pytrace=False)
    pytest.skip(message)


def data_root() -> Path:
    env = os.environ.get("HEADWAY_DATA_DIR")
    return Path(env) if env else ROOT.parent / "shared" / "data"


def needs_data(*names: str) -> pytest.MarkDecorator:
    """The test needs every data set in ``names`` (MNIST, which the ``data_dir`` fixture checks,
    need not be named): skipped, or failed under HEADWAY_REQUIRE_DATA=1, when one is missing."""
    return pytest.mark.needs_data(*names)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Applies :func:`needs_data` before the test's fixtures run."""
    for marker in item.iter_markers("needs_data"):
        root = data_root()
        missing = [name for name in marker.args if not (root / name).is_dir()]
        if missing:
            missing_data(f"data set(s) {missing} not found in {root}")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Under HEADWAY_REQUIRE_DATA=1, a skip that names HEADWAY_DATA_DIR fails: it covers the
    data skips written without :func:`missing_data`."""
    report = yield
    if data_required() and report.skipped and isinstance(report.longrepr, tuple) and DATA_HINT in str(report.longrepr[2]):
        report.outcome = "failed"
        report.longrepr = f"{report.longrepr[2]} ({REQUIRE_DATA}=1: missing data fails the test)"
    return report


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``system`` tests get SYSTEM_TIMEOUT_S instead of pyproject's default, unless they set their own."""
    for item in items:
        if item.get_closest_marker("system") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(SYSTEM_TIMEOUT_S))


@pytest.fixture(scope="session")
def data_dir() -> str:
    """The real data folder, which holds MNIST; a test using it is skipped (or failed) without."""
    root = data_root()
    if not (root / "mnist").is_dir():
        missing_data(f"real data (mnist) not found at {root}")
    return str(root)


@pytest.fixture
def task_identity():
    """Messages built outside a Flower run need an identity for their metadata."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
