"""The compute floor of a FedLog run: the simulation's client work with no Flower engine and no Ray.

    python -m benchmarks.floor --clients 50 --rounds 5 --processes 2

Every client does what it does in ``headway run`` (client/procedures/fedlog.py): the same
partition (core/partition.py through client/env.py), the same seeded body rebuilt for each
message and loaded with its kept state, the same local training, statistics, uplink
encoding and local evaluation; the server adds the statistics in partition-id order and
solves the head exactly as strategies/fedlog.py does. Only the messaging is gone: a round
is a loop over the clients, in this process or spread over ``--processes`` worker
processes (the simulation's Ray actors; each runs torch with the threads Ray gives an
actor of ``client-num-cpus``). Its per-round accuracies equal the simulation's round by
round (tests/test_floor.py), which is what makes it the same work.

The setup is FedLog on the MNIST Table 1 config with 60 training images a client:
``train-fraction`` grows with the clients (1.0 at 1 000); beyond 1 000 clients MNIST has
too few images, so the run reads a user source (docs/your-data.md) made of MNIST repeated,
each copy shifted by a pixel or two (:func:`repeated_mnist`). Prints one JSON object:
seconds per round (round 1 apart: it also holds the statistics round of fedlog-init=stats),
accuracy per round, wall seconds and the peak RSS and PSS of this process and its workers.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil

if TYPE_CHECKING:  # imported lazily where used: a spawned worker imports only what it runs
    from headway.core.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "benchmarks" / "configs" / "mnist-table1.toml"
TABLE1_CLIENTS, TABLE1_FRACTION = 50, 0.05  # Table 1: 50 clients on 5 % of MNIST's 60 000 training images
MNIST_TRAIN = 60_000
SHIFTS = [(0, 0), (0, 1), (1, 0), (0, -1), (-1, 0), (1, 1), (-1, -1), (1, -1), (-1, 1), (0, 2), (2, 0), (0, -2), (-2, 0)]

# ----- the setup: config overrides for n clients ------------------------------------------


def cache_dir() -> Path:
    """Where generated benchmark data goes: $HEADWAY_BENCH_CACHE, else the user cache."""
    return Path(os.environ.get("HEADWAY_BENCH_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "headway-bench")


def repeated_mnist(copies: int, data_dir: str = "") -> Path:
    """An npz user source (docs/your-data.md) of MNIST's train and test sets repeated
    ``copies`` times, copy k rolled by SHIFTS[k] pixels (so no two copies are the same
    image); written once into :func:`cache_dir`. Its labels are MNIST's digits."""
    if not 1 <= copies <= len(SHIFTS):
        raise ValueError(f"copies must be in 1..{len(SHIFTS)}, got {copies}")
    path = cache_dir() / f"mnist-x{copies}.npz"
    if path.exists():
        return path
    from headway.core.config import resolve_settings
    from headway.core.data import load_dataset

    cfg = resolve_settings({"dataset": "mnist", "data-dir": data_dir})
    ds = load_dataset("mnist", cfg.data_dir, 0)

    def repeat(x: np.ndarray) -> np.ndarray:
        return np.concatenate([np.roll(x[:, 0], SHIFTS[k], axis=(1, 2)) for k in range(copies)])

    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".part.npz")
    np.savez(
        part,
        x_train=repeat(ds.x_train),
        y_train=np.tile(ds.y_train, copies),
        x_test=repeat(ds.x_test),
        y_test=np.tile(ds.y_test, copies),
    )
    part.replace(path)
    return path


def setup_sets(clients: int, rounds: int, data_dir: str = "") -> tuple[list[str], str]:
    """The ``--set`` overrides of the Table 1 config for ``clients`` clients with 60 training
    images each, and a line saying what data that is."""
    sets = ["algorithm=fedlog", f"num-clients={clients}", f"num-server-rounds={rounds}", "target-accuracy=0.0"]
    fraction = TABLE1_FRACTION * clients / TABLE1_CLIENTS
    if fraction <= 1.0:
        return [*sets, f"train-fraction={fraction:g}"], f"MNIST, train-fraction {fraction:g}"
    copies = math.ceil(fraction)
    source = repeated_mnist(copies, data_dir)
    return [*sets, f"dataset={source}", f"train-fraction={fraction / copies:g}"], (
        f"MNIST x{copies} (user npz source; copy k rolled by up to 2 pixels), train-fraction {fraction / copies:g}"
    )


def load_cfg(config: str | Path, sets: list[str]) -> Settings:
    """The settings of the run config, read as ``headway run`` reads it."""
    from headway.simulation.runner import load_config

    cfg = load_config(str(config), sets)
    if cfg.algorithm != "fedlog":
        raise SystemExit(f"the floor runs FedLog only; the config says algorithm={cfg.algorithm!r}")
    if cfg.fedlog.dp != "off" or cfg.fraction_train != 1.0 or cfg.client_noise or cfg.fault_clients:
        raise SystemExit("the floor reproduces FedLog without DP, with every client every round, no client-noise and no faults")
    return cfg


