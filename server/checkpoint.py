"""Round checkpoints: after every finished round the server writes what it needs to continue the
run (its state, the round engine's registry, the recorder's rounds) to
``<results folder>/checkpoints/round-000007.ckpt``, atomically, keeping the last few; a resumed run
loads the newest whole one and is refused when its run config or code differ beyond
:data:`MAY_CHANGE`.

A checkpoint file is a fixed header (magic, format version, payload length, the payload's
SHA-256) and a pickled :class:`Checkpoint`. It is read back with an allow-list unpickler: a file
found in a folder is data, never code, so it may only name plain types, numpy's array
reconstruction and headway's own state dataclasses.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import io
import json
import logging
import os
import pickle
import re
import struct
import tempfile
import time
from dataclasses import dataclass, is_dataclass
from enum import Enum
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import IO, Any

from headway.core.settings import Settings
from headway.strategies.state import ServerState

log = logging.getLogger("headway")

FOLDER = "checkpoints"
MAGIC = b"HWCKPT"
FORMAT = 1
HEADER = struct.Struct(">6sHQ32s")  # magic, format version, payload length, payload SHA-256
NAME = re.compile(r"round-(\d{6,})\.ckpt")
TEMP_SUFFIX = ".tmp"
CHUNK = 1 << 20  # bytes per write call: a large payload is written in pieces
# the packages whose sources the code version hashes: headway and each of its code packages, named,
# not imported (found with find_spec: the server side never imports the client's or the runner's code)
PACKAGES = ("headway", *(f"headway.{name}" for name in ("core", "client", "server", "strategies", "simulation")))

MAY_CHANGE: frozenset[str] = frozenset(
    {
        "num-server-rounds",
        "round-timeout",
        "sample-timeout",
        "checkpoint-keep",
        "resume-dir",
        "results-dir",
        "target-accuracy",
        "tensorboard",
        "mlflow-tracking-uri",
        "ray-address",
        "client-num-cpus",
        "client-num-gpus",
    }
)
"""Run-config keys a resume may change: how long to run, wait, keep and report, and where Ray runs, never what a round computes."""


@dataclass(frozen=True)
class Checkpoint:
    """Everything the server needs to continue a run after round ``round`` (see the module docstring)."""

    round: int  # last finished round; the run continues at round + 1
    state: ServerState[Any]  # the server's state after that round (arrays, method state, sampling stream position)
    engine: dict[str, Any]  # Engine.snapshot(): plain values, restored by Engine.restore()
    pending: dict[str, Any] | None  # a round record still waiting for the next round's carried scores (with-next-train)
    rounds: list[dict[str, Any]]  # the Recorder's round records so far
    run_key: str  # the key the nodes file their saved state under: drawn by the first run's server (OS entropy), kept across resumes
    elapsed: float  # wall seconds the run had used
    config: dict[str, Any]  # Settings.to_config() of the run that wrote it
    code: str  # code_version() of the code that wrote it


@dataclass(frozen=True)
class CheckpointCost:
    """What writing one checkpoint cost: its size on disk, the seconds to pickle and write it, and where
    it went (None when ``checkpoint-keep`` is 0 and nothing was written)."""

    bytes: int
    seconds: float
    path: Path | None


class UnreadableCheckpoint(Exception):
    """A checkpoint file that is not a whole, valid checkpoint; its message says why, in a few words."""


# ---- code version -----------------------------------------------------------------------------


@functools.cache
def code_version() -> str:
    """headway's version and a SHA-256 of its own .py sources (the packages in :data:`PACKAGES`, found
    from where Python imports them, so an editable and a wheel install agree); computed once per process."""
    digest = hashlib.sha256()
    for package in PACKAGES:
        for name, text in _package_sources(package):
            digest.update(f"{name}\0{len(text)}\0".encode())
            digest.update(text)
    return f"{_headway_version()} {digest.hexdigest()}"


def _package_sources(package: str) -> list[tuple[str, bytes]]:
    """(path relative to the package's parent, bytes) of every .py file of ``package``, sorted by path;
    empty when the package is not installed. find_spec locates it without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return []
    # the package's own folder only: in a source tree headway's __path__ also holds the checkout's root
    root = Path(spec.origin).parent
    own = (p for p in root.rglob("*.py") if "__pycache__" not in p.parts)
    if package == "headway":  # its subpackages are hashed as packages of their own
        own = (p for p in root.glob("*.py"))
    return sorted((f"{package}/{path.relative_to(root).as_posix()}", path.read_bytes()) for path in own)


def _headway_version() -> str:
    """The installed headway distribution's version, for humans reading a refusal."""
    try:
        return version("headway")
    except PackageNotFoundError:
        return "unknown"


# ---- file format ------------------------------------------------------------------------------


def encode(ckpt: Checkpoint) -> bytes:
    """``ckpt`` as a checkpoint file's bytes: header, then the pickled checkpoint."""
    payload = pickle.dumps(ckpt, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(MAGIC, FORMAT, len(payload), hashlib.sha256(payload).digest()) + payload


def decode(data: bytes) -> Checkpoint:
    """The checkpoint held in a file's bytes; :class:`UnreadableCheckpoint` saying why they are not one."""
    if len(data) < HEADER.size:
        raise UnreadableCheckpoint(f"truncated: {len(data)} bytes, less than its {HEADER.size}-byte header")
    magic, fmt, length, sha = HEADER.unpack_from(data)
    if magic != MAGIC:
        raise UnreadableCheckpoint("not a headway checkpoint: bad header")
    if fmt != FORMAT:
        raise UnreadableCheckpoint(f"file format {fmt}; this code reads format {FORMAT}")
    whole = HEADER.size + length
    if len(data) < whole:
        raise UnreadableCheckpoint(f"truncated: {len(data)} of {whole} bytes")
    if len(data) > whole:
        raise UnreadableCheckpoint(f"{len(data) - whole} bytes past its end")
    payload = memoryview(data)[HEADER.size :]
    if hashlib.sha256(payload).digest() != sha:
        raise UnreadableCheckpoint("its SHA-256 does not match its contents")
    return _unpickle(payload)


def _unpickle(payload: memoryview) -> Checkpoint:
    """The payload unpickled through :class:`_RestrictedUnpickler`, which must give a :class:`Checkpoint`."""
    try:
        ckpt = _RestrictedUnpickler(io.BytesIO(payload)).load()
    except UnreadableCheckpoint:
        raise
    except Exception as exc:  # a valid digest over a payload this code cannot rebuild: any unpickling error
        raise UnreadableCheckpoint(f"cannot be unpickled: {type(exc).__name__}: {exc}") from exc
    if not isinstance(ckpt, Checkpoint):
        raise UnreadableCheckpoint(f"it holds a {type(ckpt).__name__}, not a Checkpoint")
    return ckpt


_NUMPY = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
}
_PLAIN = {
    ("builtins", name)
    for name in ("set", "frozenset", "complex", "bytearray", "slice", "range", "list", "dict", "tuple", "int", "float", "str", "bool")
} | {("collections", name) for name in ("OrderedDict", "defaultdict", "deque", "Counter")}
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    _PLAIN | _NUMPY | {("headway.strategies.state", "_restored"), ("headway.server.checkpoint", "Checkpoint")}
)
OWN_STATE_PACKAGES = ("headway.core", "headway.strategies")


