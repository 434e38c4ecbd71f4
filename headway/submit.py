"""`headway submit CONNECTION [FLWR-RUN OPTIONS...]`: submit a run to a deployment and exit
with how it ended, which `flwr run` does not (it exits 0 for a failed run).

It runs `flwr run APP CONNECTION --stream [OPTIONS...]`, passing the run's log through as it
comes, then asks the SuperLink for the run's status (`flwr ls CONNECTION --run-id N --format
json`: ``finished:completed``, ``finished:failed``, ``finished:stopped``) and, where the
run's results folder named in the log is readable here, its summary.json. ``--run-id N``
follows a run already submitted (`flwr log N CONNECTION --stream`) instead. ``--resume DIR``
submits a run that continues the run in the results folder DIR from its last checkpoint: the
run config of DIR/config.json with ``resume-dir`` = DIR, and --run-config's keys on top (e.g.
``num-server-rounds=N`` extends a complete run); the ServerApp checks the rest
(docs/checkpoints.md).

Exit codes, as `headway run`'s: 0 complete; 1 failed (or the run never started, or its end
is unknown); 130 when Ctrl-C stops this command and 143 when SIGTERM does (the run goes on
on the SuperLink: the verdict says how to follow or stop it); 143 also for a run that was
stopped (`flwr stop`, the SuperLink shutting down).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EXIT_COMPLETE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 130, 143
STARTED = re.compile(r"Successfully started run (\d+)")
RESULTS = re.compile(r"headway: .*(?:-> | results so far are in )(\S+)\s*$")  # server/app.py's first and last lines


@dataclass
class Verdict:
    """How a run ended, as Flower and (where readable) its summary.json say: the exit code and one line."""

    code: int
    line: str


def parser(prog: str = "headway submit") -> argparse.ArgumentParser:
    """The argument parser of ``headway submit``; its own and the ones it passes on to ``flwr run``."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Submit a run with `flwr run APP CONNECTION --stream`, show its log, and exit with how it ended: "
            "0 complete, 1 failed, 130/143 interrupted (Ctrl-C/SIGTERM here: the run goes on on the SuperLink; "
            "143 also for a run stopped there). Options it does not know go to `flwr run` (e.g. --run-config)."
        ),
        epilog="example: headway submit lab --run-config \"algorithm='fedlog' num-clients=3\"",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("connection", metavar="CONNECTION", help="the SuperLink connection `headway connect` wrote")
    p.add_argument("--app", default=".", help="the Flower app folder `flwr run` builds (a headway checkout)")
    p.add_argument("--run-id", type=int, default=None, help="follow this run, already submitted, instead of submitting one")
    p.add_argument(
        "--resume",
        metavar="DIR",
        default=None,
        help="continue the run in results folder DIR (as the ServerApp sees it) from its last checkpoint: its config.json's run "
        "config with resume-dir=DIR; --run-config keys go on top (num-server-rounds=N extends a complete run)",
    )
    p.add_argument(
        "--wait", type=float, default=60.0, help="seconds to wait, after the log ends, for the SuperLink to report the run finished"
    )
    return p


def main(argv: list[str] | None = None, prog: str = "headway submit") -> int:
    """The command line: submit (or follow) and report; the exit code of the run's status."""
    args, flwr_args = parser(prog).parse_known_args(argv)
    exe = flwr_exe()
    if exe is None:
        print("error: flwr not found: install headway (pip install -e .) in this environment", file=sys.stderr)
        return 2
    if args.run_id is not None and flwr_args:
        print(f"error: --run-id follows a submitted run; `flwr run` options ({' '.join(flwr_args)}) have no use there", file=sys.stderr)
        return 2
    if args.run_id is not None and args.resume is not None:
        print("error: --resume submits a run; --run-id follows one already submitted: give one of them", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="headway-resume-") as scratch:
        if args.resume is not None:
            try:
                flwr_args = resume_args(Path(args.resume), flwr_args, Path(scratch))
            except ResumeRefused as why:
                print(f"headway: {why}", file=sys.stderr)
                return 2
        if args.run_id is None:
            cmd = [exe, "run", args.app, args.connection, "--stream", *flwr_args]
        else:
            cmd = [exe, "log", str(args.run_id), args.connection, "--stream"]
        code, run_id, results, signum = follow(cmd)
    run_id = args.run_id if args.run_id is not None else run_id
    if run_id is None:
        verdict = Verdict(EXIT_FAILED, f"headway: no run was started: `flwr run` exited with {code} (see its output above)")
    elif signum is not None:
        verdict = detached(run_id, args.connection, signum)
    else:
        status = run_status(exe, args.connection, run_id, args.wait)
        verdict = judge(run_id, status, read_summary(results), results)
    print(verdict.line, file=sys.stdout if verdict.code == EXIT_COMPLETE else sys.stderr, flush=True)
    return verdict.code


class ResumeRefused(Exception):
    """What keeps ``--resume DIR`` from submitting, in one line."""


