"""Sending messages and collecting replies with byte metering, sampling that times
out, and failure counting: the plumbing every strategy shares."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np
from flwr.app import Message, RecordDict
from flwr.common.serde import recorddict_to_proto
from flwr.serverapp import Grid

log = logging.getLogger("headway")


def payload_bytes(content: RecordDict) -> int:
    """Bytes of a message's content as serialized on the wire (protobuf)."""
    return recorddict_to_proto(content).ByteSize()


@dataclass
class Meter:
    """Bytes, participants and failures of one round, split by phase."""

    bytes: dict[str, list[int]] = field(default_factory=dict)  # phase -> [down, up]
    failures: int = 0
    failure_reasons: list[str] = field(default_factory=list)

    def add(self, phase: str, down: int = 0, up: int = 0) -> None:
        acc = self.bytes.setdefault(phase, [0, 0])
        acc[0] += down
        acc[1] += up

    def fail(self, reason: str) -> None:
        self.failures += 1
        self.failure_reasons.append(reason)
        log.warning("dropped a reply: %s", reason)

    def phase_bytes(self, phase: str) -> tuple[int, int]:
        down, up = self.bytes.get(phase, [0, 0])
        return down, up


def wait_for_nodes(grid: Grid, wanted: int, timeout: float) -> list[int]:
    """Connected node IDs once ``wanted`` are there, or whatever is there after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= wanted or time.monotonic() >= deadline:
            if len(nodes) < wanted:
                log.warning("only %d of %d nodes connected after %.0f s; going on with them", len(nodes), wanted, timeout)
            return nodes
        time.sleep(0.5)


def sample_positions(n: int, k: int, rng: np.random.Generator, weights: Sequence[float] | None = None) -> list[int]:
    """``k`` distinct positions out of ``n``, uniformly or with probabilities ∝ ``weights``.

    Node IDs are random uint64: we sample list positions, never IDs in a float array.
    """
    k = max(1, min(k, n)) if n else 0
    if weights is None:
        return sorted(rng.choice(n, size=k, replace=False).tolist())
    w = np.asarray(weights, dtype=float)
    w = np.where(np.isfinite(w) & (w > 0), w, 0.0)
    if np.count_nonzero(w) < k:  # too few positive weights: fall back to uniform
        return sorted(rng.choice(n, size=k, replace=False).tolist())
    return sorted(rng.choice(n, size=k, replace=False, p=w / w.sum()).tolist())


def exchange(grid: Grid, messages: Iterable[Message], timeout: float, meter: Meter, phase: str) -> list[Message]:
    """Send ``messages``, wait for replies, meter bytes both ways; return the good replies.

    Error replies and replies missing at the timeout are counted as failures.
    """
    messages = list(messages)
    if not messages:
        return []
    meter.add(phase, down=sum(payload_bytes(m.content) for m in messages))
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    good = []
    for reply in replies:
        if reply.has_error():
            meter.fail(f"{phase}: node {reply.metadata.src_node_id} error {reply.error.code}: {reply.error.reason}")
            continue
        meter.add(phase, up=payload_bytes(reply.content))
        good.append(reply)
    missing = len(messages) - len(replies)
    for _ in range(missing):
        meter.fail(f"{phase}: no reply within {timeout:.0f} s")
    return good
