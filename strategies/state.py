"""What the server holds between rounds: one frozen value, :class:`ServerState`, that the
round hooks take and return (as Flower's strategies take and return an ``ArrayRecord``).

A method whose server keeps more than its arrays (FedLog's η and Φ, FedProf's baselines and
scores, FedAvg's per-client counts under data-ratio sampling) keeps it in ``method``, one
frozen dataclass per method; per-client entries are keyed by partition id, which outlives a
node id. Every field is a plain value (numbers, numpy arrays, dicts of them, an
``ArrayRecord``), so a state pickles: the next issue's checkpoint/resume builds on it.
Dict fields are never changed in place: a hook makes the next state with new dicts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from flwr.app import ArrayRecord
from headway.strategies.arrays import to_numpy, to_record

if TYPE_CHECKING:
    from headway.strategies.base import Step

M = TypeVar("M")  # a method's own state: its frozen dataclass, or None for a method that keeps none


@dataclass(frozen=True)
class ServerState(Generic[M]):
    """The server's arrays (what clients are sent) and its method's own state, of the type its
    strategy declares (``HeadwayStrategy[FedLogState]``: a ``ServerState[FedLogState]``)."""

    arrays: ArrayRecord
    method: M
    # the seeded sampling stream's position (numpy's ``bit_generator.state``, a plain dict) after the last round,
    # so a restored state draws the clients the unbroken run would have; None before round 1
    sampling: dict[str, Any] | None = None
    # the round after which the run stopped early (a goal reached: strategies' ``evaluated`` hook), so a run resumed
    # from a checkpoint of that round stops there too; None: it runs num-server-rounds
    end: int | None = None

    def advance(self, step: Step[M]) -> ServerState[M]:
        """The state after ``step``: its new arrays and method state, each kept where the step made none."""
        return ServerState(
            self.arrays if step.arrays is None else step.arrays,
            self.method if step.method is None else step.method,
            self.sampling,
            self.end,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled with its arrays as numpy arrays by name: a record that went out in a message holds Flower's
        transport chunks (memoryviews), which do not pickle; the arrays come back with the same names, dtypes and bytes."""
        return (_restored, (to_numpy(self.arrays), self.method, self.sampling, self.end))


def _restored(arrays: dict[str, Any], method: Any, sampling: dict[str, Any] | None, end: int | None = None) -> ServerState[Any]:
    """A pickled :class:`ServerState` back (see :meth:`ServerState.__reduce__`; one pickled before ``end`` existed has none)."""
    return ServerState(to_record(arrays), method, sampling, end)
