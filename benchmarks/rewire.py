"""Regenerate the byte columns of committed result folders with the wire-true meter, by
replaying every recorded round's messages instead of re-running the experiments.

    .venv/bin/python -m benchmarks.rewire                  # every run folder under benchmarks/results
    .venv/bin/python -m benchmarks.rewire --only table1-mnist/ --force
    .venv/bin/python -m benchmarks.rewire --check          # replay against real 2-round simulations

Committed runs were metered by an old meter (the protobuf size of each message's
RecordDict). Results now count what Flower 1.39 ships for each message: its header, its
ObjectTree and every serialized object (:mod:`strategies.wire`). A message's size is a
function of its layout only: array shapes and dtypes (array bytes are raw), metric names
and integer values (varints), node and run ids (varints), the round number (the group id)
and the phase. So each run is replayed: its config.json is resolved (keys the schema no
longer knows are dropped, and named), its strategy is built with
``server.app.build_strategy`` and driven round by round through
:class:`strategies.engine.Engine` on a fake grid, exactly as
``HeadwayStrategy.start`` drives it (registration query, ``prepare`` in round 1,
``train_round``, ``evaluate_round``, ``final_evaluation`` in the last round), so every
message sent is the one the strategy builds. The fake clients answer with honest replies
of the exact shape the client procedures (``client/procedures``) send: model methods echo
the layers they were sent, FedLog a classes × m float32 statistic, FedProto prototypes and
class counts, LG-FedAvg's new test the whole local model; counts are the partitions' real
sizes (``core.partition.make_partition``), ``correct`` counts follow the round's recorded
accuracy, a loss is sent where the round recorded one. Message metadata is what Flower's
simulation gives: a random uint64 run id and node ids (drawn from a generator seeded by the
run's seed and number of clients, so a replay is reproducible and runs of one seed share
their ids), the SuperLink as node 1, and uuid4 message ids (36 characters) that replies
point back to.

Uncertainty: the real runs' run id and node ids are unknown. A random uint64 is a 10-byte
varint half the time and 9 bytes otherwise (fewer with probability 1/256), and each id is
written twice per message (header and message object), so a replayed message can differ
from the real one by ±2 bytes from the run id (the same sign for the whole run) and ±2 bytes
from the node id, plus a byte where an integer metric (a correct count) crosses a varint
length; ``--check`` measures this against real simulations.

Then, in place: rounds.jsonl byte columns (``bytes_down``, ``bytes_up``, every
``<phase>_bytes_*``, ``cumulative_bytes``), summary.json's byte figures (the old ones are
kept as ``old_meter_*``), each folder's plots and every table (``benchmarks.summarize``,
``benchmarks.dp_sweep``, ``benchmarks.flexible``; their table step only). A folder whose
summary already holds ``old_meter_total_bytes`` and whose round 1 holds
``register_bytes_down`` is done and skipped (``--force`` replays it again, to the same
bytes), so the command is idempotent and resumes where it stopped; files are replaced
atomically.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from core import protocol as P
from core.config import SCHEMA, body_for, resolve
from core.partition import make_partition
from core.sampling import sample_size
from server.app import build_strategy
from server.results import plot_curves
from strategies.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# summary.json byte figures that the old meter produced (kept as old_meter_<name>)
SUMMARY_BYTES = ("total_bytes", "total_bytes_down", "total_bytes_up", "total_eval_bytes", "bytes_to_target", "bytes_to_best")
DONE_MARK = "old_meter_total_bytes"


def is_byte_column(key: str) -> bool:
    return key in ("bytes_down", "bytes_up", "cumulative_bytes") or "_bytes_" in key or key.endswith("_bytes")


# ----- identities ---------------------------------------------------------------------
def uint64(rng: np.random.Generator, exclude: Iterable[int] = ()) -> int:
    """A uniformly random unsigned 64-bit integer, as Flower draws run and node ids
    (``generate_rand_int_from_bytes(8)``), avoiding ``exclude`` and the SuperLink's id."""
    taken = set(exclude) | {0, SUPERLINK_NODE_ID}
    while True:
        value = int.from_bytes(rng.bytes(8), "little", signed=False)
        if value not in taken:
            return value


def identity_rng(cfg: dict[str, Any]) -> np.random.Generator:
    """The generator of a replay's run id and node ids: fixed by the run's seed and number
    of clients, so a replay is reproducible and runs that differ only in method or
    settings get the same ids (their bytes then differ only by their message layouts)."""
    return np.random.default_rng([int(cfg["seed"]), int(cfg["num-clients"]), 1_000_003])


