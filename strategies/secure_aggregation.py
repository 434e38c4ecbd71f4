"""The server's side of SecAgg+ on headway's round engine: one secure exchange is four
metered exchanges (setup, share keys, collect masked vectors with the round's training,
unmask), all within one ``round-timeout`` deadline. The maths is core/secagg.py; here only
who is sent what, and what a reply may be.

Every stage reply is checked like any other (layout, size, partition id); a client that
fails a stage is out of the rest of the round. What is unmasked is only the sum of the
clients whose masked vectors arrived: no stage ever holds one client's values.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, MessageType, RecordDict
from headway.core import protocol as P
from headway.core import secagg as S
from headway.core import secagg_primitives as C
from headway.strategies.engine import Engine
from headway.strategies.replies import ArraySpec, Layout, Reply

log = logging.getLogger("headway")

MAX_CIPHERTEXT_BYTES = 4096  # one encrypted pair of shares is ~0.7 KB (a PEM private key's Shamir shares, Fernet, base64)
MAX_SHARE_BYTES = 2048
STAGE_SHARE_OF_DEADLINE = 8  # each key stage (setup, share, unmask) may take round-timeout / 8


@dataclass(frozen=True)
class SumSpec:
    """What a method adds up: its reply's arrays (name -> shape, in this order) and the
    largest |entry| the sum over this round's clients can reach (the overflow rule)."""

    arrays: Mapping[str, tuple[int, ...]]
    bound: float
    update_norm: float = 0.0  # > 0: clients send n·(w − w_sent) with ‖w − w_sent‖ clipped to this, and n (the model-averaging methods)
    row_weights: str = ""  # an array of ``arrays`` whose entries weigh the rows of the others before summing (FedProto's class counts)

    @property
    def size(self) -> int:
        """Entries of the summed vector: every array's, and n where clients send weighted updates."""
        return sum(math.prod(shape) for shape in self.arrays.values()) + (1 if self.update_norm > 0 else 0)


@dataclass(frozen=True)
class SecureSum:
    """The unmasked sum (float64 arrays) and the partitions whose vectors are in it."""

    arrays: dict[str, np.ndarray]
    partitions: list[int]
    cpu: dict[str, float]  # the server's CPU seconds in each stage, in this thread (where the Shamir recombination runs too)
    max_examples: float = math.inf  # the most examples the clients in the sum can hold together

    def __len__(self) -> int:
        return len(self.partitions)


def _content(stage: str, fields: Mapping[str, Any], base: RecordDict | None = None, server_round: int = 0) -> RecordDict:
    out = RecordDict(dict(base.items())) if base is not None else RecordDict({P.CONFIG: ConfigRecord({P.ROUND: server_round})})
    out[P.SECAGG] = ConfigRecord({P.SECAGG_STAGE: stage, **fields})
    return out


def _config_only(names: tuple[str, ...], check: Any, entries: int = 1) -> Layout:
    return Layout(None, count=False, config=names, check=check, slack_bytes=64 * 1024 + entries * (MAX_CIPHERTEXT_BYTES + 64))


def _bytes_list(value: Any, cap: int) -> list[bytes] | None:
    if not isinstance(value, list) or not all(isinstance(v, bytes) and 0 < len(v) <= cap for v in value):
        return None
    return value


def _int_list(value: Any) -> list[int] | None:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return None
    return value


def _check_keys(arrays: dict, reply: Reply) -> tuple[Any, str | None]:
    c = reply.config
    pk1, pk2, digest = c.get(P.PK1), c.get(P.PK2), c.get(P.SEED_DIGEST)
    if not (isinstance(pk1, bytes) and isinstance(pk2, bytes) and max(len(pk1), len(pk2)) <= S.MAX_KEY_BYTES):
        return None, "setup reply without two public keys of at most 1 KB"
    if not (isinstance(digest, bytes) and len(digest) == 32):
        return None, "setup reply without a 32-byte seed digest"
    for key in (pk1, pk2):
        try:
            parsed = C.load_public_key(key)
        except ValueError:
            return None, "a public key that is not a PEM EC public key"
        if parsed.curve.name != S.CURVE:
            return None, f"a public key that is not an EC key on {S.CURVE}, the curve the protocol's key agreement uses"
    return (pk1, pk2, digest), None


