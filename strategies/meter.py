"""What one round cost and what went wrong in it: bytes per phase (as shipped,
:mod:`headway.strategies.wire`) and the parameters (array elements) the messages carried, failures with
their reasons, absent and selected clients.

The engine fills a :class:`RoundMeter` while a round runs and hands it over at the
round's end; the strategy's record and the run summary read it."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from flwr.app import Message
from headway.core import protocol as P

log = logging.getLogger("headway")

# Phases whose bytes are measurement, not the method's cost (reported apart).
MEASUREMENT_PHASES = (P.PHASE_REGISTER, P.PHASE_EVALUATE, P.PHASE_UPLOAD)


def array_elements(message: Message) -> int:
    """Parameters ``message`` carries: the elements of every array of its ArrayRecords (0 for an error or empty
    message). Counted for sent messages and accepted replies only, whose shapes the layout has checked."""
    if message.has_error() or not message.has_content():
        return 0
    return sum(math.prod(int(d) for d in a.shape) for record in message.content.array_records.values() for a in record.values())


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
    params: dict[str, list[int]] = field(default_factory=dict)  # array elements per phase, down and up (the papers' "parameters")
    rejected_bytes_up: int = 0
    rejected_figures: dict[str, list[float]] = field(default_factory=dict)  # figures of refused replies, e.g. their update norms
    failures: list[str] = field(default_factory=list)
    absent: list[int] = field(default_factory=list)  # partition ids of registered nodes not connected
    selected: set[int] = field(default_factory=set)  # partition ids sent a training message
    failed: dict[int, str] = field(default_factory=dict)  # partition id -> why its training reply was not used (first reason)
    registered: int = 0  # clients registered at the round's start (connected or not)
    joined: list[int] | None = None  # join-clients runs: partition ids registered for the first time this round

    def add(
        self, phase: str, down: int = 0, up: int = 0, values_down: int = 0, values_up: int = 0, params_down: int = 0, params_up: int = 0
    ) -> None:
        """Count bytes of ``phase``: on the wire (``down``, ``up``) and of the array values alone; and the
        parameters (array elements, ``params_*``) its messages carried."""
        for table, d, u in ((self.bytes, down, up), (self.values, values_down, values_up), (self.params, params_down, params_up)):
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

    def params_record(self) -> dict[str, int]:
        """rounds.jsonl's parameter counts: ``params_down``/``params_up`` of the method's own exchanges (every phase
        but measurement, as ``bytes_down``/``bytes_up``), and ``params_<phase>_down``/``_up`` of evaluation and
        LG-FedAvg's new-test upload, apart."""
        cost = [v for p, v in self.params.items() if p not in MEASUREMENT_PHASES]
        out = {"params_down": sum(v[0] for v in cost), "params_up": sum(v[1] for v in cost)}
        for phase, label in ((P.PHASE_EVALUATE, "eval"), (P.PHASE_UPLOAD, "upload")):
            if phase in self.params:
                out[f"params_{label}_down"], out[f"params_{label}_up"] = self.params[phase]
        return out

    def phase(self, phase: str) -> tuple[int, int]:
        """(down, up) bytes on the wire of one ``phase``."""
        down, up = self.bytes.get(phase, [0, 0])
        return down, up