def resume_args(folder: Path, flwr_args: list[str], scratch: Path) -> list[str]:
    """``flwr run`` options that continue the run in ``folder``: ``flwr_args`` with their --run-config
    replaced by a TOML file (in ``scratch``) holding ``folder``/config.json's run config, the
    --run-config keys given, and resume-dir = ``folder``. ResumeRefused when ``folder`` holds no run
    or nothing to continue from, as far as this machine can see it."""
    rest, given = split_run_config(flwr_args)
    config = resume_config(folder, given)
    path = scratch / "resume.toml"
    path.write_text(toml_table(config))
    return [*rest, "--run-config", str(path)]


def split_run_config(flwr_args: list[str]) -> tuple[list[str], dict[str, Any]]:
    """``flwr_args`` without their --run-config options, and those options' keys and values as Flower reads them."""
    from click import ClickException
    from flwr.common.config import parse_config_args

    rest: list[str] = []
    texts: list[str] = []
    args = iter(flwr_args)
    for arg in args:
        if arg in ("--run-config", "-c"):
            texts.append(next(args, ""))
        elif arg.startswith("--run-config="):
            texts.append(arg.partition("=")[2])
        else:
            rest.append(arg)
    try:
        return rest, parse_config_args(texts or None)
    except (ValueError, OSError, ClickException) as exc:  # Flower raises click's exception for a malformed string
        raise ResumeRefused(f"cannot read --run-config {' '.join(texts)!r}: {exc}") from None


def resume_config(folder: Path, given: dict[str, Any]) -> dict[str, Any]:
    """The run config that continues the run in ``folder``: its config.json, then ``given``, with
    resume-dir naming ``folder`` (absolute, so the ServerApp finds it whatever its working folder)."""
    folder = folder.expanduser().absolute()
    config = read_run_config(folder)
    check_resumable(folder)
    asked = given.get("resume-dir")
    if asked not in (None, "", str(folder)) and Path(str(asked)).expanduser().absolute() != folder:
        raise ResumeRefused(f"--resume {folder} and --run-config resume-dir={asked!r} name different folders: give one")
    return {**config, **given, "resume-dir": str(folder)}


def read_run_config(folder: Path) -> dict[str, Any]:
    """``folder``/config.json, the run config of the run to continue; ResumeRefused when it cannot be read here."""
    path = folder / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResumeRefused(
            f"cannot resume: {path} not found: give the results folder of the run to continue (the folder its log "
            "named after '->'), and run this where that folder is readable"
        ) from None
    except (OSError, ValueError) as exc:
        raise ResumeRefused(f"cannot resume: {path} cannot be read ({exc})") from None
    if not isinstance(config, dict):
        raise ResumeRefused(f"cannot resume: {path} holds no run config (a JSON object)")
    return config


def check_resumable(folder: Path) -> None:
    """ResumeRefused when ``folder`` recorded rounds but holds no checkpoint file to continue from
    (which checkpoint is whole, and whether the run config and code match, the ServerApp checks)."""
    from headway.server.checkpoint import FOLDER, checkpoint_files  # local import: keeps the command's start light

    if checkpoint_files(folder / FOLDER):
        return
    rounds = folder / "rounds.jsonl"
    recorded = rounds.is_file() and bool(rounds.read_text().strip())
    if recorded:
        raise ResumeRefused(
            f"cannot resume: {folder / FOLDER} holds no checkpoint (the run had checkpoint-keep=0, or they were deleted), "
            "though the run recorded rounds: start a new run"
        )


def toml_table(config: dict[str, Any]) -> str:
    """``config`` (plain run-config values) as a TOML document of ``key = value`` lines, which `flwr run --run-config FILE` reads."""
    return "".join(f"{toml_key(k)} = {toml_value(k, v)}\n" for k, v in config.items())


def toml_key(key: str) -> str:
    """A TOML key: bare where it may be (run-config keys are), else quoted."""
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else json.dumps(key)