# ----- the clients ----------------------------------------------------------------------
class HonestClients:
    """Replies of the exact layout each method's client procedure sends, with the
    partitions' real counts and the round's recorded figures where a value's varint
    length could depend on it."""

    def __init__(self, cfg: dict[str, Any], strategy: Any):
        self.cfg = cfg
        self.strategy = strategy
        self.spec = strategy.spec
        self.algorithm = cfg["algorithm"]
        ds = strategy.services.data.dataset
        if ds is None:
            raise RuntimeError(f"data set {cfg['dataset']!r} not found (set HEADWAY_DATA_DIR): counts need the partitions")
        part = make_partition(ds, cfg)
        self.n_train = [len(t) for t in part.train]
        self.n_test = [len(t) for t in part.test]
        self.classification = self.spec.task == "classification"
        classes = self.spec.num_classes
        self.class_counts = [
            np.bincount(ds.y_train[t], minlength=classes).astype(np.float64) if self.classification else None for t in part.train
        ]
        self.row: dict[str, Any] = {}

    def body(self, pid: int) -> str:
        return body_for(self.cfg, pid)

    def registration(self, pid: int) -> RecordDict:
        return RecordDict({P.METRICS: MetricRecord({P.PARTITION_ID: pid}), P.CONFIG: ConfigRecord({P.BODY: self.body(pid)})})

    def _finite(self, key: str) -> bool:
        value = self.row.get(key)
        return isinstance(value, (int, float)) and bool(np.isfinite(value))

    def train_metrics(self, pid: int, trained: bool = True) -> MetricRecord:
        """``client.procedures.base.train_metrics``: count, partition id, loss when finite
        (a round whose record has no finite train_loss had no client sending one)."""
        met: dict[str, Any] = {P.NUM_EXAMPLES: self.n_train[pid], P.PARTITION_ID: pid}
        if trained and self._finite("train_loss"):
            met[P.LOSS] = float(self.row["train_loss"])
        return MetricRecord(met)

    def _correct(self, pid: int, key: str) -> int:
        acc = self.row.get(key)
        if not isinstance(acc, (int, float)) or not np.isfinite(acc):
            acc = self.row.get("accuracy") or 0.0
        return int(round(float(acc) * self.n_test[pid]))

    def test_metrics(self, pid: int) -> MetricRecord:
        """``client.procedures.base.test_metrics`` (plus FedProto's two correct counts)."""
        n = self.n_test[pid]
        met: dict[str, Any] = {P.NUM_EXAMPLES: n, P.PARTITION_ID: pid}
        if n and self._finite("loss"):
            met[P.LOSS] = float(self.row["loss"])
        if self.classification:
            met[P.CORRECT] = self._correct(pid, "accuracy") if n else 0
        else:
            met[P.SQUARED_ERROR] = float((self.row.get("mse") or 0.0) * n)
        if self.algorithm == "fedproto":
            head = self._correct(pid, "accuracy_head") if n else 0
            proto = self._correct(pid, "accuracy_prototype") if n else 0
            met[f"{P.CORRECT}-head"], met[f"{P.CORRECT}-prototype"] = head, proto
            if self.cfg["fedproto-predict"] == "prototype":
                met[P.CORRECT] = proto
        return MetricRecord(met)

    def train(self, pid: int, msg: Message) -> RecordDict:
        content = msg.content
        if self.algorithm == "fedlog":
            phase = str(content[P.CONFIG].get(P.PHASE, P.PHASE_TRAIN))
            stats = self._fedlog_stats(pid)
            arrays = ArrayRecord({P.STATS: Array(stats.astype(np.float32))})
            if self.cfg["fedlog-dp"] == "local":
                return RecordDict({P.ARRAYS: arrays, P.METRICS: MetricRecord({P.PARTITION_ID: pid})})
            return RecordDict({P.ARRAYS: arrays, P.METRICS: self.train_metrics(pid, trained=phase == P.PHASE_TRAIN)})
        if self.algorithm == "fedproto":
            counts = self.class_counts[pid]
            protos = np.zeros((self.spec.num_classes, self.strategy.m))
            protos[counts > 0] = 0.1
            arrays = ArrayRecord({P.PROTOTYPES: Array(protos.astype(np.float32)), P.CLASS_COUNTS: Array(counts.astype(np.float32))})
            return RecordDict({P.ARRAYS: arrays, P.METRICS: self.train_metrics(pid)})
        # model methods: the layers received, trained, sent back (same names, shapes, dtypes)
        sent = content[P.ARRAYS]
        arrays = ArrayRecord({k: Array(np.ascontiguousarray(sent[k].numpy())) for k in sent.keys()})
        return RecordDict({P.ARRAYS: arrays, P.METRICS: self.train_metrics(pid)})

    def _fedlog_stats(self, pid: int) -> np.ndarray:
        """Σ φ⊗e_y: class counts in the constant column, feature sums within the clip bound."""
        counts = self.class_counts[pid]
        bound = self.cfg["fedlog-clip"] if self.cfg["fedlog-clip"] > 0 else 1.0
        stats = np.empty((self.spec.num_classes, self.strategy.m))
        stats[:, 0] = counts
        stats[:, 1:] = 0.25 * bound * counts[:, None]
        return stats

    def evaluate(self, pid: int, msg: Message) -> RecordDict:
        phase = str(msg.content[P.CONFIG].get(P.PHASE, ""))
        if phase == P.PHASE_UPLOAD:  # LG-FedAvg's new test: the whole local model, once
            model = self.strategy._model(self.body(pid))
            weights = ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
            return RecordDict({P.ARRAYS: weights, P.METRICS: MetricRecord({P.PARTITION_ID: pid})})
        return RecordDict({P.METRICS: self.test_metrics(pid)})


