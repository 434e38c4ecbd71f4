"""One pass of Flower's simulation message extractor against ours (simulation/flower_fixes.py).

``.venv/bin/python -m benchmarks.extractor``: for 50, 1 000 and 10 000 nodes with one queued
message each, the wall-clock of one pass (Flower: ``get_message_ins(node, limit=1)`` for every
node; ours: :func:`hand_out`), the median of a few repeats on fresh stores:

- hand-out pass: every message is new and is handed out (the pass right after the grid pushes);
- idle pass: every message was handed out and waits for its reply (the passes during a round):
  Flower scans the store for each node; ours visits only what is new (nothing) and, once a
  second, sweeps the whole store (the sweep column).

and the wall-clock of one exchange through Flower's own machinery with clients that answer at
once (``InMemoryGrid.send_and_receive`` to every node, the extractor thread, a thread storing
each reply as it is queued): what the 0.1 s sleeps add per exchange, with Flower's code and with
``faster_simulation_engine``. Writes benchmarks/results/extractor/extractor.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import secrets
import statistics
import time
from pathlib import Path
from typing import Any

from headway.simulation.flower_fixes import hand_out

OUT = Path(__file__).parent / "results" / "extractor" / "extractor.json"


def link_state(num_nodes: int) -> tuple[Any, int, list[int]]:
    """A Flower ``InMemoryLinkState`` set up as ``run_simulation`` sets it up: one run in the
    no-op federation, ``num_nodes`` registered nodes; returns (state, run_id, node_ids)."""
    from flwr.common.constant import HEARTBEAT_INTERVAL_INF, NOOP_ACCOUNT_NAME, NOOP_FLWR_AID
    from flwr.proto.task_pb2 import Task  # type: ignore[attr-defined]
    from flwr.server.superlink.linkstate import LinkStateFactory
    from flwr.server.superlink.linkstate.in_memory_linkstate import RunRecord
    from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME, NOOP_FEDERATION_ID
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supercore.run import Run
    from flwr.superlink.federation import NoOpFederationManager

    state: Any = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(), ObjectStoreFactory()).state()
    run = Run.create_empty(run_id=7)
    run.primary_task_id = 11
    run.federation_id = NOOP_FEDERATION_ID
    state.run_ids[run.run_id] = RunRecord(run=run)
    state.task_store[11] = Task(task_id=11, run_id=run.run_id)
    nodes = []
    for _ in range(num_nodes):
        node_id = state.create_node(NOOP_FLWR_AID, NOOP_ACCOUNT_NAME, secrets.token_bytes(32), heartbeat_interval=HEARTBEAT_INTERVAL_INF)
        state.acknowledge_node_heartbeat(node_id=node_id, heartbeat_interval=HEARTBEAT_INTERVAL_INF)
        nodes.append(node_id)
    return state, run.run_id, nodes


def instruction(run_id: int, node_id: int, ttl: float = 3600.0, tag: int = 0) -> Any:
    """A train message from the server to ``node_id`` as the grid pushes it (message id set),
    its ``tag`` in a ConfigRecord so a test can tell messages apart."""
    from uuid import uuid4

    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    # Message() reads the sender's identity from TaskIdentity (run_simulation sets it); set it
    # for this call only, so no test sees it changed
    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    try:
        msg = Message(RecordDict({"c": ConfigRecord({"tag": tag})}), dst_node_id=node_id, message_type="train", ttl=ttl, group_id="1")
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved
    msg.metadata.__dict__["_message_id"] = str(uuid4())  # as InMemoryGrid.push_messages does
    return msg


def queued(num_nodes: int, per_node: int = 1) -> tuple[Any, list[int]]:
    """A link state with ``per_node`` stored messages for each of ``num_nodes`` nodes."""
    state, run_id, nodes = link_state(num_nodes)
    for k in range(per_node):
        for node in nodes:
            assert state.store_message_ins(instruction(run_id, node, tag=k)) is not None
    return state, nodes


def flower_pass(state: Any, nodes: list[int]) -> list[Any]:
    """The body of Flower 1.39's ``add_messages_to_queue`` loop, without the queue and the wait."""
    out = []
    for node_id in nodes:
        out.extend(state.get_message_ins(node_id=node_id, limit=1))
    return out


def time_pass(fn: Any, num_nodes: int, repeats: int, idle: bool = False) -> float:
    """Median seconds of one pass of ``fn`` over a fresh store of one message per node (``idle``:
    after a first pass handed them all out)."""
    times = []
    for _ in range(repeats):
        state, nodes = queued(num_nodes)
        if idle:
            assert len(fn(state, nodes)) == num_nodes
        t0 = time.perf_counter()
        got = fn(state, nodes)
        times.append(time.perf_counter() - t0)
        assert len(got) == (0 if idle else num_nodes)
    return statistics.median(times)


