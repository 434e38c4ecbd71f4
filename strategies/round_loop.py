"""The run of a strategy's rounds on an engine: registration, the work before round 1,
each round's training and evaluation (or its scores carried by the next round's training
replies), and one rounds.jsonl record per round handed to a callback.

The loop holds the run's :class:`~headway.strategies.state.ServerState` and replaces it with what
each hook returns; :attr:`RoundLoop.state` is the last one, also after a round raised (what
summary.json reports)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic

from headway.core import protocol as P
from headway.core.config import scores_with_train
from headway.core.partition import counts_line, empty_note
from headway.strategies.base import Step
from headway.strategies.engine import Engine, RoundFailed
from headway.strategies.meter import RoundMeter
from headway.strategies.replies import Reply
from headway.strategies.round_record import round_record
from headway.strategies.state import M, ServerState

if TYPE_CHECKING:
    from headway.strategies.base import HeadwayStrategy

log = logging.getLogger("headway")

RoundCallback = Callable[[dict[str, Any]], None]
# after each round: (round, the server's state after it, the round still waiting for its carried scores as plain values, or None)
CheckpointCallback = Callable[[int, "ServerState[Any]", "dict[str, Any] | None"], None]


@dataclass(frozen=True)
class Pending:
    """A finished round waiting for its record (client-evaluation=with-next-train: for the
    scores the next round's train replies carry)."""

    round: int
    step: Step[Any]
    figures: dict[str, Any]
    meter: RoundMeter
    seconds: float
    elapsed: float
    aggregated: bool
    counts: dict[int, int]  # partition id -> training rows in this round (train_counts), what its record's row sums use
    expected: list[int] = field(default_factory=list)  # partitions the evaluation exchange would have asked

    def plain(self) -> dict[str, Any]:
        """This pending round as plain values that pickle (a checkpoint's ``pending``): its step without
        the arrays, method state and carried scores (its record needs only the step's counts and figures)."""
        step: Step[Any] = Step(None, self.step.clients, dict(self.step.metrics), dict(self.step.details), kept=self.step.kept)
        return {
            "round": self.round,
            "step": step,
            "figures": dict(self.figures),
            "meter": self.meter,
            "seconds": self.seconds,
            "elapsed": self.elapsed,
            "aggregated": self.aggregated,
            "counts": dict(self.counts),
            "expected": list(self.expected),
        }

    @classmethod
    def from_plain(cls, values: Mapping[str, Any]) -> Pending:
        """A pending round back from :meth:`plain`."""
        return cls(**values)


class RoundLoop(Generic[M]):
    """Runs ``strategy``'s rounds on ``engine``, calling ``on_round`` with each round's record."""

    def __init__(
        self,
        strategy: HeadwayStrategy[M],
        engine: Engine,
        on_round: RoundCallback | None = None,
        on_checkpoint: CheckpointCallback | None = None,
    ):
        self.strategy = strategy
        self.engine = engine
        self.on_round = on_round
        self.on_checkpoint = on_checkpoint  # after each round, once its record (if due) went to on_round
        self.state: ServerState[M] | None = None  # the server's state after the last hook that returned one

    def run(
        self, state: ServerState[M], num_rounds: int, first: int = 1, pending: Mapping[str, Any] | None = None, elapsed: float = 0.0
    ) -> ServerState[M]:
        """Run rounds ``first`` to ``num_rounds`` from ``state`` (``first`` > 1: a state saved after round ``first`` - 1,
        whose sampling stream goes on where it stopped, and ``pending``: that round's record still waiting for the
        scores round ``first``'s train replies carry, as :meth:`Pending.plain` gave it; ``elapsed``: the seconds the run
        had used before, where records' elapsed_seconds go on from); returns the server's last state. The run stops early
        after a round whose :meth:`evaluated` decision says ``stop`` (a goal reached): that round gets the final evaluation,
        and the state's ``end`` keeps it, so a run resumed from its checkpoint stops there too. Raises :class:`RoundFailed` when round 1 (or the work before it) gets no valid reply."""
        strategy, engine, settings = self.strategy, self.engine, self.strategy.settings
        strategy.summary()
        self.state = state
        if state.end is not None:  # a checkpoint of the round the run stopped at (a goal reached): nothing more to run
            return state
        if state.sampling is not None:
            engine.services.sampling.bit_generator.state = state.sampling
        started = time.monotonic() - elapsed
        engine.wait_for_clients()
        # a round whose clients' scores come with the next round's train replies
        waiting_round: Pending | None = None if pending is None else Pending.from_plain(pending)
        try:
            for rnd in range(first, num_rounds + 1):
                t0 = time.monotonic()
                engine.begin_round(rnd)
                extra: dict[str, float] = resume_bytes(engine.meter) if rnd == first > 1 else {}
                if not engine.registry.clients:
                    raise RoundFailed(first_reason(engine.meter, "no client registered"))
                counts = strategy.train_counts(engine)  # after registration: dataset=local nodes declare theirs there
                if rnd == first:
                    self.log_counts(counts)
                prep: Step[M] | None = None
                if rnd == 1:
                    self.state, prep = strategy.prepare(self.state, engine)
                    if prep is not None:
                        if prep.clients == 0:
                            raise RoundFailed(first_reason(engine.meter, "the work before round 1 got no valid reply"))
                        extra.update({f"prepare_{k}": v for k, v in prep.metrics.items()})
                step = strategy.train_round(rnd, self.state, engine)
                if waiting_round is not None:
                    waiting, waiting_round = waiting_round, None  # emitted once, even if the callback raises
                    self.emit(waiting, self.carried_scores(waiting, step.scores))
                # the round's draws are done: the state keeps where the stream stands
                self.state = replace(self.state.advance(step), sampling=dict(engine.services.sampling.bit_generator.state))
                if rnd == 1 and step.clients == 0:
                    raise RoundFailed(first_reason(engine.meter, "every client failed in round 1"))
                every = settings.eval_every
                due = rnd == num_rounds or bool(every and rnd % every == 0)
                carried = due and scores_with_train(settings, rnd + 1)
                evaluation = strategy.evaluate_round(rnd, self.state, engine) if due and not carried else {}
                self.state, decided = strategy.evaluated(rnd, self.state, evaluation)
                if "stop" in decided:  # the run ends with this round: the state says so, for a resume from its checkpoint
                    self.state = replace(self.state, end=rnd)
                    log.info("round %d: %s reached; the run stops after it", rnd, decided["stop"])
                    if not due:  # a last round is always scored (lg-rounds may end the run between eval-every rounds)
                        evaluation = strategy.evaluate_round(rnd, self.state, engine)
                evaluation.update(decided)
                if rnd == num_rounds or self.state.end is not None:
                    evaluation.update(strategy.final_evaluation(self.state, engine))
                evaluation.update(strategy.global_evaluation(self.state))
                # whether the server's state moved this round: new arrays, or (no arrays to return, e.g. FedPFT's chain) a quorum of
                # replies; round 1 also counts a first model built before it (FedLog's statistics round)
                aggregated = bool(
                    step.arrays is not None
                    or (step.clients >= settings.min_replies and not step.kept)
                    or (rnd == 1 and prep is not None and prep.arrays is not None)
                )
                done = Pending(
                    rnd,
                    step,
                    {**extra, **evaluation},
                    engine.end_round(),
                    time.monotonic() - t0,
                    time.monotonic() - started,
                    aggregated,
                    counts,
                )
                if carried:
                    waiting_round = replace(done, expected=sorted(engine.partition_of(n) for n in engine.nodes()))
                else:
                    self.emit(done, {})
                if self.on_checkpoint is not None:  # the state, draws and records of round rnd are all in: it can be resumed after
                    self.on_checkpoint(rnd, self.state, None if waiting_round is None else waiting_round.plain())
                if self.state.end is not None:
                    break
        except BaseException:
            if waiting_round is not None:  # the round after it failed: its record still goes out, without the scores it waited for
                self.emit(waiting_round, {"eval_missing_partitions": waiting_round.expected})
            raise
        return self.state

    def log_counts(self, by_partition: Mapping[int, int]) -> None:
        """Round 1's line on the clients' training rows, and a warning when some hold none."""
        counts = list(by_partition.values())
        log.info("%s (train-fraction=%g)", counts_line(counts), self.strategy.settings.train_fraction)
        if empty := empty_note(counts):  # most empty is refused before the run (headway.core.partition)
            log.warning("%s", empty)

    def carried_scores(self, pending: Pending, scores: list[Reply]) -> dict[str, Any]:
        """Round ``pending.round``'s evaluation figures from the scores the next round's train replies
        carried, and the partitions the evaluation exchange would have asked that sent none."""
        figures: dict[str, Any] = dict(self.strategy.aggregate_evaluate(pending.round, scores))
        missing = sorted(set(pending.expected) - {r.partition_id for r in scores})
        if missing:
            figures["eval_missing_partitions"] = missing
        return figures

    def emit(self, done: Pending, evaluation: Mapping[str, Any]) -> None:
        """Hand round ``done.round``'s record, with ``evaluation`` added, to the callback."""
        record = round_record(done.round, done.step, {**done.figures, **evaluation}, done.meter, done.seconds, done.elapsed, done.counts)
        record["aggregated"] = done.aggregated
        if self.on_round is not None:
            self.on_round(record)


def resume_bytes(meter: RoundMeter) -> dict[str, float]:
    """The first round of a resumed run: its nodes' registration again is traffic an unbroken run did not have, so it
    leaves the meter's register phase (and the record's register_bytes_*) for ``resume_bytes_down``/``_up``."""
    down, up = meter.bytes.pop(P.PHASE_REGISTER, [0, 0])
    meter.values.pop(P.PHASE_REGISTER, None)
    return {"resume_bytes_down": down, "resume_bytes_up": up}


def first_reason(meter: RoundMeter, what: str) -> str:
    """``what``, with the round's first failure when there was one."""
    return f"{what}; first failure: {meter.failures[0]}" if meter.failures else what
