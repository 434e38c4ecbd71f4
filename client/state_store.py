"""A client's local state (``context.state``: bodies, heads, counters) kept on the node's
disk, so a SuperNode that restarts, and so rejoins under a new node id with an empty
state, picks up where it stopped instead of from the seed; and so a resumed run (issue 40)
finds the state its nodes had at the checkpoint it continues from.

On when the SuperNode's node config names a ``state-dir`` (``headway supernode
--state-dir``), or in simulation when the runner gives :func:`headway.client.app.build_client_app`
one. The folder is keyed by the run's lineage key (a random token the run's server draws and
sends in every registration query, the same after a resume: only that server can name the
state; before a registration, this run's id or its pointer file) and the partition id, and holds
VERSIONS: the state after each message the client answered, tagged with that message's
position (round, then query < train < evaluate). A client with an empty state restores the
newest version strictly before the position of the message it answers, so a resumed round
never sees what the killed run wrote in that round. The state is saved before the reply is
sent, so a node that dies in between resumes one message ahead of what the server received
(harmless for local training). Old runs' folders are not removed.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import ConfigRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
from headway.client.secure_aggregation import SESSION
from headway.core import protocol as P

log = logging.getLogger("headway")

VOLATILE = (SESSION,)  # never on disk: a secure-aggregation round's secrets
STORE_RECORD = "state-store"  # in the state itself: how often it was restored from disk
LINEAGE_RECORD = "headway-lineage"  # in the state itself: the lineage key a resumed server gave (P.LINEAGE)
# versions kept: a killed run can only have written positions within the round after its last checkpoint, at most
# three (query, train, evaluate); the fourth is the last of the round before, which a resume of that round restores
KEEP = 4

PHASE_RANK = {"query": 0, "train": 1, "evaluate": 2}  # order of a round's messages; every train stage shares one position
Position = tuple[int, int]  # (server round, PHASE_RANK of the message kind)
_VERSION = re.compile(r"round-(\d+)-(query|train|evaluate)\.state")
_KEY = re.compile(r"[0-9a-f]{32}")  # a run key as a headway server draws it (secrets.token_hex(16))


def position(server_round: int, kind: str) -> Position:
    """The position of a ``kind`` message (query, train, evaluate) of ``server_round`` in a run's timeline."""
    return (int(server_round), PHASE_RANK[kind])


def state_root(node_config: Mapping[str, Any], state_dir: Path | None = None) -> Path | None:
    """The folder of this node's saved states: its node config's ``state-dir``, else ``state_dir``
    (simulation), else None (nothing on disk)."""
    folder = str(node_config.get("state-dir", "") or "")
    return Path(folder) if folder else state_dir


def state_folder(root: Path | None, key: str | None, partition_id: int | str) -> Path | None:
    """Where one client's versions live: ``root/run-KEY/partition-ID``; None without a root or a run key."""
    return None if root is None or key is None else root / f"run-{key}" / f"partition-{partition_id}"


def check_lineage(key: object) -> str:
    """A run key from a registration query, checked: it names a folder and must be one a server drew
    (32 hex digits), never a run id anyone can list nor a name that collides with a pointer file (ValueError otherwise)."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise ValueError(f"the registration's {P.LINEAGE} {str(key)[:80]!r} is not a run key (32 lowercase hex digits)")
    return key


def lineage_key(state: RecordDict, root: Path | None, run_id: int, received: object = None) -> str | None:
    """The key this client's store is filed under: ``received`` (the server's ``P.LINEAGE``, then kept
    in ``state`` and, under ``root``, in a pointer file from this run's id so a node restarted within
    the run finds it), else the one kept, else the pointer's; None before any (nothing on disk then:
    filing under the public run id would let another run plant state there)."""
    if received is not None:
        key = check_lineage(received)
        state[LINEAGE_RECORD] = ConfigRecord({P.LINEAGE: key})
        if root is not None:
            _write_pointer(root / f"run-{run_id}.lineage", key)
        return key
    if LINEAGE_RECORD in state.config_records:
        return str(state.config_records[LINEAGE_RECORD][P.LINEAGE])
    pointer = None if root is None else root / f"run-{run_id}.lineage"
    if pointer is not None and pointer.is_file():
        try:
            return check_lineage(pointer.read_text().strip())
        except ValueError as exc:
            log.error(
                "the lineage pointer %s is unreadable (%s); no saved state is used until the server registers this node", pointer, exc
            )
    return None


def _write_pointer(path: Path, key: str) -> None:
    """Record ``key`` at ``path`` (atomically), unless it is there already."""
    if path.is_file() and path.read_text().strip() == key:
        return
    _write_atomic(path, key.encode())


def save_state(state: RecordDict, path: Path) -> None:
    """Write ``state`` (less its VOLATILE records) to ``path`` atomically and durably (a crash or
    power loss leaves the previous file whole)."""
    _write_atomic(path, state_bytes(state))


def state_bytes(state: RecordDict) -> bytes:
    """What is saved of ``state``: all but its VOLATILE records, serialized."""
    kept = RecordDict({name: record for name, record in state.items() if name not in VOLATILE})
    return recorddict_to_proto(kept).SerializeToString()


def _write_atomic(path: Path, data: bytes) -> None:
    """Temp file in the same folder, write, flush, fsync, rename over ``path``, fsync the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
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


