"""Flower's SuperNode with a counter on its Fleet calls that logs what each message is made
of as it crosses: headers and object trees pulled and pushed, and every object's content. The
deployment tests compare these counts with headway's wire meter.

    HEADWAY_WIRE_LOG=FILE python -m tests.wire_probe [flower-supernode arguments]

Each successful Fleet call that carries message parts appends one JSON line
``{"call": ..., "down": bytes, "up": bytes}`` to FILE. The counter sits on Flower 1.39's gRPC
channel (an interceptor) or on Flower 1.40+'s HTTP Fleet client (around its one call method),
where the same protobuf requests and responses cross. Framing (gRPC and HTTP/2, or HTTP/1.1),
TLS, node and run ids in requests, heartbeats and polls that return nothing are not counted:
the meter does not count them either (see docs/engine.md, "Byte accounting").
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import threading
from typing import Any

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


def record(path: str, call: str, request: Any, response: Any) -> None:
    """Append the message-part bytes of one successful Fleet call to ``path`` (calls without any: nothing)."""
    down, up = message_part_bytes(call, request, response)
    if down or up:
        with _lock, open(path, "a") as fh:
            fh.write(json.dumps({"call": call, "down": down, "up": up}) + "\n")


def install_grpc(path: str) -> None:
    """Flower 1.39: add a counting interceptor to every Fleet channel the SuperNode opens."""
    import flwr.client.grpc_rere_client.connection as connection
    import grpc

    class CountingInterceptor(grpc.UnaryUnaryClientInterceptor):
        def intercept_unary_unary(self, continuation, client_call_details, request):
            outcome = continuation(client_call_details, request)
            try:
                response = outcome.result()
            except Exception:  # a failed call moved nothing the meter counts; Flower retries it
                return outcome
            record(path, str(client_call_details.method).rsplit("/", 1)[-1], request, response)
            return outcome

    original = connection.create_channel

    def create_channel(*args: Any, **kwargs: Any) -> grpc.Channel:
        call = inspect.signature(original).bind(*args, **kwargs)  # interceptors, by keyword or by position
        call.arguments["interceptors"] = [*(call.arguments.get("interceptors") or []), CountingInterceptor()]
        return original(*call.args, **call.kwargs)

    connection.create_channel = create_channel


def install_http(path: str) -> None:
    """Flower 1.40+: count around the HTTP Fleet client's one call method (a call that fails raises: nothing recorded)."""
    from flwr.supernode.fleet_http_client import FleetHttpClient

    original = FleetHttpClient._unary_unary

    def counted(self: FleetHttpClient, **kwargs: Any) -> Any:
        response = original(self, **kwargs)
        record(path, kwargs["rpc_method"].rsplit("/", 1)[-1], kwargs["request"], response)
        return response

    FleetHttpClient._unary_unary = counted  # type: ignore[method-assign]


def install(path: str) -> None:
    """Count every Fleet call of this SuperNode into ``path``, on whichever transport the installed Flower speaks."""
    http = importlib.util.find_spec("flwr.supernode.fleet_http_client") is not None
    (install_http if http else install_grpc)(path)


if __name__ == "__main__":
    import sys

    install(os.environ["HEADWAY_WIRE_LOG"])
    sys.argv[0] = "flower-supernode"
    flower_supernode()
