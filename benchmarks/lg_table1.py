"""LG-FedAvg Table 1 (Liang et al. 2020, §4.1): accuracy and parameters communicated, MNIST and CIFAR-10.

100 devices, non-iid by shards (200 shards of 300 MNIST / 250 CIFAR-10 training rows, 2 a device; the test set
follows each device's classes), LeNet-5, C = 0.1, E = 1, B = 50, SGD (momentum 0.5; lr 0.05 MNIST, 0.1 CIFAR-10:
the authors' scripts). Arms: FedAvg until the goal accuracy (97.5 % MNIST, 57 % CIFAR-10: ``goal-accuracy``);
LG-FedAvg whose warm-up is that FedAvg run (``lg-warmup-goal``), then ``--lg-rounds`` rounds averaging only the two
convolutions (``lg-global-layers = "convs.*"``, as the paper's text says); local only (each device alone, when the
method ``local-only`` exists). Local test: the last round's pooled client accuracy; new test: LG-FedAvg's ensemble
of local models on the whole test set, FedAvg's global model on it (``global-eval``), local only's ensemble.

    headway bench lg_table1                                          # the paper's MNIST setting, one seed
    headway bench lg_table1 --dataset cifar10                        # CIFAR-10 (goal 57 %, 60 LG rounds)
    headway bench lg_table1 --goal 0.95 --max-rounds 250 --eval-every 5 --tag short   # a shortened run

A run stops at its goal, or at ``--max-rounds`` (num-server-rounds) when it never gets there: the table says which.
LG-FedAvg's warm-up is capped (``lg-warmup-rounds``) at ``--max-rounds`` minus its LG rounds, so it always gets them.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from headway.core.goal import first_round_reaching
from headway.core.methods import METHODS

from benchmarks.runner import add_run_arguments, finished, load_run, results_root, simulate

CONFIGS = {"mnist": "benchmarks/configs/lg-table1-mnist.toml", "cifar10": "benchmarks/configs/lg-table1-cifar10.toml"}
GOALS = {"mnist": 0.975, "cifar10": 0.57}
PAPER_LG_ROUNDS = {"mnist": 50, "cifar10": 60}  # Table 1: 400 FedAvg + 50 LG rounds (MNIST), 1200 + 60 (CIFAR-10)
GLOBAL = "convs.*"  # "the two convolutional layers as our global model"
ARMS = ("fedavg", "lg-fedavg", "local-only")
# the paper's Table 1 (mean over 10 runs): local test %, new test %, FedAvg rounds, LG rounds, parameters communicated
PAPER: dict[tuple[str, str], tuple[str, str, str, str, str]] = {
    ("mnist", "fedavg"): ("98.15", "98.15", "725", "0", "5.05e10"),
    ("mnist", "lg-fedavg"): ("98.66", "97.81", "400", "50", "2.80e10"),
    ("mnist", "local-only"): ("97.17", "84.01", "0", "0", "0"),
    ("cifar10", "fedavg"): ("59.94", "59.94", "1850", "0", "1.30e10"),
    ("cifar10", "lg-fedavg"): ("89.66", "59.63", "1200", "60", "8.48e9"),
    ("cifar10", "local-only"): ("86.81", "54.83", "0", "0", "0"),
}


def overrides(arm: str, goal: float, lg_rounds: int, max_rounds: int, eval_every: int, seed: int) -> dict[str, Any]:
    """One arm's run-config keys on top of the data set's config."""
    out: dict[str, Any] = {"algorithm": arm, "seed": seed, "num-server-rounds": max_rounds, "eval-every": eval_every}
    if arm == "fedavg":
        out.update({"goal-accuracy": goal, "global-eval": True})  # new test: the global model on the whole test set
    elif arm == "lg-fedavg":
        cap = max(1, max_rounds - lg_rounds)  # a goal never reached still leaves the LG rounds
        out.update(
            {"lg-warmup-goal": goal, "lg-warmup-rounds": cap, "lg-rounds": lg_rounds, "lg-global-layers": GLOBAL, "lg-new-test": True}
        )
    return out


def row(folder: Path) -> dict[str, Any]:
    """What a finished run gives the table."""
    summary, rounds = load_run(folder)
    last = rounds[-1] if rounds else {}
    warmup = summary.get("warmup_rounds_used")
    algorithm = summary.get("algorithm")
    fedavg_rounds = summary["rounds"] if algorithm == "fedavg" else (warmup or 0)
    params = summary.get("params_communicated")
    return {
        "local": summary.get("final_accuracy"),
        "new": last.get("new_test_accuracy", last.get("global_accuracy")),
        "fedavg_rounds": fedavg_rounds if algorithm != "local-only" else 0,
        "lg_rounds": summary["rounds"] - (warmup or 0) if algorithm == "lg-fedavg" else 0,
        "goal": summary.get("goal_round") if algorithm == "fedavg" else warmup_goal_round(folder, rounds, warmup),
        "params": params,
        "params_from_bytes": params is None,
        "value_bytes": summary.get("total_values_bytes"),
        "wire_bytes": summary.get("total_bytes"),
        "seconds": summary.get("wall_seconds") or 0.0,
    }


def warmup_goal_round(folder: Path, rounds: list[dict[str, Any]], warmup: int | None) -> int | None:
    """The warm-up round that reached ``lg-warmup-goal`` (None: the warm-up ended at its cap, or never)."""
    goal = float(json.loads((folder / "config.json").read_text()).get("lg-warmup-goal") or 0.0)
    return first_round_reaching([r for r in rounds if r["round"] <= (warmup or 0)], goal)


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def goal_cell(arm: str, goal_round: int | None) -> str:
    """The round the goal was reached at (FedAvg: the run's; LG-FedAvg: its warm-up's); local only has no goal."""
    if arm == "local-only":
        return "–"
    return "not reached" if goal_round is None else str(goal_round)


def params_cell(r: dict[str, Any]) -> str:
    """Parameters communicated: the run's own count, else array-value bytes / 4 (float32), marked ≈."""
    if not r["params_from_bytes"]:
        return f"{r['params']:.3g}"
    return "–" if r["value_bytes"] is None else f"≈{r['value_bytes'] / 4:.3g}"


