"""The round engine every strategy runs on: what a round may wait for, and what crossed the wire.

:class:`Engine`: exchanges with a deadline (``round-timeout`` per exchange; a node that
misses it is not asked again in the same round), quorum (``min-replies``), decoding of
every reply against the method's :class:`~headway.strategies.replies.Layout`, relays from one
client to the next with a per-hop deadline, and seeded sampling of the registered nodes.
It delegates who the clients are to :mod:`headway.strategies.registration` (its ``registry`` and
``registrar``) and what a round cost to :mod:`headway.strategies.meter` (its ``meter``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sized
from typing import Any

from flwr.app import Message, MessageType, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from headway.core import protocol as P
from headway.core.joining import join_plan, split_joined
from headway.core.sampling import draw_with_replacement, sample_positions, sample_size
from headway.core.settings import Settings
from headway.strategies.meter import RoundMeter, array_elements, short_reason
from headway.strategies.registration import ClientRegistry, Registrar
from headway.strategies.replies import Layout, Problem, Rejection, Reply, decode
from headway.strategies.services import Services, example_cap
from headway.strategies.wire import WireMeter
from typing_extensions import TypeVar

log = logging.getLogger("headway")

# RoundMeter is re-exported: strategies import it with the Engine
__all__ = ["WAIT_REPORT_EVERY", "Engine", "RoundFailed", "RoundMeter"]

# The first message of a round's training to each client it asks (a round's ``selected``): a train message,
# a relay hop, or under secure aggregation the key setup that opens it.
SELECTING_PHASES = (P.PHASE_TRAIN, P.PHASE_CHAIN, P.STAGE_SETUP)
# Phases where a client's failure keeps its training reply out of the round's aggregate (SecAgg+'s unmask stage
# does not: a client that sent its masked vector and then dropped is still in the sum).
CONTRIBUTING_PHASES = (P.PHASE_TRAIN, P.PHASE_CHAIN, P.STAGE_SETUP, P.STAGE_SHARE, P.STAGE_COLLECT)

T = TypeVar("T", default=Any)  # what a layout's check makes of a reply's arrays (its payload)


class RoundFailed(RuntimeError):
    """A step of a round could not go on (e.g. every client failed in round 1)."""


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
            out[node] = f"the SuperLink answered for it: error {r.error.code}: {short_reason(r.error.reason or '')}"
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
        settings: Settings,
        services: Services,
        clock: Callable[[], float] = time.monotonic,
        admit: Callable[[str], str | None] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.grid = grid
        self.sleep = sleep  # between polls for connected nodes (tests pass a fake that moves their clock)
        self.settings = settings
        self.services = services
        self.registry = ClientRegistry(settings.num_clients)
        # admit: why a node's declared body cannot take part in this run, or None
        self.registrar = Registrar(self, grid, settings, services, self.registry, admit)
        # join-clients: partitions left out until round join-round + 1 (derived from the round number: a resumed run agrees)
        self.join = join_plan(settings.join_clients, settings.join_round, settings.join_fraction_old, settings.fraction_train)
        self.clock = clock
        self.wire = WireMeter()
        self.meter = RoundMeter()
        self.round = 0
        self.missed: set[int] = set()  # nodes that missed a deadline this round
        self.waited = False  # True once clients were waited for (or discovery did it): wait_for_clients then waits no more

    # ----- rounds -----------------------------------------------------------------
    def begin_round(self, server_round: int) -> None:
        """Start a round: fresh meter and deadlines; register nodes that are new (join-clients: hold those whose round has not come)."""
        self.round = server_round
        self.missed = set()
        self.wire.clear()
        connected = set(self.grid.get_node_ids())
        self.registry.release_conflicts(connected)
        self.registry.release_held(connected, everyone=self.join.joined(server_round))
        before = {c.partition_id for c in self.registry.clients.values()}
        new = [
            n
            for n in sorted(connected)
            if (n not in self.registry.clients or self.registry.rejoining(n))
            and n not in self.registry.refused
            and n not in self.registry.held
        ]
        if new:
            self.register(new)
        if self.join.active:
            self.hold_joiners(server_round)
            self.meter.joined = sorted(
                c.partition_id
                for c in self.registry.clients.values()
                if c.partition_id in self.join.partitions and c.partition_id not in before
            )
        self.meter.absent = sorted(c.partition_id for n, c in self.registry.clients.items() if n not in connected)
        self.meter.registered = len(self.registry.clients)

    def hold_joiners(self, server_round: int) -> None:
        """Registered nodes whose partition joins after this round leave the registry for :attr:`ClientRegistry.held`:
        not sampled, evaluated or counted, and not asked again until their round comes."""
        held = [info.partition_id for info in self.registry.clients.values() if self.join.waiting(info.partition_id, server_round)]
        for node in [n for n, info in self.registry.clients.items() if info.partition_id in held]:
            self.registry.hold(node)
        if held:
            log.info("join-clients: partition(s) %s held out until round %d", ", ".join(map(str, sorted(held))), self.join.after + 1)

    def end_round(self) -> RoundMeter:
        """The finished round's meter (and a fresh one for what follows)."""
        meter, self.meter = self.meter, RoundMeter()
        return meter

    # ----- checkpoint and resume ---------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """What the engine keeps that later rounds depend on, as plain values (a checkpoint's ``engine``): the
        registry by partition id (node id, body, declared data and its fingerprint, last round, failure streak),
        refused nodes and conflicts. The sampling stream's position is the server state's (``ServerState.sampling``)."""
        return {"registry": self.registry.snapshot()}

    def restore(self, snapshot: Mapping[str, Any]) -> None:
        """Take back :meth:`snapshot` for a resumed run: every node registers again (in simulation under a new id),
        checked against the client it claims to be."""
        self.registry.restore(snapshot["registry"])

    def file_state_under(self, run_key: str) -> None:
        """Send ``run_key`` in every registration: the nodes keep their saved state under it, so a resumed run that
        sends it again (from its checkpoint) finds that state, and no other run can name it."""
        self.registrar.lineage = run_key

    # ----- who takes part ---------------------------------------------------------
    def wait_for_clients(self) -> list[int]:
        """Before round 1: wait up to ``sample-timeout`` for ``min-available-clients``
        (0: ``num-clients``, less the ``join-clients``, which join later) to connect; returns the connected node ids. Says at once how many
        are expected and connected, again each time the count changes (at most every
        :data:`WAIT_REPORT_EVERY` seconds otherwise), with what to change if it never adds up.
        Once per engine: later calls (``waited`` set) return the connected nodes at once."""
        if self.waited:
            return sorted(self.grid.get_node_ids())
        self.waited = True
        s = self.settings
        key, wanted = ("min-available-clients", s.min_available_clients) if s.min_available_clients else ("num-clients", s.num_clients)
        if not s.min_available_clients and self.join.active:  # the join-clients' nodes may well connect only when their round comes
            key, wanted = "min-available-clients", s.num_clients - len(self.join.partitions)
        limit = float(s.sample_timeout)
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
        """Ask ``nodes`` who they are and register or refuse each (:meth:`Registrar.register`)."""
        self.registrar.register(nodes)

    def example_cap(self) -> int:
        """The most examples one client may declare or report where the server holds no
        partition sizes: ``max-client-examples``, else :data:`~headway.strategies.services.DEFAULT_EXAMPLE_CAP`."""
        return example_cap(self.settings.max_client_examples)

    def nodes(self) -> list[int]:
        """Registered, connected nodes that have not missed a deadline this round, by partition id."""
        connected = set(self.grid.get_node_ids())
        return [n for n in self.registry.ordered(connected) if n not in self.missed]

    def sample(self, fraction: float, weights: Mapping[int, float] | None = None) -> list[int]:
        """K = max(1, round(N·fraction)) of the N available nodes, without replacement,
        uniformly or by successive sampling ∝ ``weights`` (keyed by node id; see
        :mod:`headway.core.sampling` for the inclusion probabilities)."""
        nodes = self.nodes()
        if not nodes:
            return []
        w = None if weights is None else [float(weights.get(n, 0.0)) for n in nodes]
        if self.join.joined(self.round):
            return [nodes[i] for i in self.after_join(nodes, w)]
        k = sample_size(len(nodes), fraction)
        return [nodes[i] for i in sample_positions(len(nodes), k, self.services.sampling, w)]

    def after_join(self, nodes: list[int], weights: list[float] | None) -> list[int]:
        """Positions in ``nodes`` a round after the join trains: every joined client, and ``join-fraction-old``
        of the others drawn as :meth:`sample` draws (none for a fraction of 0)."""
        joined, others = split_joined([self.partition_of(n) for n in nodes], self.join.partitions)
        k = self.join.old_count(len(others))
        w = None if weights is None else [weights[i] for i in others]
        picked = sample_positions(len(others), k, self.services.sampling, w) if k else []
        return sorted(joined + [others[i] for i in picked])

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
        """The partition id registered node ``node_id`` holds."""
        return self.registry.clients[node_id].partition_id

    # ----- exchanges --------------------------------------------------------------
    def send(self, phase: str, contents: Mapping[int, RecordDict], kind: str, timeout: float | None = None) -> list[Message]:
        """Send, wait until all answered or the deadline; meter down; count the silent, each
        with what really happened: the SuperLink's word about the node (e.g. it stopped sending
        heartbeats), or how long was waited of which deadline."""
        if not contents:
            return []
        timeout = self.settings.round_timeout if timeout is None else timeout
        messages = [Message(content=c, dst_node_id=n, message_type=kind, group_id=str(self.round)) for n, c in contents.items()]
        if phase in SELECTING_PHASES:
            self.meter.selected.update(c.partition_id for n, c in self.registry.clients.items() if n in contents)
        self.meter.add(
            phase,
            down=sum(self.wire.message(m) for m in messages),
            values_down=sum(self.wire.values(m) for m in messages),
            params_down=sum(array_elements(m) for m in messages),
        )
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
        """``node`` as failures name it: its id, and its partition where it has one."""
        pid = self.registry.partition(node)
        return f"node {node}" + ("" if pid is None else f" (partition {pid})")

    def _accept(self, phase: str, reply: Message, layout: Layout[T] | Callable[[int], Layout[T]], split: str) -> Reply[T] | None:
        """Decode one reply; meter it as the method's bytes if valid, as rejected if not.

        Everything computed from the reply (its size, its layout, its values) is behind one
        guard: a reply that trips any of it is a rejected reply, never a crash."""
        node = reply.metadata.src_node_id
        nbytes, values, params, scored, step = 0, 0, 0, 0, "measured"
        decoded: Reply[T] | None
        problem: Problem | None
        try:
            nbytes, step = self.wire.message(reply), "read"
            if reply.has_error():
                decoded, problem = None, f"error {reply.error.code}: {short_reason(reply.error.reason or '')}"
            else:
                pid = self.partition_of(node)
                this = layout if isinstance(layout, Layout) else layout(node)
                most = self._most(node, pid, split)
                most_test = self._most(node, pid, "test") if this.scores is not None else math.inf
                decoded, problem = decode(reply, this, pid, most, nbytes, most_test)
                values = self.wire.values(reply) if decoded is not None else 0
                params = array_elements(reply) if decoded is not None else 0
                scored = self.wire.record_bytes(reply, P.SCORES) if decoded is not None and decoded.scores is not None else 0
        except Exception as exc:
            decoded, problem = None, f"reply cannot be {step}: {type(exc).__name__}: {short_reason(str(exc))}"
            if step == "measured":  # serializing it failed: a record holds what Flower's records never allow
                problem = f"{problem} (a record holds a value of a type Flower's records do not allow)"
        if decoded is None and reply.has_error() and reply.error.code == P.ERROR_UNREGISTERED:
            self.registry.forget(node)  # it restarted and lost the schema: registered afresh next round
        if decoded is None:
            self.meter.reject(nbytes, problem.figures if isinstance(problem, Rejection) else {})
            self._fail(phase, node, str(problem))
            self.registry.failed(node)
            return None
        self.meter.add(phase, up=nbytes - scored, values_up=values, params_up=params)
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
        layout: Layout[T] | Callable[[int], Layout[T]],
        split: str = "train",
        timeout: float | None = None,
    ) -> list[Reply[T]]:
        """Send each node its content; return the valid replies, decoded against ``layout``
        (or ``layout(node_id)`` where replies differ per client, e.g. by body).

        Ends when every node has answered or at the ``round-timeout`` deadline; silent,
        erroring and invalid replies are counted with their reason. ``split`` names the
        data a reply's count is about (train or test), for its bound; ``timeout`` replaces the
        deadline (an exchange that is one stage of a longer one). Replies come back in
        partition-id order, whatever order they arrived in, so one config gives one result."""
        replies = self.send(phase, contents, kind, timeout)
        accepted = [r for r in (self._accept(phase, m, layout, split) for m in replies) if r is not None]
        return sorted(accepted, key=lambda r: r.partition_id)  # arrival order must not change a result (sums, draws)

    def quorum(self, phase: str, replies: Sized) -> bool:
        """Whether ``replies`` (or the clients in a secure sum) reach ``min-replies``; a shortfall is counted as a failure."""
        need = self.settings.min_replies
        if len(replies) >= need:
            return True
        self.meter.fail(f"{phase}: {len(replies)} valid replies, fewer than min-replies={need}; keeping the previous model")
        return False

    def relay(
        self,
        phase: str,
        order: list[int],
        first: RecordDict,
        forward: Callable[[Reply[T]], tuple[RecordDict, Layout[T]]],
        layout: Layout[T],
        hop_timeout: float,
        kind: str = MessageType.TRAIN,
    ) -> list[Reply[T]]:
        """Pass a message along ``order``: ``first`` (whose reply must match ``layout``) goes
        to the first node, and each valid reply becomes, through ``forward``, the next node's
        message and the layout that node's reply must match. A hop that fails (silent past
        ``hop_timeout``, or an invalid reply) is skipped: the next node gets what the failed
        one was given. No hop waits past the round deadline of ``round-timeout`` from the
        relay's start."""
        deadline = self.clock() + self.settings.round_timeout
        content = first
        out: list[Reply[T]] = []
        for node in order:
            left = deadline - self.clock()
            if left <= 0:
                self.meter.fail(f"{phase}: relay deadline passed before {self._who(node)}; {len(order) - len(out)} hops left unvisited")
                break
            replies = self.send(phase, {node: content}, kind, timeout=min(hop_timeout, left))
            reply = self._accept(phase, replies[0], layout, "train") if replies else None
            if reply is None:
                log.warning("%s: relay skips %s; the next client gets the same message", phase, self._who(node))
                continue
            out.append(reply)
            content, layout = forward(reply)
        return out
