"""FedLog server cost without Flower: solve_head time and peak memory for several
classes × m, and the time to check and add 10 000 client replies.

    .venv/bin/python -m benchmarks.server_cost [--out benchmarks/results/server_cost.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
import tracemalloc
from pathlib import Path

import numpy as np
from headway.core.fedlog import StatsCheck, solve_head, stationarity_residual


def synthetic_stats(rng: np.random.Generator, classes: int, m: int, n: int) -> np.ndarray:
    counts = rng.multinomial(n, np.full(classes, 1.0 / classes)).astype(float)
    stats = rng.gamma(2.0, 0.5, size=(classes, m)) * counts[:, None]
    stats[:, 0] = counts
    return stats


def time_solve(classes: int, m: int, repeats: int, rng: np.random.Generator) -> dict:
    n = 50 * classes * 10
    stats = synthetic_stats(rng, classes, m, n)
    solve_head(stats, n)  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        eta = solve_head(stats, n)
        times.append(time.perf_counter() - t0)
    tracemalloc.start()
    solve_head(stats, n)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "classes": classes,
        "m": m,
        "seconds_median": float(np.median(times)),
        "seconds_max": float(np.max(times)),
        "peak_bytes": int(peak),
        "stationarity_residual": stationarity_residual(eta, stats, n),
    }


def time_aggregation(replies: int, classes: int, m: int, rng: np.random.Generator) -> dict:
    per_client = [synthetic_stats(rng, classes, m, 60).astype(np.float32) for _ in range(replies)]
    counts = [float(s[:, 0].sum()) for s in per_client]
    check = StatsCheck(classes, m)
    t0 = time.perf_counter()
    total = np.zeros((classes, m))
    for s, n in zip(per_client, counts):
        s64 = s.astype(np.float64)
        if check.problem(s64, n) is None:
            total += s64
    t_sum = time.perf_counter() - t0
    t1 = time.perf_counter()
    solve_head(total, sum(counts))
    return {"replies": replies, "classes": classes, "m": m, "check_and_sum_seconds": t_sum, "solve_seconds": time.perf_counter() - t1}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmarks/results/server_cost.json")
    args = p.parse_args()
    rng = np.random.default_rng(0)
    solve = [time_solve(c, m, r, rng) for c, m, r in ((10, 51, 50), (100, 101, 20), (1000, 1025, 5))]
    agg = time_aggregation(10_000, 10, 51, rng)
    result = {
        "machine": f"{platform.processor() or platform.machine()}, {platform.python_version()}",
        "solve_head": solve,
        "aggregation": agg,
    }
    for row in solve:
        print(
            f"solve_head {row['classes']:>5} x {row['m']:<5} median {row['seconds_median'] * 1e3:8.2f} ms  max {row['seconds_max'] * 1e3:8.2f} ms  "
            f"peak {row['peak_bytes'] / 1e6:7.2f} MB  residual {row['stationarity_residual']:.1e}"
        )
    print(
        f"aggregation of {agg['replies']} replies (10 x 51): check+sum {agg['check_and_sum_seconds']:.3f} s, solve {agg['solve_seconds'] * 1e3:.2f} ms"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
