"""Who the clients are: registration of nodes before their first round, admission of
what they declare, and the rules by which a partition or client index changes hands.

- :class:`ClientRegistry`: node id ↔ partition id (stated once, in a registration query
  before a node's first round), body, last seen, consecutive failures and refused nodes
  (a method's per-client state is in its server state, keyed by partition id: strategies/state.py).
  Nodes are ordered by partition id, so seeded sampling is reproducible although node
  ids are random.
- :class:`Registrar`: asks new nodes who they are and admits or refuses each: its body
  (the strategy's ``admit``), and with ``dataset=local`` its data profile against the run's
  schema, the description it gave discovery, ``max-client-examples``, and the data of a
  client index's former holder (:meth:`ClientRegistry.takeover_problem`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.app.typing import ConfigRecordValues, MetricRecordValues
from flwr.serverapp import Grid
from headway.core import protocol as P
from headway.core.settings import Settings
from headway.strategies.meter import RoundMeter, short_reason
from headway.strategies.services import Services, example_cap
from headway.strategies.wire import WireMeter

if TYPE_CHECKING:
    from headway.core.sources import DataSchema

log = logging.getLogger("headway")

MAX_BODY_NAME = 300  # characters of a body name a registration may give (an import path with its weights file fits)

# A dataset=local node's data as it declared it: class name -> [train, test] example counts.
Declared = dict[str, list[int]]


@dataclass
class ClientInfo:
    """What the server knows of one node."""

    node_id: int
    partition_id: int
    body: str
    last_seen: float = 0.0
    last_round: int = 0
    consecutive_failures: int = 0
    declared: Declared | None = None  # dataset=local: the node's own data as it declared it (classes -> [train, test] counts)
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
        # a resumed run: partition id -> the client a checkpoint had registered there, until a node registers as it again
        self.returning: dict[int, ClientInfo] = {}
        # join-clients: node id -> partition id of nodes that registered before their partition's round (not asked again until it comes)
        self.held: dict[int, int] = {}

    def claim(self, node_id: int, partition_id: object, body: object, connected: Collection[int]) -> str | None:
        """Register ``node_id`` as ``partition_id``; the reason it cannot be, or None.

        A partition held by a node that is no longer ``connected`` moves to the new node, and
        with it the server's state of that client, keyed by partition id (without SuperNode
        authentication a restarted SuperNode comes back under a new node id). One held by a connected node
        is refused until that node leaves, except that a node returning under the id that
        held the partition before takes it back (with authentication node ids are stable)."""
        if isinstance(partition_id, bool) or not isinstance(partition_id, (int, float)) or partition_id != int(partition_id):
            return f"registration gives partition id {partition_id!r}, expected a whole number"
        pid = int(partition_id)
        if not 0 <= pid < self.num_partitions:
            return f"registration gives partition id {pid}, outside 0..{self.num_partitions - 1}"
        if (problem := self.return_problem(node_id, pid, str(body), connected)) is not None:
            return problem
        before = self.returning.pop(pid, None)
        holder = self.by_partition(pid)
        if holder is not None and holder != node_id:
            if holder in connected and self.displaced.get(node_id) != pid:
                self.conflicts[node_id] = holder
                return (
                    f"partition id {pid} is already held by node {holder}, which is still connected: two SuperNodes were started "
                    f"with the same --partition-id (this one is asked again if node {holder} leaves)"
                )
            self.clients.pop(holder)
            if before is None:  # not a node coming back to a resumed run under a new id (simulation, no authentication)
                self.displaced[holder] = pid
                if holder in connected:  # the returning first holder takes precedence over the node that took its place
                    self.refuse(holder, f"partition id {pid} went back to node {node_id}, which held it before")
                    self.conflicts[holder] = node_id
                log.warning("partition %d moves from node %d to node %d, keeping the server's state of that client", pid, holder, node_id)
        self.displaced.pop(node_id, None)
        info = ClientInfo(node_id, pid, str(body), last_seen=time.monotonic())
        if before is not None:  # what the run knew of this client goes on as if it had never stopped
            info.last_round, info.consecutive_failures = before.last_round, before.consecutive_failures
            info.declared, info.fingerprint = before.declared, before.fingerprint
        self.clients[node_id] = info
        return None

    def return_problem(self, node_id: int, pid: int, body: str, connected: Collection[int]) -> str | None:
        """Why ``node_id`` may not register as ``pid`` in a resumed run, or None: the partition must come back
        with the body it ran, and where its node from before is still connected (SuperNode authentication keeps
        node ids) from that node alone."""
        before = self.returning.get(pid)
        if before is None:
            return None
        if body != before.body:
            return f"partition id {pid} ran body {before.body!r} before the resume; this node comes back with {body!r}: it is not the client that left"
        if before.node_id != node_id and before.node_id in connected:
            return f"partition id {pid} was node {before.node_id}'s before the resume, and node {before.node_id} is connected: this node is someone else"
        return None

    def rejoining(self, node_id: int) -> bool:
        """Whether ``node_id`` holds a client restored from a checkpoint that has not registered again (it must, to learn the lineage)."""
        info = self.clients.get(node_id)
        return info is not None and self.returning.get(info.partition_id) is info

    def snapshot(self) -> dict[str, Any]:
        """The registry as plain values (a checkpoint's): every client by partition id, refused nodes and conflicts."""
        clients = [
            {
                "node_id": c.node_id,
                "partition_id": c.partition_id,
                "body": c.body,
                "last_round": c.last_round,
                "consecutive_failures": c.consecutive_failures,
                "declared": c.declared,
                "fingerprint": c.fingerprint,
            }
            for c in sorted(self.clients.values(), key=lambda c: c.partition_id)
        ]
        return {"clients": clients, "refused": dict(self.refused), "conflicts": dict(self.conflicts), "displaced": dict(self.displaced)}

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """The registry of :meth:`snapshot` back; each client waits (:attr:`returning`) for a node to register as it again."""
        self.clients = {}
        for c in snapshot["clients"]:
            info = ClientInfo(
                int(c["node_id"]),
                int(c["partition_id"]),
                str(c["body"]),
                last_seen=time.monotonic(),
                last_round=int(c["last_round"]),
                consecutive_failures=int(c["consecutive_failures"]),
                declared=c["declared"],
                fingerprint=c["fingerprint"],
            )
            self.clients[info.node_id] = info
        self.returning = {c.partition_id: c for c in self.clients.values()}
        self.refused = dict(snapshot["refused"])
        self.conflicts = dict(snapshot["conflicts"])
        self.displaced = dict(snapshot["displaced"])

    def free_indices(self, count: int, connected: Collection[int] = ()) -> list[int]:
        """Up to ``count`` client indices no connected registered node holds (dataset=local: the server
        numbers nodes that own their data): those nobody holds, lowest first, then those whose holder
        Flower no longer lists in ``connected`` (a node restarted without authentication returns under
        a new node id; :meth:`Registrar.problem` lets it take such an index only with the same data)."""
        held = {c.partition_id for n, c in self.clients.items() if n in connected}
        unheld = [i for i in range(self.num_partitions) if self.by_partition(i) is None]
        orphaned = [i for i in range(self.num_partitions) if i not in held and i not in unheld]
        return (unheld + orphaned)[:count]

    def takeover_problem(self, index: int, fingerprint: str, declared: Declared, connected: Collection[int]) -> str | None:
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

    def hold(self, node_id: int) -> None:
        """Move registered ``node_id`` out of the run until :meth:`release_held` lets it register again."""
        info = self.clients.pop(node_id)
        self.held[node_id] = info.partition_id

    def release_held(self, connected: Collection[int], everyone: bool) -> None:
        """Forget held nodes that left (``connected`` lacks them), or all of them (``everyone``: their round has come), so they register afresh."""
        self.held = {} if everyone else {n: p for n, p in self.held.items() if n in connected}

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
        """The registered node holding ``partition_id``, or None."""
        return next((n for n, c in self.clients.items() if c.partition_id == partition_id), None)

    def ordered(self, nodes: Iterable[int]) -> list[int]:
        """Registered nodes among ``nodes``, by partition id."""
        return sorted((n for n in nodes if n in self.clients), key=lambda n: self.clients[n].partition_id)

    def seen(self, node_id: int, server_round: int) -> None:
        """Note a valid reply from ``node_id`` in ``server_round``: its failure streak ends."""
        info = self.clients[node_id]
        info.last_seen, info.last_round, info.consecutive_failures = time.monotonic(), server_round, 0

    def failed(self, node_id: int) -> None:
        """Count one more failure in a row of ``node_id`` (nothing if it is not registered)."""
        if node_id in self.clients:
            self.clients[node_id].consecutive_failures += 1

    def partition(self, node_id: int) -> int | None:
        """The partition id ``node_id`` registered as, or None if it is not registered."""
        info = self.clients.get(node_id)
        return None if info is None else info.partition_id


def _counts(declared: Mapping[str, list[int]]) -> str:
    """A declaration in a few words: how many classes and train/test examples."""
    train = sum(int(v[0]) for v in declared.values())
    test = sum(int(v[1]) for v in declared.values())
    return f"{len(declared)} classes, {train} train / {test} test examples"


class Channel(Protocol):
    """What registration needs of the engine: the round's meters and its exchange with a deadline."""

    round: int
    meter: RoundMeter
    wire: WireMeter

    def send(self, phase: str, contents: Mapping[int, RecordDict], kind: str, timeout: float | None = None) -> list[Message]:
        """Send each node its content and return the replies that came before the deadline."""
        ...


class Registrar:
    """Registers new nodes into a :class:`ClientRegistry` (see the module docstring)."""

    def __init__(
        self,
        channel: Channel,
        grid: Grid,
        settings: Settings,
        services: Services,
        registry: ClientRegistry,
        admit: Callable[[str], str | None] | None = None,
    ):
        self.channel = channel
        self.grid = grid
        self.settings = settings
        self.services = services
        self.registry = registry
        self.admit = admit  # why a node's declared body cannot take part in this run, or None
        self.lineage: str | None = None  # the run's key, sent in every registration: nodes file their saved state under it
        self.takeover_refused: set[int] = set()  # nodes refused an orphaned index for other data (register offers them another)

    def register(self, nodes: list[int]) -> None:
        """Ask ``nodes`` for their partition id and body (one query each, within one deadline).
        With ``dataset=local`` the query gives each node the run's schema and a free client
        index instead, and the node answers with what its own data holds; the index of a node
        refused then is offered again, in another query and deadline, to a node that had none
        (until every node has had one, or none is left)."""
        schema = self.services.schema
        fields: dict[str, ConfigRecordValues] = {P.ROUND: self.channel.round, P.PHASE: P.PHASE_REGISTER}
        if self.lineage is not None:
            fields[P.LINEAGE] = self.lineage
        connected = set(self.grid.get_node_ids())
        if schema is None:
            self._registrations({n: RecordDict({P.CONFIG: ConfigRecord(fields)}) for n in nodes}, connected, {})
        else:
            self._register_local(nodes, schema, fields, connected)
        for node in nodes:
            if node not in self.registry.clients and node not in self.registry.refused:
                self.registry.refuse(node, "did not answer its registration")  # asked again if it reconnects as a new node
        log.info("registry: %d clients registered (%d refused)", len(self.registry.clients), len(self.registry.refused))

    def _register_local(self, nodes: list[int], schema: DataSchema, fields: Mapping[str, ConfigRecordValues], connected: set[int]) -> None:
        """dataset=local: offer each of ``nodes`` a free client index with the run's ``schema``, until each is
        registered, refused, or has been offered every index."""
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
                self.registry.refuse(node, f"every one of the num-clients={self.settings.num_clients} client indices is taken")

    def _registrations(self, contents: Mapping[int, RecordDict], connected: Collection[int], offered: Mapping[int, int]) -> None:
        """Send registration queries ``contents`` (one deadline) and register or refuse each node that answers."""
        for reply in self.channel.send(P.PHASE_REGISTER, contents, MessageType.QUERY):
            node = reply.metadata.src_node_id
            try:  # everything read from a registration is untrusted: one bad one refuses that node only
                problem = self.problem(node, reply, connected, offered.get(node))
            except Exception as exc:
                problem = f"registration cannot be read: {type(exc).__name__}: {short_reason(str(exc))}"
            if problem:
                self.registry.refuse(node, problem)
                self.channel.meter.fail(f"node {node}: {problem}")

    def problem(self, node: int, reply: Message, connected: Collection[int], offered: int | None = None) -> str | None:
        """Register ``node`` from its reply (as client index ``offered`` with dataset=local);
        why it cannot take part, or None."""
        from headway.core.run_data import MAX_PROFILE_CHARS, read_profile

        meter, wire = self.channel.meter, self.channel.wire
        if reply.has_error():
            meter.add(P.PHASE_REGISTER, up=wire.message(reply))
            return f"registration error {reply.error.code}: {short_reason(reply.error.reason or '')}"
        met: Mapping[str, MetricRecordValues] = reply.content.metric_records.get(P.METRICS, {})
        cfg: Mapping[str, ConfigRecordValues] = reply.content.config_records.get(P.CONFIG, {})
        text = cfg.get(P.DATA_PROFILE)
        if isinstance(text, str) and len(text) > MAX_PROFILE_CHARS:  # refused before measuring: serializing it is the cost
            return f"its data profile has {len(text)} characters, more than {MAX_PROFILE_CHARS}"
        meter.add(P.PHASE_REGISTER, up=wire.message(reply))
        body = cfg.get(P.BODY, "")
        if not isinstance(body, str) or len(body) > MAX_BODY_NAME:
            return f"registration gives body {short_reason(repr(body), 120)}, expected a body name of at most {MAX_BODY_NAME} characters"
        if self.admit is not None and (problem := self.admit(body)):
            return problem
        if offered is None:
            return self.registry.claim(node, met.get(P.PARTITION_ID), body, connected)
        declared, problem = self.declared(text, self.services.described.get(node))
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

    def declared(self, text: object, described: Mapping[str, Any] | None = None) -> tuple[Declared | None, str | None]:
        """A dataset=local node's profile read against the run's schema: its classes and their
        (train, test) counts, or why it cannot take part (its data does not fit the run, it
        declares more of a class than its ``described`` discovery description did, or more
        examples than ``max-client-examples`` allows)."""
        from headway.core.node_merge import description_problem
        from headway.core.run_data import read_profile

        schema = self.services.schema
        if schema is None:  # only a dataset=local run, which always has a schema, offers client indices
            raise RuntimeError("a node was offered a client index in a run without a data schema")
        profile = read_profile(text)
        if (problem := description_problem(profile, schema)) is not None:  # discovery's checks (headway.core.node_merge)
            return None, f"its data does not fit the run: {problem}"
        declared = {str(k): [int(v[0]), int(v[1])] for k, v in profile["classes"].items()}
        if described is not None:
            before = described["classes"]
            more = next((c for c, (a, b) in declared.items() if c not in before or a > before[c][0] or b > before[c][1]), None)
            if more is not None:
                return None, (
                    f"it declares {declared[more]} examples of class {short_reason(repr(more), 80)}, more than the "
                    f"{before.get(more, [0, 0])} it described before the run"
                )
        cap = example_cap(self.settings.max_client_examples)
        total = sum(a + b for a, b in declared.values())
        if total > cap:
            return (
                None,
                f"it declares {total} examples, more than max-client-examples={cap} allows: raise that key if the node truly holds them",
            )
        return declared, None
