"""Round checkpoint files (server/checkpoint.py): a real ServerState through the allow-list unpickler,
payloads that name other code refused, cut or flipped files never read as valid (the previous one
is loaded instead), pruning, a writer killed by SIGKILL in mid-write, and the resume refusals."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from headway.core.settings import SCHEMA, Settings
from headway.server import checkpoint as C
from headway.server.checkpoint import (
    HEADER,
    MAY_CHANGE,
    Checkpoint,
    code_version,
    load_checkpoint,
    resume_problem,
    write_checkpoint,
)
from headway.strategies.arrays import to_numpy, to_record
from headway.strategies.fedlog import FedLogState
from headway.strategies.fedprof import FedProfClientState, FedProfState, Validation
from headway.strategies.state import ServerState

from tests.conftest import ROOT


def fedlog_state() -> ServerState[FedLogState]:
    """A FedLog server state as a round leaves it: a float32 head sent to clients, float64 η and Φ, and a sampling stream position."""
    rng = np.random.default_rng(7)
    rng.random(5)
    eta = rng.normal(size=(10, 51))
    arrays = to_record({"head.weight": eta[:, 1:].astype(np.float32), "head.bias": eta[:, 0].astype(np.float32), "steps": np.array(3)})
    method = FedLogState(eta=eta, phi_sum=rng.normal(size=(10, 51)), solve_seconds=(0.25, 0.5))
    return ServerState(arrays, method, dict(rng.bit_generator.state))


def fedprof_state() -> ServerState[FedProfState]:
    """A FedProf server state: nested dataclasses keyed by partition id, numpy values inside them."""
    clients = {3: FedProfClientState(profile=np.ones((4, 2)), version=2, div=0.5, asked=2, misses=1, n=40)}
    method = FedProfState(version=2, baselines={2: np.zeros((4, 2))}, units=4, clients=clients, selections={3: 2})
    method = dataclasses.replace(method, validation=Validation(np.arange(12, dtype=np.float32).reshape(3, 4), "mnist", 3))
    return ServerState(to_record({"w": np.arange(6.0).reshape(2, 3)}), method, None)


def make(round_: int = 1, state: ServerState[Any] | None = None, **changes: Any) -> Checkpoint:
    """A checkpoint after ``round_`` of a default run, written by this code."""
    ckpt = Checkpoint(
        round=round_,
        state=fedlog_state() if state is None else state,
        engine={"registry": {0: {"body": "mnist-cnn", "node": 2**63 + 5, "last": round_, "streak": 0}}, "refused": []},
        pending=None,
        rounds=[{"round": r, "accuracy": 0.5 + r / 100, "bytes_down": 100 * r, "bytes_up": 50 * r} for r in range(1, round_ + 1)],
        run_key="1234567890",
        elapsed=3.5 * round_,
        config=Settings().to_config(),
        code=code_version(),
    )
    return dataclasses.replace(ckpt, **changes)


def folder_of(out: Path) -> Path:
    """The checkpoints folder of results folder ``out``."""
    return out / C.FOLDER


def names(out: Path) -> list[str]:
    """The files in ``out``'s checkpoints folder, sorted."""
    return sorted(p.name for p in folder_of(out).iterdir())


def raw_file(payload: bytes) -> bytes:
    """A checkpoint file around ``payload`` with a valid header and digest: what decides is the unpickler."""
    return HEADER.pack(C.MAGIC, C.FORMAT, len(payload), hashlib.sha256(payload).digest()) + payload


# ---- round trip ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [fedlog_state(), fedprof_state()], ids=["fedlog", "fedprof"])
def test_a_server_state_comes_back_whole_through_the_restricted_unpickler(tmp_path: Path, state: ServerState[Any]) -> None:
    cost = write_checkpoint(tmp_path, make(4, state), keep=3)
    assert cost.path == folder_of(tmp_path) / "round-000004.ckpt" and cost.bytes == cost.path.stat().st_size and cost.seconds > 0

    back = load_checkpoint(tmp_path)

    assert back is not None and back.round == 4
    before, after = to_numpy(state.arrays), to_numpy(back.state.arrays)
    assert list(before) == list(after)
    assert all(
        before[k].dtype == after[k].dtype and before[k].shape == after[k].shape and before[k].tobytes() == after[k].tobytes()
        for k in before
    )
    assert pickle.dumps(back.state.method) == pickle.dumps(state.method)  # every field, nested arrays included, byte for byte
    assert back.state.sampling == state.sampling
    assert all(getattr(back, f.name) == getattr(make(4, state), f.name) for f in dataclasses.fields(Checkpoint) if f.name != "state")


