"""A client's local state (``context.state``: bodies, heads, counters) kept on the node's
disk, so a SuperNode that restarts, and so rejoins under a new node id with an empty
state, picks up where it stopped instead of from the seed.

On when the SuperNode's node config names a ``state-dir`` (``headway supernode
--state-dir``); the file is keyed by run id and partition id, written atomically after
every message the client answered that left something in its state. The state is saved
before the reply is sent, so a node that dies in between resumes one message ahead of what
the server received (harmless for local training). Old runs' folders are not removed.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

from client.secure_aggregation import SESSION
from core import protocol as P

log = logging.getLogger("headway")

VOLATILE = (SESSION,)  # never on disk: a secure-aggregation round's secrets
STORE_RECORD = "state-store"  # in the state itself: how often it was restored from disk


def state_path(node_config: Mapping[str, Any], run_id: int, partition_id: int | str) -> Path | None:
    """Where this client's state lives, or None when the node keeps none on disk."""
    folder = str(node_config.get("state-dir", "") or "")
    return Path(folder) / f"run-{run_id}" / f"partition-{partition_id}.state" if folder else None


def save_state(state: RecordDict, path: Path) -> None:
    """Write ``state`` to ``path`` atomically and durably (a crash or power loss leaves the
    previous file whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    kept = RecordDict({name: record for name, record in state.items() if name not in VOLATILE})
    data = recorddict_to_proto(kept).SerializeToString()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # on disk before it replaces the last good file
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_state(path: Path) -> RecordDict:
    """The state saved at ``path``."""
    proto = ProtoRecordDict()
    proto.ParseFromString(path.read_bytes())
    return recorddict_from_proto(proto)


def restore_state(state: RecordDict, path: Path) -> bool:
    """Fill an empty ``state`` from ``path`` and count the restore in it (``STORE_RECORD``);
    True if there was a saved state to restore."""
    if len(state) or not path.is_file():
        return False
    try:
        saved = load_state(path)
    except Exception as exc:  # truncated or foreign bytes: keep them aside and start from the seed
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        log.error(
            "the saved client state %s is unreadable (%s: %s); moved to %s, starting from the seed", path, type(exc).__name__, exc, aside
        )
        return False
    if not len(saved):
        return False
    for name, record in saved.items():
        state[name] = record
    restores = P.as_int(state.config_records.get(STORE_RECORD, ConfigRecord()).get("restores", 0)) + 1
    state[STORE_RECORD] = ConfigRecord({"restores": restores})
    log.warning("this SuperNode restarted: restored the client's local state from %s (restore %d)", path, restores)
    return True
