"""The round engine every strategy runs on: who the clients are, what a round may wait
for, and what crossed the wire.

- :class:`ClientRegistry`: node id ↔ partition id (stated once, in a registration query
  before a node's first round), body, last seen, consecutive failures, refused nodes,
  and per-client method state (one dataclass per method: :meth:`ClientRegistry.state`).
  Nodes are ordered by partition id, so seeded sampling is reproducible although node
  ids are random.
- :class:`Engine`: exchanges with a deadline (``round-timeout`` per exchange; a node that
  misses it is not asked again in the same round), quorum (``min-replies``), decoding of
  every reply against the method's :class:`~strategies.replies.Layout`, relays from one
  client to the next with a per-hop deadline, and the wire meter.
- :class:`RoundMeter`: bytes per phase (as shipped, :mod:`strategies.wire`), failures
  with reasons, absent nodes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sized
from dataclasses import dataclass, field
from typing import Any, TypeVar

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.app.typing import ConfigRecordValues, MetricRecordValues
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid

from core import protocol as P
from core.sampling import draw_with_replacement, sample_positions, sample_size
from strategies.replies import Layout, Reply, decode
from strategies.services import DEFAULT_EXAMPLE_CAP, Services
from strategies.wire import WireMeter

log = logging.getLogger("headway")

MAX_BODY_NAME = 300  # characters of a body name a registration may give (an import path with its weights file fits)

# Phases whose bytes are measurement, not the method's cost (reported apart).
MEASUREMENT_PHASES = (P.PHASE_REGISTER, P.PHASE_EVALUATE, P.PHASE_UPLOAD)
# The first message of a round's training to each client it asks (a round's ``selected``): a train message,
# a relay hop, or under secure aggregation the key setup that opens it.
SELECTING_PHASES = (P.PHASE_TRAIN, P.PHASE_CHAIN, P.STAGE_SETUP)
# Phases where a client's failure keeps its training reply out of the round's aggregate (SecAgg+'s unmask stage
# does not: a client that sent its masked vector and then dropped is still in the sum).
CONTRIBUTING_PHASES = (P.PHASE_TRAIN, P.PHASE_CHAIN, P.STAGE_SETUP, P.STAGE_SHARE, P.STAGE_COLLECT)

S = TypeVar("S")  # a method's per-client state class


class RoundFailed(RuntimeError):
    """A step of a round could not go on (e.g. every client failed in round 1)."""


@dataclass
class ClientInfo:
    """What the server knows of one node."""

    node_id: int
    partition_id: int
    body: str
    last_seen: float = 0.0
    last_round: int = 0
    consecutive_failures: int = 0
    state: Any = None  # the method's per-client state: an instance of its own dataclass (ClientRegistry.state)
    declared: dict[str, Any] | None = None  # dataset=local: the node's own data as it declared it (classes -> [train, test] counts)
    fingerprint: str | None = None  # dataset=local: digest of the node's whole data profile (classes, columns and their moments)

    def declared_count(self, split: str) -> int | None:
        """The examples this node declared for ``split`` (train or test); None when it declared none."""
        if self.declared is None:
            return None
        return int(sum(counts[0 if split == "train" else 1] for counts in self.declared.values()))


class ClientRegistry:
    """Registered nodes, refused nodes, and who holds which partition id."""

    def __init__(self, num_partitions: int):
        self.num_partitions = num_partitions
        self.clients: dict[int, ClientInfo] = {}
        self.refused: dict[int, str] = {}  # node id -> why it takes no part
        self.conflicts: dict[int, int] = {}  # refused node id -> the connected node holding its partition id
        self.displaced: dict[int, int] = {}  # node id -> the partition id that moved away from it

    def claim(self, node_id: int, partition_id: Any, body: Any, connected: Collection[int]) -> str | None:
        """Register ``node_id`` as ``partition_id``; the reason it cannot be, or None.

        A partition held by a node that is no longer ``connected`` moves to the new node
        with the server's state of that client (without SuperNode authentication a
        restarted SuperNode comes back under a new node id). One held by a connected node
        is refused until that node leaves, except that a node returning under the id that
        held the partition before takes it back (with authentication node ids are stable)."""
        if isinstance(partition_id, bool) or not isinstance(partition_id, (int, float)) or partition_id != int(partition_id):
            return f"registration gives partition id {partition_id!r}, expected a whole number"
        pid = int(partition_id)
        if not 0 <= pid < self.num_partitions:
            return f"registration gives partition id {pid}, outside 0..{self.num_partitions - 1}"
        holder = self.by_partition(pid)
        state: Any = None
        if holder is not None and holder != node_id:
            if holder in connected and self.displaced.get(node_id) != pid:
                self.conflicts[node_id] = holder
                return (
                    f"partition id {pid} is already held by node {holder}, which is still connected: two SuperNodes were started "
                    f"with the same --partition-id (this one is asked again if node {holder} leaves)"
                )
            state = self.clients.pop(holder).state
            self.displaced[holder] = pid
            if holder in connected:  # the returning first holder takes precedence over the node that took its place
                self.refuse(holder, f"partition id {pid} went back to node {node_id}, which held it before")
                self.conflicts[holder] = node_id
            log.warning("partition %d moves from node %d to node %d, keeping the server's state of that client", pid, holder, node_id)
        self.displaced.pop(node_id, None)
        self.clients[node_id] = ClientInfo(node_id, pid, str(body), last_seen=time.monotonic(), state=state)
        return None

    def state(self, node_id: int, kind: type[S]) -> S:
        """The method's state of registered node ``node_id``, a ``kind()`` made the first time it is
        asked for. One method's state class per run: a record of another class is a bug, not a fallback."""
        info = self.clients[node_id]
        if info.state is None:
            info.state = kind()
        if not isinstance(info.state, kind):
            raise TypeError(f"node {node_id} holds client state of {type(info.state).__name__}, not {kind.__name__}")
        return info.state

    def states(self, kind: type[S]) -> dict[int, S]:
        """Every registered node's state (see :meth:`state`), in registration order."""
        return {node: self.state(node, kind) for node in self.clients}

    def free_indices(self, count: int, connected: Collection[int] = ()) -> list[int]:
        """Up to ``count`` client indices no connected registered node holds (dataset=local: the server
        numbers nodes that own their data): those nobody holds, lowest first, then those whose holder
        Flower no longer lists in ``connected`` (a node restarted without authentication returns under
        a new node id; :meth:`Engine._registration_problem` lets it take such an index only with the same data)."""
        held = {c.partition_id for n, c in self.clients.items() if n in connected}
        unheld = [i for i in range(self.num_partitions) if self.by_partition(i) is None]
        orphaned = [i for i in range(self.num_partitions) if i not in held and i not in unheld]
        return (unheld + orphaned)[:count]

    def takeover_problem(self, index: int, fingerprint: str, declared: Mapping[str, Any], connected: Collection[int]) -> str | None:
        """Why a new node declaring ``declared`` (profile digest ``fingerprint``) may not take client
        ``index`` from its holder that has left, or None. Without authentication a node id proves
        nothing, so the data is the identity: only a node whose profile is the one the holder declared
        takes over its index and its server-side state."""
        holder = self.by_partition(index)
        if holder is None or holder in connected:
            return None
        info = self.clients[holder]
        if info.fingerprint is None or info.fingerprint == fingerprint:
            return None
        return (
            f"client index {index} belongs to node {holder}, which has left; this node's data differs from what node {holder} "
            f"declared ({_counts(declared)} against {_counts(info.declared or {})}), so it cannot take that index "
            "(a restarted node must come back with the same data folder)"
        )

    def forget(self, node_id: int) -> None:
        """Drop ``node_id`` so that it registers again (a dataset=local node that restarted and lost its schema)."""
        self.clients.pop(node_id, None)
        self.refused.pop(node_id, None)

    def release_conflicts(self, connected: Collection[int]) -> None:
        """Forget the refusal of nodes whose partition's holder has left, so they register again."""
        for node, holder in list(self.conflicts.items()):
            if holder not in connected or holder not in self.clients:
                del self.conflicts[node]
                self.refused.pop(node, None)

    def refuse(self, node_id: int, reason: str) -> None:
        """Keep ``node_id`` out of the run, saying why in the log."""
        if self.refused.get(node_id) != reason:
            log.warning("registry: node %d refused: %s", node_id, reason)
        self.refused[node_id] = reason

    def by_partition(self, partition_id: int) -> int | None:
        return next((n for n, c in self.clients.items() if c.partition_id == partition_id), None)

    def ordered(self, nodes: Iterable[int]) -> list[int]:
        """Registered nodes among ``nodes``, by partition id."""
        return sorted((n for n in nodes if n in self.clients), key=lambda n: self.clients[n].partition_id)

    def seen(self, node_id: int, server_round: int) -> None:
        info = self.clients[node_id]
        info.last_seen, info.last_round, info.consecutive_failures = time.monotonic(), server_round, 0

    def failed(self, node_id: int) -> None:
        if node_id in self.clients:
            self.clients[node_id].consecutive_failures += 1

    def partition(self, node_id: int) -> int | None:
        info = self.clients.get(node_id)
        return None if info is None else info.partition_id


