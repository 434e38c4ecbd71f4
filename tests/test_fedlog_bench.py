"""The FedLog α-ablation and Table A.1 benchmarks' table and summary code, on made-up result folders (no simulation)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import fedlog_alpha as A
from benchmarks import fedlog_tablea1 as T


def write_run(folder: Path, accuracies: list[float], values_up: int = 1000, status: str = "complete") -> None:
    """A result folder in the format the runner writes: summary.json and rounds.jsonl."""
    folder.mkdir(parents=True)
    rows = [
        {"round": i + 1, "accuracy": a, "cumulative_bytes": 5000 * (i + 1), "values_bytes_up": values_up} for i, a in enumerate(accuracies)
    ]
    (folder / "rounds.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = {"final_accuracy": accuracies[-1], "best_accuracy": max(accuracies), "status": status}
    (folder / "summary.json").write_text(json.dumps(summary))


def test_hz_summary_per_space_and_without_nan() -> None:
    per_class = [
        {"class": 0, "hz": 1.0, "p": 0.5, "space": "full", "dims": 10},
        {"class": 1, "hz": 3.0, "p": 0.01, "space": "full", "dims": 20},
        {"class": 2, "hz": float("nan"), "p": float("nan"), "space": "full"},
        {"class": 0, "hz": 9.0, "p": 0.2, "space": "2d"},
    ]
    full = A.hz_summary(per_class)
    assert full == {"hz": 2.0, "p": pytest.approx(0.255), "normal_share": 0.5, "classes": 2, "dims": 15.0}
    assert A.hz_summary(per_class, "2d")["hz"] == 9.0
    assert A.hz_summary([], "full")["classes"] == 0


def test_principal_drops_dead_and_collinear_columns() -> None:
    rng = np.random.default_rng(0)
    base = rng.normal(size=(200, 3))
    rows = np.column_stack([base, np.zeros(200), base[:, 0] + base[:, 1]])  # a dead unit and a collinear one
    assert A.principal(rows).shape == (200, 3)
    assert A.principal(rows, k=2).shape == (200, 2)
    labels = np.array([0] * 198 + [1] * 2)  # class 1: two rows span one axis, not testable
    assert sorted(A.class_features(rows, labels)) == [0]


def test_henze_zirkler_tells_gaussian_from_skewed_features() -> None:
    import pingouin  # in the test extra: this test runs wherever the suite does

    rng = np.random.default_rng(1)
    gauss = A.principal(np.column_stack([rng.normal(size=(300, 4)), np.zeros(300)]))
    relu = A.principal(np.maximum(rng.normal(size=(300, 4)), 0.0))
    assert pingouin.multivariate_normality(gauss).pval > 0.05
    assert pingouin.multivariate_normality(relu).pval < 0.001


def test_latest_states_takes_each_clients_newest_training_state(tmp_path: Path) -> None:
    for pid, rnd in [(0, 9), (0, 10), (1, 8), (0, 7)]:
        f = tmp_path / "client-state" / "run-ab" / f"partition-{pid}" / f"round-{rnd}-train.state"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"")
    (tmp_path / "client-state" / "run-ab" / "partition-1" / "round-11-evaluate.state").write_bytes(b"")
    found = A.latest_states(tmp_path)
    assert {pid: p.name for pid, p in found.items()} == {0: "round-10-train.state", 1: "round-8-train.state"}


def test_alpha_table_rows_per_alpha_with_hz(tmp_path: Path) -> None:
    write_run(tmp_path / A.run_name(0.01, 0), [0.9, 0.98, 0.97])
    write_run(tmp_path / A.run_name(0.1, 0), [0.5, 0.6], status="running")  # unfinished: left out
    hz = [{"class": c, "hz": 2.0, "p": 0.1 * c, "space": s, "dims": 3 + c} for c in (0, 1) for s in ("full", "2d")]
    (tmp_path / A.run_name(0.01, 0) / A.HZ_FILE).write_text(json.dumps(hz))
    lines = A.table(tmp_path, [0.01, 0.1], [0]).splitlines()
    assert len(lines) == 3
    assert lines[2] == "| 0.01 | 1 | 3 | 97.00 ± – | 98.00 ± – | 3.5 | 2.00 ± – | 0.05 | 50 % of 2 | 2.00 ± – | 0.05 | 50 % of 2 |"


def test_table_a1_rows_beside_the_paper(tmp_path: Path) -> None:
    setting = T.setting_root(tmp_path, "mnist", 3)
    write_run(setting / "fedlog-seed0", [0.9, 0.971, 0.96], values_up=2000)
    write_run(setting / "fedavg-seed0", [0.5, 0.8], values_up=10**6)
    text = T.table(tmp_path, ["mnist"], [3, 5], [0])
    rows = {line.split(" | ")[1]: line for line in text.splitlines()[2:]}
    assert set(rows) == {"fedlog", "fedavg"}
    # fedlog reaches 97 % in round 2: 2 × 2000 bytes up = 32 kb; paper's 3-class figures beside it
    assert rows["fedlog"] == (
        "| mnist 3 (97%) | fedlog | 1 | 3 | 96.00 ± – | 97.10 ± – | 0.032 Mb | 0.08 Mb | 2 | 95.97 ± 0.15 | 5.96 Mb |"
    )
    # fedavg never reaches it: counted to its best round, and the paper has no FedAvg in Table A.1
    assert rows["fedavg"].endswith("| 16 Mb (1 not reached: to best) | 0.08 Mb (1 not reached: to best) | – | – | – |")