class _RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`ALLOWED` names and the dataclasses and enums that headway's
    own ``core`` and ``strategies`` modules define; any other name makes the checkpoint unreadable."""

    def find_class(self, module: str, name: str) -> Any:
        """The object ``module.name`` names, when a checkpoint may hold it; UnreadableCheckpoint otherwise."""
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        if "." not in name and module.startswith(tuple(f"{p}." for p in OWN_STATE_PACKAGES)):
            found = super().find_class(module, name)
            if isinstance(found, type) and found.__module__ == module and (is_dataclass(found) or issubclass(found, Enum)):
                return found
        raise UnreadableCheckpoint(f"refused: it names {module}.{name}, which a checkpoint may not hold")


# ---- writing ----------------------------------------------------------------------------------


def checkpoint_name(round_: int) -> str:
    """The file name of round ``round_``'s checkpoint."""
    return f"round-{round_:06d}.ckpt"


def write_checkpoint(out: Path, ckpt: Checkpoint, keep: int) -> CheckpointCost:
    """Write ``ckpt`` into ``out``/checkpoints atomically (a temp file in that folder, written, flushed and
    fsynced, renamed over the round's name, the folder fsynced), then keep only the newest ``keep``;
    ``keep`` = 0 writes nothing. A crash at any point leaves the previous checkpoints as they were."""
    if keep < 1:
        return CheckpointCost(0, 0.0, None)
    start = time.perf_counter()
    folder = Path(out) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    data = encode(ckpt)
    final = folder / checkpoint_name(ckpt.round)
    _write_atomically(folder, final, data)
    _prune(folder, keep, ckpt.round)
    return CheckpointCost(len(data), time.perf_counter() - start, final)


def _write_atomically(folder: Path, final: Path, data: bytes) -> None:
    """``data`` into ``final`` by way of a temp file in ``folder`` (see :func:`write_checkpoint`)."""
    fd, temp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=TEMP_SUFFIX, dir=folder)
    try:
        with os.fdopen(fd, "wb") as fh:
            _write_all(fh, data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, final)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    _fsync_folder(folder)


def _write_all(fh: IO[bytes], data: bytes) -> None:
    """``data`` into ``fh`` in :data:`CHUNK`-byte pieces."""
    view = memoryview(data)
    for at in range(0, len(view), CHUNK):
        fh.write(view[at : at + CHUNK])


