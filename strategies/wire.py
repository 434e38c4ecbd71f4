"""What a message costs on Flower 1.39's Fleet link: its header plus every object of its
content-addressed object tree, as serialized (``flwr.supercore.inflatable``).

A SuperNode pulls (or pushes) a message as three parts: the message header (a protobuf
``Message`` without content, holding the metadata), the ``ObjectTree`` of object ids, and
the deflated bytes of every object in that tree (the message object, its RecordDict,
each record, each array). gRPC, HTTP/2 and TLS framing are not counted.

Ids are counted in their deployment form. A deployed message's id is its object id (64
hex characters), and a reply points back to it by that id; Flower's simulation gives
messages uuid4 ids (36 characters) instead. The meter counts both ids at 64 characters, so
a simulated run reports what the same run ships when deployed.

Beside the wire size, :meth:`WireMeter.values` counts only the bytes of the array values a
message carries (no ids, metadata, names or config): what the papers count as communication,
so our figures can be set beside theirs like for like.

Content shared by many messages (the same model sent to every client) is measured once:
:class:`WireMeter` caches the size of each content object it has seen, keyed by the
object itself, so a 44 MB model costs one serialization per round, not one per recipient.

Within one message, Flower recomputes an object's id (a serialization and a hash of its whole
subtree) every time a parent asks for it, so a naive count serializes each record five or six
times. :meth:`WireMeter.message` measures inside Flower's own ``no_object_id_recompute``
(what Flower uses when it pushes a message), so each object is serialized for its id once:
the same bytes, counted at a fraction of the driver's CPU. :func:`message_size_uncached`
is the plain count, kept as the tests' oracle.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from flwr.app import Array, Message, RecordDict
from flwr.common.serde import error_to_proto, metadata_to_proto
from flwr.proto.message_pb2 import Message as ProtoMessage  # pylint: disable=no-name-in-module
from flwr.proto.message_pb2 import ObjectTree  # pylint: disable=no-name-in-module
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects, get_object_tree, no_object_id_recompute


def _content_size(content: RecordDict) -> tuple[ObjectTree, int]:
    """(object tree, total deflated bytes) of a RecordDict and everything under it."""
    objects = get_all_nested_objects(content)
    return get_object_tree(content), sum(len(obj.deflate()) for obj in objects.values())


def values_bytes(content: RecordDict) -> int:
    """Bytes of the array values in ``content`` (elements × item size of every Array of every
    ArrayRecord): no framing, not even the serialized array's own header. An array whose
    dtype or shape does not parse (a hostile reply) counts as its serialized bytes."""
    return sum(_array_values(array) for record in content.array_records.values() for array in record.values())


def _array_values(array: Array) -> int:
    try:
        return math.prod(int(d) for d in array.shape) * np.dtype(array.dtype).itemsize
    except Exception:  # numpy raises TypeError, ValueError or even SyntaxError on hostile dtype strings
        return len(array.data)


def _header_size(message: Message) -> int:
    """The message header as it crosses the Fleet link (metadata and error, no content)."""
    proto = ProtoMessage(metadata=metadata_to_proto(message.metadata), error=error_to_proto(message.error) if message.has_error() else None)
    proto.metadata.message_id = message.object_id  # deployment ids are object ids (64 hex)
    return proto.ByteSize()


OBJECT_ID_CHARS = 64  # a deployed message id: the sha256 hex of the message object


def _reply_id_correction(message: Message) -> int:
    """Bytes a reply's ``reply_to_message_id`` adds when deployed, beyond its form here.

    The id is written twice (in the header and in the message object), each with a one-byte
    length prefix for either length."""
    reply_to = message.metadata.reply_to_message_id
    return 2 * (OBJECT_ID_CHARS - len(reply_to)) if reply_to else 0


class WireMeter:
    """Measures messages as shipped; remembers the size of content it has measured."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[RecordDict, ObjectTree, int]] = {}
        self._values: dict[int, tuple[RecordDict, int]] = {}

    def content(self, content: RecordDict) -> tuple[ObjectTree, int]:
        """(object tree, deflated bytes) of ``content``."""
        hit = self._cache.get(id(content))
        if hit is not None and hit[0] is content:
            return hit[1], hit[2]
        tree, size = _content_size(content)
        self._cache[id(content)] = (content, tree, size)
        return tree, size

    def values(self, message: Message) -> int:
        """Bytes of the array values ``message`` carries (0 for an error or empty message);
        called for sent messages and accepted replies only."""
        if message.has_error() or not message.has_content():
            return 0
        hit = self._values.get(id(message.content))
        if hit is not None and hit[0] is message.content:
            return hit[1]
        n = values_bytes(message.content)
        self._values[id(message.content)] = (message.content, n)
        return n

    def message(self, message: Message) -> int:
        """Bytes of ``message`` on the Fleet link (each object's id computed once)."""
        with no_object_id_recompute():
            return _message_size(message, self.content)

    def record_bytes(self, message: Message, name: str) -> int:
        """Bytes ``message`` carries for its record ``name`` (0 if it has none): its size less the size
        it would have without that record. Header and message object keep their size (the content id
        is 64 characters either way); the content objects and the object tree shrink."""
        if message.has_error() or not message.has_content() or name not in message.content:
            return 0
        bare = RecordDict({k: v for k, v in message.content.items() if k != name})
        with no_object_id_recompute():
            full_tree, full = self.content(message.content)
            bare_tree, rest = _content_size(bare)
            with_it = ObjectTree(object_id=message.object_id, children=[full_tree]).ByteSize() + full
            without = ObjectTree(object_id=message.object_id, children=[bare_tree]).ByteSize() + rest
        return with_it - without

    def clear(self) -> None:
        """Forget cached content (call once per round: content is rebuilt every round)."""
        self._cache.clear()
        self._values.clear()


def _message_size(message: Message, content_size: Callable[[RecordDict], tuple[ObjectTree, int]]) -> int:
    """Header, object tree, message object and content objects of ``message``."""
    msg_object = len(message.deflate()) + _reply_id_correction(message)
    if message.has_error() or not message.has_content():
        return _header_size(message) + ObjectTree(object_id=message.object_id).ByteSize() + msg_object
    content_tree, content_bytes = content_size(message.content)
    tree = ObjectTree(object_id=message.object_id, children=[content_tree])
    return _header_size(message) + tree.ByteSize() + msg_object + content_bytes


def message_size_uncached(message: Message) -> int:
    """Bytes of ``message`` on the Fleet link counted the plain way: no cache, every id
    recomputed wherever Flower asks for it (the oracle :meth:`WireMeter.message` must equal)."""
    return _message_size(message, _content_size)