@dataclass
class RoundMeter:
    """Bytes (per phase, down and up: on the wire, and the array values alone), failures
    and absent nodes of one round."""

    bytes: dict[str, list[int]] = field(default_factory=dict)
    values: dict[str, list[int]] = field(default_factory=dict)
    rejected_bytes_up: int = 0
    rejected_figures: dict[str, list[float]] = field(default_factory=dict)  # figures of refused replies, e.g. their update norms
    failures: list[str] = field(default_factory=list)
    absent: list[int] = field(default_factory=list)  # partition ids of registered nodes not connected
    selected: set[int] = field(default_factory=set)  # partition ids sent a training message
    failed: dict[int, str] = field(default_factory=dict)  # partition id -> why its training reply was not used (first reason)
    registered: int = 0  # clients registered at the round's start (connected or not)

    def add(self, phase: str, down: int = 0, up: int = 0, values_down: int = 0, values_up: int = 0) -> None:
        for table, d, u in ((self.bytes, down, up), (self.values, values_down, values_up)):
            acc = table.setdefault(phase, [0, 0])
            acc[0] += d
            acc[1] += u

    def fail(self, reason: str, partition: int | None = None, why: str | None = None) -> None:
        """Count a failure; ``partition`` (with ``why``, the reason without who it was) names a client whose
        training reply this keeps out of the round (:attr:`failed`)."""
        self.failures.append(reason)
        if partition is not None:
            self.failed.setdefault(partition, why or reason)
        log.warning("failure: %s", reason)

    def cost(self, values: bool = False) -> tuple[int, int]:
        """(down, up) bytes of the method's own traffic, every phase but measurement: on
        the wire, or (``values``) the array values alone."""
        table = self.values if values else self.bytes
        down = sum(v[0] for p, v in table.items() if p not in MEASUREMENT_PHASES)
        up = sum(v[1] for p, v in table.items() if p not in MEASUREMENT_PHASES)
        return down, up

    def phase(self, phase: str) -> tuple[int, int]:
        down, up = self.bytes.get(phase, [0, 0])
        return down, up


