"""Collect result folders into a markdown table beside FedLog's Table 1 and plots of
accuracy vs round and vs cumulative bytes (mean over seeds, one line per method).

    .venv/bin/python -m benchmarks.summarize benchmarks/results/table1-mnist --paper mnist
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
from headway.server.results import plot_curves

from benchmarks.runner import finished, fmt_mean_se, load_run

# fedlog-extended Table 1: accuracy % (mean ± s.e., 10 seeds) and communication cost to the threshold
PAPER: dict[str, dict[str, Any]] = {
    "mnist": {
        "threshold": 0.97,
        "fedavg": ("89.76 ± 0.69", "3.45 Gb"),
        "lg-fedavg-1": ("97.85 ± 0.05", "4.81 Mb"),
        "lg-fedavg-2": ("98.18 ± 0.06", "0.16 Gb"),
        "fedper": ("96.16 ± 0.19", "0.65 Gb"),
        "fedrep-1": ("98.15 ± 0.07", "0.18 Gb"),
        "fedrep-2": ("95.51 ± 0.29", "36.3 Mb"),
        "fedproto": ("98.19 ± 0.06", "3.02 Mb"),
        "fedlog": ("98.15 ± 0.05", "3.18 Mb"),
        "fedlog-c": ("98.41 ± 0.07", "3.18 Mb"),
    },
    "cifar10": {
        "threshold": 0.83,
        "fedavg": ("26.29 ± 0.44", "37.9 Gb"),
        "lg-fedavg-1": ("86.57 ± 0.29", "0.26 Gb"),
        "lg-fedavg-2": ("85.56 ± 0.32", "3.38 Gb"),
        "fedper": ("83.54 ± 0.40", "27.7 Gb"),
        "fedrep-1": ("83.23 ± 0.40", "27.34 Gb"),
        "fedrep-2": ("82.96 ± 0.35", "15.3 Gb"),
        "fedproto": ("87.37 ± 0.26", "0.18 Gb"),
        "fedlog": ("87.08 ± 0.22", "0.14 Gb"),
        "fedlog-c": ("87.57 ± 0.25", "0.11 Gb"),
    },
}
ORDER = list(PAPER["mnist"])[1:]


def load_runs(root: Path) -> dict[str, list[tuple[dict, list[dict]]]]:
    """method -> [(summary, rounds)], the method being the folder name before '-seed'."""
    runs: dict[str, list] = defaultdict(list)
    for summary_path in sorted(root.glob("*/summary.json")):
        if finished(summary_path.parent):
            runs[summary_path.parent.name.split("-seed")[0]].append(load_run(summary_path.parent))
    return runs


def bytes_to(rounds: list[dict], threshold: float) -> tuple[int, bool]:
    """Cumulative bytes when accuracy first reaches ``threshold``; else up to the best round (as the paper does)."""
    for r in rounds:
        if r["accuracy"] is not None and r["accuracy"] >= threshold:
            return r["cumulative_bytes"], True
    best = max(rounds, key=lambda r: r["accuracy"] or 0)
    return best["cumulative_bytes"], False


def values_up_to(rounds: list[dict], threshold: float) -> float | None:
    """Array-value bytes sent up (the papers' count: one direction, no framing) until
    accuracy first reaches ``threshold``, else to the best round; None for runs written
    before value bytes were recorded."""
    if not rounds or any("values_bytes_up" not in r for r in rounds):
        return None
    hit = next((i for i, r in enumerate(rounds) if r["accuracy"] is not None and r["accuracy"] >= threshold), None)
    if hit is None:
        hit = max(range(len(rounds)), key=lambda i: rounds[i]["accuracy"] or 0)
    return float(sum(r["values_bytes_up"] for r in rounds[: hit + 1]))


def fmt_bytes(b: float) -> str:
    bits = 8 * b
    return f"{bits / 1e9:.3g} Gb" if bits >= 1e9 else f"{bits / 1e6:.3g} Mb"


def _sorted(methods) -> list[str]:
    return sorted(methods, key=lambda m: (ORDER.index(m) if m in ORDER else len(ORDER), m))


def table(runs: dict, paper: str) -> str:
    ref = PAPER.get(paper, {})
    thr = ref.get("threshold", 0.0)
    lines = [
        f"| method | seeds | rounds | final accuracy % | best % | bits to {thr:.0%} (up + down) | round reached | value bits up to {thr:.0%} (the paper's count) | total bits | wall time | paper accuracy | paper cost |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method in _sorted(runs):
        items = runs[method]
        bests = np.array([s["best_accuracy"] for s, _ in items]) * 100
        reach = [bytes_to(r, thr) for _, r in items]
        rounds_to = [next((r["round"] for r in rs if r["accuracy"] is not None and r["accuracy"] >= thr), None) for _, rs in items]
        reached = sum(ok for _, ok in reach)
        cost = fmt_bytes(float(np.mean([b for b, _ in reach]))) + (
            "" if reached == len(reach) else f" ({len(reach) - reached} not reached: to best)"
        )
        total = fmt_bytes(float(np.mean([s["total_bytes"] for s, _ in items])))
        wall = np.mean([s["wall_seconds"] for s, _ in items]) / 60
        pa, pc = ref.get(method, ("", ""))
        rt = ", ".join(str(r) if r else "–" for r in rounds_to)
        n_rounds = max(len(r) for _, r in items)
        final = fmt_mean_se([s["final_accuracy"] for s, _ in items])
        values = [v for _, r in items if (v := values_up_to(r, thr)) is not None]
        vcost = fmt_bytes(float(np.mean(values))) + ("" if reached == len(reach) else " (to best)") if len(values) == len(items) else "–"
        lines.append(
            f"| {method} | {len(items)} | {n_rounds} | {final} | {bests.mean():.2f} | {cost} | {rt} | {vcost} | {total} | {wall:.1f} min | {pa} | {pc} |"
        )
    return "\n".join(lines)


def mean_curve(items: list[tuple[dict, list[dict]]]) -> list[dict]:
    """Per-round mean accuracy and cumulative bytes over the seeds (rounds all runs have)."""
    n = min(len(r) for _, r in items)
    out = []
    for i in range(n):
        rows = [r[i] for _, r in items]
        accs = [row["accuracy"] for row in rows if row.get("accuracy") is not None]
        out.append(
            {
                "round": i + 1,
                "accuracy": float(np.mean(accs)) if accs else None,
                "cumulative_bytes": float(np.mean([row["cumulative_bytes"] for row in rows])),
            }
        )
    return out


def summarize(root: Path, paper: str) -> str:
    """Write ``table.md`` and the two plots into ``root``; return the table."""
    runs = load_runs(root)
    if not runs:
        raise SystemExit(f"no finished runs (*/summary.json) under {root}")
    md = table(runs, paper)
    (root / "table.md").write_text(md + "\n")
    seeds = sorted({len(items) for items in runs.values()})
    plot_curves(
        {m: mean_curve(runs[m]) for m in _sorted(runs)}, root, f"FedLog Table 1 setup, {paper} (mean of {'/'.join(map(str, seeds))} seeds)"
    )
    return md


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", help="folder of result folders named METHOD-seedN")
    p.add_argument("--paper", default="mnist", choices=sorted(PAPER))
    args = p.parse_args()
    print(summarize(Path(args.root), args.paper))


if __name__ == "__main__":
    main()
