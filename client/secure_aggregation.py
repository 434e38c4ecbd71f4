"""The client's side of SecAgg+ (core/secagg.py): a TRAIN message carrying a ``secagg``
ConfigRecord is one stage of the protocol. The collect stage runs the method's own train
procedure, then sends only its summed arrays, encoded and masked; nothing else of the
reply (count, loss) leaves the node.

This ports the stages of Flower's legacy ``secaggplus_mod`` rather than wrapping it: the
mod reads and writes legacy ``FitRes`` records (``parameters`` and ``num_examples``),
while a headway reply is named arrays of a method (FedLog's T carries its counts inside),
and the mod masks with a 32-bit seeded generator (core/secagg.py says why not).

The round's secrets live in ``context.state`` under :data:`SESSION`, which the node never
writes to disk (client/state_store.py), and are dropped after the unmask stage.

The server is not trusted to follow the protocol: the threshold and neighbourhood it announces
are checked against a floor from this client's own run config (core/secagg.py, ``client_floor``),
and the client never reveals a share of its own secrets (docs/secure-aggregation.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from headway.core import protocol as P
from headway.core import secagg as S
from headway.core.settings import Settings

SESSION = "secagg-session"
PROTOCOL_FLOOR = S.client_floor(min_replies=1, secagg_shares=0, secagg_threshold=0.5)  # the least any run config implies
NEXT = {P.STAGE_SHARE: P.STAGE_SETUP, P.STAGE_COLLECT: P.STAGE_SHARE, P.STAGE_UNMASK: P.STAGE_COLLECT}  # stage -> the one before


def is_stage(content: RecordDict) -> bool:
    """Whether a train message is a secure-aggregation stage (it carries the SecAgg+ config record)."""
    return P.SECAGG in content.config_records


def answer(
    content: RecordDict,
    node_id: int,
    partition_id: int,
    state: RecordDict,
    train: Callable[[RecordDict], RecordDict],
    cfg: Settings | None = None,
) -> RecordDict:
    """The reply to one stage message; ``train`` runs the method's procedure on a train content;
    ``cfg`` is this client's run config, the source of the floor it holds the server to (the
    ClientApp always passes it; None: the protocol's own floor, 3 clients and threshold 2).
    Raises SecAggError (or KeyError/TypeError on a malformed message) when the stage cannot go on."""
    floor = S.settings_floor(cfg) if cfg is not None else PROTOCOL_FLOOR
    fields = content.config_records[P.SECAGG]
    stage = str(fields[P.SECAGG_STAGE])
    session = state.config_records.get(SESSION, ConfigRecord())
    if stage != P.STAGE_SETUP and session.get(P.SECAGG_STAGE) != NEXT.get(stage):
        raise S.SecAggError(f"stage {stage!r} after {session.get(P.SECAGG_STAGE)!r}: the protocol starts again from setup")
    reply: dict[str, Any]
    if stage == P.STAGE_SETUP:
        threshold = P.as_int(fields[P.SECAGG_THRESHOLD])
        S.check_threshold(floor, threshold)
        keys, seed = S.new_keys(), S.random_seed()
        session = ConfigRecord({P.SECAGG_THRESHOLD: threshold, "sk1": keys.sk1, P.PK1: keys.pk1, "sk2": keys.sk2})
        session[P.PK2], session["seed"] = keys.pk2, seed
        reply = {P.PK1: keys.pk1, P.PK2: keys.pk2, P.SEED_DIGEST: S.seed_digest(seed)}
    elif stage == P.STAGE_SHARE:
        ids = _ints(fields[P.IDS])
        neighbours = dict(zip(ids, zip(_blobs(fields[P.PK1S]), _blobs(fields[P.PK2S]), strict=True), strict=True))
        texts = S.share_secrets(node_id, _keys(session), _blob(session["seed"]), neighbours, P.as_int(session[P.SECAGG_THRESHOLD]), floor)
        session[P.IDS], session[P.PK1S], session[P.PK2S] = ids, _blobs(fields[P.PK1S]), _blobs(fields[P.PK2S])
        reply = {P.IDS: list(texts), P.CIPHERTEXTS: list(texts.values())}
    elif stage == P.STAGE_COLLECT:
        reply_content = _collect(fields, content, node_id, session, train)
        state[SESSION] = session
        return RecordDict({**reply_content, P.METRICS: MetricRecord({P.PARTITION_ID: partition_id})})
    elif stage == P.STAGE_UNMASK:
        del state[SESSION]  # the round's secrets are spent, whatever the answer: a second unmask finds no session
        revealed = S.reveal(
            node_id, _held(session), _ints(fields[P.ALIVE]), _ints(fields[P.DROPPED]), P.as_int(session[P.SECAGG_THRESHOLD])
        )
        return RecordDict(
            {
                P.CONFIG: ConfigRecord({P.IDS: list(revealed), P.SHARES: list(revealed.values())}),
                P.METRICS: MetricRecord({P.PARTITION_ID: partition_id}),
            }
        )
    else:
        raise S.SecAggError(f"unknown secure-aggregation stage {stage!r}")
    session[P.SECAGG_STAGE] = stage
    state[SESSION] = session
    return RecordDict({P.CONFIG: ConfigRecord(reply), P.METRICS: MetricRecord({P.PARTITION_ID: partition_id})})


def _collect(
    fields: ConfigRecord, content: RecordDict, node_id: int, session: ConfigRecord, train: Callable[[RecordDict], RecordDict]
) -> dict[str, Any]:
    """Open the relayed shares, train, and mask the summed arrays of the reply."""
    keys, threshold = _keys(session), P.as_int(session[P.SECAGG_THRESHOLD])
    neighbours = _neighbours(session)
    sources = _ints(fields[P.IDS])
    held = S.open_shares(node_id, keys, neighbours, dict(zip(sources, _blobs(fields[P.CIPHERTEXTS]), strict=True)), threshold)
    session["held-ids"] = list(held)
    session["held-seeds"] = [s for s, _ in held.values()]
    session["held-keys"] = [k for _, k in held.values()]
    session[P.SECAGG_STAGE] = P.STAGE_COLLECT
    train_content = RecordDict({name: record for name, record in content.items() if name != P.SECAGG})
    out = train(train_content)
    arrays = out.array_records[P.ARRAYS]
    names = _names(fields[P.SUM_NAMES])
    weights_name = str(fields.get(P.SUM_ROW_WEIGHTS, ""))
    weights = arrays[weights_name].numpy().astype(np.float64) if weights_name else None
    parts = []
    for name in names:  # FedProto: counts × prototypes, and the counts
        part = arrays[name].numpy().astype(np.float64)
        if weights is not None and name != weights_name:
            part = part * weights.reshape((-1,) + (1,) * (part.ndim - 1))
        parts.append(part.ravel())
    values = np.concatenate(parts)
    clip = float(fields.get(P.SUM_UPDATE_NORM, 0.0))  # type: ignore[arg-type]
    if clip > 0:  # model averaging: the n-weighted update from the model sent, clipped in L2 as the server bounds updates, and n
        sent = train_content.array_records[P.ARRAYS]
        update = values - np.concatenate([sent[name].numpy().astype(np.float64).ravel() for name in names])
        norm = float(np.linalg.norm(update))
        n = float(P.as_int(out.metric_records[P.METRICS][P.NUM_EXAMPLES]))
        values = np.concatenate([n * update * min(1.0, clip / norm) if norm > 0 else update, [n]])
    if not np.all(np.isfinite(values)):
        raise S.SecAggError("the method's reply holds NaN or Inf: nothing to add")
    encoded = S.encode(values, P.as_int(fields[P.FRAC_BITS]), np.random.default_rng())  # rounding from OS entropy
    vector = S.masked(node_id, keys, _blob(session["seed"]), encoded, {v: neighbours[v][0] for v in held})
    return {P.ARRAYS: ArrayRecord({P.MASKED: Array(vector)})}


def _keys(session: ConfigRecord) -> S.Keys:
    return S.Keys(_blob(session["sk1"]), _blob(session[P.PK1]), _blob(session["sk2"]), _blob(session[P.PK2]))


def _neighbours(session: ConfigRecord) -> dict[int, tuple[bytes, bytes]]:
    return dict(zip(_ints(session[P.IDS]), zip(_blobs(session[P.PK1S]), _blobs(session[P.PK2S]), strict=True), strict=True))


def _held(session: ConfigRecord) -> dict[int, tuple[bytes, bytes]]:
    """The other neighbours' shares this client holds (none of its own: it never made one)."""
    return dict(zip(_ints(session["held-ids"]), zip(_blobs(session["held-seeds"]), _blobs(session["held-keys"]), strict=True), strict=True))


def _blob(value: Any) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError("expected bytes")
    return value


def _ints(value: Any) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise TypeError("expected a list of node ids")
    return [int(v) for v in value]


def _blobs(value: Any) -> list[bytes]:
    if not isinstance(value, list) or not all(isinstance(v, bytes) for v in value):
        raise TypeError("expected a list of bytes")
    return list(value)


def _names(value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TypeError("expected a list of array names")
    return list(value)
