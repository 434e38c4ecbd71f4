"""Client replies, decoded once against what the method declared they may be.

Every reply is untrusted. :func:`decode` turns a Flower reply into a :class:`Reply` only
when its records, array names, shapes and dtypes, values, metric types and counts are what
the :class:`Layout` allows and it is no larger than the layout's byte cap; otherwise it
returns the exact reason, which the engine counts as a failure. Nothing that failed here
is ever aggregated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, cast

import numpy as np
from flwr.app import Message
from flwr.app.typing import ConfigRecordValues, MetricRecordValues
from headway.core import protocol as P
from typing_extensions import TypeVar

# What a layout's check makes of a reply's arrays: the reply's payload. A bare ``Layout`` or
# ``Reply`` (a layout built where the payload's type is not known) has a payload of any type.
T = TypeVar("T", default=Any)


@dataclass(init=False)
class Rejection:
    """Why a reply was refused, with figures the round reports (e.g. its update norm): what a
    layout's check may return instead of a plain reason."""

    reason: str
    figures: dict[str, float]

    def __init__(self, reason: str, **figures: float):
        self.reason = reason
        self.figures = figures

    def __str__(self) -> str:
        return self.reason


# Why a reply was refused: the reason, or a Rejection that also carries figures.
Problem = str | Rejection

# A method's own check of decoded arrays: (payload, None) or (None, why).
Check = Callable[[dict[str, np.ndarray], "Reply[Any]"], "tuple[T | None, Problem | None]"]


@dataclass(frozen=True)
class ArraySpec:
    """One array a reply must carry: its shape and dtype. A dimension given by name (a
    str) may have any length up to the layout's bound for that name, and every array
    using the name must agree on it (e.g. FedPFT's number of classes sent)."""

    shape: tuple[int | str, ...]
    dtype: str | tuple[str, ...] = "float32"  # or the dtypes accepted (e.g. float16, with a float32 fallback)

    @property
    def dtypes(self) -> tuple[str, ...]:
        """The dtypes accepted, as a tuple."""
        return (self.dtype,) if isinstance(self.dtype, str) else tuple(self.dtype)

    def max_shape(self, dims: Mapping[str, int]) -> tuple[int, ...]:
        """The shape with each named dimension at its largest length in ``dims``."""
        return tuple(dims[d] if isinstance(d, str) else d for d in self.shape)

    def nbytes_max(self, dims: Mapping[str, int]) -> int:
        """The most bytes the array's values may take, named dimensions bounded by ``dims``."""
        return int(np.prod(self.max_shape(dims), dtype=np.int64)) * max(np.dtype(d).itemsize for d in self.dtypes)

    @property
    def nbytes(self) -> int:
        """The bytes of an array with no named dimensions, in its widest dtype."""
        return self.nbytes_max({})


# Flower's framing of one array in a reply, beyond its values: ~470-500 bytes measured for
# ShuffleNet V2's and MobileNet V2's 300+ arrays (npy header, 64-hex object id, tree entry,
# record key); twice that is allowed. A fixed slack alone rejected every honest ShuffleNet reply.
PER_ARRAY_BYTES = 1024


@dataclass(frozen=True)
class Layout(Generic[T]):
    """What a reply of one phase may hold.

    ``arrays``: the exact arrays (None: the reply carries no ArrayRecord).
    ``count``: whether ``num-examples`` is required, and its inclusive upper bound comes
    from the engine (the client's partition size, or a cap).
    ``metrics``: required metric names; ``optional``: names that may also appear.
    ``config``: names a ConfigRecord may hold (None: no ConfigRecord).
    ``check``: the method's bound on the values (clip bound, update norm, ...).
    ``slack_bytes``: allowance above the arrays' own size for headers and metadata, plus
    ``PER_ARRAY_BYTES`` for every array (its npy header, object id and tree entry).
    ``dims``: the largest length of each named dimension of ``arrays``.
    ``scores``: the layout of a ``scores`` MetricRecord the reply must also carry (a train
    reply under client-evaluation=with-next-train: checked as an evaluation reply is).
    """

    arrays: Mapping[str, ArraySpec] | None
    count: bool = True
    metrics: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    config: tuple[str, ...] | None = None
    check: Check[T] | None = None
    slack_bytes: int = 64 * 1024
    dims: Mapping[str, int] = field(default_factory=dict)
    scores: Layout[Any] | None = None

    @property
    def max_bytes(self) -> int:
        """The largest reply, in bytes on the wire, this layout accepts."""
        arrays = self.arrays or {}
        return sum(s.nbytes_max(self.dims) for s in arrays.values()) + self.slack_bytes + PER_ARRAY_BYTES * len(arrays)