def version_path(folder: Path, pos: Position) -> Path:
    """The file of the version at ``pos`` in ``folder``."""
    kind = next(k for k, rank in PHASE_RANK.items() if rank == pos[1])
    return folder / f"round-{pos[0]:06d}-{kind}.state"


def versions(folder: Path) -> list[tuple[Position, Path]]:
    """The versions saved in ``folder``, oldest first (temp files and set-aside ones are not versions)."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _VERSION.fullmatch(path.name)
        if match:
            found.append((position(int(match[1]), match[2]), path))
    return sorted(found)


def save_version(state: RecordDict, folder: Path, pos: Position, keep: int = KEEP) -> Path:
    """Save ``state`` as the version at ``pos`` (replacing one there), drop versions after ``pos``
    (a killed run's abandoned future) and all but the newest ``keep``; the path that holds it. A state
    equal to the newest version at or before ``pos`` is not written again (an evaluation leaves most
    states as training left them): the newest version before any later message is then that one."""
    data = state_bytes(state)
    saved = versions(folder)
    for at, old in saved:
        if at > pos:
            old.unlink(missing_ok=True)
    earlier = [v for v in saved if v[0] <= pos]
    if earlier and _same_bytes(earlier[-1][1], data):
        return earlier[-1][1]
    path = version_path(folder, pos)
    _write_atomic(path, data)
    for _, old in [*(v for v in earlier if v[0] < pos), (pos, path)][:-keep]:
        old.unlink(missing_ok=True)
    return path


def _same_bytes(path: Path, data: bytes) -> bool:
    """Whether the file at ``path`` holds exactly ``data`` (False when it cannot be read)."""
    try:
        return path.stat().st_size == len(data) and path.read_bytes() == data
    except OSError:
        return False


def is_fresh(state: RecordDict) -> bool:
    """True when ``state`` holds nothing of the client's own (at most the lineage key it was given)."""
    return all(name == LINEAGE_RECORD for name in state)


def restore_state(state: RecordDict, folder: Path, before: Position) -> bool:
    """Fill a fresh ``state`` (:func:`is_fresh`) from the newest readable version in ``folder``
    strictly before position ``before``, and count the restore in it (``STORE_RECORD``); True if
    one was restored. An unreadable version is moved aside (one error line) and the one before it tried."""
    if not is_fresh(state):
        return False
    for at, path in reversed(versions(folder)):
        if at >= before:
            continue
        saved = _read_version(path)
        if saved is None:
            continue
        if not len(saved):
            return False
        _fill(state, saved, path)
        return True
    return False


def _read_version(path: Path) -> RecordDict | None:
    """The version at ``path``, or None when it is unreadable (then moved to ``*.corrupt``)."""
    try:
        return load_state(path)
    except Exception as exc:  # truncated or foreign bytes: keep them aside and try the version before
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        log.error(
            "the saved client state %s is unreadable (%s: %s); moved to %s, trying the version before", path, type(exc).__name__, exc, aside
        )
        return None


def _fill(state: RecordDict, saved: RecordDict, path: Path) -> None:
    """Copy ``saved`` into ``state`` and count the restore."""
    for name, record in saved.items():
        if name != LINEAGE_RECORD or LINEAGE_RECORD not in state:  # the key just received wins over the one saved
            state[name] = record
    restores = P.as_int(state.config_records.get(STORE_RECORD, ConfigRecord()).get("restores", 0)) + 1
    state[STORE_RECORD] = ConfigRecord({"restores": restores})
    log.warning("restored the client's local state from %s (restore %d): this node restarted or its run resumed", path, restores)
