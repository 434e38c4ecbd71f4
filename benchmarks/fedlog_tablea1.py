"""FedLog's Table A.1 (fedlog-extended App. D.2): 3 and 5 classes per client, MNIST and CIFAR-10.

    headway bench fedlog_tablea1 mnist --classes 3 5 --set num-server-rounds=20 --tag r20
    headway bench fedlog_tablea1 cifar10 --classes 3 5 --set num-server-rounds=10 --tag r10

Runs FedLog, FedLog-C (α = 0.01) and FedAvg on the dataset's Table 1 config with
``classes-per-client`` = 3 or 5 (``partition=pathological``: every client that many distinct
classes, its test rows from the same classes), one folder per (classes, method, seed) under
``benchmarks/results/fedlog-table-a1[-TAG]/<dataset>-c<K>/`` (resumable), then prints and
writes ``table.md`` beside the paper's figures. The paper does not give Table A.1's cost
threshold: the cost columns use Table 1's (97 % MNIST, 83 % CIFAR-10) and, where a run never
reaches it, count to its best round, as the paper does. FedAvg is not in the paper's Table A.1
(it lists LG-FedAvg 1, FedProto, FedLog and FedLog-C): its paper cells are empty.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from benchmarks.compare import METHODS as TABLE1_METHODS
from benchmarks.runner import CONFIGS, add_run_arguments, finished, fmt_mean_se, load_run, results_root, simulate
from benchmarks.summarize import PAPER as TABLE1
from benchmarks.summarize import bytes_to, fmt_bytes, values_up_to

METHODS = ("fedlog", "fedlog-c", "fedavg")
# fedlog-extended Table A.1: (accuracy % mean ± s.e. over 10 seeds, comm cost) per (dataset, classes per client)
PAPER_A1: dict[tuple[str, int], dict[str, tuple[str, str]]] = {
    ("mnist", 3): {"fedlog": ("95.97 ± 0.15", "5.96 Mb"), "fedlog-c": ("96.13 ± 0.10", "4.08 Mb")},
    ("mnist", 5): {"fedlog": ("92.43 ± 0.18", "6.12 Mb"), "fedlog-c": ("92.53 ± 0.21", "3.18 Mb")},
    ("cifar10", 3): {"fedlog": ("78.48 ± 0.33", "0.31 Gb"), "fedlog-c": ("79.18 ± 0.31", "0.22 Gb")},
    ("cifar10", 5): {"fedlog": ("68.06 ± 0.39", "0.28 Gb"), "fedlog-c": ("69.06 ± 0.33", "0.17 Gb")},
}


def setting_root(root: Path, dataset: str, classes: int) -> Path:
    """The folder of one Table A.1 column: ``root/<dataset>-c<classes>``."""
    return root / f"{dataset}-c{classes}"


def row(setting: str, method: str, runs: list[tuple[dict, list[dict]]], threshold: float, paper: tuple[str, str]) -> str:
    """One markdown row: accuracy, value bits up to ``threshold`` (to the best round where a run
    never reaches it, marked), the rounds reached, beside the paper's accuracy and cost."""
    reached = [next((r["round"] for r in rows if r["accuracy"] is not None and r["accuracy"] >= threshold), None) for _, rows in runs]
    values = [values_up_to(rows, threshold) for _, rows in runs]
    missing = sum(r is None for r in reached)
    up = "–" if any(v is None for v in values) else fmt_bytes(sum(v for v in values if v is not None) / len(values))
    both = fmt_bytes(sum(bytes_to(rows, threshold)[0] for _, rows in runs) / len(runs))
    note = f" ({missing} not reached: to best)" if missing else ""
    return (
        f"| {setting} | {method} | {len(runs)} | {len(runs[0][1])} | {fmt_mean_se([s['final_accuracy'] for s, _ in runs])} | "
        f"{fmt_mean_se([s['best_accuracy'] for s, _ in runs])} | {up}{note} | {both}{note} | "
        f"{', '.join(str(r) if r else '–' for r in reached)} | {paper[0] or '–'} | {paper[1] or '–'} |"
    )


def table(root: Path, datasets: Sequence[str], classes: Sequence[int], seeds: Sequence[int]) -> str:
    """The markdown table of the finished runs under ``root``."""
    lines = [
        "| data, classes per client | method | seeds | rounds | final accuracy % | best % | value bits up to the threshold (the paper's count) "
        "| bits both ways to the threshold | round reached | paper accuracy | paper cost |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in datasets:
        threshold = float(TABLE1[dataset]["threshold"])
        for k in classes:
            for method in METHODS:
                folders = [setting_root(root, dataset, k) / f"{method}-seed{s}" for s in seeds]
                runs = [load_run(f) for f in folders if finished(f)]
                if runs:
                    paper = PAPER_A1.get((dataset, k), {}).get(method, ("", ""))
                    lines.append(row(f"{dataset} {k} ({threshold:.0%})", method, runs, threshold, paper))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="headway bench fedlog_tablea1", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("datasets", nargs="*", default=["mnist"], help=f"any of {', '.join(sorted(CONFIGS))} (default: mnist)")
    p.add_argument("--classes", type=int, nargs="+", default=[3, 5], help="classes per client (the paper: 3 and 5)")
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    add_run_arguments(p)
    args = p.parse_args(argv)
    unknown = sorted(set(args.datasets) - set(CONFIGS))
    if unknown:
        p.error(f"unknown data set {', '.join(unknown)}: give any of {', '.join(sorted(CONFIGS))}")
    root = results_root("fedlog-table-a1", args.tag)
    if not args.summarize_only:
        for dataset in args.datasets:
            for k in args.classes:
                for seed in args.seeds:
                    for method in args.methods:
                        keys = {**TABLE1_METHODS[method], "classes-per-client": k, "seed": seed}
                        simulate(dataset, setting_root(root, dataset, k) / f"{method}-seed{seed}", keys, args.set)
    text = table(root, args.datasets, args.classes, args.seeds)
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
