"""The headway ClientApp: finds this node's partition and body, then hands each message
to the method's local procedure. Local state (bodies, heads) lives in ``context.state``."""

from __future__ import annotations

from typing import Any, Mapping

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from client.env import client_env
from client.faults import corrupt
from client.registry import PROCEDURES
from core.config import fault_ids


def _handle(msg: Message, context: Context, kind: str, overrides: Mapping[str, Any]) -> Message:
    env = client_env({**dict(context.run_config), **overrides}, context.node_config)
    procedure = PROCEDURES[env.cfg["algorithm"]]
    handler = procedure.train if kind == "train" else procedure.evaluate
    content = handler(env, msg.content, context.state)
    if kind == "train" and env.partition_id in fault_ids(env.cfg):
        content = corrupt(content, env.cfg["fault-mode"])
    return Message(content=content, reply_to=msg)


def build_client_app(overrides: Mapping[str, Any] | None = None) -> ClientApp:
    """A ClientApp whose run config is the Flower run config overlaid with ``overrides``.

    ``flwr run`` uses :data:`app` (no overrides); :mod:`server.run` passes its resolved
    config here because ``run_simulation`` has no run-config argument.
    """
    overrides = dict(overrides or {})
    client_app = ClientApp()

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        return _handle(msg, context, "train", overrides)

    @client_app.evaluate()
    def evaluate(msg: Message, context: Context) -> Message:
        return _handle(msg, context, "evaluate", overrides)

    return client_app


app = build_client_app()