def _counts(declared: Mapping[str, Any]) -> str:
    """A declaration in a few words: how many classes and train/test examples."""
    train = sum(int(v[0]) for v in declared.values())
    test = sum(int(v[1]) for v in declared.values())
    return f"{len(declared)} classes, {train} train / {test} test examples"


def _short(reason: str, limit: int = 300) -> str:
    """A client's error reason without a long remote traceback: its last line, bounded."""
    lines = [line.strip() for line in str(reason).strip().splitlines() if line.strip()]
    text = lines[-1] if lines else "no reason given"
    return text if len(text) <= limit else text[: limit - 1] + "…"


WAIT_REPORT_EVERY = 10.0  # seconds between "waiting for clients" lines while the count stays the same


def waiting_line(connected: int, wanted: int, key: str, waited: float, limit: float, final: bool = False) -> str:
    """The line a user reads while the server waits for clients (``final``: when it stops
    waiting): how many are connected of how many ``key`` asks for, how long is left, and the fix."""
    more = wanted - connected
    if connected == 0:
        hint = "no SuperNode is connected: start them (headway supernode --superlink HOST:PORT ...) or check their --superlink address"
    else:
        hint = (
            f"if {connected} SuperNode{'s are' if connected != 1 else ' is'} all you run, set {key}={connected} "
            f'(--run-config "{key}={connected}"), or start {more} more SuperNode{"s" if more != 1 else ""}'
        )
    if final:
        return f"only {connected} of {wanted} clients ({key}={wanted}) connected after {waited:.0f} s; going on with them; {hint}"
    return (
        f"waiting for clients: {connected} of {wanted} connected ({key}={wanted}); going on with those connected "
        f"in {max(limit - waited, 0.0):.0f} s (sample-timeout={limit:g}); {hint}"
    )


