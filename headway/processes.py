"""Run one of Flower's commands as a supervised child and stop it together with everything
it spawned.

Flower's SuperLink starts its ServerApp in a new session (its own process group) and a
SuperNode starts a SuperExec that starts ClientApps, so neither a PID nor a process group
covers a deployment's processes. The supervisor makes itself a *child subreaper*: whatever
its descendants leave behind is re-parented to it instead of init, so one walk of the
process tree finds them all, and it stops them on SIGTERM, SIGINT or SIGHUP, and when
Flower's command exits. The subreaper is Linux only (prctl); elsewhere it falls back to the
child's process group. The process tree is read with psutil.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import psutil

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def _prctl(option: int, value: int) -> bool:
    """Call prctl(2); False where it does not exist (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(option, value, 0, 0, 0) == 0


def _die_with_parent() -> None:
    """In the child, before exec: receive SIGTERM when the supervisor dies (even by SIGKILL)."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # someone else's process: it exists
        return True


def _live_children(pid: int) -> list[psutil.Process]:
    """Live (not zombie) descendants of ``pid``; empty if it is gone."""
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [p for p in procs if running(p.pid)]


def descendants(pid: int) -> list[int]:
    """PIDs of the live descendants of ``pid`` (zombies excluded)."""
    return [p.pid for p in _live_children(pid)]


def _reap() -> None:
    """Collect exited children (ours, or orphans handed to us as subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal_all(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` s for ``pids`` to exit (reaping what is ours); those left."""
    deadline = time.monotonic() + timeout
    while True:
        _reap()
        left = [p for p in pids if running(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.1)


def stop_descendants(grace: float = 10.0) -> list[int]:
    """Stop every descendant of this process in two waves: first what Flower's command
    started (ServerApp, SuperExec, ClientApps), which may still need the command to finish
    cleanly, then everything left; each wave gets SIGTERM, and SIGKILL after ``grace``
    seconds. Returns the PIDs that had to be killed."""
    me = os.getpid()
    killed: list[int] = []
    for apps_only in (True, False):
        pids = [p.pid for p in _live_children(me) if not apps_only or _parent(p) != me]
        _signal_all(pids, signal.SIGTERM)
        left = _wait_gone(pids, grace)
        _signal_all(left, signal.SIGKILL)
        killed += left
        _wait_gone(left, 5.0)
    return killed


def _parent(proc: psutil.Process) -> int | None:
    """The parent PID of ``proc``; None once it is gone."""
    try:
        return proc.ppid()
    except psutil.NoSuchProcess:
        return None


def _relay(stream: IO[bytes], hints: Mapping[str, str], seen: list[str]) -> None:
    """Copy the child's stderr to ours line by line, noting in ``seen`` every ``hints`` key
    (a text Flower prints) that appears."""
    out = getattr(sys.stderr, "buffer", None)
    for line in iter(stream.readline, b""):
        if out is not None:
            out.write(line)
            out.flush()
        else:  # a stderr without bytes (pytest's capture): the text
            sys.stderr.write(line.decode(errors="replace"))
        text = line.decode(errors="replace")
        seen.extend(needle for needle in hints if needle in text and needle not in seen)
    stream.close()


class _Stop(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _stop_tree(child: subprocess.Popen | None, subreaper: bool, grace: float) -> list[int]:
    """Stop every process the command left (as subreaper: all our descendants; else the
    child's process group); the PIDs that had to be killed."""
    if subreaper:
        return stop_descendants(grace)
    if child is not None:  # no subreaper: the child's own process group is what we can reach
        try:
            os.killpg(child.pid, signal.SIGTERM)
            child.wait(timeout=grace)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    return []


@dataclass
class Companion:
    """A command that serves beside the supervised one (the Fleet proxy beside the SuperLink):
    started once ``ready()`` holds (polled every ``poll`` s), stopped with the rest; ``name`` in messages."""

    cmd: list[str]
    ready: Callable[[], bool]
    name: str
    poll: float = 0.2
    process: subprocess.Popen | None = None


def _spawn(cmd: list[str], env: Mapping[str, str] | None, subreaper: bool, stderr: int | None = None) -> subprocess.Popen:
    """Start ``cmd`` as a supervised child: it dies with us, in a process group of its own (see :func:`supervise`)."""
    return subprocess.Popen(
        cmd,
        env=None if env is None else dict(env),
        preexec_fn=_die_with_parent,
        process_group=0 if subreaper else None,
        start_new_session=not subreaper,
        stderr=stderr,
    )


def _wait_with(
    child: subprocess.Popen, name: str, companion: Companion, env: Mapping[str, str] | None, subreaper: bool
) -> tuple[int, bool]:
    """Wait for ``child`` to exit while starting ``companion`` once it is ready and watching it:
    (the exit code, False) when the child exits; (the companion's code or 1, True) when the companion does."""
    while True:
        rc = child.poll()
        if rc is not None:
            return rc, False
        if companion.process is None and companion.ready():
            companion.process = _spawn(companion.cmd, env, subreaper)
        elif companion.process is not None and companion.process.poll() is not None:
            code = companion.process.returncode
            how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited (code {code})"
            print(f"[headway] {companion.name} {how}: stopping {name}", file=sys.stderr, flush=True)
            return (128 - code if code < 0 else code) or 1, True
        time.sleep(companion.poll)


def supervise(
    cmd: list[str],
    grace: float = 10.0,
    pid_file: str = "",
    env: Mapping[str, str] | None = None,
    hints: Mapping[str, str] | None = None,
    again: Callable[[int, list[str]], float | None] | None = None,
    companion: Companion | None = None,
) -> int:
    """Run ``cmd`` (with environment ``env``; None: this process's) until it exits or this
    process is told to stop; then stop every process it left. Returns the command's exit
    code, or 128 + the signal that stopped us. With ``hints`` (text the command may print
    on stderr: a line of advice), the command's stderr passes through this process, and
    when it fails having printed one of those texts, the advice follows Flower's lines.
    With ``again``, called with the exit code and the ``hints`` texts seen when the command
    exits by itself: a number of seconds to wait before running it again (what it left is
    stopped first; a stop signal still ends everything), or None to finish. With ``companion``, a
    second command started once ``companion.ready()`` holds, which lives as long as ``cmd``: if it
    exits, everything is stopped and the code is its own (or 1)."""
    subreaper = _prctl(PR_SET_CHILD_SUBREAPER, 1)
    stopping: list[int] = []  # the first stop signal; once set, later ones are ignored

    def on_signal(signum: int, _frame: object) -> None:
        if not stopping:
            stopping.append(signum)
            raise _Stop(signum)

    child: subprocess.Popen | None = None
    relay: threading.Thread | None = None
    seen: list[str] = []  # the hints texts the command printed (its last run)
    killed: list[int] = []
    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        if pid_file:
            Path(pid_file).write_text(f"{os.getpid()}\n")
        while True:
            seen = []
            # its own process group: Ctrl-C in a terminal reaches the supervisor only, which then
            # stops the processes in order (without a subreaper: its own session, to kill as a group)
            child = _spawn(cmd, env, subreaper, stderr=subprocess.PIPE if hints else None)
            if hints and child.stderr is not None:
                relay = threading.Thread(target=_relay, args=(child.stderr, hints, seen), daemon=True)
                relay.start()
            if companion is None:
                rc = child.wait()
            else:
                rc, died = _wait_with(child, cmd[0], companion, env, subreaper)
                if died:
                    break
            delay = again(rc, seen) if again is not None else None
            if delay is None:
                break
            killed += _stop_tree(child, subreaper, grace)  # a stop signal here or in the wait ends it all
            if relay is not None:
                relay.join(timeout=5.0)
            time.sleep(delay)
        stopping.append(0)  # cleaning up after the command: no signal interrupts that
    except _Stop as stop:
        print(f"[headway] signal {signal.Signals(stop.signum).name}: stopping {cmd[0]} and its processes", file=sys.stderr, flush=True)
        rc = 128 + stop.signum
    finally:
        killed += _stop_tree(child, subreaper, grace)
        if companion is not None and companion.process is not None and not subreaper:  # as subreaper it went with the rest
            _stop_tree(companion.process, subreaper, grace)
        if killed:
            print(f"[headway] killed {len(killed)} process(es) that ignored SIGTERM for {grace:.0f} s", file=sys.stderr, flush=True)
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pid_file:
            Path(pid_file).unlink(missing_ok=True)
        if relay is not None:  # every holder of the pipe is gone now: its end is near
            relay.join(timeout=5.0)
    if rc not in (0, *(128 + s for s in STOP_SIGNALS)):
        for needle in seen:
            print(f"[headway] {hints[needle] if hints else needle}", file=sys.stderr, flush=True)
    return rc


def is_launcher(cmdline: Sequence[str]) -> bool:
    """Whether a command line is a headway launcher: the `headway` command (console script or
    ``python -m headway``), or a Python running this module's supervisor."""
    return any(Path(arg).name == "headway" or "headway.processes" in arg for arg in cmdline)


def stop_pid(pid: int, timeout: float = 45.0) -> bool:
    """Ask the supervisor ``pid`` to stop (SIGTERM) and wait until it has; True if it did.
    Refuses (ValueError) a PID that is not a headway launcher, e.g. from a stale pid file."""
    try:
        cmdline = psutil.Process(pid).cmdline()
    except psutil.NoSuchProcess:
        return True
    except psutil.AccessDenied:
        cmdline = None  # not ours to read: os.kill below says whether it is ours to stop
    if cmdline is not None and not is_launcher(cmdline):
        raise ValueError(f"process {pid} is not a headway launcher (a stale pid file?); not signalling it")
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return True
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not running(pid):  # gone, or exited and waiting for its parent to reap it
            return True
        time.sleep(0.2)
    return False
