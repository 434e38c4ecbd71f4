"""simulation/flower_fixes.py against a real Flower ``InMemoryLinkState``: what the extractor pass
keeps of Flower's semantics, what it costs (counted, not timed), the wake-ups, the version pin."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import flwr
import pytest
from flwr.app import Message, Metadata, RecordDict
from flwr.server.superlink.fleet.vce import vce_api
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
from flwr.superlink.grid.inmemory_grid import InMemoryGrid
from headway.simulation import flower_fixes
from headway.simulation.flower_fixes import faster_simulation_engine, hand_out

from benchmarks.extractor import instruction, link_state


def tag(msg: Message) -> int:
    return int(msg.content["c"]["tag"])  # type: ignore[arg-type]


def store(state, run_id, node, **kw) -> Message:
    msg = instruction(run_id, node, **kw)
    assert state.store_message_ins(msg) is not None
    return msg


def test_one_message_per_node_per_pass_in_store_order_and_marked_delivered():
    state, run_id, nodes = link_state(4)
    for k in range(3):
        for node in reversed(nodes):
            store(state, run_id, node, tag=k)
    for k in range(3):
        picked, _ = hand_out(state, set(nodes))
        assert [m.metadata.dst_node_id for m in picked] == list(reversed(nodes))  # one each, store order
        assert [tag(m) for m in picked] == [k] * 4  # each node's messages in the order stored
        assert all(m.metadata.delivered_at != "" for m in picked)
    assert hand_out(state, set(nodes)) == ([], [])
    assert len(state.message_ins_store) == 12  # delivered messages stay until their reply is pulled


def test_nodes_outside_the_mapping_get_nothing_and_keep_waiting():
    state, run_id, nodes = link_state(3)
    mine, other = store(state, run_id, nodes[0]), store(state, run_id, nodes[1])
    picked, waiting = hand_out(state, {nodes[0]})
    assert picked == [mine]
    assert waiting == [other.metadata.message_id]
    assert other.metadata.delivered_at == ""


def test_expired_and_out_of_federation_messages_deleted_as_flower_does():
    """The same store checked by Flower's ``_check_stored_messages`` and by one pass of ours
    loses the same messages; none of them is handed out."""
    results = []
    for ours in (False, True):
        state, run_id, nodes = link_state(4)
        msgs = [store(state, run_id, node, tag=i) for i, node in enumerate(nodes)]
        msgs.append(store(state, run_id, nodes[0], tag=9))
        msgs[1].metadata.created_at -= 3601  # past its one-hour ttl
        left = nodes[2]  # this node left the federation
        flower_filter = state.federation_manager.filter_nodes
        state.federation_manager.filter_nodes = lambda ids, fed, left=left, f=flower_filter: f(ids, fed) - {left}
        if ours:
            picked, _ = hand_out(state, set(nodes))
            assert sorted(tag(m) for m in picked) == [0, 3]
        else:
            state._check_stored_messages(set(state.message_ins_store))
        results.append(sorted(tag(m) for m in state.message_ins_store.values()))
    assert results[0] == results[1] == [0, 3, 9]


def test_indexed_pass_visits_only_the_ids_given():
    state, run_id, nodes = link_state(2)
    first = store(state, run_id, nodes[0])
    second = store(state, run_id, nodes[1])
    assert hand_out(state, set(nodes), [second.metadata.message_id])[0] == [second]
    assert first.metadata.delivered_at == ""
    assert hand_out(state, set(nodes), ["gone", first.metadata.message_id])[0] == [first]  # a deleted id is skipped


def test_cost_each_message_read_once_and_no_per_node_query(monkeypatch):
    """A pass over 10 000 queued messages for 1 000 nodes reads each message's metadata once and
    never calls Flower's per-node query or per-message check (Flower's pass is 1 000 scans)."""
    state, run_id, nodes = link_state(1000)
    for k in range(10):
        for node in nodes:
            store(state, run_id, node, tag=k)
    reads = 0
    flower_metadata: Any = Message.__dict__["metadata"].fget

    def counted(self):
        nonlocal reads
        reads += 1
        return flower_metadata(self)

    def forbidden(*a, **kw):
        raise AssertionError("the pass must not call this")

    monkeypatch.setattr(Message, "metadata", property(counted))
    monkeypatch.setattr(InMemoryLinkState, "get_message_ins", forbidden)
    monkeypatch.setattr(InMemoryLinkState, "_check_stored_messages", forbidden)
    picked, waiting = hand_out(state, set(nodes))
    assert reads == 10_000
    assert len(picked) == 1000 and len(waiting) == 9000
    reads = 0
    assert hand_out(state, set(nodes), [])[0] == [] and reads == 0  # an idle indexed pass reads nothing


def _run_extractor(state, nodes, f_stop, queue):
    th = threading.Thread(target=vce_api.add_messages_to_queue, args=(state, queue, dict.fromkeys(nodes, 0), f_stop))
    th.start()
    return th


def test_concurrent_pushes_none_lost_none_twice_order_kept():
    with faster_simulation_engine() as installed:
        assert installed
        state, run_id, nodes = link_state(50)
        f_stop, queue = threading.Event(), Queue[Message]()
        th = _run_extractor(state, nodes, f_stop, queue)
        pushed: list[Message] = []

        def push():
            for k in range(20):
                for node in nodes:
                    pushed.append(store(state, run_id, node, tag=k))

        pusher = threading.Thread(target=push)
        pusher.start()
        got: list[Message] = []
        deadline = time.monotonic() + 120
        while len(got) < 1000 and time.monotonic() < deadline:
            try:
                got.append(queue.get(timeout=1))
            except Empty:
                pass
        pusher.join()
        f_stop.set()
        th.join(timeout=10)
        assert not th.is_alive()
    ids = [m.metadata.message_id for m in got]
    assert len(ids) == len(set(ids)) == 1000
    assert set(ids) == {m.metadata.message_id for m in pushed}
    assert queue.empty()
    for node in nodes:
        assert [tag(m) for m in got if m.metadata.dst_node_id == node] == list(range(20))


def test_extractor_wakes_on_store_not_on_the_poll(monkeypatch):
    monkeypatch.setattr(flower_fixes, "POLL_INTERVAL", 60.0)
    with faster_simulation_engine():
        state, run_id, nodes = link_state(2)
        f_stop, queue = threading.Event(), Queue[Message]()
        th = _run_extractor(state, nodes, f_stop, queue)
        time.sleep(0.2)  # the first pass has run; the extractor now waits
        msg = store(state, run_id, nodes[1])
        assert queue.get(timeout=20) is msg
        f_stop.set()
        store(state, run_id, nodes[0])  # wakes it to see f_stop
        th.join(timeout=20)
        assert not th.is_alive()


def grid_on(state: InMemoryLinkState, run_id: int, pull_interval: float) -> InMemoryGrid:
    """Flower's in-memory grid of ``run_id`` on ``state`` (what run_simulation builds)."""

    class Factory:
        def state(self):
            return state

    grid = InMemoryGrid(Factory(), pull_interval=pull_interval)  # type: ignore[arg-type]
    grid._run = state.run_ids[run_id].run
    return grid