def _check_pairs(reply: Reply, values: str, cap: int) -> tuple[dict[int, bytes] | None, str | None]:
    ids, blobs = _int_list(reply.config.get(P.IDS)), _bytes_list(reply.config.get(values), cap)
    if ids is None or blobs is None or len(ids) != len(blobs) or len(set(ids)) != len(ids):
        return None, f"reply without matching lists of distinct node ids and {values} (each at most {cap} bytes)"
    return dict(zip(ids, blobs, strict=True)), None


def secure_sum(engine: Engine, phase: str, contents: Mapping[int, RecordDict], spec: SumSpec) -> SecureSum | None:
    """Run SecAgg+ over ``contents`` (each node's training message): the decoded sum of the
    ``spec`` arrays of the replies, or None when the round cannot finish (the reason is in
    the round's failures). All stages share one ``round-timeout`` deadline; the key stages
    (setup, share, unmask) get at most an eighth of it each, and training leaves unmask its
    eighth, so a client silent in one stage cannot use up the time of the others."""
    try:
        return _secure_sum(engine, phase, contents, spec)
    except Exception as exc:  # anything a client's reply could trip: the round fails, never the run
        log.exception("%s: secure aggregation failed", phase)
        engine.meter.fail(f"{phase}: secure aggregation: {type(exc).__name__}: {exc}; keeping the previous model")
        return None


@dataclass
class _Session:
    """One secure exchange in progress: its engine and phase, the one ``round-timeout`` deadline all
    stages share, each key stage's budget, and the server's CPU seconds per stage."""

    engine: Engine
    phase: str
    deadline: float
    budget: float
    cpu: dict[str, float]
    mark: float

    @classmethod
    def open(cls, engine: Engine, phase: str) -> _Session:
        """A session starting now."""
        timeout = engine.settings.round_timeout
        return cls(engine, phase, engine.clock() + timeout, timeout / STAGE_SHARE_OF_DEADLINE, {}, time.thread_time())

    def left(self, cap: float = math.inf, keep: float = 0.0) -> float:
        """Seconds the next exchange may wait: at most ``cap``, leaving ``keep`` of the deadline."""
        return max(min(self.deadline - keep - self.engine.clock(), cap), 0.0)

    def fail(self, why: str) -> None:
        """Count the round's failure: the sum cannot be made, the model is kept."""
        self.engine.meter.fail(f"{self.phase}: secure aggregation: {why}; keeping the previous model")

    def lap(self, stage: str) -> None:
        """The CPU seconds since the last lap are ``stage``'s."""
        now = time.thread_time()
        self.cpu[stage], self.mark = now - self.mark, now


def _secure_sum(engine: Engine, phase: str, contents: Mapping[int, RecordDict], spec: SumSpec) -> SecureSum | None:
    """The four stages of SecAgg+ in turn (:func:`_setup`, :func:`_share`, :func:`_collect`, :func:`_unmask`)."""
    settings = engine.settings
    nodes = sorted(contents)
    session = _Session.open(engine, phase)
    smallest = max(S.MIN_CLIENTS, settings.min_replies)  # what each client's floor assumes (core/secagg.py, client_floor)
    if len(nodes) < smallest:
        session.fail(
            f"{len(nodes)} client(s) asked; a secure sum needs at least {smallest} (3, as a client's secrets are shared among "
            f"at least 2 others, and min-replies={settings.min_replies})"
        )
        return None
    try:
        frac = S.fraction_bits(spec.bound)
    except S.SecAggError as exc:
        session.fail(str(exc))
        return None
    shares = S.share_count(len(nodes), settings.secagg_shares)
    threshold = S.threshold_for(shares - 1, settings.secagg_threshold)  # of the shares - 1 other neighbours that hold a client's shares
    graph = S.neighbour_graph(nodes, shares)
    public, digests = _setup(session, nodes, threshold)
    relayed = _share(session, graph, public, threshold, shares)
    masked = _collect(session, contents, relayed, threshold, spec, frac)
    if len(masked.arrived) < max(settings.min_replies, 1):  # never unmask a sum of fewer: distributed DP's noise needs min-replies shares
        session.fail(f"{len(masked.arrived)} masked vectors arrived, fewer than min-replies={settings.min_replies}; nothing is unmasked")
        return None
    summed = _unmask(session, masked, relayed, public, digests, threshold, shares)
    if summed is None:
        return None
    values = S.decode(summed, frac)
    session.lap("unmask")
    dropped = set(relayed) - set(masked.arrived)
    log.info(
        "%s: secure sum of %d clients (%d dropped after sharing keys; %d shares each, threshold %d)",
        phase,
        len(masked.arrived),
        len(dropped),
        shares,
        threshold,
    )
    return SecureSum(_arrays(values, spec), masked.partitions, session.cpu, masked.most)


