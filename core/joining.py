"""New devices that join a running federation (LG-FedAvg §4.3, Table 3): the partitions named in
``join-clients`` take no part until round ``join-round`` + 1; from then on each round trains
every joined client plus a fraction ``join-fraction-old`` of the others.

Plain functions on partition ids and counts: the engine (strategies/engine.py) applies them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from headway.core.sampling import sample_size


def parse_partition_ids(text: str, key: str = "join-clients") -> frozenset[int]:
    """``"100, 101"`` -> {100, 101}; ValueError naming ``key`` for anything but whole numbers >= 0."""
    out: set[int] = set()
    for item in (p.strip() for p in str(text).split(",")):
        if not item:
            continue
        try:
            pid = int(item)
        except ValueError:
            raise ValueError(
                f"run-config key '{key}': {item!r} is not a partition id; expected a comma list of whole numbers such as '100,101'"
            ) from None
        if pid < 0:
            raise ValueError(f"run-config key '{key}': partition id {pid} is negative")
        out.add(pid)
    return frozenset(out)


@dataclass(frozen=True)
class JoinPlan:
    """Who joins (``partitions``), after which round (``after``), and the share of the others trained with them (``fraction_old``)."""

    partitions: frozenset[int] = frozenset()
    after: int = 0
    fraction_old: float = 1.0

    @property
    def active(self) -> bool:
        """Whether any partition joins late (``join-clients`` is not empty)."""
        return bool(self.partitions)

    def waiting(self, partition_id: int, server_round: int) -> bool:
        """Whether ``partition_id`` must still be left out in ``server_round`` (it joins in round ``after`` + 1)."""
        return partition_id in self.partitions and server_round <= self.after

    def joined(self, server_round: int) -> bool:
        """Whether ``server_round`` comes after the join (the joined-plus-a-share sampling applies)."""
        return self.active and server_round > self.after

    def old_count(self, old: int) -> int:
        """How many of ``old`` other clients a round after the join trains: none for a share of 0, else max(1, round(old·share))."""
        if old == 0 or self.fraction_old <= 0:
            return 0
        return sample_size(old, self.fraction_old)


def join_plan(join_clients: str, join_round: int, join_fraction_old: float, fraction_train: float) -> JoinPlan:
    """The plan the run-config keys give; a ``join-fraction-old`` below 0 means ``fraction-train``."""
    share = fraction_train if join_fraction_old < 0 else join_fraction_old
    return JoinPlan(parse_partition_ids(join_clients), int(join_round), float(share))


def split_joined(partitions: list[int], joining: Collection[int]) -> tuple[list[int], list[int]]:
    """Positions in ``partitions`` of the joining ones and of the others, each in order."""
    joined = [i for i, p in enumerate(partitions) if p in joining]
    others = [i for i, p in enumerate(partitions) if p not in joining]
    return joined, others


def join_problem(join_clients: str, join_round: int, num_clients: int, num_rounds: int, local_data: bool, data_ratio: bool) -> str | None:
    """Why the join keys cannot run as given (one line: the key, what is wrong, what to do), or None."""
    joining = parse_partition_ids(join_clients)
    if not joining:
        return None
    outside = sorted(p for p in joining if p >= num_clients)
    if outside:
        return f"run-config key 'join-clients': partition id {outside[0]} is outside 0..{num_clients - 1} (num-clients={num_clients})"
    if len(joining) == num_clients:
        return "run-config key 'join-clients' names every partition: leave at least one client to run the rounds before the join"
    if join_round >= num_rounds:
        return (
            f"run-config key 'join-round' is {join_round}, but the run has num-server-rounds={num_rounds}: "
            "the join-clients would never take part; lower join-round or raise num-server-rounds"
        )
    if local_data:
        return "run-config key 'join-clients' names partition ids, which dataset='local' nodes do not hold: join needs nodes started with --partition-id"
    if data_ratio:
        return "run-config key 'join-clients' does not combine with client-sampling=data-ratio: use client-sampling=uniform"
    return None