@dataclass
class Reply(Generic[T]):
    """A decoded, valid reply: who sent it and what it holds."""

    node_id: int
    partition_id: int
    arrays: dict[str, np.ndarray]
    count: int | None
    metrics: dict[str, float]
    payload: T  # what the layout's check made of the arrays (None where the layout has no check)
    config: dict[str, ConfigRecordValues] = field(default_factory=dict)
    nbytes: int = 0
    max_count: float = math.inf  # the most examples the sender can hold (its partition's size, or the cap)
    scores: Reply[Any] | None = None  # the test scores a train reply carried (client-evaluation=with-next-train), decoded

    @property
    def examples(self) -> int:
        """``count`` where the reply's layout required one (``count=True``: every valid reply carries it)."""
        if self.count is None:
            raise ValueError(f"node {self.node_id}'s reply carries no num-examples: its layout did not ask for one")
        return self.count


def _metric_problem(name: str, value: MetricRecordValues) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"metric {name!r} is a {type(value).__name__}, expected a number"
    if not math.isfinite(float(value)):
        return f"metric {name!r} is {value}, expected a finite number"
    return None


def _integral(name: str, value: float, upper: float) -> str | None:
    if value < 0 or value != int(value):
        return f"metric {name!r} is {value:g}, expected a whole number >= 0"
    if value > upper:
        return f"metric {name!r} is {value:g}, above the {upper:g} this client can hold"
    return None


def _match_shape(
    name: str, got: tuple[int, ...], want: tuple[int | str, ...], dims: Mapping[str, int], bound: dict[str, int]
) -> tuple[tuple[int, ...], str | None]:
    """The concrete shape ``got`` when it fits ``want`` (binding named dimensions in ``bound``), else the reason."""
    if len(got) != len(want) or any(not isinstance(w, str) and g != w for g, w in zip(got, want)):
        return got, f"array {name!r} has shape {got}, expected {want}"
    for g, w in zip(got, want):
        if isinstance(w, str):
            if not 0 <= g <= dims[w]:
                return got, f"array {name!r} has {g} {w}, more than the {dims[w]} allowed"
            if bound.setdefault(w, g) != g:
                return got, f"array {name!r} has {g} {w}, but another array has {bound[w]}"
    return got, None


def _decode_metrics(
    record: Mapping[str, MetricRecordValues], layout: Layout[Any], partition_id: int, max_count: float
) -> tuple[dict[str, float], int | None, str | None]:
    """(metrics, count, None) when a MetricRecord holds what ``layout`` requires and allows, else ({}, None, the reason)."""
    metrics: dict[str, float] = {}
    expected = set(layout.metrics) | ({P.NUM_EXAMPLES} if layout.count else set()) | {P.PARTITION_ID}
    for name, value in record.items():
        if name not in expected and name not in layout.optional:
            return {}, None, f"unexpected metric {name!r}"
        if problem := _metric_problem(name, value):
            return {}, None, problem
        assert isinstance(value, (int, float))  # for mypy: _metric_problem refused anything else
        metrics[name] = float(value)
    if missing := sorted(expected - set(metrics)):
        return {}, None, f"reply lacks metric(s) {missing}"
    if metrics[P.PARTITION_ID] != partition_id:
        return {}, None, f"reply claims partition {metrics[P.PARTITION_ID]:g}, but this node registered as partition {partition_id}"
    count = None
    if layout.count:
        if problem := _integral(P.NUM_EXAMPLES, metrics[P.NUM_EXAMPLES], max_count):
            return {}, None, problem
        count = int(metrics[P.NUM_EXAMPLES])
    return metrics, count, None


