"""The quick benchmark: every method for a few rounds on small real setups, the figures a
refactor must keep (final accuracy, bytes each way, rounds aggregated) beside its seconds.

    headway bench quick                       # -> benchmarks/results/quick/
    headway bench quick --tag after --compare benchmarks/results/quick

Each run is one ``headway run`` (a fresh process and Ray) into ``<root>/<name>/``; a run whose
summary says complete is skipped. ``--compare`` prints every figure that differs from an
earlier root's and exits 1 if one does: accuracy to the 4 decimals the table shows, rounds
aggregated exactly, wire bytes within 0.1 % (Flower's node ids are random, so a message's
varint-coded fields vary by a byte or so from run to run of the same code; the values bytes, which do
not, are compared exactly where both runs recorded them); seconds are reported, never compared.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from benchmarks.runner import CONFIGS, load_run, results_root, simulate

SHORT = {"num-server-rounds": 3, "seed": 0}
FEDPROF = "benchmarks/configs/fedprof-mnist.toml"

# name -> (config, run-config overrides): the Table 1 MNIST setup (50 clients, 2 classes each) for
# the methods of Table 1, FedProf's own MNIST setup shrunk to 100 clients, FedPFT on raw pixels.
RUNS: dict[str, tuple[str, dict[str, Any]]] = {
    "fedavg": (CONFIGS["mnist"], {"algorithm": "fedavg"}),
    "fedavg-data-ratio": (CONFIGS["mnist"], {"algorithm": "fedavg", "client-sampling": "data-ratio", "fraction-train": 0.2}),
    "fedprox": (CONFIGS["mnist"], {"algorithm": "fedprox"}),
    "lg-fedavg-1": (CONFIGS["mnist"], {"algorithm": "lg-fedavg", "lg-global-layers": 1}),
    "fedper": (CONFIGS["mnist"], {"algorithm": "fedper"}),
    "fedrep-1": (CONFIGS["mnist"], {"algorithm": "fedrep", "fedrep-local-layers": 1}),
    "fedproto": (CONFIGS["mnist"], {"algorithm": "fedproto"}),
    "fedlog": (CONFIGS["mnist"], {"algorithm": "fedlog"}),
    "fedlog-c": (CONFIGS["mnist"], {"algorithm": "fedlog", "fedlog-alpha": 0.01}),
    "fedlog-sparse-f16": (CONFIGS["mnist"], {"algorithm": "fedlog", "fedlog-uplink": "sparse", "fedlog-wire-dtype": "float16"}),
    "fedlog-dp-local": (CONFIGS["mnist"], {"algorithm": "fedlog", "fedlog-dp": "local", "fedlog-clip": 1.0, "fedlog-epsilon": 1.0}),
    "fedprof-full": (
        FEDPROF,
        {"algorithm": "fedprof", "num-clients": 100, "fraction-train": 0.1, "fedprof-val-size": 2000, "server-holdout": 2000},
    ),
    "fedprof-partial": (
        FEDPROF,
        {
            "algorithm": "fedprof",
            "num-clients": 100,
            "fraction-train": 0.1,
            "fedprof-val-size": 2000,
            "server-holdout": 2000,
            "fedprof-aggregation": "partial",
        },
    ),
    "fedpft": (CONFIGS["mnist"], {"algorithm": "fedpft", "fedpft-extractor": "identity", "num-server-rounds": 1}),
    "fedpft-chain": (
        CONFIGS["mnist"],
        {"algorithm": "fedpft", "fedpft-extractor": "identity", "fedpft-topology": "chain", "num-server-rounds": 1, "num-clients": 10},
    ),
}

# Draws that come from OS entropy by design, so two runs of the same code differ: DP noise (its
# accuracy is reported, not compared), and FedProf's private half of D^V, which a server-side secret
# makes reproducible for this benchmark (strategies/fedprof.py).
ENTROPY = {"fedlog-dp-local": "local DP noise comes from OS entropy"}
FEDPROF_SECRET = {"HEADWAY_FEDPROF_SECRET": "headway-quick-benchmark"}

BYTES_TOLERANCE = 1e-3  # relative, for wire bytes (see the module docstring)


def figures(folder: Path) -> dict[str, Any]:
    """The compared figures of one finished run, plus its seconds."""
    summary, rounds = load_run(folder)
    return {
        "accuracy": summary.get("final_accuracy"),
        "bytes_down": sum(r.get("bytes_down", 0) for r in rounds),
        "bytes_up": sum(r.get("bytes_up", 0) for r in rounds),
        "values_bytes_down": sum(r.get("values_bytes_down", 0) for r in rounds),
        "values_bytes_up": sum(r.get("values_bytes_up", 0) for r in rounds),
        "rounds_aggregated": sum(1 for r in rounds if r.get("aggregated")),
        "seconds": round(sum(r.get("seconds", 0.0) for r in rounds), 1),
    }


def table(rows: dict[str, dict[str, Any]]) -> str:
    head = "| run | final accuracy | bytes down | bytes up | rounds aggregated | seconds |\n|---|---|---|---|---|---|\n"
    lines = [
        f"| {name} | {'–' if f['accuracy'] is None else format(f['accuracy'], '.4f')} | {f['bytes_down']:,} | {f['bytes_up']:,} | {f['rounds_aggregated']} | {f['seconds']} |"
        for name, f in rows.items()
    ]
    return head + "\n".join(lines) + "\n"


def differences(rows: dict[str, dict[str, Any]], earlier: Path) -> list[str]:
    """Every compared figure that differs from the run of the same name under ``earlier``."""
    out = []
    for name, f in rows.items():
        old_file = earlier / "figures.json"
        old = json.loads(old_file.read_text()).get(name) if old_file.exists() else None
        if old is None:
            out.append(f"{name}: no earlier figures in {earlier}")
            continue
        acc, old_acc = (None if a is None else round(a, 4) for a in (f["accuracy"], old["accuracy"]))
        if acc != old_acc and name not in ENTROPY:
            out.append(f"{name}: accuracy {old_acc} -> {acc}")
        if f["rounds_aggregated"] != old["rounds_aggregated"]:
            out.append(f"{name}: rounds aggregated {old['rounds_aggregated']} -> {f['rounds_aggregated']}")
        for key in ("bytes_down", "bytes_up"):
            if abs(f[key] - old[key]) > BYTES_TOLERANCE * old[key]:
                out.append(f"{name}: {key} {old[key]:,} -> {f[key]:,}")
        for key in ("values_bytes_down", "values_bytes_up"):
            if key in old and f[key] != old[key]:
                out.append(f"{name}: {key} {old[key]:,} -> {f[key]:,}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="headway bench quick", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    p.add_argument("--tag", default="", help="suffix of the results folder (benchmarks/results/quick-TAG)")
    p.add_argument("--compare", type=Path, help="an earlier results folder whose figures these must equal")
    args = p.parse_args(argv)
    root = results_root("quick", args.tag)
    rows: dict[str, dict[str, Any]] = {}
    for name in args.runs:
        config, overrides = RUNS[name]
        if overrides["algorithm"] == "fedprof":
            os.environ.update(FEDPROF_SECRET)
        simulate(config, root / name, {**SHORT, **overrides})
        rows[name] = figures(root / name)
        (root / "figures.json").write_text(json.dumps(rows, indent=1) + "\n")
    (root / "table.md").write_text(table(rows))
    print(table(rows))
    if args.compare is not None:
        diff = differences(rows, args.compare)
        print("\n".join(diff) if diff else f"every compared figure equals {args.compare}'s")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
