"""How FedLog's simulation scales with the number of clients on one machine.

    python -m benchmarks.scale --clients 100 1000 --rounds 3

Each run is FedLog on the MNIST Table 1 setup (mnist-cnn, 2 classes a client, Adam 1e-3,
batch 10, 5 local epochs) with the *same data per client* as Table 1 (60 training images:
train-fraction grows with the number of clients, 1.0 at 1 000), every client every round,
in a fresh process. The benchmark samples the resident memory of that process and all its
descendants (Ray's raylet, GCS and workers) every half second and writes, per run,
``benchmarks/results/scale/<n>-clients/`` (the run's own results folder) and one row of
``scale.jsonl``: seconds per round (mean of rounds after the first, and round 1 apart,
which also collects the statistics of fedlog-init=stats), peak memory, accuracy, bytes.
Runs already in ``scale.jsonl`` are skipped, so the command resumes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from benchmarks.runner import ROOT, load_run
from headway.processes import descendants

OUT = ROOT / "benchmarks" / "results" / "scale"
TABLE1_CLIENTS, TABLE1_FRACTION = 50, 0.05


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants, from /proc."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    break
        except OSError:
            pass
    return total


def run_one(clients: int, rounds: int, sets: list[str]) -> dict:
    """One simulation with ``clients`` clients; its timing, peak memory and results."""
    out = OUT / f"{clients}-clients"
    fraction = min(1.0, TABLE1_FRACTION * clients / TABLE1_CLIENTS)
    args = [
        sys.executable,
        "-m",
        "simulation",
        "benchmarks/configs/mnist-table1.toml",
        "--out",
        str(out),
        "--overwrite",
        "--set",
        "algorithm=fedlog",
        "--set",
        f"num-clients={clients}",
        "--set",
        f"num-server-rounds={rounds}",
        "--set",
        f"train-fraction={fraction}",
        "--set",
        "target-accuracy=0.0",
    ]
    for s in sets:
        args += ["--set", s]
    print("run", " ".join(args[1:]), flush=True)
    peak, stop = [0], threading.Event()
    started = time.monotonic()
    proc = subprocess.Popen(args, cwd=ROOT)

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], tree_rss(proc.pid))
            stop.wait(0.5)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    code = proc.wait()
    stop.set()
    sampler.join()
    if code != 0:
        raise SystemExit(f"the {clients}-client run failed (exit {code}); see its output above and {out}")
    summary, rows = load_run(out)
    later = [r["seconds"] for r in rows[1:]]
    return {
        "clients": clients,
        "rounds": len(rows),
        "train_fraction": fraction,
        "examples_per_client": 60000 * fraction / clients,
        "wall_seconds": round(time.monotonic() - started, 1),
        "round1_seconds": round(rows[0]["seconds"], 1),
        "seconds_per_round": round(sum(later) / len(later), 1) if later else None,
        "peak_rss_gib": round(peak[0] / 2**30, 2),
        "final_accuracy": summary["final_accuracy"],
        "bytes_per_round": round(sum(r["bytes_down"] + r["bytes_up"] for r in rows[1:]) / max(len(rows) - 1, 1)),
        "failures": summary["failures"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.scale", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--clients", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra run-config overrides")
    args = p.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    table = OUT / "scale.jsonl"
    done = {json.loads(line)["clients"] for line in table.read_text().splitlines()} if table.exists() else set()
    for n in args.clients:
        if n in done:
            print(f"skip {n} clients (in {table})", flush=True)
            continue
        row = run_one(n, args.rounds, args.set)
        with table.open("a") as fh:
            fh.write(json.dumps(row) + "\n")
        print(json.dumps(row), flush=True)
    for line in table.read_text().splitlines():
        r = json.loads(line)
        print(
            f"{r['clients']:>5} clients: round 1 {r['round1_seconds']} s, later rounds {r['seconds_per_round']} s each, "
            f"peak memory {r['peak_rss_gib']} GiB, accuracy {r['final_accuracy']}, {r['failures']} failures"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