def toml_value(key: str, value: Any) -> str:
    """One run-config value as TOML (a JSON string is a TOML basic string); ResumeRefused for a value no run config holds."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)  # Python's repr is TOML's float, inf and nan included
    if isinstance(value, str):
        return json.dumps(value)
    raise ResumeRefused(f"cannot resume: config.json's {key!r} is {value!r}, not a run-config value (bool, int, float, string)")


def flwr_exe() -> str | None:
    """The `flwr` command next to this Python (a virtual environment's bin/), else on PATH."""
    from headway.deploy import flower_path

    return shutil.which("flwr", path=flower_path())


def follow(cmd: list[str]) -> tuple[int, int | None, str | None, int | None]:
    """Run ``cmd`` (`flwr run ... --stream` or `flwr log ... --stream`), echoing its output;
    its exit code, the run id it started, the results folder the log names, and the signal
    (SIGINT, SIGTERM) that stopped this command, if one did."""
    from headway.deploy import flower_env

    got: dict[str, Any] = {"signal": None}
    proc = subprocess.Popen(
        cmd, env=flower_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True
    )

    def stop_following(signum: int, _frame: Any) -> None:
        got["signal"] = signum
        if proc.poll() is None:
            proc.terminate()  # `flwr` only follows; the run itself goes on on the SuperLink

    saved = {s: signal.signal(s, stop_following) for s in (signal.SIGINT, signal.SIGTERM)}
    run_id: int | None = None
    results: str | None = None
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            if run_id is None and (m := STARTED.search(line)):
                run_id = int(m.group(1))
            if m := RESULTS.search(line):
                results = m.group(1)
        code = proc.wait()
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, run_id, results, got["signal"]


def run_status(exe: str, connection: str, run_id: int, wait: float, pause: Callable[[float], None] = time.sleep) -> dict[str, str]:
    """The run's status and status details from `flwr ls --run-id N --format json`, asked
    until it is finished or ``wait`` seconds pass (the log can end just before the status
    is written); on an answer that cannot be read, its ``error``."""
    from headway.deploy import flower_env

    deadline = time.monotonic() + wait
    while True:
        out = subprocess.run(
            [exe, "ls", connection, "--run-id", str(run_id), "--format", "json"], env=flower_env(), capture_output=True, text=True
        )
        status = read_ls(out.stdout, run_id)
        if status.get("status", "").startswith("finished") or time.monotonic() >= deadline:
            if "error" in status and out.stderr.strip():
                status["error"] += f" ({out.stderr.strip().splitlines()[-1]})"
            return status
        pause(2.0)


def read_ls(text: str, run_id: int) -> dict[str, str]:
    """``status`` and ``details`` of run ``run_id`` from `flwr ls --format json`'s output, or ``error``."""
    start = text.find("{")
    try:
        data = json.loads(text[start:]) if start >= 0 else None
    except json.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        return {"error": f"`flwr ls` gave no JSON: {text.strip()[-200:]!r}"}
    if not data.get("success"):
        return {"error": f"`flwr ls` failed: {data.get('error-message') or data.get('error') or data}"}
    runs = [r for r in data.get("runs", []) if isinstance(r, dict) and str(r.get("run-id")) == str(run_id)]
    if not runs:
        return {"error": f"the SuperLink lists no run {run_id}"}
    return {"status": str(runs[0].get("status", "")), "details": str(runs[0].get("status-details") or "")}


def read_summary(folder: str | None) -> dict[str, Any] | None:
    """summary.json of the results folder the run's log named, when it is readable from here
    (the ServerApp writes it on the SuperLink's machine, relative to the SuperLink's folder)."""
    if not folder:
        return None
    try:
        summary = json.loads((Path(folder) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary if isinstance(summary, dict) else None


def judge(run_id: int, status: dict[str, str], summary: dict[str, Any] | None, folder: str | None = None) -> Verdict:
    """The exit code and verdict line of a run from Flower's status and its summary.json in
    ``folder`` (the worse of the two: a summary that says failed under a completed Flower status fails)."""
    flower = status.get("status", "")
    said = summary.get("status") if summary else None
    where = f" (results: {folder})" if summary and folder else ""
    reason = (summary or {}).get("reason") or status.get("details") or ""
    if "error" in status and said is None:
        return Verdict(EXIT_FAILED, f"headway: run {run_id}: its end is unknown: {status['error']}")
    if flower.endswith(":stopped") or said == "interrupted":
        return Verdict(EXIT_TERMINATED, f"headway: run {run_id} was stopped ({flower or 'Flower: no status'}){_because(reason)}{where}")
    if flower.endswith(":failed") or said == "failed":
        return Verdict(EXIT_FAILED, f"headway: run {run_id} failed ({flower or 'Flower: no status'}){_because(reason)}{where}")
    if flower.endswith(":completed") and said in (None, "complete"):
        figures = "" if not summary else f": final accuracy {_figure(summary.get('final_accuracy'))} after {_rounds(summary.get('rounds'))}"
        if summary:
            from headway.core.rounds import short_rounds_note  # local import: keeps the command's start light

            figures += short_rounds_note(summary)  # rounds that ran without some client (summary.json: rounds_with_missing_clients)
        return Verdict(EXIT_COMPLETE, f"headway: run {run_id} complete{figures}{where}")
    return Verdict(
        EXIT_FAILED,
        f"headway: run {run_id} is not finished ({flower or status.get('error', 'no status')}) though its log ended: "
        f"follow it again with `headway submit CONNECTION --run-id {run_id}`",
    )


def detached(run_id: int, connection: str, signum: int) -> Verdict:
    """The verdict when a signal stopped this command: it stopped following, the run goes on."""
    code = EXIT_INTERRUPTED if signum == signal.SIGINT else EXIT_TERMINATED
    return Verdict(
        code,
        f"headway: stopped following run {run_id} ({signal.Signals(signum).name}); it goes on on the SuperLink: "
        f"`headway submit {connection} --run-id {run_id}` follows it again, `flwr stop {run_id} {connection}` stops it",
    )


def _because(reason: str) -> str:
    text = " ".join(str(reason).split())
    return f": {text[:400]}" if text else ""


def _rounds(count: Any) -> str:
    """summary.json's round count in words ("1 round", "3 rounds"); as written when it is not a whole number."""
    from headway.core.console import plural

    return plural(count, "round") if isinstance(count, int) and not isinstance(count, bool) else f"{count} rounds"


def _figure(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)
