"""A client's local state (``context.state``: bodies, heads, counters) kept on the node's
disk, so a SuperNode that restarts, and so rejoins under a new node id with an empty
state, picks up where it stopped instead of from the seed.

On when the SuperNode's node config names a ``state-dir`` (``server.launch supernode
--state-dir``); the file is keyed by run id and partition id, written atomically after
every message the client answered.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from flwr.app import RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

log = logging.getLogger("headway")


def state_path(node_config: Mapping[str, Any], run_id: int, partition_id: int) -> Path | None:
    """Where this client's state lives, or None when the node keeps none on disk."""
    folder = str(node_config.get("state-dir", "") or "")
    return Path(folder) / f"run-{run_id}" / f"partition-{partition_id}.state" if folder else None


def save_state(state: RecordDict, path: Path) -> None:
    """Write ``state`` to ``path`` atomically (a crash leaves the previous file whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = recorddict_to_proto(state).SerializeToString()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def restore_state(state: RecordDict, path: Path) -> bool:
    """Fill an empty ``state`` from ``path``; True if there was a saved state to restore."""
    if len(state) or not path.is_file():
        return False
    proto = ProtoRecordDict()
    proto.ParseFromString(path.read_bytes())
    for name, record in recorddict_from_proto(proto).items():
        state[name] = record
    log.info("restored this client's local state from %s", path)
    return True