def answering(state: InMemoryLinkState, msgs: list[Message], delay: float) -> threading.Thread:
    """A started thread that replies to each of ``msgs``, in order, ``delay`` s after it is pushed."""
    for msg in msgs:
        msg.metadata.__dict__["_message_id"] = ""  # push_messages sets it

    def answer():
        for msg in msgs:
            while msg.metadata.message_id == "" or msg.metadata.message_id not in state.message_ins_store:
                time.sleep(0.005)
            time.sleep(delay)
            reply = Message(RecordDict(), reply_to=msg)
            reply.metadata.__dict__["_message_id"] = str(uuid.uuid4())
            assert state.store_message_res(reply) is not None

    th = threading.Thread(target=answer)
    th.start()
    return th


def timed_exchange(state, grid, msgs: list[Message], delay: float, timeout: float) -> tuple[list[Message], float]:
    """The grid's send_and_receive of ``msgs``, each answered ``delay`` s after its push: the
    replies and the seconds it took."""
    th = answering(state, msgs, delay=delay)
    t0 = time.monotonic()
    replies = list(grid.send_and_receive(msgs, timeout=timeout))
    took = time.monotonic() - t0
    th.join()
    return replies, took


def test_grid_wakes_when_the_replies_are_stored():
    """With a 60 s pull interval the grid still returns as soon as the last reply is stored."""
    with faster_simulation_engine():
        state, run_id, nodes = link_state(3)
        grid = grid_on(state, run_id, pull_interval=60.0)
        msgs = [instruction(run_id, node) for node in nodes]
        replies, took = timed_exchange(state, grid, msgs, delay=0.05, timeout=120)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == sorted(m.metadata.message_id for m in msgs)
    assert took < 30  # Flower's loop sleeps the full 60 s after its first pull


