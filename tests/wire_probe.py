"""Flower's SuperNode with a gRPC interceptor on its Fleet channel that logs what each
message is made of as it crosses: headers and object trees pulled and pushed, and every
object's content. The deployment tests compare these counts with headway's wire meter.

    HEADWAY_WIRE_LOG=FILE python -m tests.wire_probe [flower-supernode arguments]

Each successful Fleet call that carries message parts appends one JSON line
``{"call": ..., "down": bytes, "up": bytes}`` to FILE. gRPC, HTTP/2 and TLS framing, node
and run ids in requests, heartbeats and polls that return nothing are not counted: the
meter does not count them either (see docs/engine.md, "Byte accounting").
"""

from __future__ import annotations

import inspect
import json
import os
import threading
from typing import Any

import flwr.client.grpc_rere_client.connection as connection
import grpc
from flwr.supernode.cli import flower_supernode

_lock = threading.Lock()


def message_part_bytes(call: str, request: Any, response: Any) -> tuple[int, int]:
    """(down, up) bytes of message parts in one Fleet call, as serialized."""
    if call == "PullMessages":
        return sum(m.ByteSize() for m in response.messages_list) + sum(t.ByteSize() for t in response.message_object_trees), 0
    if call == "PullObject":
        return (len(response.object_content) if response.object_available else 0), 0
    if call == "PushMessages":
        return 0, sum(m.ByteSize() for m in request.messages_list) + sum(t.ByteSize() for t in request.message_object_trees)
    if call == "PushObject":
        return 0, len(request.object_content)
    return 0, 0


class CountingInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Logs the message-part bytes of every Fleet call that succeeds."""

    def __init__(self, path: str):
        self.path = path

    def intercept_unary_unary(self, continuation, client_call_details, request):
        outcome = continuation(client_call_details, request)
        call = str(client_call_details.method).rsplit("/", 1)[-1]
        try:
            response = outcome.result()
        except Exception:  # a failed call moved nothing the meter counts; Flower retries it
            return outcome
        down, up = message_part_bytes(call, request, response)
        if down or up:
            with _lock, open(self.path, "a") as fh:
                fh.write(json.dumps({"call": call, "down": down, "up": up}) + "\n")
        return outcome


def install(path: str) -> None:
    """Make every Fleet channel the SuperNode opens count through :class:`CountingInterceptor`."""
    original = connection.create_channel

    def create_channel(*args: Any, **kwargs: Any) -> grpc.Channel:
        call = inspect.signature(original).bind(*args, **kwargs)  # interceptors, by keyword or by position
        call.arguments["interceptors"] = [*(call.arguments.get("interceptors") or []), CountingInterceptor(path)]
        return original(*call.args, **call.kwargs)

    connection.create_channel = create_channel


if __name__ == "__main__":
    import sys

    install(os.environ["HEADWAY_WIRE_LOG"])
    sys.argv[0] = "flower-supernode"
    flower_supernode()
