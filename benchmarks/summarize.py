"""Collect result folders into a markdown table (beside the paper's figures) and
combined plots of accuracy vs round and vs cumulative bytes.

    .venv/bin/python -m benchmarks.summarize benchmarks/results/mnist-table1 --paper mnist
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from server.results import plot_curves

# FedLog (extended) Table 1: accuracy % and communication cost to the threshold
PAPER = {
    "mnist": {"threshold": 0.97, "fedavg": ("89.76 ± 0.69", "3.45 Gb"), "fedlog": ("98.15 ± 0.05", "3.18 Mb"), "fedlog-c": ("98.41 ± 0.07", "3.18 Mb")},
    "cifar10": {"threshold": 0.83, "fedavg": ("", ""), "fedlog": ("87.08 ± 0.22", "0.14 Gb"), "fedlog-c": ("87.57 ± 0.25", "0.11 Gb")},
}


def load_runs(root: Path) -> dict[str, list[tuple[dict, list[dict]]]]:
    """method -> [(summary, rounds)], the method being the folder name before '-seed'."""
    runs: dict[str, list] = defaultdict(list)
    for summary_path in sorted(root.glob("*/summary.json")):
        method = summary_path.parent.name.split("-seed")[0]
        rounds = [json.loads(line) for line in (summary_path.parent / "rounds.jsonl").read_text().splitlines()]
        runs[method].append((json.loads(summary_path.read_text()), rounds))
    return runs


def bytes_to(rounds: list[dict], threshold: float) -> tuple[int, bool]:
    """Cumulative bytes when accuracy first reaches ``threshold``; else up to the best round (as the paper does)."""
    for r in rounds:
        if r["accuracy"] is not None and r["accuracy"] >= threshold:
            return r["cumulative_bytes"], True
    best = max(rounds, key=lambda r: r["accuracy"] or 0)
    return best["cumulative_bytes"], False


def fmt_bytes(b: float) -> str:
    bits = 8 * b
    return f"{bits / 1e9:.3g} Gb" if bits >= 1e9 else f"{bits / 1e6:.3g} Mb"


def table(runs: dict, paper: str) -> str:
    ref = PAPER.get(paper, {})
    thr = ref.get("threshold", 0.0)
    lines = [f"| method | seeds | final accuracy % | best % | bits to {thr:.0%} (up + down) | rounds to {thr:.0%} | total bits | wall time | paper accuracy | paper cost |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for method, items in sorted(runs.items()):
        finals = np.array([s["final_accuracy"] for s, _ in items]) * 100
        bests = np.array([s["best_accuracy"] for s, _ in items]) * 100
        se = finals.std(ddof=1) / np.sqrt(len(finals)) if len(finals) > 1 else 0.0
        reach = [bytes_to(r, thr) for _, r in items]
        rounds_to = [next((r["round"] for r in rs if r["accuracy"] is not None and r["accuracy"] >= thr), None) for _, rs in items]
        cost = fmt_bytes(np.mean([b for b, _ in reach])) + ("" if all(ok for _, ok in reach) else " (not reached: to best)")
        total = fmt_bytes(np.mean([s["total_bytes"] for s, _ in items]))
        wall = np.mean([s["wall_seconds"] for s, _ in items]) / 60
        pa, pc = ref.get(method, ("", ""))
        rt = ", ".join(str(r) if r else "–" for r in rounds_to)
        lines.append(f"| {method} | {len(items)} | {finals.mean():.2f} ± {se:.2f} | {bests.mean():.2f} | {cost} | {rt} | {total} | {wall:.1f} min | {pa} | {pc} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("root", help="folder of result folders named METHOD-seedN")
    p.add_argument("--paper", default="mnist", choices=sorted(PAPER))
    args = p.parse_args()
    root = Path(args.root)
    runs = load_runs(root)
    md = table(runs, args.paper)
    (root / "table.md").write_text(md + "\n")
    plot_curves({m: items[0][1] for m, items in sorted(runs.items())}, root, f"FedLog Table 1 setup, {args.paper} (seed of the first run)")
    print(md)


if __name__ == "__main__":
    main()