def _setup(session: _Session, nodes: list[int], threshold: int) -> tuple[dict[int, tuple[bytes, bytes]], dict[int, bytes]]:
    """Stage 0: fresh keys and a seed digest from every client; clients that sent a public key another
    client also sent are out. Returns each client's two public keys and its seed digest."""
    engine = session.engine
    setup = _content(P.STAGE_SETUP, {P.SECAGG_THRESHOLD: threshold}, server_round=engine.round)
    replies = engine.exchange(
        P.STAGE_SETUP,
        {v: setup for v in nodes},
        MessageType.TRAIN,
        _config_only((P.PK1, P.PK2, P.SEED_DIGEST), _check_keys),
        timeout=session.left(session.budget),
    )
    got = {r.node_id: r.payload for r in replies}
    seen = Counter(k for (pk1, pk2, _) in got.values() for k in (pk1, pk2))
    twins = {k for k, times in seen.items() if times > 1}
    for v in [v for v, (pk1, pk2, _) in got.items() if pk1 in twins or pk2 in twins]:
        engine.meter.fail(f"{P.STAGE_SETUP}: node {v} sent a public key another client also sent")
        del got[v]
    session.lap("setup")
    return {v: (pk1, pk2) for v, (pk1, pk2, _) in got.items()}, {v: d for v, (_, _, d) in got.items()}


def _share(
    session: _Session, graph: Any, public: Mapping[int, tuple[bytes, bytes]], threshold: int, shares: int
) -> dict[int, dict[int, bytes]]:
    """Stage 1: each client gets its neighbours' keys and sends each neighbour encrypted shares.
    Returns, by recipient, the ciphertexts relayed to it (by sender)."""
    engine = session.engine
    asked = S.key_requests(graph, public)
    share_msgs = {
        v: _content(
            P.STAGE_SHARE,
            {
                P.IDS: list(keys),
                P.PK1S: [k[0] for k in keys.values()],
                P.PK2S: [k[1] for k in keys.values()],
                P.SECAGG_THRESHOLD: threshold,
            },
            server_round=engine.round,
        )
        for v, keys in asked.items()
        if len(keys) - 1 >= threshold
    }

    def check_shares(arrays: dict, reply: Reply) -> tuple[Any, str | None]:
        texts, problem = _check_pairs(reply, P.CIPHERTEXTS, MAX_CIPHERTEXT_BYTES)
        if texts is None:
            return None, problem
        return texts, S.share_problem(reply.node_id, asked[reply.node_id], texts)

    replies = engine.exchange(
        P.STAGE_SHARE,
        share_msgs,
        MessageType.TRAIN,
        _config_only((P.IDS, P.CIPHERTEXTS), check_shares, shares),
        timeout=session.left(session.budget),
    )
    relayed: dict[int, dict[int, bytes]] = S.relay_shares({r.node_id: r.payload for r in replies})
    session.lap("share")
    return relayed


@dataclass(frozen=True)
class _Masked:
    """What stage 2 collected: the sum of the masked vectors, the nodes and partitions whose vectors
    arrived, and the examples those clients can hold together (their bounds at collect)."""

    total: np.ndarray
    arrived: list[int]
    partitions: list[int]
    most: float


