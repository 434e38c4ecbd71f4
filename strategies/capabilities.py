"""What a strategy can do, read from what it implements (never from a hand-set flag): a
method supports ``secure-aggregation`` when its strategy can aggregate from a sum alone, and
a robust ``aggregation`` rule when its strategy averages the round's model updates.

A capability's hooks count only where they stand for the class's own aggregation: a class
that replaces ``aggregate_train`` with a different rule (FedProf's full/partial aggregation
over FedAvg) does not keep the sum and averaging hooks it inherits, which describe the rule
it replaced."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from headway.strategies.state import M

if TYPE_CHECKING:
    from headway.strategies.base import Step, TrainRound
    from headway.strategies.replies import Reply
    from headway.strategies.secure_aggregation import SecureSum, SumSpec

SECURE_SUM = "secure_sum"
ROBUST_AGGREGATION = "robust_aggregation"
SECURE_SUM_HOOKS = ("sum_spec", "aggregate_sum")
ROBUST_HOOKS = ("update_weights",)


@runtime_checkable
class SecureSummable(Protocol[M]):
    """A strategy whose aggregation needs only the sum of the replies: what the clients add
    up (``sum_spec``) and the step from that sum (``aggregate_sum``)."""

    def sum_spec(self, ctx: TrainRound[M], nodes: list[int]) -> SumSpec: ...  # noqa: D102

    def aggregate_sum(self, ctx: TrainRound[M], total: SecureSum) -> Step[M]: ...  # noqa: D102


@runtime_checkable
class RobustAggregatable(Protocol[M]):
    """A strategy whose aggregation is a weighted average of model updates (the weights from
    ``update_weights``), the average a robust rule replaces (:class:`headway.strategies.robust.RobustAverage`)."""

    def update_weights(self, ctx: TrainRound[M], replies: list[Reply]) -> Sequence[float]: ...  # noqa: D102


def capabilities_of(cls: type) -> frozenset[str]:
    """The capability names a strategy class implements (see the module docstring)."""
    found = set()
    if _implements(cls, SECURE_SUM_HOOKS):
        found.add(SECURE_SUM)
    if _implements(cls, ROBUST_HOOKS):
        found.add(ROBUST_AGGREGATION)
    return frozenset(found)


def hidden_hooks(cls: type, names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` that ``cls`` inherits from above the class defining its ``aggregate_train``: hooks
    it has but that do not count (a class with its own ``aggregate_train`` must restate them to keep them)."""
    aggregation = _owner(cls, "aggregate_train")
    return [n for n in names if (owner := _owner(cls, n)) is not None and aggregation is not None and not issubclass(owner, aggregation)]


def _owner(cls: type, name: str) -> type | None:
    """The class of ``cls``'s MRO that defines ``name`` (None: none does)."""
    return next((base for base in cls.__mro__ if name in vars(base)), None)


def _implements(cls: type, names: tuple[str, ...]) -> bool:
    """Every one of ``names`` is defined for ``cls`` by the class that defines its ``aggregate_train``
    or by a subclass of it (so the hook describes the aggregation ``cls`` really runs)."""
    aggregation = _owner(cls, "aggregate_train")
    for name in names:
        owner = _owner(cls, name)
        if owner is None or aggregation is None or not issubclass(owner, aggregation):
            return False
    return True
