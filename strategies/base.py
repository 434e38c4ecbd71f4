"""The shape every headway strategy shares: Flower's Strategy with a round loop that
meters bytes, samples with a timeout, counts failures and reports each round.

A method overrides the Flower hooks (configure/aggregate train and evaluate) and, when
its rounds are shaped differently, :meth:`prepare` (work before round 1, such as
FedLog's statistics round) or :meth:`train_round` (several exchanges in a round,
relays from one client to the next, one-shot rounds).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterable

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy
from flwr.serverapp.strategy.result import Result

from core import protocol as P
from core.data import DatasetSpec
from strategies.exchange import Meter, exchange, sample_positions, wait_for_nodes

log = logging.getLogger("headway")

RoundCallback = Callable[[dict[str, Any]], None]
GlobalEval = Callable[[int, ArrayRecord], dict[str, float] | None]


def count_of(reply: Message) -> float | None:
    """A reply's num-examples, or None when it is absent or not a count."""
    met = reply.content.metric_records.get(P.METRICS)
    if met is None or P.NUM_EXAMPLES not in met:
        return None
    n = float(met[P.NUM_EXAMPLES])
    return n if np.isfinite(n) and n >= 0 else None


class HeadwayStrategy(Strategy):
    """Base strategy: subclasses set ``name`` and implement the four Flower hooks."""

    name = "base"
    has_global_model = False  # one model for everyone: the server also scores it on the test set

    def __init__(self, cfg: dict[str, Any]):
        self.cfg = cfg
        self.rng = np.random.default_rng(cfg["seed"] + 7919)
        self.meter = Meter()
        self.round_metrics: dict[str, float] = {}  # extra per-round figures for rounds.jsonl
        self.nodes: list[int] = []

    # ----- set-up ---------------------------------------------------------------
    def check(self, spec: DatasetSpec) -> None:
        """Fail at start when the run config cannot work with this method."""

    def initial_arrays(self, spec: DatasetSpec) -> ArrayRecord:
        """What the server holds before round 1 (a model, a head, or nothing)."""
        return ArrayRecord()

    def summary_extra(self) -> dict[str, Any]:
        """Method-specific figures for summary.json."""
        return {}

    # ----- sampling -------------------------------------------------------------
    def available_nodes(self, grid: Grid) -> list[int]:
        wanted = self.cfg["min-available-clients"] or self.cfg["num-clients"]
        self.nodes = wait_for_nodes(grid, wanted, self.cfg["sample-timeout"])
        return self.nodes

    def sample(self, grid: Grid, fraction: float, weights: list[float] | None = None) -> list[int]:
        """Node IDs for this round: ``fraction`` of those connected (at least one)."""
        nodes = self.available_nodes(grid)
        if not nodes:
            return []
        k = max(1, int(round(fraction * len(nodes))))
        return [nodes[i] for i in sample_positions(len(nodes), k, self.rng, weights)]

    def messages(self, grid: Grid, nodes: Iterable[int], content: RecordDict | Callable[[int], RecordDict], kind: str) -> list[Message]:
        """One message per node: the same content, or ``content(node_id)`` per node."""
        out = []
        for node in nodes:
            body = content(node) if callable(content) else content
            out.append(Message(content=body, dst_node_id=node, message_type=kind))
        return out

    def config(self, server_round: int, **fields: Any) -> ConfigRecord:
        return ConfigRecord({P.ROUND: server_round, **fields})

    def screen(self, replies: Iterable[Message], check: Callable[[ArrayRecord, float], tuple[Any, str | None]]) -> list[tuple[Any, float, float]]:
        """(payload, num-examples, train loss) of the replies whose arrays pass ``check``.

        ``check(arrays, n)`` returns the decoded payload and a reason when the reply cannot
        be real; such replies, and replies without arrays or a count, are rejected.
        """
        good = []
        for reply in replies:
            n = count_of(reply)
            arrays = reply.content.array_records.get(P.ARRAYS)
            if n is None or arrays is None:
                self.reject(reply, "reply without arrays and a valid num-examples")
                continue
            try:
                payload, problem = check(arrays, n)
            except Exception as exc:  # an undecodable payload is a bad reply, not a crash
                payload, problem = None, f"payload cannot be decoded: {exc}"
            if problem:
                self.reject(reply, problem)
                continue
            good.append((payload, n, float(reply.content[P.METRICS].get(P.LOSS, np.nan))))
        return good

    def reject(self, reply: Message, reason: str) -> None:
        """Drop a reply whose content cannot be real; counted in the round's failures."""
        self.meter.fail(f"node {reply.metadata.src_node_id}: {reason}")

    # ----- rounds ---------------------------------------------------------------
    def prepare(self, grid: Grid, arrays: ArrayRecord, timeout: float) -> ArrayRecord:
        """Work before round 1 (default: none); its bytes count in round 1."""
        return arrays

    def train_round(self, server_round: int, arrays: ArrayRecord, grid: Grid, timeout: float) -> ArrayRecord:
        """One training round: configure, exchange, aggregate (a failed round keeps ``arrays``)."""
        msgs = self.configure_train(server_round, arrays, ConfigRecord(), grid)
        replies = exchange(grid, msgs, timeout, self.meter, "train")
        new_arrays, metrics = self.aggregate_train(server_round, replies)
        if metrics is not None:
            self.round_metrics.update({f"train_{k}": float(v) for k, v in metrics.items() if not isinstance(v, list)})
        return arrays if new_arrays is None else new_arrays

    def evaluate_round(self, server_round: int, arrays: ArrayRecord, grid: Grid, timeout: float) -> dict[str, float]:
        msgs = self.configure_evaluate(server_round, arrays, ConfigRecord(), grid)
        replies = exchange(grid, msgs, timeout, self.meter, "evaluate")
        metrics = self.aggregate_evaluate(server_round, replies)
        return {} if metrics is None else {k: float(v) for k, v in metrics.items() if not isinstance(v, list)}

    def final_evaluation(self, arrays: ArrayRecord, grid: Grid, timeout: float) -> dict[str, float]:
        """Extra evaluation after the last round (default: none), such as LG-FedAvg's new test."""
        return {}

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: GlobalEval | None = None,
        on_round: RoundCallback | None = None,
    ) -> Result:
        """Run ``num_rounds`` rounds; after each, call ``on_round`` with the round's record.

        ``train_config``/``evaluate_config`` keep Flower's signature; headway's per-round
        settings come from the run config, which every client reads itself.
        """
        self.summary()
        result = Result()
        arrays = initial_arrays
        started = time.monotonic()
        arrays = self.prepare(grid, arrays, timeout)
        for rnd in range(1, num_rounds + 1):
            t0 = time.monotonic()
            arrays = self.train_round(rnd, arrays, grid, timeout)
            if rnd == 1 and self.meter.failures and not self.round_metrics.get("train_clients"):
                raise RuntimeError(f"every client failed in round 1; first failure: {self.meter.failure_reasons[0]}")
            evaluation = self.evaluate_round(rnd, arrays, grid, timeout)
            if rnd == num_rounds:
                evaluation.update(self.final_evaluation(arrays, grid, timeout))
            glob = evaluate_fn(rnd, arrays) if evaluate_fn is not None else None
            record = self._round_record(rnd, evaluation, glob, time.monotonic() - t0, time.monotonic() - started)
            result.arrays = arrays
            result.evaluate_metrics_clientapp[rnd] = MetricRecord({k: v for k, v in evaluation.items() if np.isfinite(v)})
            if on_round is not None:
                on_round(record)
        return result

    def _round_record(self, rnd: int, evaluation: dict[str, float], glob: dict[str, float] | None, seconds: float, elapsed: float) -> dict[str, Any]:
        down, up = self.meter.phase_bytes("train")
        eval_down, eval_up = self.meter.phase_bytes("evaluate")
        record: dict[str, Any] = {
            "round": rnd,
            "accuracy": evaluation.get("accuracy"),
            "bytes_down": down,
            "bytes_up": up,
            "eval_bytes_down": eval_down,
            "eval_bytes_up": eval_up,
            "clients": int(self.round_metrics.pop("train_clients", 0)),
            "failures": self.meter.failures,
            "seconds": seconds,
            "elapsed_seconds": elapsed,
        }
        for phase in sorted(set(self.meter.bytes) - {"train", "evaluate"}):  # e.g. LG-FedAvg's model upload
            record[f"{phase}_bytes_down"], record[f"{phase}_bytes_up"] = self.meter.phase_bytes(phase)
        record.update({k: v for k, v in evaluation.items() if k != "accuracy"})
        record.update(self.round_metrics)
        if glob:
            record.update({f"global_{k}": v for k, v in glob.items()})
        if self.meter.failure_reasons:
            record["failure_reasons"] = self.meter.failure_reasons[:20]
        self.meter = Meter()
        self.round_metrics = {}
        return record

    # ----- shared helpers for subclasses ------------------------------------------
    def evaluate_messages(self, server_round: int, arrays: ArrayRecord, grid: Grid, **fields: Any) -> list[Message]:
        """Every connected client evaluates ``arrays`` on its own test split."""
        content = RecordDict({P.ARRAYS: arrays, P.CONFIG: self.config(server_round, **fields)})
        return self.messages(grid, self.available_nodes(grid), content, MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Sample-weighted mean of clients' local test metrics: Σ correct / Σ examples."""
        total, correct, loss, sq = 0.0, 0.0, 0.0, 0.0
        per_client = []
        extra: dict[str, float] = {}  # "correct-<how>" counts -> accuracy_<how> (e.g. FedProto's two predictions)
        for reply in replies:
            met = reply.content.metric_records.get(P.METRICS)
            if met is None or P.NUM_EXAMPLES not in met:
                self.reject(reply, "evaluation reply without metrics")
                continue
            n = float(met[P.NUM_EXAMPLES])
            if not np.isfinite(n) or n < 0:
                self.reject(reply, f"evaluation reply with num-examples={n}")
                continue
            total += n
            correct += float(met.get(P.CORRECT, 0.0))
            loss += float(met.get(P.LOSS, 0.0)) * n
            sq += float(met.get(P.SQUARED_ERROR, 0.0))
            for key, value in met.items():
                if key.startswith(P.CORRECT + "-"):
                    extra[key] = extra.get(key, 0.0) + float(value)
            if n > 0 and P.CORRECT in met:
                per_client.append(float(met[P.CORRECT]) / n)
        if total == 0:
            return None
        out = MetricRecord({"loss": loss / total, "eval_clients": len(per_client), "test_examples": total})
        if per_client:
            out["accuracy"] = correct / total
            out["accuracy_client_mean"] = float(np.mean(per_client))
            out["accuracy_client_min"] = float(np.min(per_client))
            for key, value in extra.items():
                out["accuracy_" + key[len(P.CORRECT) + 1 :]] = value / total
        else:
            out["mse"] = sq / total
        return out

    def summary(self) -> None:
        log.info("strategy %s: %s", self.name, {k: v for k, v in self.cfg.items() if k.startswith(self.name)})