def test_grid_pulls_only_the_ids_whose_reply_was_stored(monkeypatch):
    """After the first pull (every id, as Flower's), a pull asks only for ids answered since: each
    answered id is asked for once, where Flower's loop asks for every missing id on every pull."""
    monkeypatch.setattr(flower_fixes, "SWEEP_INTERVAL", 1000.0)  # no full pull after the first
    with faster_simulation_engine():
        state, run_id, nodes = link_state(20)
        grid = grid_on(state, run_id, pull_interval=0.01)
        asked: list[set[str]] = []
        pull = grid.pull_messages

        def counted(ids):
            asked.append(set(ids))
            return pull(ids)

        monkeypatch.setattr(grid, "pull_messages", counted)
        msgs = [instruction(run_id, node) for node in nodes]
        th = answering(state, msgs, delay=0.01)
        replies = list(grid.send_and_receive(msgs, timeout=60))
        th.join()
    assert sorted(r.metadata.reply_to_message_id for r in replies) == sorted(m.metadata.message_id for m in msgs)
    assert len(asked[0]) == 20  # the first pull: every id
    later = [i for ids in asked[1:] for i in ids]
    assert len(later) == len(set(later)) and len(later) <= 20  # then each answered id once
    assert not flower_fixes._signals(state).answered  # nothing left waiting to be pulled


def test_a_slow_sweep_defers_the_next_one():
    """The next whole-store sweep waits SWEEP_INTERVAL, or 1/SWEEP_SHARE times as long as the
    last sweep took, whichever is longer (a sweep a second of 10 000 messages grew the driver's
    cost a message with the clients)."""
    assert flower_fixes.next_sweep(100.0, 100.001) == 100.0 + flower_fixes.SWEEP_INTERVAL
    assert flower_fixes.next_sweep(100.0, 100.2) == pytest.approx(100.0 + 0.2 / flower_fixes.SWEEP_SHARE)


def test_grid_sweeps_take_a_bounded_share_of_the_driver(monkeypatch):
    """With every missing id asked for as often as allowed (SWEEP_INTERVAL 0) and each such
    sweep taking 0.05 s, sweeps stay within SWEEP_SHARE of the time: about one in 0.5 s at a
    share of 0.1, where without the bound every pull of a 1.2 s exchange would be one."""
    monkeypatch.setattr(flower_fixes, "SWEEP_INTERVAL", 0.0)
    monkeypatch.setattr(flower_fixes, "SWEEP_SHARE", 0.1)
    with faster_simulation_engine():
        state, run_id, nodes = link_state(20)
        grid = grid_on(state, run_id, pull_interval=0.01)
        sweeps: list[float] = []
        pull = grid.pull_messages

        def slow_sweep(ids):
            if len(ids) > 1 and set(ids) >= {m.metadata.message_id for m in msgs if m.metadata.message_id in state.message_ins_store}:
                sweeps.append(time.monotonic())
                time.sleep(0.05)
            return pull(ids)

        monkeypatch.setattr(grid, "pull_messages", slow_sweep)
        msgs = [instruction(run_id, node) for node in nodes]
        replies, took = timed_exchange(state, grid, msgs, delay=0.06, timeout=60)
    assert len(replies) == 20 and took > 1.0
    assert 1 <= len(sweeps) <= 1 + took / 0.5
    assert all(b - a >= 0.45 for a, b in zip(sweeps, sweeps[1:], strict=False))