# ----- the grid -------------------------------------------------------------------------
def phase_of(msg: Message) -> str:
    """The meter phase a message belongs to (from its type and config)."""
    kind = msg.metadata.message_type
    if kind == MessageType.QUERY:
        return P.PHASE_REGISTER
    cfg = msg.content.config_records.get(P.CONFIG, {}) if msg.has_content() else {}
    phase = str(cfg.get(P.PHASE, ""))
    if kind == MessageType.TRAIN:
        return phase or P.PHASE_TRAIN
    return phase or P.PHASE_EVALUATE


class ReplayGrid:
    """Flower's simulation grid, as the strategy sees it: connected nodes with random
    uint64 ids, messages given a uuid4 id when pushed (``InMemoryGrid.push_messages``),
    replies built by ``Message(content, reply_to=...)`` as a ClientApp does."""

    def __init__(self, n: int, clients: HonestClients, rng: np.random.Generator):
        self.clients = clients
        self.nodes: list[int] = []
        for _ in range(n):
            self.nodes.append(uint64(rng, self.nodes))
        self.pid = {node: i for i, node in enumerate(self.nodes)}  # node i holds partition i
        self.messages: Counter = Counter()  # (phase, "down"/"up") -> messages this round
        self.silent_train = 0  # training replies to leave out this round (recorded clients < sampled)

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def send_and_receive(self, messages, timeout=None):
        messages = list(messages)
        silent: set[int] = set()
        train = [m for m in messages if phase_of(m) == P.PHASE_TRAIN]
        if self.silent_train and train:
            order = sorted(train, key=lambda m: self.pid[m.metadata.dst_node_id])
            silent = {id(m) for m in order[len(order) - self.silent_train :]}
            self.silent_train = 0
        out = []
        for msg in messages:
            msg.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            phase = phase_of(msg)
            self.messages[(phase, "down")] += 1
            if id(msg) in silent:
                continue
            pid = self.pid[msg.metadata.dst_node_id]
            kind = msg.metadata.message_type
            if kind == MessageType.QUERY:
                content = self.clients.registration(pid)
            elif kind == MessageType.TRAIN:
                content = self.clients.train(pid, msg)
            else:
                content = self.clients.evaluate(pid, msg)
            self.messages[(phase, "up")] += 1
            out.append(Message(content=content, reply_to=msg))
        return out


# ----- replay ---------------------------------------------------------------------------
def load_rounds(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "rounds.jsonl").read_text().splitlines() if line.strip()]