# ----- one client's work (client/procedures/fedlog.py, without the records) -----------------


def torch_threads(cfg: Settings) -> int:
    """The torch threads of a Ray actor with ``client-num-cpus`` CPUs: Ray sets OMP_NUM_THREADS
    to max(1, floor(num_cpus)) in its workers (ray._private.utils.set_omp_num_threads_if_unset)."""
    return max(1, math.floor(cfg.client_num_cpus))


_WORKER: dict[str, Settings] = {}  # this process's run settings, set once by _init_worker


def _init_worker(cfg: Settings) -> None:
    """A worker process: the run config, and torch's threads as a Ray actor has them."""
    import torch

    torch.set_num_threads(torch_threads(cfg))
    _WORKER["settings"] = cfg


@dataclass
class Task:
    """One message to one client: its partition, kept body state, and what the server sent."""

    partition_id: int
    phase: str  # stats | train | evaluate
    server_round: int
    state: dict[str, np.ndarray] | None
    eta: np.ndarray
    phi: np.ndarray | None = None  # FedLog-C's Φ (or class means) as sent


@dataclass
class Answer:
    partition_id: int
    count: int
    sent: np.ndarray | None = None  # statistics as sent up
    loss: float = float("nan")
    correct: int = 0
    state: dict[str, np.ndarray] | None = field(default=None, repr=False)


def client_work(task: Task) -> Answer:
    """What client ``task.partition_id`` does with one message, as in the simulation."""
    import torch
    from headway.client.env import client_env
    from headway.client.procedures.fedlog import feature_map, local_statistics, train_body
    from headway.core.fedlog import uplink_array
    from headway.core.training import predict, task_metrics

    cfg = _WORKER["settings"]
    env = client_env(cfg.to_config(), {"partition-id": task.partition_id})
    kept = {k: torch.from_numpy(v) for k, v in task.state.items()} if task.state is not None else None
    fmap = feature_map(env, kept)  # seeded: this also seeds torch's generator, which the body's dropout draws from
    if task.phase == "evaluate":
        eta = torch.as_tensor(task.eta, dtype=torch.float32, device=env.device)
        fmap.eval()
        out = predict(lambda x: fmap(x) @ eta.T, env.x_test, device=env.device)
        task_metrics(env.data.task, out, env.y_test)  # the reply's loss, as the client computes it
        return Answer(task.partition_id, len(env.y_test), correct=int((out.argmax(1) == env.y_test).sum()) if len(env.y_test) else 0)
    loss, state = float("nan"), task.state
    if task.phase == "train":
        loss = train_body(env, fmap, task.eta, task.phi, task.server_round)
        state = {k: v.detach().cpu().numpy().copy() for k, v in fmap.body.state_dict().items()}
    stats = local_statistics(env, fmap)
    sent = uplink_array(stats, cfg.fedlog.uplink == "sparse", cfg.fedlog.uplink_dtype)
    return Answer(task.partition_id, len(env.y_train), sent=sent, loss=loss, state=state)


# ----- the server (strategies/fedlog.py's maths) ---------------------------------------------


class Server:
    """FedLog's server: the head η, the summed statistics, and the wire dtype of what it sends."""

    def __init__(self, cfg: Settings):
        from headway.core.config import body_names
        from headway.core.models import common_width
        from headway.core.run_data import run_spec

        spec = run_spec(cfg)
        self.cfg, self.classes = cfg, spec.num_classes
        self.m = common_width(body_names(cfg), spec.input_shape, cfg.feature_dim) + 1
        self.eta = np.random.default_rng(cfg.seed).normal(0.0, 1.0 / np.sqrt(self.m), size=(self.classes, self.m))
        self.phi_sum: np.ndarray | None = None

    def wire(self, values: np.ndarray) -> np.ndarray:
        if self.cfg.fedlog.wire_dtype == "float16":
            half = values.astype(np.float16)
            if np.all(np.isfinite(half)):
                return half
        return values.astype(np.float32)

    def sent_phi(self) -> np.ndarray | None:
        """FedLog-C's Φ as sent with a training message (None for plain FedLog or before any)."""
        if self.cfg.fedlog.alpha <= 0 or self.phi_sum is None:
            return None
        from headway.core.fedlog import class_means

        return self.wire(class_means(self.phi_sum) if self.cfg.fedlog.wire_dtype == "float16" else self.phi_sum)

    def aggregate(self, answers: list[Answer]) -> None:
        """Eq. 11 and 12 on the replies in partition-id order, as the strategy decodes them."""
        from headway.core.fedlog import dense_statistics, solve_head, sum_rows

        payloads = []
        for a in sorted(answers, key=lambda a: a.partition_id):
            assert a.sent is not None
            if self.cfg.fedlog.uplink == "sparse":
                stats, problem = dense_statistics(a.sent.astype(np.float64), self.classes)
                assert stats is not None, problem
            else:
                stats = a.sent.astype(np.float64)
            payloads.append(sum_rows(stats) if self.cfg.fedlog.uplink_dtype == "float16" else stats)
        phi = np.sum(payloads, axis=0)
        n = float(sum(a.count for a in answers))
        self.eta = solve_head(phi, n, chi=self.cfg.fedlog.prior_chi, nu=self.cfg.fedlog.prior_nu)
        self.phi_sum = phi


