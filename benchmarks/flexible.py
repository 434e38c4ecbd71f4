"""FedLog with flexible architectures (fedlog-extended §4.4, Figure 3 left), on CIFAR-10
since CIFAR-100 is not available offline: half the clients run `cifar-cnn-small` (the
second-to-last fully connected layer removed) and every client starts from its own body
initialization (`body-init=per-client`), under one global head; beside the same method
with every client on `cifar-cnn` from one initialization.

    .venv/bin/python -m benchmarks.flexible --set num-server-rounds=40 --tag r40 \\
        --reference benchmarks/results/table1-cifar10

Writes ``benchmarks/results/flexible-cifar10[-<tag>]/<method>-<arm>-seed<N>/``
resumably, then ``table.md`` and ``accuracy_vs_round.png``. With ``--reference``, the
all-`cifar-cnn` arm is read from that folder's ``<method>-seed<N>`` Table 1 runs (cut to
this run's rounds) instead of being run again; without noise, nothing in FedLog
depends on the total number of rounds, so their first R rounds are an R-round run.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from headway.server.results import plot_curves

from benchmarks.compare import METHODS
from benchmarks.runner import add_run_arguments, finished, fmt_mean_se, load_run, results_root, simulate
from benchmarks.summarize import mean_curve

ARMS = {
    "all-cifar-cnn": {"body-init": "shared"},  # the config's body, cifar-cnn, for every client
    "half-small": {"bodies": "cifar-cnn,cifar-cnn-small", "body-init": "per-client"},
}


def arm_runs(
    root: Path, reference: Path | None, method: str, arm: str, seeds: list[int], rounds: int | None
) -> list[tuple[dict, list[dict]]]:
    """The finished runs of one (method, arm), each cut to ``rounds`` rounds."""
    folders = [
        (reference / f"{method}-seed{s}" if arm == "all-cifar-cnn" and reference else root / f"{method}-{arm}-seed{s}") for s in seeds
    ]
    runs = [load_run(f) for f in folders if finished(f)]
    return [(summary, rows[:rounds] if rounds else rows) for summary, rows in runs]


def table(results: dict[str, list[tuple[dict, list[dict]]]]) -> str:
    lines = ["| method | arm | seeds | rounds | final accuracy % | best % | bits (up + down) |", "|---|---|---|---|---|---|---|"]
    for label, items in results.items():
        finals = [rows[-1]["accuracy"] for _, rows in items]
        best = max(max(r["accuracy"] or 0 for r in rows) for _, rows in items) * 100
        bits = sum(8 * rows[-1]["cumulative_bytes"] for _, rows in items) / len(items)
        method, arm = label.split(" / ")
        lines.append(f"| {method} | {arm} | {len(items)} | {len(items[0][1])} | {fmt_mean_se(finals)} | {best:.2f} | {bits / 1e6:.1f} Mb |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.flexible", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--methods", nargs="+", default=["fedlog", "fedlog-c"], choices=list(METHODS))
    p.add_argument("--reference", type=Path, help="Table 1 results folder to take the all-cifar-cnn arm from")
    add_run_arguments(p)
    args = p.parse_args(argv)
    root = results_root("flexible-cifar10", args.tag)
    if not args.summarize_only:
        for seed in args.seeds:
            for method in args.methods:
                for arm, overrides in ARMS.items():
                    if arm == "all-cifar-cnn" and args.reference:
                        continue
                    simulate("cifar10", root / f"{method}-{arm}-seed{seed}", {"seed": seed, **METHODS[method], **overrides}, args.set)
    flex = {m: arm_runs(root, None, m, "half-small", args.seeds, None) for m in args.methods}
    results = {}
    for method in args.methods:
        n = min((len(rows) for _, rows in flex[method]), default=None)
        for arm in ARMS:
            items = flex[method] if arm == "half-small" else arm_runs(root, args.reference, method, arm, args.seeds, n)
            if items:
                results[f"{method} / {arm}"] = items
    if not results:
        raise SystemExit(f"no finished runs under {root}")
    md = table(results)
    (root / "table.md").write_text(md + "\n")
    plot_curves({label: mean_curve(items) for label, items in results.items()}, root, "FedLog, flexible architecture, CIFAR-10")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