def test_the_clientapp_loader_is_pickled_once_and_unpickled_once_per_process(monkeypatch):
    import pickle

    from ray import cloudpickle

    app = ["the app"]

    def app_fn():  # a closure, as Flower's loader is
        return app[0]

    loader = flower_fixes.LoadOnce(app_fn)
    shipped = pickle.dumps(loader)
    assert len(shipped) < len(loader.blob) + 300  # the blob travels as bytes, the closure is not pickled again
    loads = []

    def counted_loads(blob: bytes) -> Any:
        loads.append(1)
        return pickle.loads(blob)

    monkeypatch.setattr(cloudpickle, "loads", counted_loads)
    monkeypatch.setattr(flower_fixes, "_LOADERS", {})
    first, second = pickle.loads(shipped), pickle.loads(shipped)  # two messages reaching one actor
    assert first() == second() == "the app"
    assert loads == [1]  # unpickled once for the process, however many messages


def test_installs_on_the_recorded_flower_sources_and_restores_on_exit():
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    assert "add_messages_to_queue" in vce_api.run_api.__code__.co_names  # looked up when run_api starts the thread
    ray_parts = ("build", "num_workers", "terminate")
    originals = (vce_api.add_messages_to_queue, InMemoryGrid.send_and_receive, InMemoryLinkState.store_message_ins)
    ray_originals = [RayBackend.__dict__[name] for name in ray_parts]
    with faster_simulation_engine() as installed:
        assert installed
        assert vce_api.add_messages_to_queue is not originals[0]
        assert InMemoryGrid.send_and_receive is not originals[1]
        assert InMemoryLinkState.store_message_ins is not originals[2]
        assert all(RayBackend.__dict__[name] is not was for name, was in zip(ray_parts, ray_originals, strict=True))
    assert (vce_api.add_messages_to_queue, InMemoryGrid.send_and_receive, InMemoryLinkState.store_message_ins) == originals
    assert [RayBackend.__dict__[name] for name in ray_parts] == ray_originals


class _Pool:
    """The two fields of Flower's BasicActorPool that queue_ahead touches."""

    def __init__(self, actors: list[object]) -> None:
        self.pool = list(actors)
        self.num_actors = len(actors)


def test_queue_ahead_gives_each_actor_its_slots_and_terminate_sees_each_once():
    actors = [object(), object(), object()]
    pool = _Pool(actors)
    flower_fixes.queue_ahead(pool, slots=2)
    assert len(pool.pool) == 6 and all(pool.pool.count(a) == 2 for a in actors)
    taken = [pool.pool.pop()]  # a message in flight: its actor still has an idle slot for the next one
    assert {id(a) for a in pool.pool} == {id(a) for a in actors}
    pool.pool.extend(taken)
    flower_fixes.distinct_actors(pool)
    assert sorted(map(id, pool.pool)) == sorted(map(id, actors))


