"""LG-FedAvg Table 3 (Liang et al. 2020): a device with data never seen before joins a running federation.

MNIST over 100 devices (iid, or non-iid by 2 shards a device); FedAvg trains them until the join, then a new
device (partition 100, its train and test images rotated by 90°: ``client-transform``) joins
(``join-clients``/``join-round``) and the run goes on with the new device plus a fraction C of the old ones
(``join-fraction-old``) for FedAvg, FedProx and LG-FedAvg (whose warm-up is the FedAvg part, and whose global
layers are the two convolutions from the join on). Normal accuracy is the old devices' local test accuracy
(``accuracy_old``), rotated the new device's (``accuracy_joined``), both in the last round's record.

    headway bench lg_table3                                   # the paper's setting (500 rounds after the join)
    headway bench lg_table3 --partitions iid --fractions 0.0 --methods fedavg lg-fedavg \\
        --warmup-rounds 5 --warmup-fraction 1.0 --join-rounds 100 --tag short

The paper trains until 98 % average test accuracy before the join; here the join comes after a fixed count
of warm-up rounds (``--warmup-rounds``): the table says what each run reached then. The new device holds the
paper's 3,000 training and 500 test images (``partition-sizes``, drawn apart from the old devices' rows, which
split the rest); ``--new-device-rows share`` gives it its 1/101 share instead (about 594 and 99 iid), as the
first shortened runs had.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from benchmarks.runner import add_run_arguments, finished, load_run, results_root, simulate

CONFIG = "benchmarks/configs/lg-table3.toml"
NEW_DEVICE = 100
# label -> run-config keys. lg-fedavg: the split of the paper's experiments section (the two convolutions global);
# lg-fedavg-top: the reverse (the fully connected layers and the head global, the convolutions a local representation
# that can "unrotate" the new device's images, as the paper's §4.2 hypothesis and Alg. 1's local representations read)
METHODS: dict[str, dict[str, Any]] = {
    "fedavg": {"algorithm": "fedavg"},
    "fedprox": {"algorithm": "fedprox"},
    "lg-fedavg": {"algorithm": "lg-fedavg", "lg-global-layers": "convs.*"},
    "lg-fedavg-top": {"algorithm": "lg-fedavg", "lg-global-layers": "fcs.*,head"},
}
PARTITIONS: dict[str, dict[str, Any]] = {"iid": {"partition": "iid"}, "non-iid": {"partition": "shards", "classes-per-client": 2}}
# the paper's Table 3 (iid | non-iid), normal and rotated accuracy in %, mean over 10 runs
PAPER = {
    ("iid", 0.0, "fedavg"): (32.01, 91.83),
    ("iid", 0.0, "lg-fedavg"): (96.55, 92.92),
    ("iid", 0.1, "fedavg"): (97.35, 89.29),
    ("iid", 0.1, "fedprox"): (94.82, 87.19),
    ("iid", 0.1, "lg-fedavg"): (97.66, 93.16),
}
PAPER_JOIN_ROUNDS = 500
PAPER_NEW_DEVICE_ROWS = "3000/500"  # training/test images of the new device (§4.3)


def overrides(
    method: str,
    partition: str,
    fraction_old: float,
    warmup: int,
    warmup_fraction: float,
    after: int,
    seed: int,
    new_device_rows: str = PAPER_NEW_DEVICE_ROWS,
) -> dict[str, Any]:
    """One run's run-config keys on top of :data:`CONFIG` (``new_device_rows`` 'share': the new device's 1/101 share)."""
    out: dict[str, Any] = {
        **PARTITIONS[partition],
        **METHODS[method],
        "seed": seed,
        "fraction-train": warmup_fraction,
        "join-round": warmup,
        "join-fraction-old": fraction_old,
        "num-server-rounds": warmup + after,
        "eval-every": warmup,  # scored when the new device joins and at the end
        "global-eval": False,
    }
    if new_device_rows != "share":
        out["partition-sizes"] = f"{NEW_DEVICE}:{new_device_rows}"
    if out["algorithm"] == "lg-fedavg":
        out["lg-warmup-rounds"] = warmup
    return out


def row(folder: Path, warmup: int) -> dict[str, Any]:
    """What a finished run gives the table: accuracy at the join, then normal and rotated accuracy at the end."""
    summary, rounds = load_run(folder)
    at_join = next((r for r in rounds if r["round"] == warmup), {})
    last = rounds[-1]
    return {
        "at_join": at_join.get("accuracy"),
        "normal": last.get("accuracy_old"),
        "rotated": last.get("accuracy_joined"),
        "joined_round": next((r["round"] for r in rounds if r.get("joined")), None),
        "rounds": summary.get("rounds"),
        "minutes": (summary.get("wall_seconds") or 0) / 60,
    }


def pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f}"


def table(root: Path, keys: list[tuple[str, float, str, int]], warmup: int, after: int, rows: str = PAPER_NEW_DEVICE_ROWS) -> str:
    """The markdown table of every finished run under ``root`` beside the paper's numbers."""
    held = "its 1/101 share" if rows == "share" else f"{rows} training/test images"
    lines = [
        f"Warm-up (FedAvg) {warmup} rounds, then {after} rounds after the join (paper: until 98 %, then {PAPER_JOIN_ROUNDS}); "
        f"the new device holds {held} (paper: {PAPER_NEW_DEVICE_ROWS}).",
        "",
        "| data | C | method | seed | acc. at join | normal | rotated | paper normal | paper rotated | minutes |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for partition, c, method, seed in keys:
        folder = root / f"{partition}-c{c:g}" / f"{method}-s{seed}"
        if not finished(folder):
            continue
        r = row(folder, warmup)
        paper = PAPER.get((partition, c, METHODS[method]["algorithm"]))  # both LG splits against the paper's one LG row
        lines.append(
            f"| {partition} | {c:g} | {method} | {seed} | {pct(r['at_join'])} | {pct(r['normal'])} | {pct(r['rotated'])} | "
            f"{'–' if paper is None else paper[0]} | {'–' if paper is None else paper[1]} | {r['minutes']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="headway bench lg_table3", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--partitions", nargs="+", choices=list(PARTITIONS), default=list(PARTITIONS))
    p.add_argument("--fractions", nargs="+", type=float, default=[0.0, 0.1], help="C: share of the old devices trained after the join")
    p.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    p.add_argument("--warmup-rounds", type=int, default=100, help="FedAvg rounds before the new device joins (paper: until 98 %%)")
    p.add_argument("--warmup-fraction", type=float, default=0.1, help="fraction-train of the warm-up (paper: C = 0.1)")
    p.add_argument("--join-rounds", type=int, default=PAPER_JOIN_ROUNDS, help="rounds after the join (paper: 500)")
    p.add_argument(
        "--new-device-rows",
        default=PAPER_NEW_DEVICE_ROWS,
        help="the new device's training/test images, or 'share' for its 1/101 share (paper: 3000/500)",
    )
    add_run_arguments(p)
    args = p.parse_args(argv)
    if args.join_rounds < PAPER_JOIN_ROUNDS and not args.tag and not args.summarize_only:
        p.error(
            f"--join-rounds {args.join_rounds} shortens the paper's {PAPER_JOIN_ROUNDS}: name the results with --tag (e.g. --tag short)"
        )
    root = results_root("lg-fedavg/table3", args.tag)
    keys = [(pt, c, m, s) for s in args.seeds for pt in args.partitions for c in args.fractions for m in args.methods]
    for partition, c, method, seed in keys:
        if args.summarize_only:
            break
        out = root / f"{partition}-c{c:g}" / f"{method}-s{seed}"
        keys_of = overrides(method, partition, c, args.warmup_rounds, args.warmup_fraction, args.join_rounds, seed, args.new_device_rows)
        simulate(CONFIG, out, keys_of, args.set)
        (root / "table.md").write_text(table(root, keys, args.warmup_rounds, args.join_rounds, args.new_device_rows))  # as runs finish
    root.mkdir(parents=True, exist_ok=True)
    text = table(root, keys, args.warmup_rounds, args.join_rounds, args.new_device_rows)
    (root / "table.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
