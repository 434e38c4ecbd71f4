"""What a strategy can do, read from what it implements (never from a hand-set flag): a
method supports ``secure-aggregation`` when its strategy can aggregate from a sum alone, and
a robust ``aggregation`` rule when its strategy averages the round's model updates."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

SECURE_SUM = "secure_sum"
ROBUST_AGGREGATION = "robust_aggregation"


@runtime_checkable
class SecureSummable(Protocol):
    """A strategy whose aggregation needs only the sum of the replies: what the clients add
    up (``sum_spec``) and the step from that sum (``aggregate_sum``)."""

    def sum_spec(self, ctx: object, nodes: list[int]) -> object: ...  # noqa: D102

    def aggregate_sum(self, ctx: object, total: object) -> object: ...  # noqa: D102


@runtime_checkable
class RobustAggregatable(Protocol):
    """A strategy whose aggregation is an average of model updates, the step a robust rule replaces."""

    def robust_step(self, ctx: object, replies: list, weights: object, metrics: dict) -> object: ...  # noqa: D102


def capabilities_of(cls: type) -> frozenset[str]:
    """The capability names a strategy class implements (a method on the class, not ``NotImplementedError`` stubs of a base)."""
    found = set()
    if _implements(cls, ("sum_spec", "aggregate_sum")):
        found.add(SECURE_SUM)
    if _implements(cls, ("robust_step",)):
        found.add(ROBUST_AGGREGATION)
    return frozenset(found)


def _implements(cls: type, names: tuple[str, ...]) -> bool:
    """Every one of ``names`` is defined by ``cls`` or a base other than the abstract HeadwayStrategy."""
    for name in names:
        owner = next((base for base in cls.__mro__ if name in vars(base)), None)
        if owner is None or owner.__name__ == "HeadwayStrategy":
            return False
    return True
