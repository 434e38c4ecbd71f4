"""Resuming a run: where it goes on from (its newest whole checkpoint, :mod:`headway.server.checkpoint`), the
checkpoint written after every round, and the test-only hook that kills the server at a named point."""

from __future__ import annotations

import json
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headway.core.config import ConfigError
from headway.core.settings import Settings
from headway.server.checkpoint import Checkpoint, CheckpointCost, checkpoint_name, code_version, load_checkpoint, write_checkpoint
from headway.server.results import Recorder
from headway.strategies.engine import Engine
from headway.strategies.state import ServerState

log = logging.getLogger("headway")


# Test-only fault hook (tests/test_resume_simulation.py): "record:K" SIGKILLs the server's process after round K's
# record went to rounds.jsonl and before its checkpoint; "checkpoint:K" right after round K's checkpoint. Unset: nothing.
KILL_ENV = "HEADWAY_TEST_KILL"


def killed_at(point: str, rnd: int) -> None:
    """SIGKILL this process where :data:`KILL_ENV` names ``point`` and round ``rnd`` (a crash no handler sees)."""
    if os.environ.get(KILL_ENV) == f"{point}:{rnd}":
        os.kill(os.getpid(), signal.SIGKILL)


@dataclass(frozen=True)
class Resume:
    """Where a resumed run goes on from: its checkpoint (None: none was written, it starts again at round 1) and that file's name."""

    checkpoint: Checkpoint | None
    source: str


def resume_point(out: Path) -> Resume:
    """The checkpoint to continue the run in ``out`` from; ConfigError (one line) when there is no run there, or
    rounds after round 1 were recorded but no checkpoint is left to continue from. A run stopped before round 1's
    checkpoint has none and starts again from round 1."""
    if not (out / "config.json").is_file():
        raise ConfigError(f"cannot resume: {out} holds no run (no config.json): give the results folder of the run to continue")
    ckpt = load_checkpoint(out)
    if ckpt is not None:
        return Resume(ckpt, f"checkpoints/{checkpoint_name(ckpt.round)}")
    if complete_summary(out, None) is not None:
        raise ConfigError(
            f"cannot resume: the run in {out} is complete and kept no checkpoint (checkpoint-keep=0): "
            "it cannot be resumed or extended; start a new run"
        )
    if recorded_beyond_round_1(out / "rounds.jsonl"):
        raise ConfigError(
            f"cannot resume: {out} has no usable checkpoint in checkpoints/ (checkpoint-keep=0, or every one unreadable), "
            "though it recorded rounds: start a new run"
        )
    # a run stopped between round 1's record and its checkpoint lost only round 1, which it redoes
    log.warning("resume: no checkpoint of the run in %s was written before it stopped; it starts again from round 1", out)
    return Resume(None, "")


def recorded_beyond_round_1(rounds: Path) -> bool:
    """Whether rounds.jsonl holds a round after round 1 (what starting again from round 1 would throw away)."""
    if not rounds.is_file():
        return False
    return any(_round_of(line) != 1 for line in rounds.read_text().splitlines() if line.strip())


def _round_of(line: str) -> Any:
    """The round a rounds.jsonl line records (None for a line that is not a record)."""
    try:
        return json.loads(line).get("round")
    except (ValueError, AttributeError):
        return None


class Checkpoints:
    """Writes a checkpoint after every round of a run (RoundLoop's ``on_checkpoint``) and adds up what they cost."""

    def __init__(self, out: Path, settings: Settings, engine: Engine, recorder: Recorder, run_key: str):
        self.out, self.settings, self.engine, self.recorder, self.run_key = out, settings, engine, recorder, run_key
        self.code = code_version()
        self.written = 0
        self.bytes = 0
        self.seconds = 0.0

    def __call__(self, rnd: int, state: ServerState[Any], pending: dict[str, Any] | None) -> None:
        """Round ``rnd``'s checkpoint: the state after it, the engine's registry, the rounds recorded so far."""
        killed_at("record", rnd)
        ckpt = Checkpoint(
            rnd,
            state,
            self.engine.snapshot(),
            pending,
            [dict(r) for r in self.recorder.rounds],
            self.run_key,
            self.recorder.elapsed(),
            self.settings.to_config(),
            self.code,
        )
        cost: CheckpointCost = write_checkpoint(self.out, ckpt, self.settings.checkpoint_keep)
        if cost.path is not None:
            self.written += 1
            self.bytes += cost.bytes
            self.seconds += cost.seconds
            log.debug("checkpoint of round %d: %d bytes in %.3f s -> %s", rnd, cost.bytes, cost.seconds, cost.path)
        killed_at("checkpoint", rnd)

    def summary(self) -> dict[str, Any]:
        """summary.json's figures of the checkpoints this process wrote (none: nothing)."""
        if not self.written:
            return {}
        return {"checkpoints_written": self.written, "checkpoint_bytes": self.bytes, "checkpoint_seconds": self.seconds}


def complete_summary(out: Path, rounds: int | None) -> dict[str, Any] | None:
    """summary.json of the run in ``out`` when it says the run completed ``rounds`` rounds (None: any number), else None."""
    try:
        summary = json.loads((out / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if not isinstance(summary, dict) or summary.get("status") != "complete":
        return None
    return summary if rounds is None or summary.get("rounds") == rounds else None
