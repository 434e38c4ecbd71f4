"""Run one simulation per result folder (resumably) and read result folders back."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {"mnist": "benchmarks/configs/mnist-table1.toml", "cifar10": "benchmarks/configs/cifar10-table1.toml"}


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    """The options every benchmark command shares: seeds, run-config overrides, the
    results-folder tag and summarize-only."""
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a run-config key for every run that reads it (e.g. num-server-rounds=20; another method's key, "
        "such as lg-new-test, is left out of the runs of the methods that do not read it)",
    )
    p.add_argument("--tag", default="", help="suffix of the results folder, to keep reduced runs apart")
    p.add_argument("--summarize-only", action="store_true", help="only rewrite the table and plots from finished runs")


def results_root(name: str, tag: str) -> Path:
    """``benchmarks/results/<name>[-<tag>]``."""
    return ROOT / "benchmarks" / "results" / (name + (f"-{tag}" if tag else ""))


def finished(folder: Path) -> bool:
    """Whether ``folder`` holds a complete run: a summary.json whose status is "complete"
    (runs written before summaries had a status count as complete)."""
    try:
        summary = json.loads((folder / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return summary.get("status", "complete") == "complete"


def simulate(dataset: str, out: Path, overrides: Mapping[str, Any], sets: Sequence[str] = ()) -> None:
    """One ``python -m headway.simulation`` run of the dataset's Table 1 config (or of the config
    file ``dataset`` names, when it is not a key of CONFIGS) in a fresh process
    (a fresh Ray), with ``overrides`` then ``sets`` on top; skipped if ``out`` holds a
    complete run, and run again over what a failed or interrupted run left there."""
    if finished(out):
        print(f"skip {out} (done)", flush=True)
        return
    args = [sys.executable, "-m", "simulation", CONFIGS.get(dataset, dataset), "--out", str(out)]
    if out.is_dir() and any(out.iterdir()):
        args.append("--overwrite")  # an earlier run of this folder stopped before completing
    for key, value in overrides.items():
        args += ["--set", f"{key}={value}"]
    for s in read_by_run(CONFIGS.get(dataset, dataset), overrides, sets):
        args += ["--set", s]
    print("run", " ".join(args[1:]), flush=True)
    subprocess.run(args, cwd=ROOT, check=True)


def read_by_run(config: str, overrides: Mapping[str, Any], sets: Sequence[str]) -> list[str]:
    """The benchmark's ``sets`` (given for every run) that this run of ``config`` with ``overrides`` reads: one of another
    method's keys (lg-new-test=False on a FedAvg arm) is left out of it, with a line saying so, where `headway run` would
    refuse it (headway.core.config: a method key the run does not read is an error)."""
    from headway.core.config import SCHEMA
    from headway.core.methods import keys_not_read
    from headway.simulation.runner import parse_sets, read_config_file

    given = parse_sets(list(sets))
    run = {**read_config_file(str(ROOT / config)), **overrides, **given}
    algorithm, inputs = (str(run.get(k, SCHEMA[k].default)) for k in ("algorithm", "inputs"))
    unread = set(keys_not_read(algorithm, given, inputs))
    kept = [s for s in sets if s.split("=", 1)[0].strip() not in unread]
    for s in sorted(set(sets) - set(kept)):
        print(f"--set {s} left out of this {algorithm} run: algorithm={algorithm} does not read it", flush=True)
    return kept


def load_run(folder: Path) -> tuple[dict, list[dict]]:
    """(summary, per-round rows) of one finished result folder."""
    rounds = [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines() if line.strip()]
    return json.loads((folder / "summary.json").read_text()), rounds


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error (nan with one value)."""
    v = np.asarray(values, dtype=float)
    se = float(v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
    return float(v.mean()), se


def fmt_mean_se(values: Sequence[float], scale: float = 100.0) -> str:
    """'mean ± s.e.' of ``values`` × ``scale`` with two decimals ('–' for the s.e. of one value)."""
    m, se = mean_se([x * scale for x in values])
    return f"{m:.2f} ± " + (f"{se:.2f}" if np.isfinite(se) else "–")
