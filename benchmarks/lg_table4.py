"""LG-FedAvg Table 4 (Liang et al. 2020): fair local representations on UCI Adult, race and sex protected.

10 devices, iid or non-iid (``shards``: 100 shards of 150 rows, 10 a device), about 15,000 training rows
(``train-fraction`` 0.4607 of adult.data, a stratified draw: not the paper's first 15,000 rows). Three arms:

- ``fedavg``: every round a warm-up round (``lg-warmup-rounds``: FedAvg on the whole model), not trained against the
  adversary (λ = 0); the adversary is each client's own, trained on the global model's representation and never
  averaged (the paper averages a global adversary by FedAvg: here it stays local, a deviation said in the README);
- ``lg-fedavg-adv``: LG-FedAvg (the head global, the body local), λ = 0: the adversary trained and scored, not fought;
- ``lg-fedavg+adv``: the same with λ = 30 (the authors' ``lambdas``): Eq. 6.

Scores (the last evaluated round, pooled over the clients' local test splits): classifier accuracy and ROC AUC,
the adversary's ROC AUC and a fresh post-hoc adversary's AUC on the frozen local representations.

    headway bench lg_table4                      # 10 rounds (the authors' global_epochs), one seed
    headway bench lg_table4 --partitions iid --set num-server-rounds=3 --tag short
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.runner import add_run_arguments, finished, load_run, results_root, simulate

CONFIG = "benchmarks/configs/lg-table4.toml"
METHODS: dict[str, dict[str, Any]] = {
    "fedavg": {"lg-warmup-rounds": 1_000_000, "lg-adversary-weight": 0.0},
    "lg-fedavg-adv": {"lg-adversary-weight": 0.0},
    "lg-fedavg+adv": {"lg-adversary-weight": 30.0},
}
PARTITIONS: dict[str, dict[str, Any]] = {"iid": {"partition": "iid"}, "non-iid": {"partition": "shards", "classes-per-client": 10}}
# the paper's Table 4: class accuracy, class AUC, adversary AUC in %, mean over 10 runs
PAPER = {
    ("iid", "fedavg"): (83.7, 89.4, 65.5),
    ("iid", "lg-fedavg-adv"): (84.3, 89.0, 63.3),
    ("iid", "lg-fedavg+adv"): (82.1, 85.7, 50.1),
    ("non-iid", "fedavg"): (83.7, 88.7, 64.1),
    ("non-iid", "lg-fedavg-adv"): (81.1, 84.4, 62.7),
    ("non-iid", "lg-fedavg+adv"): (80.1, 84.1, 49.8),
}


def row(folder: Path) -> dict[str, Any]:
    """The last scored round's figures of a finished run."""
    summary, rounds = load_run(folder)
    last = next(r for r in reversed(rounds) if "accuracy" in r)
    return {
        "round": last["round"],
        **{k: last.get(k) for k in ("accuracy", "class_auc", "adv_auc", "posthoc_adv_auc")},
        "minutes": (summary.get("wall_seconds") or 0) / 60,
    }


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def table(root: Path, keys: list[tuple[str, str, int]]) -> str:
    """The markdown table of every finished run under ``root`` beside the paper's numbers."""
    lines = [
        "| data | method | seed | round | class acc | class AUC | adv AUC | post-hoc adv AUC | paper acc / AUC / adv AUC | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for partition, method, seed in keys:
        folder = root / partition / f"{method}-s{seed}"
        if not finished(folder):
            continue
        r = row(folder)
        paper = PAPER.get((partition, method))
        lines.append(
            f"| {partition} | {method} | {seed} | {r['round']} | {pct(r['accuracy'])} | {pct(r['class_auc'])} | {pct(r['adv_auc'])} | "
            f"{pct(r['posthoc_adv_auc'])} | {' / '.join(map(str, paper)) if paper else '–'} | {r['minutes']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="headway bench lg_table4", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--partitions", nargs="+", choices=list(PARTITIONS), default=list(PARTITIONS))
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    add_run_arguments(p)
    args = p.parse_args(argv)
    root = results_root("lg-fedavg/table4", args.tag)
    keys = [(pt, m, s) for s in args.seeds for pt in args.partitions for m in args.methods]
    for partition, method, seed in keys:
        if args.summarize_only:
            break
        out = root / partition / f"{method}-s{seed}"
        simulate(CONFIG, out, {**PARTITIONS[partition], **METHODS[method], "seed": seed}, args.set)
        (root / "table.md").write_text(table(root, keys))  # as runs finish
    root.mkdir(parents=True, exist_ok=True)
    text = table(root, keys)
    (root / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