def test_a_restored_sampling_stream_draws_what_the_unbroken_one_draws(tmp_path: Path) -> None:
    state = fedlog_state()
    write_checkpoint(tmp_path, make(2, state), keep=3)
    back = load_checkpoint(tmp_path)
    assert back is not None and back.state.sampling is not None and state.sampling is not None

    unbroken, resumed = np.random.default_rng(), np.random.default_rng()
    unbroken.bit_generator.state = state.sampling
    resumed.bit_generator.state = back.state.sampling
    assert np.array_equal(unbroken.permutation(50), resumed.permutation(50))


# ---- payloads that are not ours -----------------------------------------------------------------


class Runs:
    """An object whose pickle calls ``target(*args)`` when loaded: what a hostile checkpoint would hold."""

    def __init__(self, target: Any, *args: Any):
        self.target, self.args = target, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.target, self.args)


@pytest.mark.parametrize(
    ("target", "named"),
    [(os.system, f"{os.system.__module__}.system"), (eval, "builtins.eval"), (subprocess.call, "subprocess.call")],
    ids=["os.system", "eval", "subprocess"],
)
def test_a_payload_that_names_other_code_is_refused_and_never_run(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, target: Any, named: str
) -> None:
    marker = tmp_path / "ran"
    write_checkpoint(tmp_path, make(1), keep=3)
    args = {os.system: (f"touch {marker}",), eval: (f"open({str(marker)!r}, 'w')",), subprocess.call: (["touch", str(marker)],)}[target]
    hostile = dataclasses.replace(make(2), engine={"registry": Runs(target, *args)})
    (folder_of(tmp_path) / "round-000002.ckpt").write_bytes(raw_file(pickle.dumps(hostile)))

    with caplog.at_level(logging.WARNING, logger="headway"):
        back = load_checkpoint(tmp_path)

    assert back is not None and back.round == 1
    assert not marker.exists()
    assert caplog.messages == [
        f"checkpoint round-000002.ckpt is unreadable (refused: it names {named}, which a checkpoint may not hold); "
        "falling back to round-000001.ckpt"
    ]


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("headway.strategies.engine", "Engine"),
        ("headway.strategies.state", "ServerState.advance"),
        ("headway.strategies.fedlog", "np"),
        ("headway.core.fedlog", "solve_head"),
    ],
    ids=["non-dataclass class", "dotted name", "re-exported module", "function"],
)
def test_only_dataclasses_and_enums_of_our_own_state_packages_are_rebuilt(module: str, name: str) -> None:
    payload = b"\x80\x04c" + f"{module}\n{name}\n".encode() + b"."
    with pytest.raises(C.UnreadableCheckpoint, match="refused: it names"):
        C.decode(raw_file(payload))


def test_a_payload_that_is_not_a_checkpoint_is_unreadable() -> None:
    with pytest.raises(C.UnreadableCheckpoint, match="it holds a dict, not a Checkpoint"):
        C.decode(raw_file(pickle.dumps({"round": 3})))


# ---- cut and flipped files ----------------------------------------------------------------------


def whole_file(tmp_path: Path, round_: int) -> tuple[Path, bytes]:
    """Checkpoints of rounds 1..``round_`` written; the newest one's path and bytes."""
    for r in range(1, round_ + 1):
        write_checkpoint(tmp_path, make(r), keep=5)
    path = folder_of(tmp_path) / C.checkpoint_name(round_)
    return path, path.read_bytes()


