"""The baseline profile a FedProf server computes for the model a message carries, for fake clients
that answer with (a distortion of) it: the server's state is its own, so a test rebuilds the
baseline from D^V, made reproducible by ``$HEADWAY_FEDPROF_SECRET`` (set it before calling)."""

from __future__ import annotations

import hashlib

import numpy as np
from flwr.app import Message
from flwr.serverapp import Grid
from headway.strategies.engine import Engine
from headway.strategies.fedprof import FedProf
from headway.strategies.round_loop import RoundCallback, RoundLoop
from headway.strategies.state import ServerState


class Baseline:
    """``baseline(msg)``: RP^B of the model in ``msg`` on the server's D^V (one computation per model)."""

    def __init__(self, strategy: FedProf):
        self.strategy = strategy
        self.validation = strategy.draw_validation()  # the server's own draw: the same rows under the same secret
        self.seen: dict[bytes, np.ndarray] = {}

    def __call__(self, msg: Message) -> np.ndarray:
        """The baseline of the global model ``msg`` carries."""
        arrays = msg.content.array_records["arrays"]
        key = hashlib.sha256(b"".join(np.ascontiguousarray(v.numpy()).tobytes() for v in arrays.values())).digest()
        if key not in self.seen:
            self.seen[key] = self.strategy.baseline(self.validation, arrays)
        return self.seen[key]


def run(strategy: FedProf, grid: Grid, rounds: int, on_round: RoundCallback | None = None) -> tuple[Engine, ServerState]:
    """Run ``rounds`` rounds on ``grid``: the engine and the server's last state."""
    engine = strategy.connect(grid)
    return engine, RoundLoop(strategy, engine, on_round).run(strategy.initial_state(), rounds)