def superlink_errors(sent: Iterable[Message], replies: Iterable[Message]) -> dict[int, str]:
    """Node id -> what the SuperLink answered in that node's place. Flower's SuperLink replies
    itself (source node 1, an error such as NODE_UNAVAILABLE) when a node stops sending
    heartbeats or a reply expires; such a reply names the message it answers, not the node."""
    to = {m.metadata.message_id: m.metadata.dst_node_id for m in sent if m.metadata.message_id}
    out: dict[int, str] = {}
    for r in replies:
        node = to.get(r.metadata.reply_to_message_id)
        if node is not None and r.metadata.src_node_id == SUPERLINK_NODE_ID and r.has_error():
            out[node] = f"the SuperLink answered for it: error {r.error.code}: {_short(r.error.reason or '')}"
    return out


def silence(told: str | None, waited: float, timeout: float) -> str:
    """Why a node's reply is missing, as true as the engine knows it: what the SuperLink said,
    else the deadline it missed, else (Flower stopped waiting early) how long was waited."""
    if told is not None:
        return f"no reply; {told} (after {waited:.1f} s of the {timeout:g} s deadline)"
    if waited >= timeout - 0.5:
        return f"no reply within {timeout:g} s"
    return f"no reply; Flower stopped waiting after {waited:.1f} s of the {timeout:g} s deadline"


