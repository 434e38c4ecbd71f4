"""Conversions between Flower's ``ArrayRecord`` and numpy arrays by name, as the strategies
check, average and send them."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord


def to_numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    """A record's arrays as numpy arrays, by name."""
    return {k: v.numpy() for k, v in record.items()}


def same_arrays(a: ArrayRecord, b: ArrayRecord) -> bool:
    """Whether two records hold the same names, each with the same dtype, shape and values."""
    if list(a) != list(b):
        return False
    x, y = to_numpy(a), to_numpy(b)
    return all(x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]) for k in x)


def to_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """Numpy arrays as a record, each C-contiguous as Flower's Array needs."""
    return ArrayRecord(
        {k: Array(np.asarray(v, order="C")) for k, v in arrays.items()}
    )  # order="C" keeps 0-d arrays 0-d (BatchNorm counters); ascontiguousarray makes them (1,)
