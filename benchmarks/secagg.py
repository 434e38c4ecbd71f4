"""FedLog plain, under secure-aggregation=secagg+, and under secagg+ with distributed DP
(ε = 1 and 10, next to central DP at the same ε), on the MNIST Table 1 setup with 60
training images a client.

    .venv/bin/headway bench secagg --clients 50 200 --rounds 20

Part 1 runs each variant as ``headway run`` in a fresh process (resumable: a finished run is
not run again) and writes one row per run to benchmarks/results/secagg/secagg.jsonl: final and
best accuracy, bytes per round (down and up, and the SecAgg stages' share), seconds per round
(rounds 2 on), the server's CPU seconds per stage (its own thread, from rounds.jsonl) and
messages per round. Part 2 (``--stages``) times one client's and the server's work in each
stage with the protocol run in this process (core/secagg.py, no Flower): n clients, each with
its k neighbours, a FedLog T of 10 × 51. Prints and writes secagg.md.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from typing import Any

import numpy as np

from benchmarks.floor import CONFIG, setup_sets
from benchmarks.runner import ROOT, load_run

OUT = ROOT / "benchmarks" / "results" / "secagg"
TABLE = OUT / "secagg.jsonl"
VARIANTS: dict[str, list[str]] = {
    "plain": [],
    "secagg+": ["secure-aggregation=secagg+"],
    "secagg+ ddp eps=10": ["secure-aggregation=secagg+", "fedlog-dp=distributed", "fedlog-epsilon=10"],
    "secagg+ ddp eps=1": ["secure-aggregation=secagg+", "fedlog-dp=distributed", "fedlog-epsilon=1"],
    "central dp eps=10": ["fedlog-dp=central", "fedlog-epsilon=10"],  # what distributed DP must match: the same σ on the sum
    "central dp eps=1": ["fedlog-dp=central", "fedlog-epsilon=1"],
}
COMMON = ["fedlog-clip=4"]  # secagg+ needs a bound; the plain run uses the same clip so only the protocol differs
STAGES = ("setup", "share", "collect", "unmask")


def run_variant(clients: int, rounds: int, variant: str) -> dict[str, Any]:
    """``headway run`` of one variant; its row."""
    sets, data = setup_sets(clients, rounds)
    extra = [*COMMON, *VARIANTS[variant]]
    if "fedlog-dp=distributed" in extra:
        extra.append(f"min-replies={clients}")  # every client's noise share counts: the sum carries exactly the central σ
    out = OUT / f"{clients}-clients-{rounds}-rounds-{variant.replace(' ', '-').replace('+', 'plus').replace('=', '')}"
    args = [
        sys.executable,
        "-m",
        "simulation",
        str(CONFIG),
        "--out",
        str(out),
        "--overwrite",
        *(x for s in [*sets, *extra] for x in ("--set", s)),
    ]
    print("run", variant, clients, "clients", flush=True)
    started = time.monotonic()
    subprocess.run(args, cwd=ROOT, check=True)
    wall = time.monotonic() - started
    summary, rows = load_run(out)
    later = rows[1:] or rows
    stage_bytes = {
        s: sum(r.get(f"secagg_{s}_bytes_down", 0) + r.get(f"secagg_{s}_bytes_up", 0) for r in later) / len(later)
        for s in ("setup", "share", "unmask")
    }
    cpu = {s: float(np.mean([r.get(f"secagg_server_cpu_{s}", 0.0) for r in later])) for s in STAGES}
    return {
        "variant": variant,
        "clients": clients,
        "rounds": len(rows),
        "data": data,
        "final_accuracy": rows[-1]["accuracy"],
        "best_accuracy": max(r["accuracy"] for r in rows if r["accuracy"] is not None),
        "bytes_down_per_round": round(sum(r["bytes_down"] for r in later) / len(later)),
        "bytes_up_per_round": round(sum(r["bytes_up"] for r in later) / len(later)),
        "secagg_stage_bytes_per_round": {k: round(v) for k, v in stage_bytes.items()},
        "seconds_per_round": round(sum(r["seconds"] for r in later) / len(later), 2),
        "server_cpu_per_stage": {k: round(v, 4) for k, v in cpu.items()},
        "messages_per_round": clients * (4 if variant.startswith("secagg") else 1) + clients,  # + the evaluation exchange
        "failures": sum(r["failures"] for r in rows),
        "wall_seconds": round(wall, 1),
        "status": summary.get("status"),
        "dp": summary.get("dp"),  # FedLog's DP report (mode, ε, δ, σ, ...) where fedlog-dp is on
    }


def stage_costs(n: int, shares_wanted: int = 0, size: int = 510) -> dict[str, Any]:
    """CPU seconds of each stage for one client (mean over clients) and for the server, the
    protocol run in this process: n clients, T of ``size`` values."""
    from headway.core import secagg as S

    shares = S.share_count(n, shares_wanted)
    t = S.threshold_for(shares - 1, 0.5)  # of the shares - 1 other neighbours, as the server does
    floor = S.client_floor(min_replies=1, secagg_shares=shares_wanted, secagg_threshold=0.5)
    nodes = list(range(1, n + 1))
    graph = S.neighbour_graph(nodes, shares, random.Random(0))
    client = dict.fromkeys(STAGES, 0.0)
    server = dict.fromkeys(STAGES, 0.0)

    def timed(where: dict[str, float], stage: str, fn: Any, *args: Any) -> Any:
        t0 = time.process_time()
        out = fn(*args)
        where[stage] += time.process_time() - t0
        return out

    keys = {v: timed(client, "setup", S.new_keys) for v in nodes}
    seeds = {v: S.random_seed() for v in nodes}
    public = {v: (keys[v].pk1, keys[v].pk2) for v in nodes}
    asked = timed(server, "setup", S.key_requests, graph, public)
    sent = {}
    for v in nodes:
        sent[v] = timed(client, "share", S.share_secrets, v, keys[v], seeds[v], asked[v], t, floor)
    relayed = timed(server, "share", S.relay_shares, sent)
    rng = np.random.default_rng(0)
    total = np.zeros(size, dtype=np.uint64)
    held = {}
    for v in nodes:
        held[v] = timed(client, "collect", S.open_shares, v, keys[v], asked[v], relayed[v], t)
        enc = timed(client, "collect", S.encode, rng.normal(0, 10, size), 24, rng)
        total = total + timed(client, "collect", S.masked, v, keys[v], seeds[v], enc, {u: public[u][0] for u in relayed[v]})
    requests = S.unmask_requests({v: relayed[v].keys() for v in relayed}, nodes)
    answers = {v: timed(client, "unmask", S.reveal, v, held[v], a, d, t) for v, (a, d) in requests.items()}
    digests = {v: S.seed_digest(seeds[v]) for v in nodes}
    timed(server, "unmask", lambda: S.unmask_sum(total, nodes, [], S.gather_shares(requests, answers), public, digests, relayed, t))
    return {
        "clients": n,
        "shares": shares,
        "threshold": t,
        "client_cpu_per_stage": {k: round(v / n, 5) for k, v in client.items()},
        "server_cpu_per_stage": {k: round(v, 4) for k, v in server.items()},
    }


def markdown(rows: list[dict[str, Any]], stages: list[dict[str, Any]]) -> str:
    out = [
        "| clients | variant | final acc | best acc | bytes/round down | up | of which setup/share/unmask | s/round | server CPU s/round setup/share/collect/unmask |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sb = r["secagg_stage_bytes_per_round"]
        cpu = r["server_cpu_per_stage"]
        out.append(
            f"| {r['clients']} | {r['variant']} | {r['final_accuracy']:.4f} | {r['best_accuracy']:.4f} | {r['bytes_down_per_round']:,} | "
            f"{r['bytes_up_per_round']:,} | {sb['setup']:,} / {sb['share']:,} / {sb['unmask']:,} | {r['seconds_per_round']:.2f} | "
            f"{cpu['setup']:.3f} / {cpu['share']:.3f} / {cpu['collect']:.3f} / {cpu['unmask']:.3f} |"
        )
    if stages:
        out += [
            "",
            "| clients | shares k | threshold t | one client's CPU s: setup / share / collect / unmask | server's CPU s (protocol only) |",
            "|---|---|---|---|---|",
        ]
        for s in stages:
            c, v = s["client_cpu_per_stage"], s["server_cpu_per_stage"]
            out.append(
                f"| {s['clients']} | {s['shares']} | {s['threshold']} | {c['setup']:.4f} / {c['share']:.4f} / {c['collect']:.4f} / {c['unmask']:.4f} | "
                f"{v['setup']:.4f} / {v['share']:.4f} / {v['collect']:.4f} / {v['unmask']:.4f} |"
            )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--stages", action="store_true", help="also time each stage in process (part 2)")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    rows = [json.loads(line) for line in TABLE.read_text().splitlines()] if TABLE.exists() else []
    for clients in args.clients:
        for variant in args.variants:
            if any(r["clients"] == clients and r["variant"] == variant and r["rounds"] == args.rounds for r in rows):
                continue
            row = run_variant(clients, args.rounds, variant)
            rows.append(row)
            with TABLE.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    stages = json.loads((OUT / "stages.json").read_text()) if (OUT / "stages.json").exists() else []
    if args.stages:  # this run's client counts replace their old rows; the others stay
        stages = sorted(
            [s for s in stages if s["clients"] not in args.clients] + [stage_costs(n) for n in args.clients], key=lambda s: s["clients"]
        )
        (OUT / "stages.json").write_text(json.dumps(stages, indent=1) + "\n")
    text = markdown(sorted(rows, key=lambda r: (r["clients"], list(VARIANTS).index(r["variant"]))), stages)
    (OUT / "secagg.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
