"""Deliberately bad replies, for testing that the server survives them.

Clients named in run-config 'fault-clients' pass their training replies through
:func:`corrupt`; nothing else in the client changes.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from core import protocol as P


def corrupt(content: RecordDict, mode: str) -> RecordDict:
    """The reply ``content`` damaged the way ``mode`` says."""
    if mode == "error":
        raise RuntimeError("fault injection: this client fails on purpose (fault-mode=error)")
    arrays = content.array_records.get(P.ARRAYS, ArrayRecord())
    damaged = {}
    for name, arr in arrays.items():
        a = arr.numpy().astype(np.float32, copy=True)
        if mode == "nan":
            a.flat[0] = np.nan
        elif mode == "wrong-shape":
            a = a.reshape(-1)[:-1] if a.size > 1 else np.zeros(2, np.float32)
        elif mode == "scaled":
            a = a * 1e6
        damaged[name] = Array(np.ascontiguousarray(a))
    out = RecordDict({P.ARRAYS: ArrayRecord(damaged)} if damaged else {})
    metrics = dict(content.metric_records.get(P.METRICS, MetricRecord()))
    if mode == "negative-count":
        metrics[P.NUM_EXAMPLES] = -5
    out[P.METRICS] = MetricRecord(metrics)
    return out
