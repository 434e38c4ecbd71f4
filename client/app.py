"""The headway ClientApp: finds this node's partition and body, then hands each message
to the method's local procedure. Local state (bodies, heads) lives in ``context.state``,
and on the node's disk too where the SuperNode names a ``state-dir`` (:mod:`client.state_store`).

A procedure that fails answers with an error reply carrying its own message (not a
remote traceback), so the server can count it with a readable reason.
"""

from __future__ import annotations

import logging
from typing import Any, Mapping

from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client.env import ClientEnv, client_env
from client.faults import corrupt
from client.registry import PROCEDURES
from client.state_store import restore_state, save_state, state_path
from core import protocol as P
from core.config import fault_ids

log = logging.getLogger("headway")


def registration(env: ClientEnv) -> RecordDict:
    """What a client states once, before its first round: its partition id and body."""
    return RecordDict({P.METRICS: MetricRecord({P.PARTITION_ID: env.partition_id}), P.CONFIG: ConfigRecord({P.BODY: env.body})})


def _handle(msg: Message, context: Context, kind: str, overrides: Mapping[str, Any]) -> Message:
    try:
        env = client_env({**dict(context.run_config), **overrides}, context.node_config)
    except Exception as exc:  # a node that cannot find its data or partition says so
        return Message(Error(code=P.ERROR_BAD_INPUT, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
    faulty = env.partition_id in fault_ids(env.cfg)
    store = state_path(context.node_config, context.run_id, env.partition_id)
    try:
        if store is not None:
            restore_state(context.state, store)
        if kind == "query":
            content = registration(env)
        else:
            procedure = PROCEDURES[env.cfg["algorithm"]]
            handler = procedure.train if kind == "train" else procedure.evaluate
            content = handler(env, msg.content, context.state)
            if store is not None and len(context.state):
                save_state(context.state, store)
        if faulty:
            content = corrupt(content, env.cfg["fault-mode"], kind, timeout=env.cfg["round-timeout"] + 5.0)
    except Exception as exc:
        log.exception("client %d: %s failed", env.partition_id, kind)
        return Message(Error(code=P.ERROR_CLIENT, reason=f"{type(exc).__name__}: {exc}"), reply_to=msg)
    return Message(content=content, reply_to=msg)


def build_client_app(overrides: Mapping[str, Any] | None = None) -> ClientApp:
    """A ClientApp whose run config is the Flower run config overlaid with ``overrides``.

    ``flwr run`` uses :data:`app` (no overrides); the simulation runner passes its
    resolved config here because ``run_simulation`` has no run-config argument.
    """
    overrides = dict(overrides or {})
    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        return _handle(msg, context, "train", overrides)

    @client_app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return _handle(msg, context, "evaluate", overrides)

    @client_app.query()
    def query(msg: Message, context: Context) -> Message:
        return _handle(msg, context, "query", overrides)

    return client_app


app = build_client_app()