def load_config(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """The folder's config.json resolved by today's schema; keys it no longer knows are dropped (and returned)."""
    raw = json.loads((folder / "config.json").read_text())
    dropped = sorted(set(raw) - set(SCHEMA))
    return resolve({k: v for k, v in raw.items() if k in SCHEMA}), dropped


def replay(cfg: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Counter]]:
    """The byte columns of every recorded round, replayed; and the messages per (phase, direction) of each round."""
    rng = identity_rng(cfg)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, uint64(rng), SUPERLINK_NODE_ID
    strategy = build_strategy(cfg)
    clients = HonestClients(cfg, strategy)
    grid = ReplayGrid(cfg["num-clients"], clients, rng)
    engine = strategy.engine = Engine(grid, cfg, strategy.services)
    arrays = strategy.initial_arrays()
    engine.wait_for_clients()
    out, counts = [], []
    for i, row in enumerate(rows, start=1):
        rnd = row["round"]
        if rnd != i:
            raise RuntimeError(f"rounds.jsonl is not rounds 1..N (line {i} is round {rnd})")
        clients.row = row
        grid.messages = Counter()
        engine.begin_round(rnd)
        if rnd == 1:
            arrays, _ = strategy.prepare(arrays, engine)
        sampled = sample_size(len(engine.nodes()), cfg["fraction-train"])
        grid.silent_train = max(0, sampled - int(row.get("clients", sampled)))
        step = strategy.train_round(rnd, arrays, engine)
        if step.arrays is not None:
            arrays = step.arrays
        strategy.evaluate_round(rnd, arrays, engine)
        if rnd == cfg["num-server-rounds"]:
            strategy.final_evaluation(arrays, engine)
        meter = engine.end_round()
        if step.clients != row.get("clients", step.clients):
            raise RuntimeError(f"round {rnd}: replay aggregated {step.clients} replies, the run recorded {row.get('clients')}")
        if meter.failures or meter.rejected_bytes_up:
            raise RuntimeError(f"round {rnd}: a replayed reply failed: {meter.failures[:3]}")
        record = strategy._round_record(rnd, step, {}, meter, 0.0, 0.0)
        out.append({k: v for k, v in record.items() if is_byte_column(k)})
        counts.append(grid.messages)
    return out, counts


def merge_row(old: dict[str, Any], new: dict[str, Any], cumulative: int) -> dict[str, Any]:
    """``old`` with its byte columns replaced by ``new`` (phase columns where the old ones
    stood, else after bytes_up) and ``cumulative_bytes`` last, as the recorder writes it."""
    phases = {k: v for k, v in new.items() if k not in ("bytes_down", "bytes_up")}
    row: dict[str, Any] = {}
    placed = False
    for key, value in old.items():
        if key == "cumulative_bytes":
            continue
        if key in ("bytes_down", "bytes_up"):
            row[key] = new[key]
            if key == "bytes_up" and not any(is_byte_column(k) and k not in ("bytes_down", "bytes_up", "cumulative_bytes") for k in old):
                row.update(phases)
                placed = True
            continue
        if is_byte_column(key):
            if not placed:
                row.update(phases)
                placed = True
            continue
        row[key] = value
    if not placed:
        row.update(phases)
    row["cumulative_bytes"] = cumulative
    return row


def new_summary(summary: dict[str, Any], rows: list[dict[str, Any]], cfg: dict[str, Any]) -> dict[str, Any]:
    """summary.json with byte figures from ``rows`` (as ``Recorder.finish`` computes them);
    the first-ever values are kept as ``old_meter_<name>``."""
    out = dict(summary)
    for key in SUMMARY_BYTES:
        if f"old_meter_{key}" not in out:
            out[f"old_meter_{key}"] = summary.get(key)
    target = cfg.get("target-accuracy") or 0.0
    reached = next((r for r in rows if target > 0 and r.get("accuracy") is not None and r["accuracy"] >= target), None)
    scored = [r for r in rows if r.get("accuracy") is not None]
    fresh = {
        "total_bytes": rows[-1]["cumulative_bytes"] if rows else 0,
        "total_bytes_down": sum(r.get("bytes_down", 0) for r in rows),
        "total_bytes_up": sum(r.get("bytes_up", 0) for r in rows),
        "total_eval_bytes": sum(r.get("eval_bytes_down", 0) + r.get("eval_bytes_up", 0) for r in rows),
        "bytes_to_target": reached["cumulative_bytes"] if reached else None,
        "round_to_target": reached["round"] if reached else None,
    }
    if scored:
        fresh["bytes_to_best"] = max(scored, key=lambda r: r["accuracy"]).get("cumulative_bytes")
    for key, value in fresh.items():
        if key in out or key in ("bytes_to_target", "round_to_target"):
            out[key] = value
    return out


