"""One line of rounds.jsonl, built from what a round produced (its :class:`~headway.strategies.base.Step`),
its evaluation figures and its :class:`~headway.strategies.engine.RoundMeter` (the results contract
in the design brief names the fields)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from headway.core import protocol as P
from headway.strategies.base import Step
from headway.strategies.meter import RoundMeter

# rounds.jsonl figures that are counts: written as whole numbers, though method metrics arrive as floats
COUNT_FIELDS = ("prepare_clients", "eval_clients", "test_examples", "chain_hops", "synthetic_examples")


def round_record(
    rnd: int,
    step: Step,
    figures: Mapping[str, Any],
    meter: RoundMeter,
    seconds: float,
    elapsed: float,
    counts: Mapping[int, int],
) -> dict[str, Any]:
    """Round ``rnd``'s record: bytes by phase, who was selected, used, missing and absent, failures,
    ``figures`` (evaluation and preparation), the step's metrics and details; ``counts`` are the
    clients' training rows by partition id (empty when unknown)."""
    down, up = meter.cost()
    values_down, values_up = meter.cost(values=True)
    used = meter.selected - set(meter.failed)  # the selected clients whose training replies arrived valid
    missing = {str(p): meter.failed[p] for p in sorted(meter.failed) if p in meter.selected}
    missing.update({str(p): "not connected" for p in meter.absent if p not in meter.selected})
    record: dict[str, Any] = {
        "round": rnd,
        "accuracy": figures.get("accuracy"),
        "bytes_down": down,
        "bytes_up": up,
        "values_bytes_down": values_down,
        "values_bytes_up": values_up,
        "clients": step.clients,
        "selected": sorted(meter.selected),
        # training rows in all (each client's: summary.json's train_examples): of the clients whose replies were used, and of every selected one
        "train_examples": rows(counts, used) if counts else None,
        "selected_train_examples": rows(counts, meter.selected) if counts else None,
        "registered_clients": meter.registered,
        "missing_clients": missing,
        "failures": len(meter.failures),
        "failure_reasons": meter.failures[:20],
        "absent": len(meter.absent),
        "absent_partitions": list(meter.absent),
        "seconds": seconds,
        "elapsed_seconds": elapsed,
    }
    if meter.joined is not None:  # join-clients runs: who joined the running federation this round
        record["joined"] = list(meter.joined)
    record.update(phase_bytes(meter))
    record.update(meter.params_record())  # parameters (array elements) communicated, the papers' count (issue 41)
    if meter.rejected_bytes_up:
        record["rejected_bytes_up"] = meter.rejected_bytes_up
    record.update({f"rejected_{name}s": values for name, values in meter.rejected_figures.items()})
    record.update({k: v for k, v in figures.items() if k != "accuracy"})
    record.update({f"train_{k}" if k in ("loss",) else k: v for k, v in step.metrics.items()})
    record.update(step.details)
    for key in COUNT_FIELDS:  # whole counts as ints (metrics travel as floats: 10.0 clients)
        value = record.get(key)
        if isinstance(value, float) and value.is_integer():
            record[key] = int(value)
    return record


def phase_bytes(meter: RoundMeter) -> dict[str, int]:
    """``<phase>_bytes_down``/``_up`` of every phase but training (whose bytes are the record's own)."""
    out: dict[str, int] = {}
    for phase in sorted(meter.bytes):
        if phase == P.PHASE_TRAIN:
            continue
        prefix = "eval" if phase == P.PHASE_EVALUATE else phase.replace("-model", "").replace("-", "_")  # secagg-setup: secagg_setup
        out[f"{prefix}_bytes_down"], out[f"{prefix}_bytes_up"] = meter.phase(phase)
    return out


def rows(counts: Mapping[int, int], partitions: set[int]) -> int:
    """The training rows of ``partitions`` in all (those whose count is known)."""
    return sum(counts[p] for p in partitions if p in counts)
