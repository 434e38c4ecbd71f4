"""FedProf §5 benchmarks: FedProf against FedAvg with uniform random selection, in the same
aggregation mode (full or partial), and against FedProx in the partial group (as the paper's
Table 1 groups them), on the same clients and seeds.

The FedAvg arm is FedProf with ``fedprof-alpha=0``: every score is 1, so clients are drawn
uniformly without replacement and aggregated exactly as FedProf aggregates; the only
difference is the selection. (Its clients still send their profiles, which the bytes show.)

    python -m benchmarks.fedprof mnist --seeds 0 1 2                 # the paper's lengths
    python -m benchmarks.fedprof mnist --seeds 0 1 2 --rounds 120 40 --tag short
    python -m benchmarks.fedprof mnist --summarize-only --tag short
    python -m benchmarks.fedprof mnist --modes full-cache --seeds 0 --rounds 120 40 --tag short

Runs resume: a finished run folder is skipped. Results go to
``benchmarks/results/fedprof-<task>[-<tag>]/<mode>/<method>-s<seed>/``; the table, plots
and figures are written beside them by :mod:`benchmarks.fedprof_report`.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from headway.strategies.fedprof import SECRET_ENV

from benchmarks.runner import add_run_arguments, results_root, simulate

TASKS = {
    # task: (config, paper's T_max for full and partial aggregation)
    "mnist": ("benchmarks/configs/fedprof-mnist.toml", (240, 80)),
    "gasturbine": ("benchmarks/configs/fedprof-gasturbine.toml", (500, 500)),
    "cifar10": ("benchmarks/configs/fedprof-cifar10.toml", (150, 120)),
}
MODES = ("full", "partial")  # the paper's two groups; their T_max are TASKS' pair
# full-cache: the other reading of full aggregation (an unselected client counts with its last
# local model, not the current global model); it belongs to the paper's full group
GROUP = {"full": "full", "full-cache": "full", "partial": "partial"}
# method label -> run-config overrides. FedProx is in the paper's partial group only (its Table 1):
# FedProx's own scheme, K draws with replacement by data ratio n_k/n and the draws averaged
# with equal weight, with the proximal term mu (fedprox-mu, 0.01 by default: FedProx's paper
# tunes mu per task among 0.001-1 and the FedProf paper does not say which it used).
METHODS: dict[str, dict[str, Any]] = {
    "fedprof": {},
    "fedavg": {"fedprof-alpha": 0.0},
    "fedprox": {"algorithm": "fedprox", "client-sampling": "data-ratio"},
}
MODES_OF = {"fedprox": ("partial",)}  # methods run in some modes only


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fedprof", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("task", choices=sorted(TASKS))
    p.add_argument("--modes", nargs="+", choices=list(GROUP), default=list(MODES))
    p.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=list(METHODS))
    p.add_argument(
        "--rounds",
        type=int,
        nargs=2,
        metavar=("FULL", "PARTIAL"),
        help="rounds of full and partial runs (default: the paper's T_max); give a --tag when shortening",
    )
    add_run_arguments(p)
    args = p.parse_args(argv)
    # FedProf draws D^V from OS entropy unless the server has a secret: a benchmark must be
    # repeatable, and in simulation the clients share the server's environment anyway
    os.environ.setdefault(SECRET_ENV, "headway-benchmarks")
    config, paper_rounds = TASKS[args.task]
    group_rounds = dict(zip(MODES, args.rounds or paper_rounds))
    rounds = {mode: group_rounds[group] for mode, group in GROUP.items()}
    shortened = any(rounds[m] < r for m, r in zip(MODES, paper_rounds))
    if shortened and not args.tag and not args.summarize_only:
        p.error(f"--rounds {args.rounds} shortens the paper's runs ({paper_rounds}); name the results with --tag (e.g. --tag short)")
    root = results_root(f"fedprof-{args.task}", args.tag)
    if not args.summarize_only:
        for seed in args.seeds:
            for mode in args.modes:
                for method in (m for m in args.methods if mode in MODES_OF.get(m, GROUP)):
                    overrides = {
                        "algorithm": "fedprof",
                        "fedprof-aggregation": mode,
                        "num-server-rounds": rounds[mode],
                        "seed": seed,
                        **METHODS[method],
                    }
                    simulate(config, root / mode / f"{method}-s{seed}", overrides, args.set)
    from benchmarks.fedprof_report import report

    report(root, args.task, paper_rounds)


if __name__ == "__main__":
    main()