@pytest.mark.parametrize("cut", ["empty", "in the header", "after the header", "middle", "last byte"])
def test_a_truncated_checkpoint_is_never_read_and_the_previous_one_is(tmp_path: Path, caplog: pytest.LogCaptureFixture, cut: str) -> None:
    path, data = whole_file(tmp_path, 3)
    at = {"empty": 0, "in the header": 10, "after the header": HEADER.size, "middle": len(data) // 2, "last byte": len(data) - 1}[cut]
    path.write_bytes(data[:at])

    with caplog.at_level(logging.WARNING, logger="headway"):
        back = load_checkpoint(tmp_path)

    assert back is not None and back.round == 2
    expected = (
        f"truncated: {at} bytes, less than its {HEADER.size}-byte header" if at < HEADER.size else f"truncated: {at} of {len(data)} bytes"
    )
    assert caplog.messages == [f"checkpoint round-000003.ckpt is unreadable ({expected}); falling back to round-000002.ckpt"]


@pytest.mark.parametrize(
    ("where", "why"),
    [
        ("payload", "its SHA-256 does not match its contents"),
        ("digest", "its SHA-256 does not match its contents"),
        ("magic", "not a headway checkpoint: bad header"),
        ("length", "truncated"),
    ],
)
def test_a_flipped_byte_falls_back_to_the_previous_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, where: str, why: str
) -> None:
    path, data = whole_file(tmp_path, 3)
    at = {"payload": HEADER.size + (len(data) - HEADER.size) // 2, "digest": HEADER.size - 1, "magic": 0, "length": 8}[where]
    flipped = bytearray(data)
    flipped[at] ^= 0x01 if where != "length" else 0x10
    path.write_bytes(bytes(flipped))

    with caplog.at_level(logging.WARNING, logger="headway"):
        back = load_checkpoint(tmp_path)

    assert back is not None and back.round == 2
    assert len(caplog.messages) == 1 and why in caplog.messages[0] and caplog.messages[0].endswith("falling back to round-000002.ckpt")


def test_bytes_past_the_end_and_a_renamed_file_are_unreadable(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, data = whole_file(tmp_path, 2)
    path.write_bytes(data + b"x")
    os.replace(folder_of(tmp_path) / "round-000001.ckpt", folder_of(tmp_path) / "round-000004.ckpt")

    with caplog.at_level(logging.WARNING, logger="headway"):
        assert load_checkpoint(tmp_path) is None

    assert caplog.messages == [
        "checkpoint round-000004.ckpt is unreadable (it holds round 1, not the 4 its name says); falling back to round-000002.ckpt",
        "checkpoint round-000002.ckpt is unreadable (1 bytes past its end); no earlier checkpoint to fall back to",
    ]


def test_no_checkpoints_folder_is_no_checkpoint(tmp_path: Path) -> None:
    assert load_checkpoint(tmp_path) is None


# ---- pruning and leftovers ----------------------------------------------------------------------


def test_only_the_last_keep_checkpoints_stay(tmp_path: Path) -> None:
    for r in range(1, 7):
        write_checkpoint(tmp_path, make(r), keep=2)
    assert names(tmp_path) == ["round-000005.ckpt", "round-000006.ckpt"]
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and loaded.round == 6


def test_keep_zero_writes_nothing(tmp_path: Path) -> None:
    cost = write_checkpoint(tmp_path, make(1), keep=0)
    assert cost == C.CheckpointCost(0, 0.0, None) and not folder_of(tmp_path).exists()


def test_checkpoints_after_the_round_written_belong_to_an_abandoned_run_and_go(tmp_path: Path) -> None:
    """A run resumed from round 2 (3 and 4 unreadable) that writes round 3 must not leave the old round 4 to be loaded next."""
    for r in range(1, 5):
        write_checkpoint(tmp_path, make(r), keep=5)
    write_checkpoint(tmp_path, make(3, run_key="resumed"), keep=5)
    assert names(tmp_path) == ["round-000001.ckpt", "round-000002.ckpt", "round-000003.ckpt"]
    loaded = load_checkpoint(tmp_path)
    assert loaded is not None and loaded.run_key == "resumed"


def test_leftover_temp_files_are_ignored_and_removed(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    write_checkpoint(tmp_path, make(1), keep=3)
    (folder_of(tmp_path) / ".round-000002.ckpt.abc123.tmp").write_bytes(C.encode(make(2))[:100])
    (folder_of(tmp_path) / "notes.txt").write_text("a user's file")

    with caplog.at_level(logging.WARNING, logger="headway"):
        back = load_checkpoint(tmp_path)

    assert back is not None and back.round == 1 and caplog.messages == []
    assert names(tmp_path) == ["notes.txt", "round-000001.ckpt"]


# ---- a writer killed in mid-write ---------------------------------------------------------------

SLOW_WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import numpy as np
    from headway.server import checkpoint as C
    from headway.strategies.arrays import to_record
    from tests.test_checkpoint import make, fedlog_state
    import dataclasses

    real_write_all = C._write_all

    class Slow:
        # a file whose every piece is flushed to disk and then waits, so the test sees a write in progress
        def __init__(self, fh):
            self.fh = fh
        def write(self, piece):
            self.fh.write(piece)
            self.fh.flush()
            time.sleep(0.02)

    C.CHUNK = 1 << 16
    C._write_all = lambda fh, data: real_write_all(Slow(fh), data)
    big = dataclasses.replace(fedlog_state(), arrays=to_record({"w": np.ones((1 << 20,), np.float64)}))
    C.write_checkpoint(Path(sys.argv[1]), make(2, big), keep=3)
    print("finished", flush=True)
    """
)


def test_a_writer_killed_by_sigkill_mid_write_leaves_the_previous_checkpoint_loaded(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, make(1), keep=3)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_WRITER, str(tmp_path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        temp = wait_for_partial_temp(folder_of(tmp_path), proc)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL, err.decode()
    assert b"finished" not in out
    assert temp.exists() and not (folder_of(tmp_path) / "round-000002.ckpt").exists()

    back = load_checkpoint(tmp_path)

    assert back is not None and back.round == 1
    assert names(tmp_path) == ["round-000001.ckpt"]


def wait_for_partial_temp(folder: Path, proc: subprocess.Popen[bytes]) -> Path:
    """The temp file of the write ``proc`` is in the middle of, once it holds its header and some payload."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1].decode()
        temps = [p for p in folder.iterdir() if p.name.endswith(C.TEMP_SUFFIX)]
        if temps and temps[0].stat().st_size > HEADER.size + (1 << 18):
            return temps[0]
        time.sleep(0.02)
    raise AssertionError("the writer never got half way")


# ---- resume refusals ----------------------------------------------------------------------------


def test_the_same_run_resumes() -> None:
    assert resume_problem(make(5), Settings()) is None


def test_one_changed_key_is_named_with_both_values(tmp_path: Path) -> None:
    line = resume_problem(make(5), dataclasses.replace(Settings(), lr=0.02), tmp_path)
    assert line is not None and "\n" not in line
    assert line.startswith(f"cannot resume from {tmp_path}: run-config key 'lr' was 0.001, now 0.02 (only ")
    assert line.endswith(" may change on resume)") and "num-server-rounds" in line


def test_several_changed_keys_are_all_named_in_one_line() -> None:
    settings = dataclasses.replace(Settings(), lr=0.02, seed=3, dataset="fashion-mnist")
    line = resume_problem(make(5), settings)
    assert line is not None and "\n" not in line
    assert "run-config keys 'dataset' was \"mnist\", now \"fashion-mnist\"; 'lr' was 0.001, now 0.02; 'seed' was 0, now 3 (only" in line


def test_a_method_key_that_changed_is_named() -> None:
    settings = dataclasses.replace(Settings(), fedlog=dataclasses.replace(Settings().fedlog, epsilon=2.0))
    line = resume_problem(make(5), settings)
    assert line is not None and "'fedlog-epsilon' was 1.0, now 2.0" in line


def test_a_code_change_is_refused() -> None:
    line = resume_problem(make(5, code="0.0.9 " + "ab" * 32), Settings())
    assert line == (
        "cannot resume: the code changed since the checkpoint was written (headway 0.0.9 digest abababababab…, now headway "
        f"{code_version().split()[0]} digest {code_version().split()[1][:12]}…): resume with the code that wrote it, or start a new run"
    )


def test_num_server_rounds_before_the_checkpoint_is_refused() -> None:
    line = resume_problem(make(7), dataclasses.replace(Settings(), num_server_rounds=5))
    assert line == "cannot resume: the checkpoint is after round 7; num-server-rounds=5 would end before it"
    assert resume_problem(make(7), dataclasses.replace(Settings(), num_server_rounds=7)) is None


@pytest.mark.parametrize(
    "change",
    [{"num_server_rounds": 200}, {"round_timeout": 30.0}, {"checkpoint_keep": 0}, {"resume_dir": "results/x"}, {"tensorboard": False}],
    ids=lambda c: next(iter(c)),
)
def test_a_key_that_may_change_is_accepted(change: dict[str, Any]) -> None:
    assert resume_problem(make(7), dataclasses.replace(Settings(), **change)) is None


def test_may_change_names_only_schema_keys_and_nothing_a_round_computes() -> None:
    assert MAY_CHANGE.issubset(SCHEMA)
    assert not MAY_CHANGE & {"seed", "lr", "algorithm", "dataset", "num-clients", "fraction-train", "device", "eval-every", "min-replies"}


# ---- code version -------------------------------------------------------------------------------


def test_code_version_is_the_version_and_a_digest_computed_once() -> None:
    ver, digest = code_version().split(" ")
    assert ver and len(digest) == 64 and int(digest, 16) >= 0
    assert code_version() is code_version()


def test_code_version_follows_the_sources_and_nothing_else(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "a40_probe_pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "m.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(C, "PACKAGES", ("a40_probe_pkg",))
    compute = C.code_version.__wrapped__
    first = compute()

    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "m.cpython-311.pyc").write_bytes(b"\x00")
    (package / "notes.txt").write_text("not source")
    assert compute() == first
    (package / "sub" / "m.py").write_text("X = 2\n")
    assert compute() != first
