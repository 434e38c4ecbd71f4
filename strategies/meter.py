"""What one round cost and what went wrong in it: bytes per phase (as shipped,
:mod:`strategies.wire`), failures with their reasons, absent and selected clients.

The engine fills a :class:`RoundMeter` while a round runs and hands it over at the
round's end; the strategy's record and the run summary read it."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

from core import protocol as P

log = logging.getLogger("headway")

# Phases whose bytes are measurement, not the method's cost (reported apart).
MEASUREMENT_PHASES = (P.PHASE_REGISTER, P.PHASE_EVALUATE, P.PHASE_UPLOAD)


def short_reason(reason: str, limit: int = 300) -> str:
    """A client's error reason without a long remote traceback: its last line, bounded."""
    lines = [line.strip() for line in str(reason).strip().splitlines() if line.strip()]
    text = lines[-1] if lines else "no reason given"
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
    joined: list[int] | None = None  # join-clients runs: partition ids registered for the first time this round

    def add(self, phase: str, down: int = 0, up: int = 0, values_down: int = 0, values_up: int = 0) -> None:
        """Count bytes of ``phase``: on the wire (``down``, ``up``) and of the array values alone."""
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

    def reject(self, nbytes: int, figures: Mapping[str, float]) -> None:
        """Count a refused reply's ``nbytes`` and the ``figures`` its rejection carries (e.g. its update norm)."""
        self.rejected_bytes_up += nbytes
        for name, value in figures.items():
            self.rejected_figures.setdefault(name, []).append(value)

    def cost(self, values: bool = False) -> tuple[int, int]:
        """(down, up) bytes of the method's own traffic, every phase but measurement: on
        the wire, or (``values``) the array values alone."""
        table = self.values if values else self.bytes
        down = sum(v[0] for p, v in table.items() if p not in MEASUREMENT_PHASES)
        up = sum(v[1] for p, v in table.items() if p not in MEASUREMENT_PHASES)
        return down, up

    def phase(self, phase: str) -> tuple[int, int]:
        """(down, up) bytes on the wire of one ``phase``."""
        down, up = self.bytes.get(phase, [0, 0])
        return down, up