class Engine:
    """Exchanges of one run with its clients (see the module docstring)."""

    def __init__(
        self,
        grid: Grid,
        cfg: dict[str, Any],
        services: Services,
        clock: Callable[[], float] = time.monotonic,
        admit: Callable[[str], str | None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.grid = grid
        self.sleep = sleep  # between polls for connected nodes (tests pass a fake that moves their clock)
        self.admit = admit  # why a node's declared body cannot take part in this run, or None
        self.cfg = cfg
        self.services = services
        self.registry = ClientRegistry(cfg["num-clients"])
        self.clock = clock
        self.wire = WireMeter()
        self.meter = RoundMeter()
        self.round = 0
        self.missed: set[int] = set()  # nodes that missed a deadline this round
        self.takeover_refused: set[int] = set()  # nodes refused an orphaned index for other data (register offers them another)
        self.waited = False  # True once clients were waited for (or discovery did it): wait_for_clients then waits no more

    # ----- rounds -----------------------------------------------------------------
    def begin_round(self, server_round: int) -> None:
        """Start a round: fresh meter and deadlines; register nodes that are new."""
        self.round = server_round
        self.missed = set()
        self.wire.clear()
        connected = set(self.grid.get_node_ids())
        self.registry.release_conflicts(connected)
        new = [n for n in sorted(connected) if n not in self.registry.clients and n not in self.registry.refused]
        if new:
            self.register(new)
        self.meter.absent = sorted(c.partition_id for n, c in self.registry.clients.items() if n not in connected)
        self.meter.registered = len(self.registry.clients)

    def end_round(self) -> RoundMeter:
        """The finished round's meter (and a fresh one for what follows)."""
        meter, self.meter = self.meter, RoundMeter()
        return meter

    # ----- who takes part ---------------------------------------------------------
    def wait_for_clients(self) -> list[int]:
        """Before round 1: wait up to ``sample-timeout`` for ``min-available-clients``
        (0: ``num-clients``) to connect; returns the connected node ids. Says at once how many
        are expected and connected, again each time the count changes (at most every
        :data:`WAIT_REPORT_EVERY` seconds otherwise), with what to change if it never adds up.
        Once per engine: later calls (``waited`` set) return the connected nodes at once."""
        if self.waited:
            return sorted(self.grid.get_node_ids())
        self.waited = True
        key = "min-available-clients" if self.cfg["min-available-clients"] else "num-clients"
        wanted, limit = int(self.cfg[key]), float(self.cfg["sample-timeout"])
        start = self.clock()
        said: tuple[int, float] | None = None  # (count, when) of the last line
        while True:
            nodes = sorted(self.grid.get_node_ids())
            now = self.clock()
            if len(nodes) >= wanted:
                log.info("clients: %d of %d connected%s", len(nodes), wanted, "" if said is None else f" after {now - start:.0f} s")
                return nodes
            if now - start >= limit:
                log.warning("%s", waiting_line(len(nodes), wanted, key, now - start, limit, final=True))
                return nodes
            if said is None or said[0] != len(nodes) or now - said[1] >= WAIT_REPORT_EVERY:
                log.info("%s", waiting_line(len(nodes), wanted, key, now - start, limit))
                said = (len(nodes), now)
            self.sleep(0.5)

    def register(self, nodes: list[int]) -> None:
        """Ask ``nodes`` for their partition id and body (one query each, within one deadline).
        With ``dataset=local`` the query gives each node the run's schema and a free client
        index instead, and the node answers with what its own data holds; the index of a node
        refused then is offered again, in another query and deadline, to a node that had none
        (until every node has had one, or none is left)."""
        schema = self.services.schema
        fields: dict[str, ConfigRecordValues] = {P.ROUND: self.round, P.PHASE: P.PHASE_REGISTER}
        connected = set(self.grid.get_node_ids())
        if schema is None:
            self._registrations({n: RecordDict({P.CONFIG: ConfigRecord(fields)}) for n in nodes}, connected, {})
        else:
            schema_json, waiting = schema.to_json(), list(nodes)
            tried: dict[int, set[int]] = {n: set() for n in nodes}
            # an index offered to a node that is then refused (its data does not fit, it did not answer) is free
            # again: offer it to a node still waiting, so a misfit node never keeps a fitting one out of the run.
            # A node refused only because an orphaned index's holder declared other data waits for another index.
            while waiting and (free := self.registry.free_indices(self.registry.num_partitions, connected)):
                offered: dict[int, int] = {}
                for n in waiting:
                    i = next((i for i in free if i not in tried[n] and i not in offered.values()), None)
                    if i is not None:
                        offered[n] = i
                if not offered:
                    break
                for n, i in offered.items():
                    tried[n].add(i)
                    self.registry.refused.pop(n, None)
                    self.takeover_refused.discard(n)
                self._registrations(
                    {
                        n: RecordDict({P.CONFIG: ConfigRecord({**fields, P.DATA_SCHEMA: schema_json, P.CLIENT_INDEX: i})})
                        for n, i in offered.items()
                    },
                    connected,
                    offered,
                )
                waiting = [n for n in waiting if n not in offered or n in self.takeover_refused]
            for node in waiting:
                if node not in self.registry.refused:
                    self.registry.refuse(node, f"every one of the num-clients={self.cfg['num-clients']} client indices is taken")
        for node in nodes:
            if node not in self.registry.clients and node not in self.registry.refused:
                self.registry.refuse(node, "did not answer its registration")  # asked again if it reconnects as a new node
        log.info("registry: %d clients registered (%d refused)", len(self.registry.clients), len(self.registry.refused))

    def _registrations(self, contents: Mapping[int, RecordDict], connected: Collection[int], offered: Mapping[int, int]) -> None:
        """Send registration queries ``contents`` (one deadline) and register or refuse each node that answers."""
        for reply in self._send(P.PHASE_REGISTER, contents, MessageType.QUERY):
            node = reply.metadata.src_node_id
            try:  # everything read from a registration is untrusted: one bad one refuses that node only
                problem = self._registration_problem(node, reply, connected, offered.get(node))
            except Exception as exc:
                problem = f"registration cannot be read: {type(exc).__name__}: {_short(str(exc))}"
            if problem:
                self.registry.refuse(node, problem)
                self.meter.fail(f"node {node}: {problem}")

    def _registration_problem(self, node: int, reply: Message, connected: Collection[int], offered: int | None = None) -> str | None:
        """Register ``node`` from its reply (as client index ``offered`` with dataset=local);
        why it cannot take part, or None."""
        from core.run_data import MAX_PROFILE_CHARS, read_profile

        if reply.has_error():
            self.meter.add(P.PHASE_REGISTER, up=self.wire.message(reply))
            return f"registration error {reply.error.code}: {_short(reply.error.reason or '')}"
        met: Mapping[str, MetricRecordValues] = reply.content.metric_records.get(P.METRICS, {})
        cfg: Mapping[str, ConfigRecordValues] = reply.content.config_records.get(P.CONFIG, {})
        text = cfg.get(P.DATA_PROFILE)
        if isinstance(text, str) and len(text) > MAX_PROFILE_CHARS:  # refused before measuring: serializing it is the cost
            return f"its data profile has {len(text)} characters, more than {MAX_PROFILE_CHARS}"
        self.meter.add(P.PHASE_REGISTER, up=self.wire.message(reply))
        body = cfg.get(P.BODY, "")
        if not isinstance(body, str) or len(body) > MAX_BODY_NAME:
            return f"registration gives body {_short(repr(body), 120)}, expected a body name of at most {MAX_BODY_NAME} characters"
        if self.admit is not None and (problem := self.admit(body)):
            return problem
        if offered is None:
            return self.registry.claim(node, met.get(P.PARTITION_ID), body, connected)
        declared, problem = self._declared(text, self.services.described.get(node))
        fingerprint = hashlib.sha256(json.dumps(read_profile(text), sort_keys=True).encode()).hexdigest() if declared else ""
        if problem is None and declared is not None:
            problem = self.registry.takeover_problem(offered, fingerprint, declared, connected)
            if problem is not None:
                self.takeover_refused.add(node)
        if problem is None:  # the index is the server's to give: whatever the node says of itself, it holds the one offered
            problem = self.registry.claim(node, offered, body, connected)
        if problem is None:
            self.registry.clients[node].declared = declared
            self.registry.clients[node].fingerprint = fingerprint
        return problem

    def _declared(self, text: Any, described: Mapping[str, Any] | None = None) -> tuple[dict[str, Any] | None, str | None]:
        """A dataset=local node's profile read against the run's schema: its classes and their
        (train, test) counts, or why it cannot take part (its data does not fit the run, it
        declares more of a class than its ``described`` discovery description did, or more
        examples than ``max-client-examples`` allows)."""
        from core.node_merge import description_problem
        from core.run_data import read_profile

        profile = read_profile(text)
        if (problem := description_problem(profile, self.services.schema)) is not None:  # discovery's checks (core.node_merge)
            return None, f"its data does not fit the run: {problem}"
        declared = {str(k): [int(v[0]), int(v[1])] for k, v in profile["classes"].items()}
        if described is not None:
            before = described["classes"]
            more = next((c for c, (a, b) in declared.items() if c not in before or a > before[c][0] or b > before[c][1]), None)
            if more is not None:
                return None, (
                    f"it declares {declared[more]} examples of class {_short(repr(more), 80)}, more than the "
                    f"{before.get(more, [0, 0])} it described before the run"
                )
        cap = self.example_cap()
        total = sum(a + b for a, b in declared.values())
        if total > cap:
            return (
                None,
                f"it declares {total} examples, more than max-client-examples={cap} allows: raise that key if the node truly holds them",
            )
        return declared, None

    def example_cap(self) -> int:
        """The most examples one client may declare or report where the server holds no
        partition sizes: ``max-client-examples``, else :data:`~strategies.services.DEFAULT_EXAMPLE_CAP`."""
        return int(self.cfg["max-client-examples"]) or DEFAULT_EXAMPLE_CAP

    def nodes(self) -> list[int]:
        """Registered, connected nodes that have not missed a deadline this round, by partition id."""
        connected = set(self.grid.get_node_ids())
        return [n for n in self.registry.ordered(connected) if n not in self.missed]

    def sample(self, fraction: float, weights: Mapping[int, float] | None = None) -> list[int]:
        """K = max(1, round(N·fraction)) of the N available nodes, without replacement,
        uniformly or by successive sampling ∝ ``weights`` (keyed by node id; see
        :mod:`core.sampling` for the inclusion probabilities)."""
        nodes = self.nodes()
        if not nodes:
            return []
        k = sample_size(len(nodes), fraction)
        w = None if weights is None else [float(weights.get(n, 0.0)) for n in nodes]
        return [nodes[i] for i in sample_positions(len(nodes), k, self.services.sampling, w)]

    def draw(self, fraction: float, weights: Mapping[int, float]) -> dict[int, int]:
        """K = max(1, round(N·fraction)) draws with replacement ∝ ``weights`` (keyed by node
        id) among the N available nodes: each drawn node and how many times it came up."""
        nodes = self.nodes()
        if not nodes:
            return {}
        k = sample_size(len(nodes), fraction)
        counts = draw_with_replacement(len(nodes), k, self.services.sampling, [float(weights.get(n, 0.0)) for n in nodes])
        return {nodes[i]: int(c) for i, c in enumerate(counts) if c > 0}

    def partition_of(self, node_id: int) -> int:
        return self.registry.clients[node_id].partition_id

    # ----- exchanges --------------------------------------------------------------
    def _send(self, phase: str, contents: Mapping[int, RecordDict], kind: str, timeout: float | None = None) -> list[Message]:
        """Send, wait until all answered or the deadline; meter down; count the silent, each
        with what really happened: the SuperLink's word about the node (e.g. it stopped sending
        heartbeats), or how long was waited of which deadline."""
        if not contents:
            return []
        timeout = self.cfg["round-timeout"] if timeout is None else timeout
        messages = [Message(content=c, dst_node_id=n, message_type=kind, group_id=str(self.round)) for n, c in contents.items()]
        if phase in SELECTING_PHASES:
            self.meter.selected.update(c.partition_id for n, c in self.registry.clients.items() if n in contents)
        self.meter.add(phase, down=sum(self.wire.message(m) for m in messages), values_down=sum(self.wire.values(m) for m in messages))
        started = self.clock()
        replies = list(self.grid.send_and_receive(messages, timeout=max(timeout, 0.0)))
        waited = self.clock() - started
        ours = [r for r in replies if r.metadata.src_node_id in contents]
        answered = {r.metadata.src_node_id for r in ours}
        told = superlink_errors(messages, replies)
        for node in contents:
            if node not in answered:
                self.missed.add(node)
                self.registry.failed(node)
                self._fail(phase, node, silence(told.get(node), waited, timeout))
        return ours

    def _fail(self, phase: str, node: int, problem: str) -> None:
        """Count ``node``'s failure in ``phase``; in a phase whose replies make the round's aggregate, its partition is named as missing."""
        pid = self.registry.partition(node) if phase in CONTRIBUTING_PHASES else None
        self.meter.fail(f"{phase}: {self._who(node)}: {problem}", pid, f"{phase}: {problem}")

    def _who(self, node: int) -> str:
        pid = self.registry.partition(node)
        return f"node {node}" + ("" if pid is None else f" (partition {pid})")

    def _accept(self, phase: str, reply: Message, layout: Layout | Callable[[int], Layout], split: str) -> Reply | None:
        """Decode one reply; meter it as the method's bytes if valid, as rejected if not.

        Everything computed from the reply (its size, its layout, its values) is behind one
        guard: a reply that trips any of it is a rejected reply, never a crash."""
        node = reply.metadata.src_node_id
        nbytes, values, scored, step = 0, 0, 0, "measured"
        decoded: Reply | None
        problem: str | None
        try:
            nbytes, step = self.wire.message(reply), "read"
            if reply.has_error():
                decoded, problem = None, f"error {reply.error.code}: {_short(reply.error.reason or '')}"
            else:
                pid = self.partition_of(node)
                layout = layout if isinstance(layout, Layout) else layout(node)
                most = self._most(node, pid, split)
                most_test = self._most(node, pid, "test") if layout.scores is not None else math.inf
                decoded, problem = decode(reply, layout, pid, most, nbytes, most_test)
                values = self.wire.values(reply) if decoded is not None else 0
                scored = self.wire.record_bytes(reply, P.SCORES) if decoded is not None and decoded.scores is not None else 0
        except Exception as exc:
            decoded, problem = None, f"reply cannot be {step}: {type(exc).__name__}: {_short(str(exc))}"
            if step == "measured":  # serializing it failed: a record holds what Flower's records never allow
                problem += " (a record holds a value of a type Flower's records do not allow)"
        if decoded is None and reply.has_error() and reply.error.code == P.ERROR_UNREGISTERED:
            self.registry.forget(node)  # it restarted and lost the schema: registered afresh next round
        if decoded is None:
            self.meter.rejected_bytes_up += nbytes
            for name, value in getattr(problem, "figures", {}).items():
                self.meter.rejected_figures.setdefault(name, []).append(value)
            self._fail(phase, node, str(problem))
            self.registry.failed(node)
            return None
        self.meter.add(phase, up=nbytes - scored, values_up=values)
        if scored:  # test scores a train reply carried (client-evaluation=with-next-train): evaluation traffic, not the method's
            self.meter.add(P.PHASE_EVALUATE, up=scored)
        self.registry.seen(node, self.round)
        return decoded

    def most_examples(self, node: int, split: str = "train") -> int:
        """The most examples ``node`` can hold in ``split`` (what it declared, else its partition's bound)."""
        return self._most(node, self.partition_of(node), split)

    def _most(self, node: int, pid: int, split: str) -> int:
        """The most examples ``node`` (partition ``pid``) can hold in ``split``: what it declared, else the partition's bound."""
        declared = self.registry.clients[node].declared_count(split)
        return declared if declared is not None else self.services.data.max_count(pid, split)

    def exchange(
        self,
        phase: str,
        contents: Mapping[int, RecordDict],
        kind: str,
        layout: Layout | Callable[[int], Layout],
        split: str = "train",
        timeout: float | None = None,
    ) -> list[Reply]:
        """Send each node its content; return the valid replies, decoded against ``layout``
        (or ``layout(node_id)`` where replies differ per client, e.g. by body).

        Ends when every node has answered or at the ``round-timeout`` deadline; silent,
        erroring and invalid replies are counted with their reason. ``split`` names the
        data a reply's count is about (train or test), for its bound; ``timeout`` replaces the
        deadline (an exchange that is one stage of a longer one). Replies come back in
        partition-id order, whatever order they arrived in, so one config gives one result."""
        replies = self._send(phase, contents, kind, timeout)
        accepted = [r for r in (self._accept(phase, m, layout, split) for m in replies) if r is not None]
        return sorted(accepted, key=lambda r: r.partition_id)  # arrival order must not change a result (sums, draws)

    def quorum(self, phase: str, replies: Sized) -> bool:
        """Whether ``replies`` (or the clients in a secure sum) reach ``min-replies``; a shortfall is counted as a failure."""
        need = self.cfg["min-replies"]
        if len(replies) >= need:
            return True
        self.meter.fail(f"{phase}: {len(replies)} valid replies, fewer than min-replies={need}; keeping the previous model")
        return False

    def relay(
        self,
        phase: str,
        order: list[int],
        first: RecordDict,
        forward: Callable[[Reply], tuple[RecordDict, Layout]],
        layout: Layout,
        hop_timeout: float,
        kind: str = MessageType.TRAIN,
    ) -> list[Reply]:
        """Pass a message along ``order``: ``first`` (whose reply must match ``layout``) goes
        to the first node, and each valid reply becomes, through ``forward``, the next node's
        message and the layout that node's reply must match. A hop that fails (silent past
        ``hop_timeout``, or an invalid reply) is skipped: the next node gets what the failed
        one was given. No hop waits past the round deadline of ``round-timeout`` from the
        relay's start."""
        deadline = self.clock() + self.cfg["round-timeout"]
        content = first
        out: list[Reply] = []
        for node in order:
            left = deadline - self.clock()
            if left <= 0:
                self.meter.fail(f"{phase}: relay deadline passed before {self._who(node)}; {len(order) - len(out)} hops left unvisited")
                break
            replies = self._send(phase, {node: content}, kind, timeout=min(hop_timeout, left))
            reply = self._accept(phase, replies[0], layout, "train") if replies else None
            if reply is None:
                log.warning("%s: relay skips %s; the next client gets the same message", phase, self._who(node))
                continue
            out.append(reply)
            content, layout = forward(reply)
        return out
