"""Deliberately bad replies, for testing that the server survives them.

A Flower client mod (:func:`fault_mod`), outside the ClientApp's own handling: clients named
in run-config ``fault-clients`` pass their replies through :func:`damage_reply` (training
replies; ``bad-eval`` damages evaluation replies; registration is never touched). It sits on
the FAB's ClientApp because the deployment fault tests submit ``fault-clients`` by run config
to the same FAB; for every node not named there it returns the reply untouched. Each mode is
one attack or defect seen in practice:

- ``nan``: a NaN in every array; ``wrong-shape``: every array one value short;
- ``negative-count``: num-examples = -5; ``huge-count``: num-examples = 1e9;
- ``zero-model``: every array zeroed and num-examples = 1e9 (owning a weighted average);
- ``scaled``: arrays × 1e6; ``huge-values``: arrays set to 1e30 (prototypes, statistics);
- ``int-arrays``: arrays sent as int32; ``extra-array``: an extra 4 MB array;
- ``oversized``: every expected array padded to 16 Mi values (64 MB a float32 array);
- ``list-metric``: num-examples sent as a list [1, 2]; ``string-metric``: the loss sent as
  a string, slipped past MetricRecord's own type check (a crafted client's Message);
- ``sign-flip``: a model sent negated (-w: relative update norm 2), for model averaging;
- ``inflated-stats``: FedLog's class means (feature sums / class count, counts honest) and FedDBE's
  mean feature all set to 0.99 × the bound the server checks them against (``fedlog-clip``, else
  ``max-feature-value``): inside every check, far above honest features (an outside probe's attack);
- ``bad-eval``: an evaluation reply claiming correct = 1e6;
- ``error``: the procedure raises; ``silent``: the client hangs past any deadline
  (sleeps ``round-timeout`` + 5 s; for tests with short timeouts);
- ``drop-after-keys``: under secure-aggregation, the client shares its keys and then fails
  every later stage (no masked vector, no shares): a client lost mid-protocol.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable, Mod
from headway.core import protocol as P
from headway.core.config import fault_ids, resolve_settings
from headway.core.methods import FEDDBE_RECORDS

log = logging.getLogger("headway")

TRAIN_MODES = (
    "nan",
    "wrong-shape",
    "negative-count",
    "huge-count",
    "zero-model",
    "scaled",
    "huge-values",
    "int-arrays",
    "extra-array",
    "oversized",
    "list-metric",
    "string-metric",
)
STAT_MODES = ("inflated-stats",)  # inside every check: caught only by the cut of outlying means
MODEL_MODES = ("sign-flip",)  # attacks on methods that average models (a negated statistic is caught by other checks)


def _damage(a: np.ndarray, mode: str) -> np.ndarray:
    """``a`` damaged by ``mode``, in its own dtype (float16 stays float16); integer arrays
    (e.g. FedPFT's class table) are only cut short."""
    if not np.issubdtype(a.dtype, np.floating):
        if mode == "wrong-shape":
            return a.reshape(-1)[:-1] if a.size > 1 else np.zeros(2, a.dtype)
        return a.copy()
    a = a.copy()
    if mode == "nan":
        a.flat[0] = np.nan
    elif mode == "wrong-shape":
        a = a.reshape(-1)[:-1] if a.size > 1 else np.zeros(2, a.dtype)
    elif mode == "scaled":
        a = a * a.dtype.type(1e6)
    elif mode == "huge-values":
        a = np.full_like(a, 1e30)
    elif mode == "zero-model":
        a = np.zeros_like(a)
    elif mode == "sign-flip":
        a = -a
    elif mode == "int-arrays":
        return np.rint(a).astype(np.int32)
    elif mode == "oversized":
        return np.resize(a.reshape(-1), 1 << 24)
    return a


def _inflate(name: str, a: np.ndarray, bound: float, mean_rows: bool) -> np.ndarray:
    """``a`` with its means at 0.99 × ``bound``: FedLog's statistics (dense, or sparse rows after their
    class index; [count, sums] or, ``mean_rows``, [count, means]) or FedDBE's mean feature; other arrays as they are."""
    out = a.astype(np.float64)
    if name in (P.STATS, P.STATS_ROWS):
        first = 1 if name == P.STATS_ROWS else 0  # the count column
        counts = out[:, first : first + 1]
        out[:, first + 1 :] = np.where(counts > 0, 0.99 * bound, 0.0) if mean_rows else 0.99 * bound * counts
    elif name == FEDDBE_RECORDS.feature_mean:
        out[:] = 0.99 * bound
    else:
        return a
    return out.astype(a.dtype)


def damage_reply(
    content: RecordDict, mode: str, kind: str = "train", timeout: float = 0.0, bound: float = 1e4, mean_rows: bool = False
) -> RecordDict:
    """The reply ``content`` of a ``kind`` message damaged the way ``mode`` says (``inflated-stats``: to the
    checked ``bound``, FedLog's statistics sent as [count, means] rows where ``mean_rows``)."""
    if mode == "bad-eval" and kind == "train" and P.SCORES in content.metric_records:  # client-evaluation=with-next-train
        carried = RecordDict(dict(content.items()))
        carried[P.SCORES] = MetricRecord({**dict(content.metric_records[P.SCORES]), P.CORRECT: 1_000_000})
        return carried
    if kind != ("evaluate" if mode == "bad-eval" else "train"):
        return content
    if mode == "error":
        raise RuntimeError("fault injection: this client fails on purpose (fault-mode=error)")
    if mode == "silent":
        time.sleep(timeout)
        return content
    out = RecordDict()
    for name, record in content.items():
        out[name] = record
    metrics = dict(content.metric_records.get(P.METRICS, MetricRecord()))
    if mode == "bad-eval":
        metrics[P.CORRECT] = 1_000_000
    elif mode in TRAIN_MODES + MODEL_MODES and P.ARRAYS in content.array_records:
        keep = (P.PROFILE,) if mode == "sign-flip" else ()  # FedProf: the model flipped behind an honest profile
        damaged = {
            k: v if k in keep else Array(np.asarray(_damage(v.numpy(), mode), order="C"))
            for k, v in content.array_records[P.ARRAYS].items()
        }
        if mode == "extra-array":
            damaged = dict(content.array_records[P.ARRAYS].items())
            damaged["padding"] = Array(np.zeros(1_000_000, np.float32))
        out[P.ARRAYS] = ArrayRecord(damaged)
    elif mode in STAT_MODES and P.ARRAYS in content.array_records:
        arrays = content.array_records[P.ARRAYS].items()
        out[P.ARRAYS] = ArrayRecord({k: Array(np.asarray(_inflate(k, v.numpy(), bound, mean_rows), order="C")) for k, v in arrays})
    if mode == "negative-count":
        metrics[P.NUM_EXAMPLES] = -5
    elif mode in ("huge-count", "zero-model"):
        metrics[P.NUM_EXAMPLES] = 1_000_000_000
    elif mode == "list-metric":
        metrics[P.NUM_EXAMPLES] = [1, 2]
    out[P.METRICS] = record = MetricRecord(metrics)
    if mode == "string-metric":  # what a client that builds its own Message can send in simulation
        record._data[P.LOSS] = "0.1"  # type: ignore[attr-defined]  # past MetricRecord's own type check, on purpose
    return out


def fault_mod(overrides: Mapping[str, Any], partition_of: Callable[[Context], int | None]) -> Mod:
    """A client mod for train and evaluate messages: the reply of a node whose partition
    (``partition_of(context)``) the run config (``overrides`` over the Flower run config)
    names in ``fault-clients`` is damaged by ``fault-mode``; every other reply, and any error
    reply, passes through. A mode that raises (``error``) answers with the error reply a
    failing procedure gives."""

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        reply = call_next(msg, context)
        run_config = {**dict(context.run_config), **overrides}
        partition = partition_of(context)
        if reply.has_error() or partition not in fault_ids(str(run_config.get("fault-clients", ""))):
            return reply
        cfg = resolve_settings(run_config, import_bodies=False)  # only for a named node: every other reply passes unread
        kind = "train" if msg.metadata.message_type == MessageType.TRAIN else "evaluate"
        if cfg.fault_mode == "drop-after-keys":
            stage = msg.content.config_records.get(P.SECAGG, ConfigRecord()).get(P.SECAGG_STAGE)
            if stage in (P.STAGE_COLLECT, P.STAGE_UNMASK):
                return Message(Error(code=P.ERROR_CLIENT, reason="fault injection: gone after sharing its keys"), reply_to=msg)
            return reply
        try:
            bound = cfg.fedlog.clip if cfg.algorithm == "fedlog" and cfg.fedlog.clip > 0 else cfg.max_feature_value
            mean_rows = cfg.fedlog.uplink_dtype == "float16"
            content = damage_reply(reply.content, cfg.fault_mode, kind, timeout=cfg.round_timeout + 5.0, bound=bound, mean_rows=mean_rows)
        except Exception as exc:
            log.exception("client %d: %s failed", partition, kind)
            return Message(Error(code=P.ERROR_CLIENT, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
        return Message(content=content, reply_to=msg)

    return mod