def accuracy(answers: list[Answer]) -> float | None:
    """Σ correct / Σ test examples over the clients that hold test examples (the strategy's aggregate)."""
    counted = [a for a in answers if a.count]
    total = float(sum(a.count for a in counted))
    return sum(a.correct for a in counted) / total if total else None


# ----- the run ---------------------------------------------------------------------------------


def run_floor(cfg: Settings, processes: int, on_round: Any = None) -> list[dict[str, Any]]:
    """Run ``cfg`` as the floor: one record per round (round, seconds, accuracy)."""
    clients = list(range(cfg.num_clients))
    states: dict[int, dict[str, np.ndarray] | None] = dict.fromkeys(clients)
    server = Server(cfg)
    pool = mp.get_context("spawn").Pool(processes, _init_worker, (cfg,)) if processes > 1 else None
    if pool is None:
        _init_worker(cfg)

    def exchange(tasks: list[Task]) -> list[Answer]:
        if pool is None:
            return [client_work(t) for t in tasks]
        return list(pool.imap_unordered(client_work, tasks, chunksize=max(1, len(tasks) // (64 * processes))))

    records: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        for rnd in range(1, cfg.num_server_rounds + 1):
            t0 = time.monotonic()
            if rnd == 1 and cfg.fedlog.init == "stats":
                server.aggregate(exchange([Task(p, "stats", 0, states[p], server.wire(server.eta), server.sent_phi()) for p in clients]))
            eta, phi = server.wire(server.eta), server.sent_phi()
            answers = exchange([Task(p, "train", rnd, states[p], eta, phi) for p in clients])
            for a in answers:
                states[a.partition_id] = a.state
            server.aggregate(answers)
            every = cfg.eval_every
            acc = None
            if rnd == cfg.num_server_rounds or (every and rnd % every == 0):
                acc = accuracy(exchange([Task(p, "evaluate", rnd, states[p], server.wire(server.eta)) for p in clients]))
            record = {"round": rnd, "seconds": time.monotonic() - t0, "elapsed_seconds": time.monotonic() - started, "accuracy": acc}
            records.append(record)
            if on_round is not None:
                on_round(record)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
    return records


# ----- memory of a process tree ------------------------------------------------------------------


def tree_memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) in bytes of ``pid`` and all its descendants; PSS shares each page among the
    processes that map it, so it does not count torch's shared libraries once per worker."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0
    rss = pss = 0
    for p in procs:
        try:
            info = p.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        rss += info.rss
        pss += getattr(info, "pss", 0)
    return rss, pss


class PeakSampler:
    """Samples :func:`tree_memory` of ``pid`` every ``interval`` seconds in a thread; keeps the peaks."""

    def __init__(self, pid: int, interval: float = 0.5):
        self.pid, self.interval = pid, interval
        self.rss = self.pss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, pss = tree_memory(self.pid)
            self.rss, self.pss = max(self.rss, rss), max(self.pss, pss)
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def summarize(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Round 1's seconds, the mean of the later rounds' and the accuracy per round."""
    later = [r["seconds"] for r in records[1:]]
    return {
        "rounds": len(records),
        "round1_seconds": round(records[0]["seconds"], 2) if records else None,
        "seconds_per_round": round(sum(later) / len(later), 2) if later else None,
        "accuracy": [r["accuracy"] for r in records],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.floor", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--clients", type=int, default=50)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--processes", type=int, default=2, help="worker processes (1: the loop runs in this process)")
    p.add_argument("--config", default=str(CONFIG), help="run config (default: the MNIST Table 1 setup)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="extra run-config overrides (after the setup's)")
    p.add_argument("--json", help="also write the result to this file")
    args = p.parse_args(argv)
    sets, data = setup_sets(args.clients, args.rounds)
    cfg = load_cfg(args.config, [*sets, *args.set])
    started = time.monotonic()
    with PeakSampler(os.getpid()) as peak:
        records = run_floor(cfg, args.processes, on_round=lambda r: print(json.dumps(r), file=sys.stderr, flush=True))
    result = {
        "kind": "floor",
        "clients": args.clients,
        "processes": args.processes,
        "torch_threads": torch_threads(cfg),
        "data": data,
        **summarize(records),
        "wall_seconds": round(time.monotonic() - started, 1),
        "peak_rss_gib": round(peak.rss / 2**30, 3),
        "peak_pss_gib": round(peak.pss / 2**30, 3),
        "per_round": records,
    }
    text = json.dumps(result)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
