"""Robust replacements of the n_k-weighted mean of model updates (run-config ``aggregation``):
each rule calls the function Flower 1.39 ships for it in ``flwr.serverapp.strategy``, on the
same arrays Flower's strategy class would give it, so the result is that class's result.

Only the averaging step changes: the replies reaching these functions have passed every
reply check (layout, update norm, counts) and the round's quorum. Which rule tolerates how
many poisoned replies: docs/trust-and-dp.md."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict
from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum
from flwr.serverapp.strategy.strategy_utils import aggregate_arrayrecords
from headway.core.aggregate import SELECTING, multi_krum_count, replies_needed, weighted_average
from headway.core.config import ConfigError
from headway.core.settings import Settings
from headway.strategies.arrays import to_record
from headway.strategies.capabilities import ROBUST_AGGREGATION, capabilities_of
from headway.strategies.replies import Reply
from headway.strategies.state import M

if TYPE_CHECKING:
    from headway.strategies.base import HeadwayStrategy, Step, TrainRound

WEIGHT = "weight"  # the MetricRecord key aggregate_arrayrecords weighs by (Flower's strategies use num-examples)


@dataclass(frozen=True)
class Rule:
    """A robust rule and its parameters: trimmed mean's ``beta`` (the fraction cut at each end),
    the ``f`` poisoned replies Krum, Multi-Krum and Bulyan are sized for, Multi-Krum's ``m``."""

    name: str
    beta: float = 0.2
    f: int = 0
    m: int = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> Rule:
        """The rule the run's ``aggregation`` names, with its parameters."""
        return cls(settings.aggregation, settings.trimmed_mean_beta, settings.malicious_clients, settings.multi_krum_select)

    def shortfall(self, n: int) -> str | None:
        """Why ``n`` replies are too few for this rule, or None. Trimmed mean needs floor(beta x n) >= 1:
        with fewer it cuts nothing and would move the model exactly as the mean does."""
        if self.name == "trimmed-mean" and int(self.beta * n) < 1:  # int(): Flower's trim_mean cuts int(beta x n)
            return f"aggregation=trimmed-mean with trimmed-mean-beta={self.beta:g} cuts floor({self.beta:g} x {n}) = 0 of {n} valid replies at each end"
        need = replies_needed(self.name, self.f)
        if n >= need:
            return None
        formula = "4f + 3" if self.name == "bulyan" else "2f + 3"
        return f"aggregation={self.name} with malicious-clients={self.f} needs at least {formula} = {need} valid replies, got {n}"


class Averaging(Protocol):
    """How a model-averaging method (FedAvg and those built on it) combines a round's valid updates."""

    def step(self, ctx: TrainRound[M], replies: list[Reply], weights: Sequence[float], metrics: dict[str, float]) -> Step[M]: ...  # noqa: D102


class WeightedMean:
    """The ``weights``-weighted mean of the replies (``aggregation=mean``)."""

    def step(self, ctx: TrainRound[M], replies: list[Reply], weights: Sequence[float], metrics: dict[str, float]) -> Step[M]:
        """The mean of the replies' arrays, each array in the dtype it was sent."""
        from headway.strategies.base import Step  # base imports the strategies' modules' types: kept out of import time

        avg = weighted_average([r.payload for r in replies], list(weights), like=ctx.sent)
        return Step(to_record(avg), len(replies), metrics)


@dataclass(frozen=True)
class RobustAverage:
    """A robust ``rule`` in place of the mean (the wrapper of a method's averaging, as Flower's
    FedMedian, Krum, ... replace FedAvg's)."""

    rule: Rule

    def step(self, ctx: TrainRound[M], replies: list[Reply], weights: Sequence[float], metrics: dict[str, float]) -> Step[M]:
        """The rule's combination of the replies; too few replies for the rule keep the previous
        model, the reason counted as a failure."""
        from headway.strategies.base import Step  # see WeightedMean.step

        if problem := self.rule.shortfall(len(replies)):
            ctx.engine.meter.fail(f"train: {problem}; keeping the previous model")
            return Step(None, len(replies), metrics, kept=True)
        avg, kept = robust_aggregate([r.payload for r in replies], weights, self.rule, ctx.sent)
        details = {"aggregation_kept": sorted(replies[i].partition_id for i in kept)} if self.rule.name in SELECTING else {}
        return Step(to_record(avg), len(replies), metrics, details)


def averaging_for(settings: Settings, strategy: HeadwayStrategy[Any]) -> Averaging:
    """The run's averaging: the weighted mean, or the robust rule ``aggregation`` names, for a
    strategy that averages updates (the config check refused it already for others: this is the last guard)."""
    if settings.aggregation == "mean":
        return WeightedMean()
    if ROBUST_AGGREGATION not in capabilities_of(type(strategy)):
        raise ConfigError(f"aggregation={settings.aggregation}: {type(strategy).__name__} does not average model updates")
    return RobustAverage(Rule.from_settings(settings))


