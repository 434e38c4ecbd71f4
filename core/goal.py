"""When a run, or LG-FedAvg's warm-up, ends at a goal accuracy (Liang et al. 2020, Table 1: FedAvg rounds until
the goal, then LG rounds). Pure functions of a round's recorded figures and the round numbers, so a run resumed
from a checkpoint takes the same decisions as the unbroken run."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def reached(figures: Mapping[str, Any], goal: float) -> bool:
    """Whether a round's evaluated ``accuracy`` (absent: the round was not evaluated) reaches ``goal`` (0: off)."""
    accuracy = figures.get("accuracy")
    return goal > 0 and accuracy is not None and float(accuracy) >= goal


def first_round_reaching(records: Sequence[Mapping[str, Any]], goal: float) -> int | None:
    """The first round record whose accuracy reaches ``goal`` (summary.json's ``goal_round``); None if none does."""
    return next((int(r["round"]) for r in records if reached(r, goal)), None)


def warming_up(server_round: int, warmup_end: int | None, goal: float, cap: int) -> bool:
    """Whether ``server_round`` is a warm-up round (whole models averaged): up to ``warmup_end`` once the warm-up
    ended; before that, while a ``goal`` (> 0) is unmet, at most ``cap`` rounds when ``cap`` > 0; without a goal,
    the first ``cap`` rounds."""
    if warmup_end is not None:
        return server_round <= warmup_end
    if cap > 0 and server_round > cap:
        return False
    return goal > 0 or server_round <= cap


def warmup_end_after(server_round: int, figures: Mapping[str, Any], warmup_end: int | None, goal: float, cap: int) -> int | None:
    """The round the warm-up ended at once round ``server_round`` (with its evaluation ``figures``) is over: the
    earlier end, else this round when it was a warm-up round that reached ``goal`` or the ``cap``; else None."""
    if warmup_end is not None or not warming_up(server_round, None, goal, cap):
        return warmup_end
    if reached(figures, goal) or (cap > 0 and server_round >= cap):
        return server_round
    return None


def lg_rounds_over(server_round: int, warmup_end: int | None, goal: float, cap: int, lg_rounds: int) -> bool:
    """Whether ``lg_rounds`` (> 0) rounds after the warm-up are done with ``server_round`` (no warm-up at all: counted from 0)."""
    if lg_rounds <= 0:
        return False
    if warmup_end is None:
        if warming_up(1, None, goal, cap):  # a warm-up that has not ended yet
            return False
        warmup_end = 0
    return server_round - warmup_end >= lg_rounds