def test_a_message_goes_to_the_actor_with_the_most_idle_slots():
    a, b, c = object(), object(), object()
    pool = _Pool([a, b, c])
    flower_fixes.queue_ahead(pool, slots=2)
    taken = []
    for _ in range(3):  # three messages: one on each actor before any actor gets a second
        flower_fixes.least_busy_last(pool.pool)
        taken.append(pool.pool.pop())
    assert sorted(map(id, taken)) == sorted(map(id, [a, b, c]))
    pool.pool.append(taken[0])  # its message done: that actor has two idle slots again, the others one
    flower_fixes.least_busy_last(pool.pool)
    assert pool.pool[-1] is taken[0]
    # a slot returned last by a busy actor: Flower's pop (the list's end) would queue the message
    # behind that actor's running one while another actor sits idle
    idle = [a, a, b]  # a: nothing in flight; b: one message in flight
    flower_fixes.least_busy_last(idle)
    assert idle[-1] is a
    empty: list[object] = []
    flower_fixes.least_busy_last(empty)  # nothing idle: nothing to move
    assert empty == []


def test_worker_loops_get_a_thread_each_beyond_flowers_executor_cap():
    with faster_simulation_engine():
        executor = vce_api.ThreadPoolExecutor()
        assert executor._max_workers >= 1000  # Flower's default: min(32, CPUs + 4)
        executor.shutdown()
    assert vce_api.ThreadPoolExecutor is ThreadPoolExecutor


def test_worker_threads_are_one_per_slot():
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    backend = RayBackend.__new__(RayBackend)  # no Ray: only the pool the property reads
    backend.pool = _Pool([object(), object()])  # type: ignore[assignment]
    assert backend.num_workers == 2
    with faster_simulation_engine():
        assert backend.num_workers == 2 * flower_fixes.TASKS_PER_ACTOR
    assert backend.num_workers == 2


def test_recorded_hashes_are_the_installed_flowers_and_cover_every_patched_module(monkeypatch):
    import importlib

    from flwr.server.superlink.fleet.vce.backend import raybackend
    from flwr.simulation.ray_transport import ray_actor

    root = flower_fixes.flower_root()
    assert root is not None
    found = flower_fixes.source_hashes(root, flower_fixes.FLOWER_FILES)
    assert flower_fixes.checked_release(found) is not None, flower_fixes.nearest_changes(found)
    assert all(set(recorded) == set(flower_fixes.FLOWER_FILES) for recorded in flower_fixes.FLOWER_SOURCES.values())
    patched = [vce_api, raybackend, ray_actor, importlib.import_module(InMemoryLinkState.__module__)]
    patched += [importlib.import_module(InMemoryGrid.__module__), importlib.import_module(Metadata.__module__)]
    patched += [importlib.import_module(name) for name in flower_fixes.ID_MODULES]
    assert {Path(str(m.__file__)).relative_to(root).as_posix() for m in patched} == set(flower_fixes.FLOWER_FILES)
    monkeypatch.setattr(flwr, "__version__", "1.41.0")  # keyed on the files, not the version string
    with faster_simulation_engine() as installed:
        assert installed


def test_a_changed_flower_source_leaves_flower_alone_with_one_warning_naming_it(tmp_path, monkeypatch, caplog):
    root = flower_fixes.flower_root()
    assert root is not None
    for name in flower_fixes.FLOWER_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((root / name).read_bytes())
    changed = tmp_path / "server/superlink/fleet/vce/vce_api.py"
    changed.write_bytes(changed.read_bytes() + b"# a later Flower\n")
    monkeypatch.setattr(flower_fixes, "flower_root", lambda: tmp_path)
    originals = (vce_api.add_messages_to_queue, InMemoryGrid.send_and_receive, InMemoryLinkState.store_message_ins)
    with caplog.at_level(logging.INFO, logger="headway"), faster_simulation_engine() as installed:
        assert not installed
        assert (vce_api.add_messages_to_queue, InMemoryGrid.send_and_receive, InMemoryLinkState.store_message_ins) == originals
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "flwr/server/superlink/fleet/vce/vce_api.py" in warnings[0], warnings
    assert "in_memory_linkstate" not in warnings[0]  # only the file that changed is named
    (tmp_path / "app/metadata.py").unlink()  # a file a later Flower moved: missing counts as changed
    found = flower_fixes.source_hashes(tmp_path, flower_fixes.FLOWER_FILES)
    assert flower_fixes.checked_release(found) is None
    assert flower_fixes.nearest_changes(found)[1] == ["server/superlink/fleet/vce/vce_api.py", "app/metadata.py"]