def _checked(layout: Layout[T], arrays: dict[str, np.ndarray], draft: Reply[None]) -> tuple[Reply[T] | None, Problem | None]:
    """Run the layout's own check on ``draft`` (a valid reply before its payload): the reply with the
    payload the check made, or the reason it fails. Without a check the payload is None."""
    if layout.check is None:
        return cast("Reply[T]", draft), None
    try:
        payload, problem = layout.check(arrays, draft)
    except Exception as exc:  # a method check that trips on odd input is a bad reply, not a crash
        return None, f"payload cannot be checked: {type(exc).__name__}: {exc}"
    if problem:
        return None, problem
    made = cast("T", payload)  # None only where the check makes no payload (a check of metrics alone)
    d = draft
    return Reply(d.node_id, d.partition_id, d.arrays, d.count, d.metrics, made, d.config, d.nbytes, d.max_count, d.scores), None


def decode(
    reply: Message, layout: Layout[T], partition_id: int, max_count: int, nbytes: int, max_test_count: float = math.inf
) -> tuple[Reply[T] | None, Problem | None]:
    """(Reply, None) when ``reply`` is what ``layout`` allows, else (None, the reason).

    ``partition_id`` is what the registry knows of the sender; ``max_count`` bounds its
    ``num-examples``; ``nbytes`` is the reply's size on the wire; ``max_test_count`` bounds
    the ``num-examples`` of the scores a train reply carries (``layout.scores``).
    """
    if nbytes > layout.max_bytes:
        return None, f"reply is {nbytes} bytes, over this phase's cap of {layout.max_bytes}"
    content = reply.content
    allowed = (
        {P.METRICS}
        | ({P.ARRAYS} if layout.arrays is not None else set())
        | ({P.CONFIG} if layout.config is not None else set())
        | ({P.SCORES} if layout.scores is not None else set())
    )
    names = set(content.keys())
    if names - allowed:
        return None, f"unexpected record(s) {sorted(names - allowed)}; this phase allows {sorted(allowed)}"
    if P.METRICS not in content.metric_records:
        return None, "reply without its metrics record"
    metrics, count, problem = _decode_metrics(content.metric_records[P.METRICS], layout, partition_id, max_count)
    if problem:
        return None, problem
    scores: Reply[Any] | None = None
    score_problem: Problem | None
    if layout.scores is not None:
        if P.SCORES not in content.metric_records:
            return None, "reply without its scores record (client-evaluation=with-next-train)"
        scored, n, score_problem = _decode_metrics(content.metric_records[P.SCORES], layout.scores, partition_id, max_test_count)
        if not score_problem:
            draft = Reply(reply.metadata.src_node_id, partition_id, {}, n, scored, None, max_count=max_test_count)
            scores, score_problem = _checked(layout.scores, {}, draft)
        if score_problem:
            return None, f"scores: {score_problem}"
    config: dict[str, ConfigRecordValues] = {}
    if layout.config is not None and P.CONFIG in content.config_records:
        config = dict(content.config_records[P.CONFIG])
        if extra := sorted(set(config) - set(layout.config)):
            return None, f"unexpected config field(s) {extra}"
    arrays: dict[str, np.ndarray] = {}
    if layout.arrays is not None:
        if P.ARRAYS not in content.array_records:
            return None, "reply without its arrays record"
        record = content.array_records[P.ARRAYS]
        got, want = set(record.keys()), set(layout.arrays)
        if got != want:
            return None, f"array names differ from the layout (missing {sorted(want - got)[:5]}, unexpected {sorted(got - want)[:5]})"
        bound: dict[str, int] = {}  # named dimensions, as the first array using each set them
        for name, spec in layout.arrays.items():
            arr = record[name]
            if arr.dtype not in spec.dtypes:
                return None, f"array {name!r} is {arr.dtype}, expected {' or '.join(spec.dtypes)}"
            shape, problem = _match_shape(name, tuple(arr.shape), spec.shape, layout.dims, bound)
            if problem:
                return None, problem
            try:
                data = arr.numpy()
            except Exception as exc:  # a shape/dtype header that lies about its data
                return None, f"array {name!r} cannot be read: {exc}"
            if data.shape != shape:
                return None, f"array {name!r} holds {data.size} values, not shape {shape}"
            if data.dtype != np.dtype(arr.dtype):  # the data's own header must agree with the declared dtype
                return None, f"array {name!r} is declared {arr.dtype} but holds {data.dtype} data"
            if np.issubdtype(data.dtype, np.floating) and not np.all(np.isfinite(data)):
                return None, f"array {name!r} contains NaN or Inf"
            arrays[name] = data
    draft = Reply(reply.metadata.src_node_id, partition_id, arrays, count, metrics, None, config, nbytes, max_count, scores)
    return _checked(layout, arrays, draft)