def _fsync_folder(folder: Path) -> None:
    """Make a rename or deletion in ``folder`` durable (a file's fsync does not cover its directory entry)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(folder: Path, keep: int, newest: int) -> None:
    """Delete all but the ``keep`` newest checkpoints up to round ``newest``, and any after it: those belong
    to a run that was killed and resumed from an earlier round, and would otherwise be loaded first."""
    found = checkpoint_files(folder)
    stale = [path for round_, path in found if round_ > newest] + [path for round_, path in found if round_ <= newest][keep:]
    for path in stale:
        path.unlink(missing_ok=True)
    if stale:
        _fsync_folder(folder)


# ---- reading ----------------------------------------------------------------------------------


def checkpoint_files(folder: Path) -> list[tuple[int, Path]]:
    """(round, path) of every checkpoint file in ``folder``, newest first; other files are not counted."""
    if not folder.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := NAME.fullmatch(p.name)) and p.is_file()]
    return sorted(found, reverse=True)


def load_checkpoint(out: Path) -> Checkpoint | None:
    """The newest whole checkpoint in ``out``/checkpoints, None when there is none. An unreadable one
    (truncated, a wrong digest, a bad header, a payload that cannot or may not be unpickled) is
    skipped with one warning line naming why and the one tried next; leftover temp files are removed."""
    folder = Path(out) / FOLDER
    _remove_temp_files(folder)
    found = checkpoint_files(folder)
    for i, (round_, path) in enumerate(found):
        try:
            return read_checkpoint(path, round_)
        except UnreadableCheckpoint as why:
            after = f"falling back to {found[i + 1][1].name}" if i + 1 < len(found) else "no earlier checkpoint to fall back to"
            log.warning("checkpoint %s is unreadable (%s); %s", path.name, why, after)
    return None


def read_checkpoint(path: Path, round_: int) -> Checkpoint:
    """The checkpoint in ``path``, which its name says is of round ``round_``; UnreadableCheckpoint saying why not."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UnreadableCheckpoint(f"cannot be read: {exc.strerror or exc}") from exc
    ckpt = decode(data)
    if ckpt.round != round_:
        raise UnreadableCheckpoint(f"it holds round {ckpt.round}, not the {round_} its name says")
    return ckpt


def _remove_temp_files(folder: Path) -> None:
    """Delete the temp files of writes that never finished (a process killed while writing)."""
    if folder.is_dir():
        for path in folder.iterdir():
            if path.name.endswith(TEMP_SUFFIX) and path.is_file():
                path.unlink(missing_ok=True)


# ---- may this run resume from it --------------------------------------------------------------


def resume_problem(ckpt: Checkpoint, settings: Settings, where: Path | str | None = None) -> str | None:
    """One line saying why a run with ``settings`` cannot continue from ``ckpt`` (read from ``where``):
    the code changed, run-config keys beyond :data:`MAY_CHANGE` differ, or num-server-rounds ends
    before the checkpoint's round; None when it can."""
    problems = [p for p in (_code_problem(ckpt), _config_problem(ckpt, settings), _rounds_problem(ckpt, settings)) if p]
    if not problems:
        return None
    prefix = "cannot resume" if where is None else f"cannot resume from {where}"
    return f"{prefix}: {'; and '.join(problems)}"


def _code_problem(ckpt: Checkpoint) -> str | None:
    """What differs between the code that wrote ``ckpt`` and this process's, or None."""
    now = code_version()
    if ckpt.code == now:
        return None
    return (
        f"the code changed since the checkpoint was written ({_short_version(ckpt.code)}, now {_short_version(now)}): "
        "resume with the code that wrote it, or start a new run"
    )


def _short_version(code: str) -> str:
    """A code_version() for a message: 'headway 0.1.0 digest 3fa9c12b0e1d…'."""
    ver, _, digest = code.partition(" ")
    return f"headway {ver} digest {digest[:12]}…"


def _config_problem(ckpt: Checkpoint, settings: Settings) -> str | None:
    """The run-config keys outside :data:`MAY_CHANGE` whose values differ, each with both values, or None."""
    now = settings.to_config()
    keys = list(ckpt.config) + [k for k in now if k not in ckpt.config]
    differ = [k for k in keys if k not in MAY_CHANGE and (k not in ckpt.config or k not in now or ckpt.config[k] != now[k])]
    if not differ:
        return None
    changes = "; ".join(f"'{k}' was {_shown(ckpt.config, k)}, now {_shown(now, k)}" for k in differ)
    noun = "run-config key" if len(differ) == 1 else "run-config keys"
    return f"{noun} {changes} (only {', '.join(sorted(MAY_CHANGE))} may change on resume)"


def _shown(config: dict[str, Any], key: str) -> str:
    """``config``'s value of ``key`` as the run config would write it, or that it has none."""
    return json.dumps(config[key], default=repr) if key in config else "absent"


def _rounds_problem(ckpt: Checkpoint, settings: Settings) -> str | None:
    """That num-server-rounds ends before the checkpoint's round, or None."""
    if settings.num_server_rounds >= ckpt.round:
        return None
    return f"the checkpoint is after round {ckpt.round}; num-server-rounds={settings.num_server_rounds} would end before it"