def test_other_state_class_gets_flowers_extractor(monkeypatch):
    calls = []
    monkeypatch.setattr(vce_api, "add_messages_to_queue", lambda *a: calls.append(a))

    class OtherState(InMemoryLinkState):
        pass

    state, _, nodes = link_state(1)
    state.__class__ = OtherState
    stopped = threading.Event()
    stopped.set()  # whichever extractor runs returns at once
    with faster_simulation_engine():
        vce_api.add_messages_to_queue(state, Queue(), {nodes[0]: 0}, stopped)
    assert len(calls) == 1 and calls[0][0] is state


@pytest.mark.integration
def test_headway_run_uses_the_fixed_extractor(tmp_path, data_dir, monkeypatch):
    """simulate() runs a real simulation through our pass (Flower's per-node query is never
    called) and gets the same rounds; Flower's functions are back afterwards."""
    from headway.core.config import resolve_settings
    from headway.simulation import simulate

    passes = []
    ours = flower_fixes.hand_out

    def counted(*a, **kw):
        passes.append(1)
        return ours(*a, **kw)

    flower_queries = []
    flower_query = InMemoryLinkState.get_message_ins

    def watched(*a, **kw):
        flower_queries.append(1)
        return flower_query(*a, **kw)

    monkeypatch.setattr(flower_fixes, "hand_out", counted)
    slots = []
    queue_ahead = flower_fixes.queue_ahead

    def queued(pool, *a, **kw):
        queue_ahead(pool, *a, **kw)
        slots.append((len(pool.pool), pool.num_actors))

    monkeypatch.setattr(flower_fixes, "queue_ahead", queued)
    monkeypatch.setattr(InMemoryLinkState, "get_message_ins", watched)
    cfg = resolve_settings(
        {"dataset": "mnist", "num-clients": 2, "num-server-rounds": 1, "partition": "pathological", "train-fraction": 0.02}
        | {"local-epochs": 1, "batch-size": 10, "seed": 0, "data-dir": data_dir}
    )
    summary = simulate(cfg, tmp_path)
    assert summary["status"] == "complete"
    assert passes and not flower_queries
    assert slots and all(n == flower_fixes.TASKS_PER_ACTOR * actors for n, actors in slots)
    assert vce_api.add_messages_to_queue.__module__ == "flwr.server.superlink.fleet.vce.vce_api"


def test_seeded_ids_repeat_per_seed_and_module_and_honour_exclude():
    one, again = flower_fixes.SeededIds(7, "m"), flower_fixes.SeededIds(7, "m")
    drawn = [one(8) for _ in range(5)]
    assert drawn == [again(8) for _ in range(5)]
    assert drawn != [flower_fixes.SeededIds(8, "m")(8) for _ in range(5)]  # another seed, another stream
    assert drawn != [flower_fixes.SeededIds(7, "n")(8) for _ in range(5)]  # another module, another stream
    assert all(0 <= n < 2**64 for n in drawn) and all(0 <= flower_fixes.SeededIds(7, "m")(1) < 256 for _ in range(3))
    first = flower_fixes.SeededIds(3, "m")(1)
    assert flower_fixes.SeededIds(3, "m")(1, exclude={first}) != first


def _register(count: int) -> list[int]:
    state = link_state(0)[0]
    return [state.create_node("aid", "name", uuid.uuid4().bytes, heartbeat_interval=60.0) for _ in range(count)]


def test_node_ids_of_a_real_link_state_repeat_with_the_seed_and_stay_unique():
    from flwr.common.constant import SUPERLINK_NODE_ID

    with faster_simulation_engine(seed=5):
        first = _register(20)
    with faster_simulation_engine(seed=5):
        second = _register(20)
    with faster_simulation_engine(seed=6):
        other = _register(20)
    assert first == second != other
    assert len(set(first)) == 20 and not {0, SUPERLINK_NODE_ID} & set(first)
    with faster_simulation_engine():  # no seed: Flower's own draws
        assert _register(3) != _register(3)


