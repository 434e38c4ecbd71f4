"""How one exchange's replies become a round's :class:`~headway.strategies.base.Step`, chosen once from
the run config and wrapped around a method's aggregation, as Flower wraps a strategy in its DP
strategies (``flwr/serverapp/strategy/dp_*.py``) instead of branching inside it:

- :class:`PlainAggregation`: the exchange, its quorum, and the method's ``aggregate_train``;
- :class:`SecureAggregation`: SecAgg+ over the same messages (:mod:`headway.strategies.secure_aggregation`),
  its quorum, and the method's ``aggregate_sum`` of what the clients added up (``sum_spec``).

A method's hooks call ``self.aggregation.step(...)`` for every exchange whose replies are
aggregated (a round's training, FedLog's statistics round), so no method can drop the
secure path by replacing its round."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from flwr.app import MessageType, RecordDict
from headway.core import protocol as P
from headway.core.config import ConfigError, scores_with_train
from headway.strategies.capabilities import SECURE_SUM, SecureSummable, capabilities_of
from headway.strategies.secure_aggregation import secure_sum
from headway.strategies.state import M

if TYPE_CHECKING:
    from headway.strategies.base import HeadwayStrategy, Step, TrainRound


class Aggregation(Protocol):
    """One aggregated exchange of a round: send ``contents``, check replies, aggregate them."""

    def step(self, strategy: HeadwayStrategy[M], phase: str, ctx: TrainRound[M], contents: Mapping[int, RecordDict]) -> Step[M]: ...  # noqa: D102


class PlainAggregation:
    """Every reply is decoded against the method's layout and aggregated by its ``aggregate_train``."""

    def step(self, strategy: HeadwayStrategy[M], phase: str, ctx: TrainRound[M], contents: Mapping[int, RecordDict]) -> Step[M]:
        """Exchange, the method's ``received`` (what it learns from the replies, quorum or not), quorum,
        ``aggregate_train`` (no quorum: the arrays are kept); a round's training replies also carry the
        previous model's test scores where client-evaluation asks it. The step's method state is what
        the round's hooks left where ``aggregate_train`` made none."""
        from headway.strategies.base import Step  # base builds an Aggregation: a module-level import would be circular

        layout = strategy.train_layout(ctx)
        # each reply also scores the model it received
        if phase == P.PHASE_TRAIN and scores_with_train(strategy.settings, ctx.server_round):
            layout = replace(layout, scores=strategy.eval_layout())
        replies = ctx.engine.exchange(phase, contents, MessageType.TRAIN, layout)
        ctx = strategy.received(ctx, contents, replies)
        scores = [r.scores for r in replies if r.scores is not None]
        if not ctx.engine.quorum(phase, replies):
            return Step(None, len(replies), scores=scores, method=ctx.state.method)
        step = strategy.aggregate_train(ctx, replies)
        return replace(step, scores=scores, method=ctx.state.method if step.method is None else step.method)


class SecureAggregation:
    """SecAgg+ around a method that can aggregate from the sum of its replies (``sum_spec`` and
    ``aggregate_sum``, :class:`~headway.strategies.capabilities.SecureSummable`): the server sees only the sum."""

    def step(self, strategy: HeadwayStrategy[M], phase: str, ctx: TrainRound[M], contents: Mapping[int, RecordDict]) -> Step[M]:
        """SecAgg+ over ``contents``, quorum on the clients in the sum, then ``aggregate_sum``."""
        from headway.strategies.base import Step  # see PlainAggregation.step

        if not isinstance(strategy, SecureSummable):  # aggregation_for admits only a strategy that sums: the last guard
            raise TypeError(f"{type(strategy).__name__} cannot aggregate from a sum of replies")
        total = secure_sum(ctx.engine, phase, contents, strategy.sum_spec(ctx, sorted(contents)))
        if total is None or not ctx.engine.quorum(phase, total):
            return Step(None, len(total) if total is not None else 0, method=ctx.state.method)
        step: Step[M] = strategy.aggregate_sum(ctx, total)
        return replace(step, method=ctx.state.method if step.method is None else step.method)


def aggregation_for(secure_aggregation: str, strategy: HeadwayStrategy[Any]) -> Aggregation:
    """The run's aggregation: secure when ``secure-aggregation`` is on (the config check refused it
    already for a method that cannot sum: this is the last guard), else plain."""
    if secure_aggregation == "off":
        return PlainAggregation()
    if SECURE_SUM not in capabilities_of(type(strategy)):
        raise ConfigError(f"secure-aggregation={secure_aggregation}: {type(strategy).__name__} cannot aggregate from a sum of replies")
    return SecureAggregation()