def ours_indexed(state: Any, nodes: list[int]) -> list[Any]:
    """Our pass as the extractor runs it between sweeps: over the ids stored since the last pass
    (here: all of them the first time, none afterwards)."""
    if not hasattr(state, "_bench_nodes"):  # the extractor gets its nodes as a dict, built once
        state._bench_nodes, state._bench_fresh = set(nodes), list(state.message_ins_store)
    fresh, state._bench_fresh = state._bench_fresh, []
    return hand_out(state, state._bench_nodes, fresh)[0]


def exchange_seconds(num_nodes: int, fixed: bool, repeats: int = 5) -> float:
    """Median seconds of one ``send_and_receive`` of one message to each of ``num_nodes`` nodes
    whose clients answer at once, through ``vce_api.add_messages_to_queue`` and ``InMemoryGrid``."""
    import contextlib
    import threading
    from queue import Empty, Queue
    from uuid import uuid4

    from flwr.app import Message, RecordDict
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid
    from headway.simulation.flower_fixes import faster_simulation_engine

    with faster_simulation_engine() if fixed else contextlib.nullcontext():
        state, run_id, nodes = link_state(num_nodes)
        factory: Any = type("Factory", (), {"state": lambda self: state})()
        grid = InMemoryGrid(factory)
        grid._run = state.run_ids[run_id].run
        f_stop, queue = threading.Event(), Queue[Message]()
        extractor = threading.Thread(target=vce_api.add_messages_to_queue, args=(state, queue, dict.fromkeys(nodes, 0), f_stop))

        def clients() -> None:
            while not f_stop.is_set():
                try:
                    msg = queue.get(timeout=0.05)
                except Empty:
                    continue
                reply = Message(RecordDict(), reply_to=msg)
                reply.metadata.__dict__["_message_id"] = str(uuid4())
                state.store_message_res(reply)

        answerer = threading.Thread(target=clients)
        extractor.start()
        answerer.start()
        times = []
        try:
            for _ in range(repeats):
                msgs = [instruction(run_id, node) for node in nodes]
                for msg in msgs:
                    msg.metadata.__dict__["_message_id"] = ""  # push_messages sets it
                t0 = time.perf_counter()
                replies = list(grid.send_and_receive(msgs, timeout=60))
                times.append(time.perf_counter() - t0)
                assert len(replies) == num_nodes
        finally:
            f_stop.set()
            extractor.join()
            answerer.join()
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, nargs="+", default=[50, 1000, 10000])
    p.add_argument("--flower-max", type=int, default=1000, help="skip Flower's pass above this many nodes (O(n^2): 10 000 takes minutes)")
    p.add_argument("--exchange-nodes", type=int, nargs="*", default=[50])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    rows = []
    print("milliseconds per pass; nodes with 1 queued message each")
    print(f"{'nodes':>6} | {'hand-out: Flower':>16} {'ours':>8} | {'idle: Flower':>12} {'ours':>8} {'sweep':>8}")
    for n in args.nodes:
        flower_runs = n <= args.flower_max
        reps = 1 if n > 100 else 5
        row = {
            "nodes": n,
            "queued_messages": n,
            "handout_flower_s": time_pass(flower_pass, n, reps) if flower_runs else None,
            "handout_ours_s": time_pass(ours_indexed, n, 5),
            "idle_flower_s": time_pass(flower_pass, n, reps, idle=True) if flower_runs else None,
            "idle_ours_s": time_pass(ours_indexed, n, 5, idle=True),
            "idle_ours_sweep_s": time_pass(lambda s, nodes: hand_out(s, set(nodes))[0], n, 5, idle=True),
        }
        rows.append(row)
        ms = {k: "skipped" if v is None else f"{v * 1e3:.3f}" for k, v in row.items() if k.endswith("_s")}
        print(
            f"{n:>6} | {ms['handout_flower_s']:>16} {ms['handout_ours_s']:>8} | {ms['idle_flower_s']:>12} {ms['idle_ours_s']:>8} {ms['idle_ours_sweep_s']:>8}",
            flush=True,
        )
    exchanges = []
    print("seconds per exchange (send_and_receive to every node, clients answering at once)")
    for n in args.exchange_nodes:
        row = {"nodes": n, "flower_s": exchange_seconds(n, fixed=False), "ours_s": exchange_seconds(n, fixed=True)}
        exchanges.append(row)
        print(f"{n:>6} nodes: Flower {row['flower_s']:.4f} s   ours {row['ours_s']:.4f} s", flush=True)
    import flwr

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "flwr": flwr.__version__,
                "python": platform.python_version(),
                "machine": platform.machine(),
                "rows": rows,
                "exchanges": exchanges,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