def test_flowers_id_draws_are_back_after_the_block():
    import importlib

    from flwr.supercore.corestate.utils import generate_rand_int_from_bytes as flower_draw

    modules = [importlib.import_module(name) for name in flower_fixes.ID_MODULES]
    before = [m.generate_rand_int_from_bytes for m in modules]
    assert all(draw in (flower_draw,) or draw.__module__.startswith("flwr.") for draw in before)
    with faster_simulation_engine(seed=1):
        assert all(isinstance(m.generate_rand_int_from_bytes, flower_fixes.SeededIds) for m in modules)
    assert [m.generate_rand_int_from_bytes for m in modules] == before
    with pytest.raises(RuntimeError), faster_simulation_engine(seed=1):
        raise RuntimeError("a run that fails")
    assert [m.generate_rand_int_from_bytes for m in modules] == before


def _tiny_run(out, data_dir, monkeypatch) -> tuple[list[dict[str, Any]], list[int], set[int]]:
    """A real 3-client, 2-round FedAvg simulation: its rounds, the node ids Flower registered and the run ids its messages carried."""
    import json

    from headway.core.config import resolve_settings
    from headway.simulation import simulate

    nodes: list[int] = []
    runs: set[int] = set()
    create_node, store_ins = InMemoryLinkState.create_node, InMemoryLinkState.store_message_ins

    def created(self, *a, **kw):
        nodes.append(create_node(self, *a, **kw))
        return nodes[-1]

    def stored(self, message):
        runs.add(message.metadata.run_id)
        return store_ins(self, message)

    monkeypatch.setattr(InMemoryLinkState, "create_node", created)
    monkeypatch.setattr(InMemoryLinkState, "store_message_ins", stored)
    cfg = resolve_settings(
        {"dataset": "mnist", "num-clients": 3, "num-server-rounds": 2, "partition": "iid", "train-fraction": 0.02}
        | {"algorithm": "fedavg", "local-epochs": 1, "batch-size": 10, "seed": 0, "data-dir": data_dir}
    )
    assert simulate(cfg, out)["status"] == "complete"
    monkeypatch.undo()
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()], nodes, runs


@pytest.mark.integration
def test_two_runs_of_one_config_ship_the_same_bytes_every_round(tmp_path, data_dir, monkeypatch):
    """Flower's ids come from the seed: the same run id and node ids in both runs, so every message, and
    every round's bytes_down/up and phase bytes, are the same size (with os.urandom ids they differ)."""
    a, nodes_a, runs_a = _tiny_run(tmp_path / "a", data_dir, monkeypatch)
    b, nodes_b, runs_b = _tiny_run(tmp_path / "b", data_dir, monkeypatch)
    assert [r["round"] for r in a] == [r["round"] for r in b] == [1, 2]
    for x, y in zip(a, b):
        wire = [k for k in x if k.endswith(("bytes_down", "bytes_up"))]
        assert "bytes_down" in wire and "bytes_up" in wire
        assert {k: y[k] for k in wire} == {k: x[k] for k in wire}, x["round"]
    assert nodes_a == nodes_b and len(set(nodes_a)) == 3 and runs_a == runs_b and len(runs_a) == 1


def test_the_fixes_install_only_where_every_file_is_one_checked_releases():
    releases = flower_fixes.FLOWER_SOURCES
    assert {flower_fixes.checked_release(recorded) for recorded in releases.values()} == set(releases)
    corestate = "supercore/corestate/in_memory_corestate.py"
    mixed = {**releases["1.39.0"], corestate: releases["1.42.0"][corestate]}  # each file some release's, the set none's
    assert flower_fixes.checked_release(mixed) is None
    assert flower_fixes.nearest_changes(mixed) == ("1.42.0", ["server/superlink/linkstate/in_memory_linkstate.py"])
