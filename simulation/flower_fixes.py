"""Fixes to Flower's simulation engine (1.39 to 1.42), installed for the duration of a run.

1. The message extractor (``vce_api.add_messages_to_queue``) asks the link state for one message
   per node, and each ask scans the whole message store under the lock: one pass costs
   O(nodes x messages). :func:`hand_out` does the same pass under one hold of the lock, reading
   each message once; the extractor visits only what was stored since (the whole store once a
   second).
2. The extractor and the grid's ``send_and_receive`` sleep 0.1 s between polls. Here the extractor
   wakes when a message is stored and the grid wakes when the replies it waits for are stored;
   both keep the 0.1 s poll as a fallback. See docs/flower-extractor.md.
3. The Ray backend runs one worker thread per actor, and a thread hands its actor the next message
   only after the last reply came back to the driver, so every actor idles for a round trip per
   message (docs/flower-extractor.md, "A second defect"). :func:`queue_ahead` gives each actor
   :data:`TASKS_PER_ACTOR` slots, so its next message is already queued at the actor when it finishes.
   A message goes to the actor with the most idle slots, so it queues behind another only when
   every actor is busy; the price: a message queued behind a slow or hanging client waits for it,
   where Flower would have given it to the next actor to finish. The worker loops also get one
   thread each (Flower's default executor caps them at min(32, CPUs + 4), leaving the rest idle).
4. Per message, the driver pickles the ClientApp loader (a closure) and pulls replies by asking
   for every id it still waits for: :class:`LoadOnce` ships the loader as bytes pickled once, and
   the grid pulls only the ids whose reply was stored (all of them once a second).
5. Flower draws the run id, node ids and task ids from ``os.urandom`` and writes them into every
   message header as varints, so a message's wire size changed from run to run. Given the run's
   seed, :class:`SeededIds` draws them from a stream of that seed instead: two runs of one config
   (and a resumed run and the run it continues) get the same ids, hence the same bytes per message.
   In simulation the ids guard nothing (no node authentication); deployment never enters here.

Written against Flower 1.39.0 and checked against 1.42.0: they install only where every Flower file they
patch (or whose private fields they read, :data:`FLOWER_FILES`) is byte-identical to one checked release's
(:data:`FLOWER_SOURCES`, by sha256), so a Flower release that leaves those files alone keeps them and one
that changes any turns them off with a warning naming the file. ``python -m headway.simulation.flower_fixes``
prints the installed Flower's hashes, to record once the fixes were checked against it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import random
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Queue
from typing import Any

from headway.core.seeds import salt

log = logging.getLogger("headway")

# The files under flwr/ that the fixes patch (or whose private fields they read), and why
FLOWER_FILES: dict[str, str] = {
    "server/superlink/fleet/vce/vce_api.py": "add_messages_to_queue and the ThreadPoolExecutor that run_api looks up",
    "server/superlink/fleet/vce/backend/raybackend.py": "RayBackend.build, num_workers, terminate",
    "simulation/ray_transport/ray_actor.py": "BasicActorPool.submit and its idle list",
    "server/superlink/linkstate/in_memory_linkstate.py": "InMemoryLinkState.store_message_ins/res, its store, lock and run table (hand_out), its id draws",
    "superlink/grid/inmemory_grid.py": "InMemoryGrid.send_and_receive",
    "supercore/corestate/in_memory_corestate.py": "the id draws of ID_MODULES",
    "simulation/run_simulation.py": "the id draws of ID_MODULES",
    "simulation/legacy_app.py": "the id draws of ID_MODULES",
    "app/metadata.py": "Metadata's private fields, which hand_out reads directly",
}
_FLOWER_1_39 = {
    "server/superlink/fleet/vce/vce_api.py": "63044d7314a339fe052070059f46b20b42ab28ec4e708d84b3025bd630b1fab4",
    "server/superlink/fleet/vce/backend/raybackend.py": "2cdc6ab2a585ac04a3cc553d6b0e9b33e7d6f22d5d6a4e6ec0170254fbbb9f09",
    "simulation/ray_transport/ray_actor.py": "174132017563559c9113602a9933ea54d7622a84d19d9fc2d5cadea1eb599561",
    "server/superlink/linkstate/in_memory_linkstate.py": "ec9e43a23daf3d8cbea9bac8f53f0b85ce4aec55a989e844fac8932d57844440",
    "superlink/grid/inmemory_grid.py": "10ee0b7e73351f938327479c679c682805f0afc5afba612930258a1e4da429dd",
    "supercore/corestate/in_memory_corestate.py": "5c7165aabcb26a17dd4ca6c4c5b53545383100477e936b2bbe9a51257d5ccaee",
    "simulation/run_simulation.py": "47b467b1d7879485320b893c207c02767d243111e04f701d68ff195b4b685850",
    "simulation/legacy_app.py": "9d40d0f80b492992d07b4ff645452150e3d0746f279157e22c5f3560f45c4eb6",
    "app/metadata.py": "5d00da8dc68208f9eb1265fdcfbcdd2d6c980e235d3c734bb104e8341f1ddff0",
}
# For each Flower release the fixes were checked against: the sha256 of each of FLOWER_FILES as it ships it.
# A Flower whose files match none of these sets runs unpatched.
FLOWER_SOURCES: dict[str, dict[str, str]] = {
    "1.39.0": _FLOWER_1_39,
    # 1.42.0 changes two: get_runs gains paging (not used here), InMemoryCoreState gains a message store
    # that the in-memory link state and the simulation never call; the id draws are the same two
    "1.42.0": {
        **_FLOWER_1_39,
        "server/superlink/linkstate/in_memory_linkstate.py": "b97b47b9613517015de0e9c064e728502a1f7076c25fe0923935508f5b6e76d7",
        "supercore/corestate/in_memory_corestate.py": "9ff18a3169d57f934820fdaa51e758352fec73224e637214d86402a0c81acc91",
    },
}
POLL_INTERVAL = 0.1  # Flower's own poll, kept as the fallback when no store event comes
SWEEP_INTERVAL = 1.0  # seconds at least between two walks of the whole store or of every missing reply
SWEEP_SHARE = 0.02  # and at most this share of the driver's time in them: a sweep's cost grows with the messages stored


def next_sweep(started: float, now: float) -> float:
    """When the next whole-store sweep may start, the last one having run from ``started``
    to ``now`` (monotonic seconds): SWEEP_INTERVAL later, or later still when a sweep is so
    long (a store of many thousands of messages) that one a second would take more than SWEEP_SHARE of
    the driver. Sweeps find only what no event signals (expiry, Flower's own error replies),
    so they may be rare; a sweep a second made the driver's cost a message grow with the clients."""
    return started + max(SWEEP_INTERVAL, (now - started) / SWEEP_SHARE)


TASKS_PER_ACTOR = 2  # messages in flight per Ray actor: the one it runs and the next, already queued there
MAX_WORKER_THREADS = 100_000  # a bound run_api's worker loops never reach (threads start one per loop)

# The modules that draw Flower's ids in a simulation, each looking up ``generate_rand_int_from_bytes``
# as its own global: run_simulation (run and task id), the link state (node ids), the core state (task
# and series ids), the legacy app (node ids)
ID_MODULES = (
    "flwr.simulation.run_simulation",
    "flwr.server.superlink.linkstate.in_memory_linkstate",
    "flwr.supercore.corestate.in_memory_corestate",
    "flwr.simulation.legacy_app",
)
DRAW = "generate_rand_int_from_bytes"
IDS = salt("flower-simulation-ids")


class _Signals:
    """Per link state: an event set when a message for the nodes is stored, and a counter (with
    its condition) of replies stored, so waiting threads wake on the change they wait for."""

    def __init__(self) -> None:
        self.ins_stored = threading.Event()
        self.fresh: dict[str, None] = {}  # ids stored since the extractor's last pass, in store order
        self.res_stored = threading.Condition()
        self.replies = 0
        self.answered: dict[str, None] = {}  # ids of instructions whose reply was stored and not yet pulled


_SIGNALS: weakref.WeakKeyDictionary[Any, _Signals] = weakref.WeakKeyDictionary()
_SIGNALS_LOCK = threading.Lock()


def _signals(state: Any) -> _Signals:
    with _SIGNALS_LOCK:
        sig = _SIGNALS.get(state)
        if sig is None:
            sig = _SIGNALS[state] = _Signals()
        return sig


def hand_out(state: Any, node_ids: Mapping[int, Any] | set[int], ids: Iterable[str] | None = None) -> tuple[list[Any], list[str]]:
    """One extractor pass over an ``InMemoryLinkState``: at most one undelivered message per node
    of ``node_ids``, in the store's order, marked delivered. Visits the messages ``ids`` names
    (default: the whole store), each once, under one hold of the state's lock; a visited message
    that expired or whose nodes left the run's federation is deleted, as Flower's
    ``_check_stored_messages`` does. Returns (messages handed out, ids of visited messages still
    waiting to be delivered)."""
    from flwr.supercore.date import now

    with state.lock:
        store = state.message_ins_store
        current = now().timestamp()
        dropped: set[str] = set()
        # (msg_id, message, metadata fields, federation_id or None when src == dst)
        live: list[tuple[str, Any, dict[str, Any], str | None]] = []
        federation_of: dict[int, str] = {}
        nodes_to_check: dict[str, set[int]] = {}
        for msg_id, msg in store.items() if ids is None else ((i, store.get(i)) for i in ids):
            if msg is None:  # deleted since it was stored (replied to, expired, stopped run)
                continue
            md = msg.metadata.__dict__  # the fields Metadata's properties read: one call a message, not six
            if md["_created_at"] + md["_ttl"] <= current:
                dropped.add(msg_id)
                continue
            src, dst = md["_src_node_id"], md["_dst_node_id"]
            if src == dst:
                live.append((msg_id, msg, md, None))
                continue
            run_id = md["_run_id"]
            federation = federation_of.get(run_id)
            if federation is None:
                federation = federation_of[run_id] = state.run_ids[run_id].run.federation_id
            nodes_to_check.setdefault(federation, set()).update((src, dst))
            live.append((msg_id, msg, md, federation))
        # One membership query per federation instead of one per message (Flower asks
        # filter_nodes({src, dst}) per message; membership is per node, so the answer is the same)
        members = {fed: state.federation_manager.filter_nodes(nodes, fed) for fed, nodes in nodes_to_check.items()}
        picked: list[Any] = []
        waiting: list[str] = []
        served: set[int] = set()
        delivered_at = now().isoformat()
        for msg_id, msg, md, federation in live:
            if federation is not None and not (md["_src_node_id"] in members[federation] and md["_dst_node_id"] in members[federation]):
                dropped.add(msg_id)
            elif md["_delivered_at"] != "":
                continue
            elif md["_dst_node_id"] in served or md["_dst_node_id"] not in node_ids:
                waiting.append(msg_id)
            else:
                served.add(md["_dst_node_id"])
                md["_delivered_at"] = delivered_at
                picked.append(msg)
        state.delete_messages(dropped)
    return picked, waiting


def add_messages_to_queue(state: Any, queue: Queue[Any], nodes_mapping: Mapping[int, int], f_stop: threading.Event) -> None:
    """Drop-in for ``vce_api.add_messages_to_queue``. Each pass visits the messages still waiting
    from the last pass and those stored since (now and then, as :func:`next_sweep` says, the whole
    store, so messages nobody reads still expire); then it waits until a message is stored or 0.1 s passes
    (Flower's poll), until ``f_stop`` is set."""
    sig = _signals(state)
    waiting: list[str] = []
    sweep_at = -float("inf")
    while not f_stop.is_set():
        sig.ins_stored.clear()  # before the pass: a message stored during it wakes the next wait
        with state.lock:
            fresh, sig.fresh = sig.fresh, {}
            if (started := time.monotonic()) >= sweep_at:
                picked, waiting = hand_out(state, nodes_mapping)
                sweep_at = next_sweep(started, time.monotonic())
            else:
                picked, waiting = hand_out(state, nodes_mapping, dict.fromkeys([*waiting, *fresh]))
        for msg in picked:
            queue.put(msg)
        sig.ins_stored.wait(POLL_INTERVAL)


def send_and_receive(self: Any, messages: Iterable[Any], *, timeout: float | None = None) -> Iterable[Any]:
    """Drop-in for ``InMemoryGrid.send_and_receive``: Flower's push-then-pull loop, except that
    between pulls it waits until as many replies were stored as it still misses (or
    ``pull_interval`` passes), instead of always sleeping ``pull_interval``, and that it pulls
    only the ids whose reply was stored since (Flower's pull costs O(ids asked), ten times a
    second, so at many clients pulling crowds out the driver's work), asking for every missing id only once per
    sweep (:func:`next_sweep`; the replies Flower makes itself: expired or undeliverable messages)."""
    sig = _signals(self.state)
    msg_ids = set(self.push_messages(messages))
    del messages
    end_time = time.time() + (timeout if timeout is not None else 0.0)
    ret: list[Any] = []
    sweep_at = -float("inf")
    while timeout is None or time.time() < end_time:
        with sig.res_stored:
            before = sig.replies
            ready = {i for i in sig.answered if i in msg_ids}
        sweep = (started := time.monotonic()) >= sweep_at
        res_msgs = self.pull_messages(msg_ids if sweep else ready) if sweep or ready else []
        if sweep:
            sweep_at = next_sweep(started, time.monotonic())
        ret.extend(res_msgs)
        pulled = {msg.metadata.reply_to_message_id for msg in res_msgs}
        msg_ids.difference_update(pulled)
        with sig.res_stored:
            for i in pulled:
                sig.answered.pop(i, None)
        if not msg_ids:
            break
        missing = len(msg_ids)
        wait = self.pull_interval if timeout is None else max(0.0, min(self.pull_interval, end_time - time.time()))
        deadline = time.monotonic() + wait
        with sig.res_stored:
            while sig.replies - before < missing and (left := deadline - time.monotonic()) > 0:
                sig.res_stored.wait(left)
    with sig.res_stored:  # replies that came too late are never pulled here: forget them
        for i in msg_ids:
            sig.answered.pop(i, None)
    return ret


_LOADERS: dict[str, Any] = {}  # in each actor process: the ClientApp loaders it has unpickled, by digest


class LoadOnce:
    """A ClientApp loader that crosses to the actors as bytes: Flower's loader is a closure, which
    Ray's cloudpickle serialises by value for every message, a driver cost that grows with the
    clients; this one is pickled once, in the driver, and unpickled once per actor."""

    def __init__(self, app_fn: Any) -> None:
        from ray import cloudpickle

        self.blob = cloudpickle.dumps(app_fn)
        self.digest = hashlib.sha256(self.blob).hexdigest()

    def __call__(self) -> Any:
        """The ClientApp, from this process's cache of unpickled loaders, so each actor unpickles it once."""
        load = _LOADERS.get(self.digest)
        if load is None:
            from ray import cloudpickle

            load = _LOADERS[self.digest] = cloudpickle.loads(self.blob)
        return load()


def queue_ahead(pool: Any, slots: int = TASKS_PER_ACTOR) -> None:
    """Let each actor of a built ``BasicActorPool`` take ``slots`` messages at once: its idle list
    holds every actor ``slots`` times. A Ray actor runs its tasks one after the other, in the order
    they were submitted, so the extra message waits at the actor instead of in the driver."""
    pool.pool = list(pool.pool) * slots


def least_busy_last(idle: list[Any]) -> None:
    """Move a slot of the actor with the most idle slots to the end of ``idle``, where Flower's
    ``BasicActorPool.submit`` pops: a message goes to a free actor before it queues behind a busy
    one (Flower's list is last-in first-out, which would hand a just-returned slot out again)."""
    count: dict[int, int] = {}
    for actor in idle:
        count[id(actor)] = count.get(id(actor), 0) + 1
    best = max(range(len(idle)), key=lambda i: count[id(idle[i])], default=None)
    if best is not None:
        idle.append(idle.pop(best))


def distinct_actors(pool: Any) -> None:
    """Undo :func:`queue_ahead` on the idle list before the pool terminates its actors (once each)."""
    pool.pool = list({id(actor): actor for actor in pool.pool}.values())


class SeededIds:
    """Drop-in for Flower's ``generate_rand_int_from_bytes`` in one module: the ids come from a
    stream of the run's seed and the module's name (one stream per module, so the order in which
    threads of different modules draw changes no id), honouring ``exclude`` as Flower does."""

    def __init__(self, seed: int, module: str) -> None:
        digest = hashlib.sha256(f"{seed}:{IDS}:{module}".encode()).digest()
        self._rng = random.Random(int.from_bytes(digest, "big"))
        self._lock = threading.Lock()  # two threads of one module may draw at once; each draw is one step of the stream

    def __call__(self, num_bytes: int, exclude: set[int] | None = None) -> int:
        """An unsigned int of ``num_bytes`` random bytes, never one in ``exclude``."""
        with self._lock:
            num = self._rng.getrandbits(8 * num_bytes)
            while exclude and num in exclude:
                num = self._rng.getrandbits(8 * num_bytes)
        return num


@contextlib.contextmanager
def seeded_ids(seed: int | None) -> Iterator[None]:
    """For the block, Flower's id draws in :data:`ID_MODULES` come from :class:`SeededIds` of
    ``seed`` (None: Flower's own ``os.urandom`` draws); Flower's function is put back on exit."""
    if seed is None:
        yield
        return
    import importlib

    modules = [importlib.import_module(name) for name in ID_MODULES]
    flower = [getattr(module, DRAW) for module in modules]
    for module in modules:
        setattr(module, DRAW, SeededIds(seed, module.__name__))
    try:
        yield
    finally:
        for module, draw in zip(modules, flower):
            setattr(module, DRAW, draw)


def source_hashes(root: Path, files: Iterable[str]) -> dict[str, str | None]:
    """The sha256 (hex) of each of ``files`` under ``root``, None for one that is not there."""
    found: dict[str, str | None] = {}
    for name in files:
        path = root / name
        found[name] = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None
    return found


def changed_sources(recorded: Mapping[str, str], found: Mapping[str, str | None]) -> list[str]:
    """The files of ``recorded`` whose hash in ``found`` differs (or that are missing), in order."""
    return [name for name, digest in recorded.items() if found.get(name) != digest]


def flower_root() -> Path | None:
    """The installed ``flwr`` package's folder, None when Flower is not installed."""
    try:
        import flwr
    except ImportError:
        return None
    return Path(flwr.__file__).parent


def checked_release(found: Mapping[str, str | None]) -> str | None:
    """The checked Flower release whose files all have the hashes in ``found``, None when none has."""
    return next((release for release, recorded in FLOWER_SOURCES.items() if not changed_sources(recorded, found)), None)


def nearest_changes(found: Mapping[str, str | None]) -> tuple[str, list[str]]:
    """The checked release closest to ``found`` (fewest files differing, the latest on a tie) and those files."""
    best = min(reversed(FLOWER_SOURCES), key=lambda release: len(changed_sources(FLOWER_SOURCES[release], found)))
    return best, changed_sources(FLOWER_SOURCES[best], found)


def _supported() -> str | None:
    """Why the fixes cannot be installed here, or None when they can: a Flower file they patch
    differs from every checked release's (or is missing), so what they assume of it may no longer hold."""
    root = flower_root()
    if root is None:
        return "Flower is not installed"
    found = source_hashes(root, FLOWER_FILES)
    if checked_release(found) is not None:
        return None
    import flwr

    release, changed = nearest_changes(found)
    files = ", ".join(f"flwr/{name}" for name in changed)
    return (
        f"{files} of the installed Flower {flwr.__version__} differ from Flower {release}'s, which "
        "simulation/flower_fixes.py patches; check the fixes against them, then record "
        "`python -m headway.simulation.flower_fixes` in its FLOWER_SOURCES"
    )


@contextlib.contextmanager
def faster_simulation_engine(seed: int | None = None) -> Iterator[bool]:
    """Install the extractor pass and the store-driven wake-ups for the block, and, given the run's
    ``seed``, Flower's ids drawn from it (:func:`seeded_ids`); yields whether they were installed.
    On a Flower whose patched files match no release of :data:`FLOWER_SOURCES`, Flower's own code runs and
    one warning names the files; on a state other than ``InMemoryLinkState`` (checked when the
    extractor starts), Flower's own code runs and one line says why."""
    why = _supported()
    if why is not None:
        log.warning("Flower's simulation engine left unpatched (slower at many clients): %s", why)
        yield False
        return
    from flwr.server.superlink.fleet.vce import vce_api
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend
    from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState
    from flwr.simulation.ray_transport.ray_actor import BasicActorPool
    from flwr.superlink.grid.inmemory_grid import InMemoryGrid

    flower_extractor = vce_api.add_messages_to_queue
    store_ins = InMemoryLinkState.store_message_ins
    store_res = InMemoryLinkState.store_message_res
    flower_send_and_receive = InMemoryGrid.send_and_receive
    ray_build, ray_num_workers, ray_terminate = RayBackend.build, RayBackend.__dict__["num_workers"], RayBackend.terminate
    pool_submit, flower_executor = BasicActorPool.submit, vce_api.ThreadPoolExecutor

    def extractor(state: Any, queue: Queue[Any], nodes_mapping: dict[int, int], f_stop: threading.Event) -> None:
        if type(state) is not InMemoryLinkState:
            log.info("Flower's message extractor kept: the link state is %s, not InMemoryLinkState", type(state).__name__)
            return flower_extractor(state, queue, nodes_mapping, f_stop)
        return add_messages_to_queue(state, queue, nodes_mapping, f_stop)

    def store_message_ins(self: Any, message: Any) -> str | None:
        sig = _signals(self)
        with self.lock:  # the id joins ``fresh`` in the order the store receives it
            message_id = store_ins(self, message)
            if message_id is not None:
                sig.fresh[message_id] = None
        if message_id is not None:
            sig.ins_stored.set()
        return message_id

    def store_message_res(self: Any, message: Any) -> str | None:
        message_id = store_res(self, message)
        if message_id is not None:
            sig = _signals(self)
            with sig.res_stored:
                sig.replies += 1
                sig.answered[message.metadata.reply_to_message_id] = None
                sig.res_stored.notify_all()
        return message_id

    def grid_send_and_receive(self: Any, messages: Iterable[Any], *, timeout: float | None = None) -> Iterable[Any]:
        if type(self.state) is not InMemoryLinkState:
            return flower_send_and_receive(self, messages, timeout=timeout)
        return send_and_receive(self, messages, timeout=timeout)

    def build(self: Any, app_fn: Any) -> None:
        ray_build(self, LoadOnce(app_fn))
        queue_ahead(self.pool)

    def submit(self: Any, actor_fn: Any, job: Any) -> Any:
        least_busy_last(self.pool)
        return pool_submit(self, actor_fn, job)

    def num_workers(self: Any) -> int:  # run_api starts this many worker threads: one per slot
        return TASKS_PER_ACTOR * ray_num_workers.fget(self)

    def terminate(self: Any) -> None:
        if self.pool is not None:
            distinct_actors(self.pool)
        ray_terminate(self)

    vce_api.add_messages_to_queue = extractor  # run_api looks it up as a module global when it starts the thread
    InMemoryLinkState.store_message_ins = store_message_ins  # type: ignore[method-assign]
    InMemoryLinkState.store_message_res = store_message_res  # type: ignore[method-assign]
    InMemoryGrid.send_and_receive = grid_send_and_receive  # type: ignore[method-assign]
    RayBackend.build = build  # type: ignore[method-assign]
    RayBackend.num_workers = property(num_workers)  # type: ignore[method-assign,assignment]
    RayBackend.terminate = terminate  # type: ignore[method-assign]
    BasicActorPool.submit = submit  # type: ignore[method-assign]
    # run_api runs each worker loop on a default ThreadPoolExecutor, whose min(32, CPUs + 4) threads would
    # leave the loops beyond that cap unstarted (and their slots, or actors, unused): one thread per loop
    vce_api.ThreadPoolExecutor = functools.partial(ThreadPoolExecutor, max_workers=MAX_WORKER_THREADS)  # type: ignore[misc,assignment]
    try:
        with seeded_ids(seed):
            yield True
    finally:
        vce_api.add_messages_to_queue = flower_extractor
        InMemoryLinkState.store_message_ins = store_ins  # type: ignore[method-assign]
        InMemoryLinkState.store_message_res = store_res  # type: ignore[method-assign]
        InMemoryGrid.send_and_receive = flower_send_and_receive  # type: ignore[method-assign]
        RayBackend.build = ray_build  # type: ignore[method-assign]
        RayBackend.num_workers = ray_num_workers  # type: ignore[method-assign]
        RayBackend.terminate = ray_terminate  # type: ignore[method-assign]
        BasicActorPool.submit = pool_submit  # type: ignore[method-assign]
        vce_api.ThreadPoolExecutor = flower_executor  # type: ignore[misc]


if __name__ == "__main__":  # the installed Flower's hashes, in the form of a FLOWER_SOURCES entry
    _root = flower_root()
    if _root is None:
        raise SystemExit("Flower is not installed: install it (pip install flwr) and run this again")
    for _name, _digest in source_hashes(_root, FLOWER_FILES).items():
        print(f'    "{_name}": "{_digest}",')