def _collect(
    session: _Session,
    contents: Mapping[int, RecordDict],
    relayed: Mapping[int, Mapping[int, bytes]],
    threshold: int,
    spec: SumSpec,
    frac: int,
) -> _Masked:
    """Stage 2: the round's training message, with the shares relayed to each; masked vectors back,
    added up (mod 2^64). Training leaves the unmask stage its budget."""
    engine = session.engine
    collect = {
        v: _content(
            P.STAGE_COLLECT,
            {
                P.IDS: list(texts),
                P.CIPHERTEXTS: list(texts.values()),
                P.SUM_NAMES: list(spec.arrays),
                P.FRAC_BITS: frac,
                P.SUM_UPDATE_NORM: spec.update_norm,
                P.SUM_ROW_WEIGHTS: spec.row_weights,
            },
            base=contents[v],
        )
        for v, texts in relayed.items()
        if len(texts) >= threshold
    }
    masked_layout = Layout({P.MASKED: ArraySpec((spec.size,), "uint64")}, count=False)
    replies = engine.exchange(session.phase, collect, MessageType.TRAIN, masked_layout, timeout=session.left(keep=session.budget))
    total = np.zeros(spec.size, dtype=np.uint64)
    for r in replies:
        total = total + r.arrays[P.MASKED]
    session.lap("collect")
    return _Masked(total, [r.node_id for r in replies], sorted(r.partition_id for r in replies), float(sum(r.max_count for r in replies)))


def _unmask(
    session: _Session,
    masked: _Masked,
    relayed: Mapping[int, Mapping[int, bytes]],
    public: Mapping[int, tuple[bytes, bytes]],
    digests: Mapping[int, bytes],
    threshold: int,
    shares: int,
) -> np.ndarray | None:
    """Stage 3: survivors reveal the seeds of the alive and the keys of the dropped; the masks are
    removed from the total. None (the reason counted) when too few or bad shares came."""
    engine = session.engine
    requests = S.unmask_requests({v: relayed[v].keys() for v in relayed}, masked.arrived)
    unmask = {
        v: _content(P.STAGE_UNMASK, {P.ALIVE: alive, P.DROPPED: dropped}, server_round=engine.round)
        for v, (alive, dropped) in requests.items()
    }

    def check_reveal(arrays: dict, reply: Reply) -> tuple[Any, str | None]:
        revealed, problem = _check_pairs(reply, P.SHARES, MAX_SHARE_BYTES)
        if revealed is None:
            return None, problem
        alive, dropped = requests[reply.node_id]
        if set(revealed) != set(alive) | set(dropped):
            return None, "shares of other clients than it was asked for"
        return revealed, None

    replies = engine.exchange(
        P.STAGE_UNMASK,
        unmask,
        MessageType.TRAIN,
        _config_only((P.IDS, P.SHARES), check_reveal, shares),
        timeout=session.left(session.budget),
    )
    dropped = set(relayed) - set(masked.arrived)
    try:
        summed: np.ndarray = S.unmask_sum(
            masked.total,
            masked.arrived,
            dropped,
            S.gather_shares(requests, {r.node_id: r.payload for r in replies}),
            public,
            digests,
            relayed,
            threshold,
        )
    except Exception as exc:  # too few or bad shares, a key that cannot agree: the round fails
        session.fail(f"{len(replies)} of {len(masked.arrived)} clients revealed shares: {type(exc).__name__}: {exc}")
        return None
    return summed


def _arrays(values: np.ndarray, spec: SumSpec) -> dict[str, np.ndarray]:
    """The decoded sum cut into ``spec``'s arrays (and n, where clients sent weighted updates)."""
    out, at = {}, 0
    for name, shape in spec.arrays.items():
        n = math.prod(shape)
        out[name] = values[at : at + n].reshape(shape)
        at += n
    if spec.update_norm > 0:
        out[P.NUM_EXAMPLES] = values[at:]
    return out
