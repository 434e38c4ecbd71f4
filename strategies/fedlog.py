"""FedLog, FedLog-C and DP-FedLog (fedlog-extended §3.3–3.6): add the clients' sufficient
statistics and set the global head to the exact MAP of Eq. 12."""

from __future__ import annotations

import logging
import time
from typing import Any, Iterable

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid

from core import protocol as P
from core.config import ConfigError, body_names
from core.data import DatasetSpec
from core.fedlog import StatsCheck, add_noise, noise_sigma, releases, solve_head
from core.models import common_width
from strategies.base import HeadwayStrategy
from strategies.exchange import exchange

log = logging.getLogger("headway")

ETA, STATS, STATS_SUM = "eta", "stats", "stats-sum"


class FedLog(HeadwayStrategy):
    """Bodies stay on the clients; the server turns summed statistics into the head η."""

    name = "fedlog"

    def __init__(self, cfg: dict):
        super().__init__(cfg)
        self.eta: np.ndarray | None = None
        self.phi_sum: np.ndarray | None = None  # last aggregate Φ (FedLog-C sends it)
        self.sigma = 0.0
        self.checker: StatsCheck | None = None
        self.noise_rng = np.random.default_rng(cfg["seed"] + 104729)
        self.solve_seconds: list[float] = []

    # ----- set-up ---------------------------------------------------------------
    def check(self, spec: DatasetSpec) -> None:
        if spec.task != "classification":
            raise ConfigError(f"fedlog needs a classification data set; '{self.cfg['dataset']}' is {spec.task}")
        try:
            self.m = common_width(body_names(self.cfg), spec.input_shape, self.cfg["feature-dim"]) + 1  # plus the constant 1
        except ValueError as exc:
            raise ConfigError(f"fedlog: {exc}") from None
        self.classes = spec.num_classes
        self.sigma = noise_sigma(self.cfg, self.m)
        local_sigma = self.sigma if self.cfg["fedlog-dp"] == "local" else 0.0
        self.checker = StatsCheck(self.classes, self.m, self.cfg["fedlog-clip"], local_sigma)

    def initial_arrays(self, spec: DatasetSpec) -> ArrayRecord:
        rng = np.random.default_rng(self.cfg["seed"])
        self.eta = rng.normal(0.0, 1.0 / np.sqrt(self.m), size=(self.classes, self.m))
        return self.head_record()

    def head_record(self) -> ArrayRecord:
        arrays = {ETA: Array(self.eta.astype(np.float32))}
        if self.cfg["fedlog-alpha"] > 0 and self.phi_sum is not None:
            arrays[STATS_SUM] = Array(self.phi_sum.astype(np.float32))
        return ArrayRecord(arrays)

    # ----- rounds ---------------------------------------------------------------
    def _train_messages(self, server_round: int, grid: Grid, phase: str) -> list[Message]:
        nodes = self.sample(grid, self.cfg["fraction-train"] if phase == "train" else 1.0)
        content = RecordDict({P.ARRAYS: self.head_record(), P.CONFIG: self.config(server_round, **{P.PHASE: phase})})
        return self.messages(grid, nodes, content, MessageType.TRAIN)

    def prepare(self, grid: Grid, arrays: ArrayRecord, timeout: float) -> ArrayRecord:
        """fedlog-init=stats: one statistics round on the untrained bodies sets the first η."""
        if self.cfg["fedlog-init"] != "stats":
            return arrays
        replies = exchange(grid, self._train_messages(0, grid, "stats"), timeout, self.meter, "train")
        self.aggregate_train(0, replies)
        log.info("fedlog: first head from %d clients' statistics", int(self.round_metrics.get("train_clients", 0)))
        self.round_metrics.pop("train_clients", None)
        return self.head_record()

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self._train_messages(server_round, grid, "train")

    def check_statistics(self, arrays: ArrayRecord, n: float) -> tuple[np.ndarray | None, str | None]:
        if STATS not in arrays:
            return None, "reply without statistics"
        stats = arrays[STATS].numpy().astype(np.float64)
        return stats, self.checker.problem(stats, n)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        good = self.screen(replies, self.check_statistics)
        if not good:
            log.warning("fedlog round %d: no valid statistics; keeping the previous head", server_round)
            self.round_metrics["train_clients"] = 0
            return None, None
        stats, counts, losses = zip(*good)
        phi = np.sum(stats, axis=0)  # Eq. 11
        n = float(np.sum(counts))
        if self.cfg["fedlog-dp"] == "central":
            phi = add_noise(phi, self.sigma, self.noise_rng)  # once, on the sum
        t0 = time.perf_counter()
        self.eta = solve_head(phi, n, chi=self.cfg["fedlog-prior-chi"], nu=self.cfg["fedlog-prior-nu"])  # Eq. 12
        dt = time.perf_counter() - t0
        self.solve_seconds.append(dt)
        self.phi_sum = phi
        finite = [v for v in losses if np.isfinite(v)]
        self.round_metrics.update({"train_clients": len(stats), "solve_seconds": dt, "train_loss": float(np.mean(finite)) if finite else float("nan")})
        return self.head_record(), None

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        return self.evaluate_messages(server_round, ArrayRecord({ETA: Array(self.eta.astype(np.float32))}), grid)

    def summary_extra(self) -> dict[str, Any]:
        cfg = self.cfg
        extra: dict[str, Any] = {
            "variant": "fedlog-c" if cfg["fedlog-alpha"] > 0 else "fedlog",
            "m": self.m,
            "prior_nu": cfg["fedlog-prior-nu"],
            "prior_chi": cfg["fedlog-prior-chi"],
            "init": cfg["fedlog-init"],
            "clip": cfg["fedlog-clip"],
            "solve_seconds_mean": float(np.mean(self.solve_seconds)) if self.solve_seconds else None,
        }
        if cfg["fedlog-dp"] != "off":
            extra["dp"] = {"mode": cfg["fedlog-dp"], "epsilon": cfg["fedlog-epsilon"], "delta": cfg["fedlog-delta"], "clip": cfg["fedlog-clip"], "k": releases(cfg), "sigma": self.sigma}
        return extra
