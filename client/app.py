"""The headway ClientApp: finds this node's partition and body, then hands each message
to the method's local procedure. Local state (bodies, heads) lives in ``context.state``,
and on the node's disk too where the SuperNode names a ``state-dir`` or the simulation runner a
state folder: versions by message position, so a restarted node or a resumed run picks up the
state it had before the message it answers (:mod:`headway.client.state_store`).

A procedure that fails answers with an error reply carrying its own message (not a
remote traceback), so the server can count it with a readable reason.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from headway.client.env import ClientEnv, client_env, local_data, node_cfg
from headway.client.faults import fault_mod
from headway.client.procedures.base import round_of
from headway.client.registry import PROCEDURES
from headway.client.secure_aggregation import answer, is_stage
from headway.client.state_store import is_fresh, lineage_key, position, restore_state, save_version, state_folder, state_root
from headway.core import protocol as P
from headway.core.config import body_for, scores_with_train
from headway.core.console import quiet_http_clients
from headway.core.run_data import node_profile
from headway.core.secagg import pinned_floor
from headway.core.settings import Settings
from headway.core.sources import limits_from_node_config

log = logging.getLogger("headway")


JOINED = "headway-joined"  # context.state record of a dataset=local node: the schema and client index it registered with


def registration(env: ClientEnv) -> RecordDict:
    """What a client states once, before its first round: its partition id and body."""
    return RecordDict({P.METRICS: MetricRecord({P.PARTITION_ID: env.partition_id}), P.CONFIG: ConfigRecord({P.BODY: env.body})})


def description(cfg: Settings, data: str, body: str, node_config: Mapping[str, Any] | None = None) -> RecordDict:
    """What a node with its own data states: its body and its data's profile (class names
    and counts, columns and their summed moments; never rows), read within its node config's limits."""
    profile = json.dumps(node_profile(data, cfg, limits_from_node_config(node_config or {})), sort_keys=True)
    return RecordDict({P.CONFIG: ConfigRecord({P.BODY: body or body_for(cfg, 0), P.DATA_PROFILE: profile})})


def joined(msg: Message, context: Context) -> tuple[str, int] | None:
    """The (schema JSON, client index) of a dataset=local node: from a registration query
    (kept in ``context.state`` for the run's later messages), else from that state."""
    config = msg.content.config_records.get(P.CONFIG, ConfigRecord()) if msg.metadata.message_type == MessageType.QUERY else ConfigRecord()
    if P.DATA_SCHEMA in config:
        context.state[JOINED] = ConfigRecord({P.DATA_SCHEMA: str(config[P.DATA_SCHEMA]), P.CLIENT_INDEX: P.as_int(config[P.CLIENT_INDEX])})
    record = context.state.config_records.get(JOINED)
    return None if record is None else (str(record[P.DATA_SCHEMA]), P.as_int(record[P.CLIENT_INDEX]))


def partition_of(context: Context) -> int | None:
    """The partition id this node answers as (what :func:`client_env` gives it): a node with
    its own data, the client index it registered with (None before it has); else its
    node config's ``partition-id``."""
    if context.node_config.get("data"):
        record = context.state.config_records.get(JOINED)
        return None if record is None else P.as_int(record[P.CLIENT_INDEX])
    return P.as_int(context.node_config["partition-id"]) if "partition-id" in context.node_config else None


def _lineage(msg: Message, context: Context, root: Path | None) -> str | None:
    """The key this node's saved state is filed under (:func:`headway.client.state_store.lineage_key`): the
    server's registration query names it (a resumed run's, the run it continues)."""
    config = msg.content.config_records.get(P.CONFIG, ConfigRecord()) if msg.metadata.message_type == MessageType.QUERY else ConfigRecord()
    return lineage_key(context.state, root, context.run_id, config.get(P.LINEAGE))