def robust_aggregate(
    arrays: Sequence[Mapping[str, np.ndarray]], weights: Sequence[float], rule: Rule, sent: Mapping[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], list[int]]:
    """The replies ``arrays`` combined by ``rule``, every array cast to the dtype of the one
    ``sent`` (integer arrays rounded), and the positions of the replies the rule kept (all for
    median and trimmed mean; Krum's pick for the others). ``weights`` (n_k, or the draws under
    client-sampling=data-ratio) weigh Krum's and Multi-Krum's average, as Flower's weigh by
    num-examples; median, trimmed mean and Bulyan weigh every reply alike, as Flower's do.
    ValueError when there are fewer replies than the rule needs (:meth:`Rule.shortfall`)."""
    if problem := rule.shortfall(len(arrays)):
        raise ValueError(problem)
    names = list(sent)
    kept = list(range(len(arrays)))
    if rule.name == "median":
        out = {k: median([a[k] for a in arrays]) for k in names}
    elif rule.name == "trimmed-mean":
        out = {k: trim_mean(np.stack([a[k] for a in arrays]), rule.beta) for k in names}
    elif rule.name in ("krum", "multi-krum"):
        count = 1 if rule.name == "krum" else multi_krum_count(rule.m, len(arrays), rule.f)
        kept = krum_select(arrays, sent, rule.f, count)
        chosen = [RecordDict({"arrays": _record(arrays[i], names), "metrics": MetricRecord({WEIGHT: float(weights[i])})}) for i in kept]
        out = {k: v.numpy() for k, v in aggregate_arrayrecords(chosen, WEIGHT).items()}
    elif rule.name == "bulyan":
        out, kept = bulyan(arrays, sent, rule.f)
    else:
        raise ValueError(f"unknown aggregation rule {rule.name!r}")
    return {k: _cast(out[k], sent[k]) for k in names}, kept


def median(layers: Sequence[np.ndarray]) -> np.ndarray:
    """The coordinate-wise median of one array over the replies. Flower has no public function
    for it: this is the line of ``FedMedian.aggregate_train`` (flwr/serverapp/strategy/fedmedian.py)."""
    return np.asarray(np.median(np.stack(layers), axis=0))


def krum_select(arrays: Sequence[Mapping[str, np.ndarray]], sent: Mapping[str, np.ndarray], f: int, count: int) -> list[int]:
    """Positions of the ``count`` replies with the lowest Krum scores, best first, by Flower's
    ``select_multikrum``. Its distances are taken between the updates w_k − w of the float
    arrays, in float64: the same distances as between the models, without the cancellation of
    ‖x‖² + ‖y‖² − 2x·y between two float32 models far larger than their difference, and without
    integer counters (BatchNorm's batches seen, which grow with a client's data, not its model)."""
    floats = [k for k, v in sent.items() if np.issubdtype(np.asarray(v).dtype, np.floating)]
    updates = [
        RecordDict({"arrays": _record({k: np.asarray(a[k], np.float64) - np.asarray(sent[k], np.float64) for k in floats}, floats)})
        for a in arrays
    ]
    position = {id(c): i for i, c in enumerate(updates)}
    return [position[id(c)] for c in select_multikrum(updates, num_malicious_nodes=f, num_nodes_to_select=count)]


def bulyan(arrays: Sequence[Mapping[str, np.ndarray]], sent: Mapping[str, np.ndarray], f: int) -> tuple[dict[str, np.ndarray], list[int]]:
    """Bulyan (El Mhamdi et al. 2018) as ``Bulyan.aggregate_train`` (flwr/serverapp/strategy/bulyan.py)
    runs it: Multi-Krum keeps θ = n − 2f replies, then each coordinate is the mean of the
    β = θ − 2f kept values nearest their median (``aggregate_n_closest_weights``)."""
    names = list(sent)
    theta = len(arrays) - 2 * f
    kept = krum_select(arrays, sent, f, theta)
    chosen = [[np.asarray(arrays[i][k]) for k in names] for i in kept]
    medians = [np.median(layer, axis=0) for layer in zip(*chosen, strict=True)]
    combined = aggregate_n_closest_weights(medians, chosen, theta - 2 * f)
    return dict(zip(names, combined, strict=True)), kept


def _record(arrays: Mapping[str, np.ndarray], names: Sequence[str]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.asarray(arrays[k], order="C")) for k in names})


def _cast(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``value`` in the dtype and shape of ``like``: integer arrays (counters) rounded."""
    dtype = np.asarray(like).dtype
    value = np.asarray(value).reshape(np.shape(like))
    return value.astype(dtype) if np.issubdtype(dtype, np.floating) else np.rint(value).astype(dtype)
