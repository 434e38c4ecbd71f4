"""FedLog's simulation against its compute floor as the number of clients grows.

    python -m benchmarks.scale --clients 50 1000 10000 --rounds 3 [--one-process] [--out DIR] [--note "..."]

For each client count the benchmark runs the compute floor (benchmarks/floor.py: the same
client work with no Flower and no Ray, in 2 worker processes, and with ``--one-process``
also in 1) and then ``headway run`` on the same settings: FedLog on the MNIST Table 1 config
with 60 training images a client (train-fraction grows with the clients, 1.0 at 1 000;
beyond that MNIST repeated with shifted copies, :func:`benchmarks.floor.setup_sets`). Each
run is a fresh process whose tree (Ray's raylet, GCS and workers; the floor's workers) has
its RSS and PSS sampled every half second. One row per run goes to
``benchmarks/results/scale/scale.jsonl`` (or ``--out``'s): seconds per round (mean of the rounds after the
first; round 1 apart, which also holds the statistics round of fedlog-init=stats), wall
seconds, peak RSS and PSS, accuracy per round, the Flower version (``flwr``; rows written
before it was recorded lack it) and, for the simulation, bytes per round and
whether its accuracies equal the floor's round by round. Rows already there are skipped,
so the command resumes: give another Flower its own ``--out``. ``scale.md`` (the table) and ``scale.svg`` (seconds
per round against clients, log-log) are rewritten from all rows at the end.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.floor import CONFIG, PeakSampler, cache_dir, setup_sets
from benchmarks.runner import ROOT, load_run

OUT = ROOT / "benchmarks" / "results" / "scale"


def measured(args: list[str]) -> tuple[float, int, int]:
    """Run ``args`` in a fresh process (in the repository root); its wall seconds and the
    peak RSS and PSS of its process tree. SystemExit when it fails."""
    print("run", " ".join(args[1:]), flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(args, cwd=ROOT)
    with PeakSampler(proc.pid) as peak:
        code = proc.wait()
    if code != 0:
        raise SystemExit(f"{' '.join(args[1:4])} failed (exit {code}); see its output above")
    return time.monotonic() - started, peak.rss, peak.pss


def memory(row: dict[str, Any], rss: int, pss: int) -> dict[str, Any]:
    return {**row, "peak_rss_gib": round(rss / 2**30, 2), "peak_pss_gib": round(pss / 2**30, 2)}


def run_floor(clients: int, rounds: int, processes: int, sets: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "floor.json"
        args = [sys.executable, "-m", "benchmarks.floor", "--clients", str(clients), "--rounds", str(rounds), "--processes", str(processes)]
        args += [*(x for s in sets for x in ("--set", s)), "--json", str(out)]
        wall, rss, pss = measured(args)
        result = json.loads(out.read_text())
    row = {k: result[k] for k in ("clients", "data", "rounds", "round1_seconds", "seconds_per_round", "accuracy")}
    return memory({"kind": f"floor-{processes}p", **row, "wall_seconds": round(wall, 1)}, rss, pss)


def portable(out: Path) -> None:
    """Name the generated data set in a run's committed config.json and summary.json by
    $HEADWAY_BENCH_CACHE, not by this machine's cache path."""
    prefix = str(cache_dir())
    for name in ("config.json", "summary.json"):
        path = out / name
        if path.exists():
            path.write_text(path.read_text().replace(prefix, "$HEADWAY_BENCH_CACHE"))


def run_simulation(clients: int, rounds: int, sets: list[str], sim_sets: list[str], folder: Path = OUT) -> dict[str, Any]:
    """``headway run`` with the floor's settings plus ``sim_sets`` (settings of the simulation
    alone, such as client-evaluation, that leave the client work unchanged); its run folder goes under ``folder``."""
    out = folder / "-".join([f"{clients}-clients", f"{rounds}-rounds", *(s.replace("=", "-") for s in [*sets, *sim_sets])])
    setup, data = setup_sets(clients, rounds)
    args = [sys.executable, "-m", "simulation", str(CONFIG), "--out", str(out), "--overwrite"]
    args += [x for s in [*setup, *sets, *sim_sets] for x in ("--set", s)]
    wall, rss, pss = measured(args)
    portable(out)
    summary, rows = load_run(out)
    if summary.get("status", "complete") != "complete" or summary.get("failures"):
        raise SystemExit(f"the {clients}-client simulation did not complete cleanly: {summary.get('reason')}")
    later = [r["seconds"] for r in rows[1:]]
    row = {
        "kind": "simulation",
        "clients": clients,
        "data": data,
        "rounds": len(rows),
        "round1_seconds": round(rows[0]["seconds"], 2),
        "seconds_per_round": round(sum(later) / len(later), 2) if later else None,
        "accuracy": [r["accuracy"] for r in rows],
        "wall_seconds": round(wall, 1),
        "bytes_per_round": round(sum(r["bytes_down"] + r["bytes_up"] for r in rows[1:]) / max(len(rows) - 1, 1)),
    }
    return memory(row, rss, pss)


def key(row: dict[str, Any]) -> tuple[int, str, int, tuple[str, ...], tuple[str, ...]]:
    return (row["clients"], row["kind"], row["rounds"], tuple(row.get("sets", ())), tuple(row.get("sim_sets", ())))


def load_rows(table: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in table.read_text().splitlines() if line.strip()] if table.exists() else []


def flower_version() -> str | None:
    """The installed Flower's version (what the simulation rows ran on), None without Flower."""
    try:
        import flwr
    except ImportError:
        return None
    return flwr.__version__


