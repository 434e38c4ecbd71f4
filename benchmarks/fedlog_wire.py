"""FedLog's bytes to 97 % on the MNIST Table 1 setup, by wire encoding.

    python -m benchmarks.fedlog_wire --seeds 0 1 2 --set num-server-rounds=20

Runs FedLog (the Table 1 config, the bodies' default dropout) with ``fedlog-uplink`` dense
and sparse, sparse with the float16 downlink (``fedlog-wire-dtype``), and sparse with float16
both ways (``fedlog-uplink-dtype`` too), one folder per
(variant, seed) under ``benchmarks/results/fedlog-wire[-TAG]/``
(resumable: finished runs are skipped), then prints and writes ``table.md``: bytes to 97 %
(both directions, from the messages; the statistics round of fedlog-init=stats included),
the round it was reached, and the final and best accuracy, mean ± s.e. over seeds, beside
the paper's 0.40 MB (3.18 Mb) to 97 % and 98.15 % final and the authors' code's 98.10 %.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks.runner import add_run_arguments, finished, fmt_mean_se, load_run, mean_se, results_root, simulate

VARIANTS = {
    "dense": {"fedlog-uplink": "dense"},
    "sparse": {"fedlog-uplink": "sparse"},
    "sparse-float16": {"fedlog-uplink": "sparse", "fedlog-wire-dtype": "float16"},
    "sparse-float16-both": {"fedlog-uplink": "sparse", "fedlog-wire-dtype": "float16", "fedlog-uplink-dtype": "float16"},
}


def values_to_target(runs: list[tuple[dict, list[dict]]]) -> tuple[str, str]:
    """Mean ± s.e. MB of array values alone (no framing) to the target round: both ways and
    up only; '–' for runs written before value bytes were recorded."""
    reached = [(s, rows) for s, rows in runs if s.get("round_to_target") is not None]
    if not reached or any("values_bytes_up" not in r for _, rows in reached for r in rows):
        return "–", "–"
    upto = [[r for r in rows if r["round"] <= s["round_to_target"]] for s, rows in reached]
    both = [sum(r["values_bytes_down"] + r["values_bytes_up"] for r in rows) / 1e6 for rows in upto]
    up = [sum(r["values_bytes_up"] for r in rows) / 1e6 for rows in upto]
    return fmt_mean_se(both, 1.0), fmt_mean_se(up, 1.0)


def table(root: Path, seeds: list[int]) -> str:
    """The markdown table of the finished runs under ``root``."""
    lines = [
        "| variant | seeds | MB to 97 % | round reached | final accuracy (%) | best accuracy (%) | MB per round after round 1 | values MB to 97 % (both ways) | values MB up to 97 % |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for variant in VARIANTS:
        runs = [load_run(root / f"{variant}-seed{s}") for s in seeds if finished(root / f"{variant}-seed{s}")]
        if not runs:
            continue
        reached = [s for s, _ in runs if s.get("bytes_to_target") is not None]
        mb = fmt_mean_se([s["bytes_to_target"] / 1e6 for s in reached], 1.0) if reached else "not reached"
        rnd = fmt_mean_se([s["round_to_target"] for s in reached], 1.0) if reached else "–"
        per_round = mean_se([(r["bytes_down"] + r["bytes_up"]) / 1e6 for _, rows in runs for r in rows[1:]])[0]
        both, up = values_to_target(runs)
        lines.append(
            f"| {variant} | {len(runs)} | {mb} | {rnd} | {fmt_mean_se([s['final_accuracy'] for s, _ in runs])} | "
            f"{fmt_mean_se([s['best_accuracy'] for s, _ in runs])} | {per_round:.3f} | {both} | {up} |"
        )
    lines.append("| paper (FedLog, Table 1) | – | – | – | 98.15 | – | – | – | 0.40 (3.18 Mb) |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.fedlog_wire", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_run_arguments(p)
    args = p.parse_args(argv)
    root = results_root("fedlog-wire", args.tag)
    if not args.summarize_only:
        for seed in args.seeds:
            for variant, keys in VARIANTS.items():
                simulate("mnist", root / f"{variant}-seed{seed}", {"algorithm": "fedlog", **keys, "seed": seed}, args.set)
    text = table(root, args.seeds)
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
