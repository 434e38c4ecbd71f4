"""Kill a run in a round and resume it: the resumed run's rounds beside an unbroken run's, and
what the checkpoints cost.

    headway bench resume                                    # FedLog, MNIST Table 1, 20 rounds, killed in round 7
    headway bench resume --rounds 6 --kill-in 3 --set num-clients=10

Three ``headway run`` processes into ``benchmarks/results/resume[-TAG]/``: ``unbroken``; ``killed``,
SIGKILLed with every process it started while round ``--kill-in`` is under way (after the record of
the round before it, half a round in), then ``headway run --resume`` on the same folder. Prints
each round's accuracy and bytes of both runs, whether they are equal, and each checkpoint's
size and write time; writes ``comparison.json`` and ``table.md``. A finished step is not run again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from benchmarks.runner import CONFIGS, ROOT, finished, load_run, results_root

COMPARED = ("accuracy", "bytes_down", "bytes_up", "values_bytes_down", "values_bytes_up", "clients")


def headway(*args: str) -> list[str]:
    """The command line of ``headway`` with ``args``, run by this interpreter."""
    return [sys.executable, "-m", "headway", *args]


def run_args(config: str, rounds: int, sets: list[str]) -> list[str]:
    """``headway run``'s arguments for the benchmark's configuration."""
    out = [config, "--set", f"num-server-rounds={rounds}"]
    for item in sets:
        out += ["--set", item]
    return out


def records(folder: Path) -> list[dict[str, Any]]:
    """The round records written so far (a torn last line skipped)."""
    path = folder / "rounds.jsonl"
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def kill_tree(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc`` and every process under it (Ray's), as a crash would end them."""
    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        procs = []
    for p in procs:
        try:
            p.kill()
        except psutil.Error:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_and_kill(argv: list[str], out: Path, kill_in: int) -> float:
    """Run ``headway run`` into ``out`` and SIGKILL it half a round into round ``kill_in``; the seconds it ran."""
    started = time.monotonic()
    proc = subprocess.Popen(headway("run", *argv, "--out", str(out)), cwd=ROOT, start_new_session=True)
    last = started
    while proc.poll() is None:
        done = records(out)
        if len(done) >= kill_in - 1:
            per_round = done[-1]["seconds"] if done else time.monotonic() - last
            time.sleep(max(per_round / 2, 0.5))
            kill_tree(proc)
            return time.monotonic() - started
        time.sleep(0.2)
    raise SystemExit(f"the run ended (exit {proc.returncode}) before round {kill_in}: nothing to resume")


def checkpoint_costs(folder: Path) -> dict[str, Any]:
    """What summary.json says the checkpoints cost, and the size of those kept."""
    summary = json.loads((folder / "summary.json").read_text())
    kept = sorted((folder / "checkpoints").glob("*.ckpt"))
    return {
        "checkpoint_bytes": summary.get("checkpoint_bytes"),
        "checkpoint_seconds": summary.get("checkpoint_seconds"),
        "kept": [p.name for p in kept],
        "kept_bytes": [p.stat().st_size for p in kept],
        "resumed": summary.get("resumed"),
    }


def compare(unbroken: list[dict[str, Any]], resumed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Round by round, the compared figures of both runs and which differ."""
    rows = []
    for a, b in zip(unbroken, resumed, strict=False):
        row: dict[str, Any] = {"round": a["round"]}
        for key in COMPARED:
            row[key] = [a.get(key), b.get(key)]
        row["differs"] = [k for k in COMPARED if a.get(k) != b.get(k)]
        rows.append(row)
    if len(unbroken) != len(resumed):
        rows.append({"round": None, "differs": [f"rounds: {len(unbroken)} unbroken, {len(resumed)} resumed"]})
    return rows


def table(rows: list[dict[str, Any]], kill_in: int) -> str:
    """The per-round comparison as markdown."""
    head = (
        f"| round | accuracy unbroken | accuracy resumed (killed in round {kill_in}) | bytes down (both) | bytes up (both) | equal |\n"
        "|---|---|---|---|---|---|\n"
    )

    def same(pair: list[Any]) -> str:
        return f"{pair[0]:,}" if pair[0] == pair[1] else f"{pair[0]:,} / {pair[1]:,}"

    lines = [
        f"| {r['round']} | {r['accuracy'][0]:.4f} | {r['accuracy'][1]:.4f} | {same(r['bytes_down'])} | {same(r['bytes_up'])} | "
        f"{'yes' if not r['differs'] else 'no: ' + ', '.join(r['differs'])} |"
        for r in rows
        if r["round"] is not None
    ]
    return head + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="headway bench resume", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=CONFIGS["mnist"], help="run-config TOML (default: FedLog Table 1 MNIST)")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--kill-in", type=int, default=7, help="the round the run is killed in")
    p.add_argument("--set", action="append", default=["algorithm=fedlog"], metavar="KEY=VALUE")
    p.add_argument("--tag", default="")
    args = p.parse_args(argv)
    if not 1 <= args.kill_in <= args.rounds:
        p.error(f"--kill-in must be a round of the run (1..{args.rounds})")
    root = results_root("resume", args.tag)
    argv_run = run_args(args.config, args.rounds, args.set)
    unbroken, killed = root / "unbroken", root / "killed"
    if not finished(unbroken):
        subprocess.run(headway("run", *argv_run, "--out", str(unbroken), "--overwrite"), cwd=ROOT, check=False)
    killed_after: float | None = None
    if not finished(killed):
        if not (killed / "checkpoints").is_dir():
            killed_after = run_and_kill([*argv_run, "--overwrite"], killed, args.kill_in)
            print(f"killed in round {args.kill_in} after {killed_after:.1f} s; rounds recorded: {len(records(killed))}", flush=True)
        subprocess.run(headway("run", "--resume", str(killed)), cwd=ROOT, check=False)
    _, a = load_run(unbroken)
    _, b = load_run(killed)
    rows = compare(a, b)
    result = {
        "config": args.config,
        "sets": args.set,
        "rounds": args.rounds,
        "kill_in": args.kill_in,
        "killed_after_seconds": killed_after,
        "unbroken": checkpoint_costs(unbroken),
        "resumed": checkpoint_costs(killed),
        "per_round": rows,
        "equal": all(not r["differs"] for r in rows),
    }
    (root / "comparison.json").write_text(json.dumps(result, indent=1) + "\n")
    text = table(rows, args.kill_in)
    (root / "table.md").write_text(text)
    print(text)
    print(json.dumps({k: result[k] for k in ("unbroken", "resumed", "equal")}, indent=1))
    return 0 if result["equal"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