def _handle(msg: Message, context: Context, kind: str, overrides: Mapping[str, Any], state_dir: Path | None = None) -> Message:
    """Answer one message: find this node's client, restore its saved state if it has none, let the
    method answer, and save the state as the version at this message's position."""
    run_config = {**dict(context.run_config), **overrides}
    root = state_root(context.node_config, state_dir)
    key: str | None = None
    try:
        cfg = node_cfg(run_config, context.node_config)
        data = local_data(cfg, context.node_config)
        phase = msg.content.config_records.get(P.CONFIG, ConfigRecord()).get(P.PHASE) if kind == "query" else None
        if data is not None and phase == P.PHASE_DESCRIBE:
            return Message(content=description(cfg, data, str(context.node_config.get("body", "")), context.node_config), reply_to=msg)
        at = position(round_of(msg.content), kind)
        key = _lineage(msg, context, root)
        if data is not None:
            local_store = state_folder(root, key, "local")
            if local_store is not None and JOINED not in context.state:  # a restarted node picks up its registration from disk
                restore_state(context.state, local_store, at)
            node = joined(msg, context)
            if node is None:
                return Message(
                    Error(code=P.ERROR_UNREGISTERED, reason="this node holds no schema of this run (it restarted): register it again"),
                    reply_to=msg,
                )
        env = client_env(run_config, context.node_config, node if data is not None else None)
    except Exception as exc:  # a node that cannot find or read its data or partition says so
        return Message(Error(code=P.ERROR_BAD_INPUT, reason=_reason(exc, key)), reply_to=msg)
    store = state_folder(root, key, "local" if data is not None else env.partition_id)
    try:
        if store is not None:
            restore_state(context.state, store, at)
        if kind == "query":
            content = registration(env) if data is None else description(cfg, data, env.body, context.node_config)
            if data is not None and store is not None:
                save_version(context.state, store, at)
        else:
            content = _answer(msg, context, kind, env)
            if store is not None and not is_fresh(context.state):  # the lineage key alone is not worth a file
                save_version(context.state, store, at)
    except Exception as exc:
        log.exception("client %d: %s failed", env.partition_id, kind)
        return Message(Error(code=P.ERROR_CLIENT, reason=_reason(exc, key)), reply_to=msg)
    return Message(content=content, reply_to=msg)


def _reason(exc: Exception, key: str | None) -> str:
    """An error reply's reason: the exception, less the run key (a state file's path names it, and the
    server records reasons in rounds.jsonl; the key must stay with the run's server and nodes)."""
    text = f"{type(exc).__name__}: {exc}"
    return text.replace(key, "<run key>") if key else text


def _answer(msg: Message, context: Context, kind: str, env: ClientEnv) -> RecordDict:
    """The method's reply to a train or evaluate message (a secure-aggregation stage included)."""
    procedure = PROCEDURES[env.cfg.algorithm]
    handler = procedure.train if kind == "train" else procedure.evaluate
    floor_cfg = pinned_floor(env.cfg, context.node_config) if kind == "train" else env.cfg  # the node's own pins
    scores = None
    if kind == "train" and scores_with_train(env.cfg, round_of(msg.content)):  # the model received, scored before training
        scores = procedure.evaluate(env, msg.content, context.state).metric_records[P.METRICS]
    if kind == "train" and env.cfg.secure_aggregation != "off" and not is_stage(msg.content):
        raise ValueError("this run is under secure-aggregation: a training message outside its protocol is refused")
    if kind == "train" and is_stage(msg.content):  # one stage of secure aggregation (client/secure_aggregation.py)
        content = answer(
            msg.content,
            msg.metadata.dst_node_id,
            env.partition_id,
            context.state,
            lambda c: handler(env, c, context.state),
            floor_cfg,  # the floor this client holds the server to: its run config, raised by its node's pins
        )
    else:
        content = handler(env, msg.content, context.state)
    if scores is not None:
        content[P.SCORES] = scores
    return content


def build_client_app(overrides: Mapping[str, Any] | None = None, state_dir: Path | None = None) -> ClientApp:
    """A ClientApp whose run config is the Flower run config overlaid with ``overrides``.

    ``flwr run`` uses :data:`app` (no overrides); the simulation runner passes its
    resolved config here because ``run_simulation`` has no run-config argument, and a
    ``state_dir`` where its clients keep their state on disk (a simulated node's config has
    no ``state-dir``), so that a resumed run finds it.
    """
    overrides = dict(overrides or {})
    quiet_http_clients()  # Flower's HTTP client logs each request at INFO wherever the root logger is at INFO (a body's basicConfig)
    client_app = ClientApp()
    faults = fault_mod(overrides, partition_of)  # test fault injection (client/faults.py): inert unless fault-clients names this node

    @client_app.train(mods=[faults])
    def train(msg: Message, context: Context) -> Message:
        return _handle(msg, context, "train", overrides, state_dir)

    @client_app.evaluate(mods=[faults])
    def evaluate(msg: Message, context: Context) -> Message:
        return _handle(msg, context, "evaluate", overrides, state_dir)

    @client_app.query()
    def query(msg: Message, context: Context) -> Message:
        return _handle(msg, context, "query", overrides, state_dir)

    return client_app


app = build_client_app()