def table(root: Path, dataset: str, keys: list[tuple[str, int]], goal: float, lg_rounds: int, max_rounds: int) -> str:
    """The markdown table of every finished run under ``root`` beside the paper's numbers."""
    lines = [
        f"{dataset}: goal {100 * goal:g} % (paper {100 * GOALS[dataset]:g} %), {lg_rounds} LG rounds after the warm-up, "
        f"at most {max_rounds} rounds a run (local only: as many as its results folder's config.json says). Paper cells in brackets.",
        "",
        "| arm | seed | local test | new test | FedAvg rounds | LG rounds | goal round | params communicated | wire bytes | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, seed in keys:
        folder = root / f"{arm}-s{seed}"
        if not finished(folder):
            continue
        r = row(folder)
        p = PAPER[(dataset, arm)]
        lines.append(
            f"| {arm} | {seed} | {pct(r['local'])} ({p[0]}) | {pct(r['new'])} ({p[1]}) | {r['fedavg_rounds']} ({p[2]}) | "
            f"{r['lg_rounds']} ({p[3]}) | {goal_cell(arm, r['goal'])} | {params_cell(r)} ({p[4]}) | "
            f"{r['wire_bytes']:.3g} | {r['seconds']:.0f} |"
        )
    if any(row(root / f"{a}-s{s}")["params_from_bytes"] for a, s in keys if finished(root / f"{a}-s{s}")):
        lines += ["", "≈: parameters from the array-value bytes / 4 (float32): the run did not count them (no params_communicated)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="headway bench lg_table1", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", choices=list(CONFIGS), default="mnist")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS))
    p.add_argument("--goal", type=float, default=None, help="goal accuracy (default: the paper's, 0.975 MNIST / 0.57 CIFAR-10)")
    p.add_argument("--lg-rounds", type=int, default=None, help="LG-FedAvg rounds after the warm-up (default: the paper's, 50 / 60)")
    p.add_argument("--max-rounds", type=int, default=None, help="cap on every run's rounds (default: the config's num-server-rounds)")
    p.add_argument("--local-rounds", type=int, default=None, help="rounds of the local-only arm (default: --max-rounds)")
    p.add_argument("--eval-every", type=int, default=1, help="clients score themselves every this many rounds (the goal is checked then)")
    add_run_arguments(p)
    args = p.parse_args(argv)
    goal = GOALS[args.dataset] if args.goal is None else args.goal
    lg_rounds = PAPER_LG_ROUNDS[args.dataset] if args.lg_rounds is None else args.lg_rounds
    max_rounds = args.max_rounds or (1500 if args.dataset == "mnist" else 3000)
    shortened = goal != GOALS[args.dataset] or args.eval_every != 1 or lg_rounds != PAPER_LG_ROUNDS[args.dataset] or args.max_rounds
    if shortened and not args.tag and not args.summarize_only:
        p.error("a goal, cap, evaluation interval or LG rounds other than the paper's: name the results with --tag (e.g. --tag short)")
    root = results_root(f"lg-fedavg/table1/{args.dataset}", args.tag)
    arms = [a for a in args.arms if a in METHODS]
    if missing := [a for a in args.arms if a not in METHODS]:
        print(f"skipping {', '.join(missing)}: no such method in this checkout", flush=True)
    keys = [(arm, seed) for seed in args.seeds for arm in arms]
    for arm, seed in keys:
        if args.summarize_only:
            break
        rounds = (args.local_rounds or max_rounds) if arm == "local-only" else max_rounds
        simulate(CONFIGS[args.dataset], root / f"{arm}-s{seed}", overrides(arm, goal, lg_rounds, rounds, args.eval_every, seed), args.set)
        (root / "table.md").write_text(table(root, args.dataset, keys, goal, lg_rounds, max_rounds))  # as runs finish
    root.mkdir(parents=True, exist_ok=True)
    text = table(root, args.dataset, keys, goal, lg_rounds, max_rounds)
    (root / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
