"""FedLog's Table 1 comparison: every method on the same data, bodies and byte accounting.

    .venv/bin/python -m benchmarks.compare mnist --seeds 0 1 2
    .venv/bin/python -m benchmarks.compare cifar10 --seeds 0 --set num-server-rounds=10

Runs each (method, seed) as its own simulation (``python -m headway.simulation``) into
``benchmarks/results/table1-<dataset>[-<tag>]/<method>-seed<N>/``, skipping runs whose
``summary.json`` says complete (a failed or interrupted run is run again), then writes ``table.md`` (mean ± standard error of the final
accuracy, bytes to the paper's threshold, the paper's figures) and the plots.
"""

from __future__ import annotations

import argparse

from benchmarks.runner import CONFIGS, add_run_arguments, results_root, simulate
from benchmarks.summarize import summarize

# method -> run-config overrides; hyperparameters shared by all come from the dataset's config
METHODS: dict[str, dict[str, object]] = {
    "fedavg": {"algorithm": "fedavg"},
    "lg-fedavg-1": {"algorithm": "lg-fedavg", "lg-global-layers": 1},
    "lg-fedavg-2": {"algorithm": "lg-fedavg", "lg-global-layers": 2},
    "fedper": {"algorithm": "fedper", "fedper-local-layers": 2},
    "fedrep-1": {"algorithm": "fedrep", "fedrep-local-layers": 1},
    "fedrep-2": {"algorithm": "fedrep", "fedrep-local-layers": 2},
    "fedproto": {"algorithm": "fedproto"},
    "fedlog": {"algorithm": "fedlog"},
    "fedlog-c": {"algorithm": "fedlog", "fedlog-alpha": 0.01},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("dataset", choices=sorted(CONFIGS))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    add_run_arguments(p)
    args = p.parse_args(argv)
    root = results_root(f"table1-{args.dataset}", args.tag)
    if not args.summarize_only:
        for seed in args.seeds:
            for method in args.methods:
                simulate(args.dataset, root / f"{method}-seed{seed}", {"seed": seed, **METHODS[method]}, args.set)
    print(summarize(root, args.dataset))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