def write_atomic(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` through a temporary file; False (and nothing written) when unchanged."""
    if path.exists() and path.read_text() == text:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def run_folders(root: Path) -> list[Path]:
    """Every folder under ``root`` (recursively) holding config.json and rounds.jsonl."""
    return sorted(p.parent for p in root.rglob("config.json") if (p.parent / "rounds.jsonl").exists())


def is_done(folder: Path) -> bool:
    try:
        summary = json.loads((folder / "summary.json").read_text())
        rows = load_rounds(folder)
    except (OSError, json.JSONDecodeError):
        return False
    return DONE_MARK in summary and bool(rows) and "register_bytes_down" in rows[0]


def rewire_folder(folder: Path, force: bool = False, dry_run: bool = False) -> dict[str, Any]:
    """Replay one run folder and rewrite its byte figures and plots; returns a report."""
    name = str(folder.relative_to(RESULTS)) if folder.is_relative_to(RESULTS) else folder.name
    report: dict[str, Any] = {"folder": name}
    rows = load_rounds(folder)
    summary_path = folder / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    if is_done(folder) and not force:
        report["skipped"] = "done"
        return report
    cfg, dropped = load_config(folder)
    report.update(
        dropped=dropped,
        algorithm=cfg["algorithm"],
        rounds=len(rows),
        fraction_train=cfg["fraction-train"],
        clients=sorted({r.get("clients") for r in rows}),
        failures=sum(r.get("failures", 0) for r in rows),
        absent=sum(r.get("absent", 0) for r in rows),
    )
    t0 = time.monotonic()
    replayed, _ = replay(cfg, rows)
    report["replay_seconds"] = round(time.monotonic() - t0, 1)
    new_rows, cumulative = [], 0
    for old, new in zip(rows, replayed):
        cumulative += new["bytes_down"] + new["bytes_up"]
        new_rows.append(merge_row(old, new, cumulative))
    report["total_bytes"] = (summary or {}).get("old_meter_total_bytes", (summary or {}).get("total_bytes")), cumulative
    if dry_run:
        return report
    write_atomic(folder / "rounds.jsonl", "".join(json.dumps(r) + "\n" for r in new_rows))
    if summary is not None:
        write_atomic(summary_path, json.dumps(new_summary(summary, new_rows, cfg), indent=2))
    plot_curves({cfg["algorithm"]: new_rows}, folder, f"{cfg['algorithm']} on {cfg['dataset']}")
    return report


# ----- tables ---------------------------------------------------------------------------
def regenerate_tables(results: Path = RESULTS) -> list[str]:
    """Rerun the table and plot step of every benchmark whose folder is under ``results``."""
    from benchmarks import dp_sweep, flexible
    from benchmarks.summarize import summarize

    done = []
    for root in sorted(p for p in results.iterdir() if p.is_dir()):
        name = root.name
        if name.startswith("table1-"):
            dataset = name[len("table1-") :].split("-")[0]
            summarize(root, dataset)
        elif name.startswith("dp-cifar10"):
            dp_sweep.summarize(root)
        elif name.startswith("flexible-cifar10"):
            tag = name[len("flexible-cifar10-") :] if name != "flexible-cifar10" else ""
            argv = ["--summarize-only", "--reference", str(results / "table1-cifar10")] + (["--tag", tag] if tag else [])
            flexible.main(argv)  # the all-cifar-cnn arm comes from the Table 1 runs, as committed
        else:
            continue
        done.append(name)
    return done


# ----- check against real simulations ---------------------------------------------------
CHECK_METHODS: dict[str, dict[str, Any]] = {
    "fedavg": {"algorithm": "fedavg"},
    "fedlog": {"algorithm": "fedlog"},
    "fedlog-c": {"algorithm": "fedlog", "fedlog-alpha": 0.01},
    "lg-fedavg": {"algorithm": "lg-fedavg"},
    "fedproto": {"algorithm": "fedproto"},
}
CHECK_BASE = {
    "dataset": "mnist",
    "num-clients": 3,
    "num-server-rounds": 2,
    "train-fraction": 0.02,
    "local-epochs": 1,
    "device": "cpu",
    "target-accuracy": 0.9,
}


# bytes per message the replay may differ by: ±2 run id, ±2 node id, a correct count's varint,
# and room for an id below 2**56 (1 in 256)
CHECK_TOLERANCE = 8.0


def message_count(column: str, counts: Counter) -> int:
    """Messages behind one byte column in a round (train and stats make bytes_down/up)."""
    direction = "down" if column.endswith("_down") else "up"
    if column in ("bytes_down", "bytes_up"):
        return counts[(P.PHASE_TRAIN, direction)] + counts[(P.PHASE_STATS, direction)]
    prefix = column.rsplit("_bytes_", 1)[0]
    phase = {"eval": P.PHASE_EVALUATE, "upload": P.PHASE_UPLOAD}.get(prefix, prefix)
    return counts[(phase, direction)]


def check(workdir: Path | None = None, methods: list[str] | None = None) -> int:
    """Run each method for real (2 rounds, 3 clients, MNIST) and compare its byte columns
    with the replay of the same folder; print the differences per column."""
    workdir = workdir or Path(tempfile.mkdtemp(prefix="rewire-check-"))
    worst = 0.0
    for method in methods or list(CHECK_METHODS):
        out = workdir / method
        sets = {**CHECK_BASE, **CHECK_METHODS[method]}
        args = [sys.executable, "-m", "simulation", "--out", str(out), "--overwrite"]
        for k, v in sets.items():
            args += ["--set", f"{k}={v}"]
        t0 = time.monotonic()
        proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"## {method}: the simulation failed (exit {proc.returncode})\n{proc.stderr[-3000:]}")
            return 1
        real = load_rounds(out)
        cfg, _ = load_config(out)
        replayed, counts = replay(cfg, real)
        print(
            f"\n## {method}: {' '.join(f'{k}={v}' for k, v in CHECK_METHODS[method].items() if k != 'algorithm')} (simulation {time.monotonic() - t0:.0f} s)"
        )
        print("| column | round | messages | real | replay | replay − real | per message |")
        print("|---|---|---|---|---|---|---|")
        for r, (a, b, c) in enumerate(zip(real, replayed, counts), start=1):
            for col in sorted(
                set(k for k in a if is_byte_column(k) and k != "cumulative_bytes") | set(k for k in b if k != "cumulative_bytes")
            ):
                x, y = a.get(col), b.get(col)
                n = message_count(col, c)
                if x is None or y is None:
                    print(f"| {col} | {r} | {n} | {x} | {y} | column missing | |")
                    worst = float("inf")
                    continue
                per = (y - x) / n if n else 0.0
                worst = max(worst, abs(per))
                print(f"| {col} | {r} | {n} | {x} | {y} | {y - x:+d} | {per:+.2f} |")
    print(f"\nlargest difference per message: {worst:.2f} bytes (results in {workdir})")
    return 0 if worst <= CHECK_TOLERANCE else 1


# ----- command line -----------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    global RESULTS
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.rewire", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--results", type=Path, default=RESULTS.resolve(), help="folder of result folders (default: benchmarks/results)")
    p.add_argument("--only", nargs="+", default=[], metavar="TEXT", help="only run folders whose path under --results contains TEXT")
    p.add_argument("--force", action="store_true", help="replay folders already rewired (gives the same bytes)")
    p.add_argument("--dry-run", action="store_true", help="replay and report, write nothing")
    p.add_argument("--no-tables", action="store_true", help="leave table.md files and the benchmarks' plots alone")
    p.add_argument("--check", action="store_true", help="compare the replay with real 2-round, 3-client simulations and exit")
    p.add_argument("--check-dir", type=Path, help="where --check writes its simulations (default: a temporary folder)")
    p.add_argument("--check-methods", nargs="+", choices=list(CHECK_METHODS), help="subset of --check's methods")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HEADWAY_DATA_DIR", str(ROOT.parent / "shared" / "data"))  # as tests/conftest.py
    if args.check:
        return check(args.check_dir, args.check_methods)
    RESULTS = args.results.resolve()
    folders = [f for f in run_folders(RESULTS) if not args.only or any(t in str(f.relative_to(RESULTS)) for t in args.only)]
    for folder in folders:
        report = rewire_folder(folder, force=args.force, dry_run=args.dry_run)
        if report.get("skipped"):
            print(f"{report['folder']}: {report['skipped']}, skipped")
            continue
        notes = []
        if report["dropped"]:
            notes.append(f"dropped config keys the schema no longer knows: {', '.join(report['dropped'])}")
        if report["fraction_train"] != 1.0 or report["failures"] or report["absent"]:
            notes.append(f"fraction-train {report['fraction_train']}, failures {report['failures']}, absent {report['absent']}")
        old, new = report["total_bytes"]
        print(
            f"{report['folder']}: {report['algorithm']}, {report['rounds']} rounds, clients per round {report['clients']}, "
            f"total bytes {old} -> {new} ({report['replay_seconds']} s){'; ' + '; '.join(notes) if notes else ''}",
            flush=True,
        )
    if not args.no_tables and not args.dry_run:
        print("tables and plots:", ", ".join(regenerate_tables(RESULTS)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