def versions(rows: list[dict[str, Any]]) -> str:
    """The Flower versions the rows name, 'not recorded' for rows written before they did."""
    return ", ".join(sorted({r.get("flwr") or "not recorded" for r in rows}))


def ratio(sim: dict[str, Any] | None, floor: dict[str, Any] | None) -> str:
    """The simulation's seconds per round over the floor's."""
    a, b = (sim or {}).get("seconds_per_round"), (floor or {}).get("seconds_per_round")
    return f"{a / b:.2f}×" if a and b else "–"


def gib(row: dict[str, Any] | None) -> str:
    return f"{row['peak_rss_gib']:.2f} / {row['peak_pss_gib']:.2f}" if row else "–"


def seconds(row: dict[str, Any] | None) -> str:
    return f"{row['seconds_per_round']} ({row['round1_seconds']})" if row else "–"


def markdown(rows: list[dict[str, Any]], note: str) -> str:
    """The table: per client count and settings, floor and simulation side by side."""
    groups: dict[tuple[int, int, tuple[str, ...]], dict[str, dict[str, Any]]] = {}
    for r in rows:
        kind = " ".join([r["kind"], *r.get("sim_sets", ())])
        groups.setdefault((r["clients"], r["rounds"], tuple(r.get("sets", ()))), {})[kind] = r
    lines = [
        "# FedLog: simulation against its compute floor",
        "",
        *([f"**{note}**", ""] if note else []),
        f"Flower: {versions(rows)}.",
        "",
        "Seconds per round: mean of rounds 2 on (round 1 in brackets: it also holds the statistics round). "
        "Memory: peak RSS / PSS of the process tree, GiB. Accuracy: after the last round; "
        "'same' when the simulation's accuracy equals the 2-process floor's in every round.",
        "",
        "| clients | rounds | data | floor 1 process | floor 2 processes | simulation | sim / floor-2p | "
        "memory floor-2p | memory sim | accuracy | same | bytes / round | settings |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (clients, rounds, sets), g in sorted(groups.items()):
        f1, f2 = g.get("floor-1p"), g.get("floor-2p")
        sims: list[tuple[str, dict[str, Any] | None]] = [(k, r) for k, r in sorted(g.items()) if k.startswith("simulation")]
        for variant, sim in sims or [("", None)]:
            any_row = sim or f2 or f1 or {}
            acc = any_row.get("accuracy", [None])[-1]
            same = "–" if not (sim and f2) else ("yes" if sim["accuracy"] == f2["accuracy"] else "**no**")
            nbytes = f"{sim['bytes_per_round']:,}" if sim else "–"
            settings = " ".join([*sets, *variant.split()[1:]]) or "Table 1"
            lines.append(
                f"| {clients:,} | {rounds} | {any_row.get('data', '')} | {seconds(f1)} | {seconds(f2)} | {seconds(sim)} | "
                f"{ratio(sim, f2)} | {gib(f2)} | {gib(sim)} | "
                f"{'–' if acc is None else f'{100 * acc:.2f} %'} | {same} | {nbytes} | {settings} |"
            )
    return "\n".join(lines) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> Path:
    """Seconds per round against clients, log-log: one line per kind and settings."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines: dict[tuple[str, tuple[str, ...]], list[tuple[int, float]]] = {}
    for r in rows:
        if r["seconds_per_round"]:
            lines.setdefault((r["kind"], tuple(r.get("sets", ())) + tuple(r.get("sim_sets", ()))), []).append(
                (r["clients"], r["seconds_per_round"])
            )
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (kind, sets), pts in sorted(lines.items()):
        ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=" ".join([kind, *sets]))
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("clients (60 training images each)")
    ax.set_ylabel("seconds per round (rounds 2 on)")
    ax.set_title("FedLog, MNIST Table 1 setup")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--clients", type=int, nargs="+", default=[50, 1000, 10000])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--one-process", action="store_true", help="also run the floor in 1 process")
    p.add_argument("--no-simulation", action="store_true", help="the floor only")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra run-config overrides for floor and simulation")
    p.add_argument(
        "--sim-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the simulation alone that leaves the client work unchanged (e.g. client-evaluation=with-next-train); "
        "the floor rows are shared with the plain simulation's",
    )
    p.add_argument("--out", type=Path, default=OUT, help="the results folder (default benchmarks/results/scale)")
    p.add_argument("--note", default="", help="a line at the top of scale.md (e.g. 'loaded machine, provisional')")
    args = p.parse_args(argv)
    out, table = args.out.resolve(), args.out.resolve() / "scale.jsonl"
    out.mkdir(parents=True, exist_ok=True)
    done = {key(r) for r in load_rows(table)}
    for n in args.clients:
        kinds = [*(["floor-1p"] if args.one_process else []), "floor-2p", *([] if args.no_simulation else ["simulation"])]
        for kind in kinds:
            extra = args.sim_set if kind == "simulation" else []
            if (n, kind, args.rounds, tuple(args.set), tuple(extra)) in done:
                print(f"skip {kind} with {n} clients (in {table})", flush=True)
                continue
            if kind == "simulation":
                row = run_simulation(n, args.rounds, args.set, args.sim_set, out)
            else:
                row = run_floor(n, args.rounds, 1 if kind == "floor-1p" else 2, args.set)
            if args.set:
                row["sets"] = args.set
            if extra:
                row["sim_sets"] = extra
            row["flwr"] = flower_version()
            with table.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    rows = load_rows(table)
    text = markdown(rows, args.note)
    (out / "scale.md").write_text(text)
    print(text)
    try:
        print("plot:", plot(rows, out / "scale.svg"))
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
