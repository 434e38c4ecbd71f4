"""The simulation runner: configuration, pre-flight checks, Flower's simulation engine,
and a last-resort summary.json when a run stops without writing one."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import tomllib
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
from headway.core.config import LOCAL, SCHEMA, ConfigError, check_against_spec, dataset_kind, resolve_settings
from headway.core.console import plural, show_headway_log, significant
from headway.core.data import DatasetMissingError
from headway.core.methods import key_owner, keys_not_read
from headway.core.run_data import load_run_dataset, run_spec
from headway.core.settings import Settings
from headway.core.sources import SourceError
from headway.server.results import Recorder, ResultsFolderError, check_out_dir, clear_results

# What pre-flight may raise; main() prints each as one line and exits 2.
PREFLIGHT_ERRORS = (ConfigError, DatasetMissingError, ResultsFolderError, SourceError)  # SourceError: a user source that cannot be read
EXIT_PREFLIGHT = 2
EXIT_FAILED = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 128 + signal.SIGTERM  # 143
STOP_GRACE = 3.0  # seconds Ray's processes get after SIGTERM on a stop by signal, before a helper SIGKILLs them
INTERRUPTED = "interrupted by Ctrl-C (SIGINT) in the simulation runner"
TERMINATED = "interrupted by SIGTERM (e.g. timeout, docker stop or a job scheduler) in the simulation runner"
STOP_REASONS: dict[int, str] = {signal.SIGINT: INTERRUPTED, signal.SIGTERM: TERMINATED}  # by number: a handler is given the number
# What a default run does not print (--verbose does): Flower's banner that run_simulation is deprecated
# (see quiet_engine for why the runner still calls it) and Ray's tip that it may one day stop hiding
# GPUs from clients given none (it still does; headway relies on that: client-num-gpus=0 trains on the CPU)
DEPRECATION_BANNER = ("DEPRECATED FEATURE", "`run_simulation` function is deprecated")
RAY_GPU_TIP = r"Tip: In future versions of Ray, Ray will no longer override accelerator visible devices"

DESCRIPTION = """\
Run one experiment in Flower's simulation engine: num-clients virtual clients (Flower
SuperNodes on Ray) and the server in this process, then write the results folder --out.

CONFIG.toml holds run-config keys, at top level or under [run-config] (the papers' setups:
benchmarks/configs/); --set KEY=VALUE overrides one (values parse as TOML; repeatable).
Every key with its default: docs/configuration.md."""

EPILOG = """\
examples:
  {prog} benchmarks/configs/mnist-table1.toml --set num-server-rounds=2 --set num-clients=10 --out results/smoke
  {prog} --set algorithm=fedavg --set dataset=path/to/images --out results/mine

results (--out): config.json, rounds.jsonl (a line per round), summary.json (final and best
accuracy, bytes, status, reason) and the plots; every field: docs/results.md. The runner prints
headway's round lines and Flower's warnings; the summary at the end is summary.json with figures
to 4 significant digits (the file keeps them whole).

Checks that stop a run before Ray starts (bad key or value, data set not found, results folder
not empty without --overwrite, ...) print one "error:" line. Exit codes: 0 complete, 1 failed,
2 refused before starting, 130 interrupted by Ctrl-C, 143 by SIGTERM; summary.json says why."""


def parse_value(text: str) -> Any:
    """A --set value as TOML would read it (numbers, booleans), else the raw string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def load_config(path: str | None, sets: list[str]) -> Settings:
    """The settings of the keys from CONFIG.toml overlaid with ``key=value`` overrides, validated. Where the
    overrides switch the file's algorithm, the file's keys for other methods are left out (:func:`other_methods_keys`)."""
    cfg = read_config_file(path) if path else {}
    given = parse_sets(sets)
    if left := other_methods_keys(cfg, given):
        _say_left_out(path or "", cfg, left, given["algorithm"])
        cfg = {k: v for k, v in cfg.items() if k not in left}
    settings = resolve_settings({**cfg, **given})
    if dataset_kind(settings.dataset) == "path":  # Ray's workers run elsewhere than the cwd: every process reads the same absolute path
        settings = replace(settings, dataset=str(Path(settings.dataset).expanduser().absolute()))
    return settings


def read_config_file(path: str) -> dict[str, Any]:
    """The run-config keys of CONFIG.toml (top level, or under [run-config]); ConfigError in one line when it cannot be read."""
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:  # not "[Errno 2] No such file or directory: 'x.toml'"
        raise ConfigError(
            f"config file {path}: {exc.strerror or exc}: give the path of a TOML file of run-config keys, "
            "or leave it out (the defaults and --set alone)"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not TOML ({exc}): fix it, or leave it out (the defaults and --set alone)") from None
    return dict(data.get("run-config", {k: v for k, v in data.items() if not isinstance(v, dict)}))


def parse_sets(sets: list[str]) -> dict[str, Any]:
    """``key=value`` overrides as run-config keys (values parsed as TOML; a later one wins); ConfigError on one without '='."""
    given: dict[str, Any] = {}
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"--set takes key=value, got {item!r}")
        key, value = item.split("=", 1)
        given[key.strip()] = parse_value(value.strip())
    return given


def other_methods_keys(file_cfg: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """The config file's method keys that the algorithm ``given`` switches the run to does not read: a file of
    benchmarks/configs/ is one setup that several methods run with --set algorithm=..., so the keys of its own method
    do not apply to the others (headway.core.methods.reads). None where ``given`` names no other algorithm than the file's
    (default: fedlog): the run then refuses such a key (headway.core.config), as it does one given with --set."""
    algorithm = given.get("algorithm")
    if algorithm is None or algorithm == file_cfg.get("algorithm", SCHEMA["algorithm"].default):
        return []
    inputs = str(given.get("inputs", file_cfg.get("inputs", SCHEMA["inputs"].default)))
    return [k for k in keys_not_read(str(algorithm), file_cfg, inputs) if k not in given]


def _say_left_out(path: str, file_cfg: dict[str, Any], left: list[str], algorithm: Any) -> None:
    """One line naming the keys :func:`other_methods_keys` left out that were set away from their default."""
    shown = [k for k in left if file_cfg[k] != SCHEMA[k].default]
    if not shown:
        return
    owners = " and ".join(dict.fromkeys(f"{owner.display}'s" for k in shown if (owner := key_owner(k)) is not None))
    logging.getLogger("headway").info(
        "config file %s: %s left out (%s keys, which --set algorithm=%s does not read)",
        path,
        ", ".join(f"{k}={file_cfg[k]!r}" for k in shown),
        owners,
        algorithm,
    )


def load_resume_config(out_dir: str | Path, sets: list[str]) -> Settings:
    """The settings to continue the run in ``out_dir`` with: its config.json overlaid with ``key=value``
    overrides (e.g. a larger num-server-rounds), validated. ConfigError when the folder holds no run."""
    path = Path(out_dir) / "config.json"
    try:
        saved = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"--resume {out_dir}: {exc.strerror or exc} ({path}): give the results folder of the run to continue") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--resume {out_dir}: {path} is not JSON ({exc})") from None
    if not isinstance(saved, dict):
        raise ConfigError(f"--resume {out_dir}: {path} does not hold a run config")
    return resolve_settings({**saved, **parse_sets(sets)})


def resume_preflight(cfg: Settings, out_dir: str | Path) -> dict[str, Any] | None:
    """The checks of a resume before the simulation engine starts: a checkpoint (or a run stopped before its
    first round ended) to continue from, and one whose config and code this run may continue (ConfigError, one line).
    Returns the run's summary when it already completed ``num-server-rounds`` (nothing to run), else None."""
    from headway.server.app import build_strategy
    from headway.server.checkpoint import resume_problem
    from headway.server.resume import complete_summary, resume_point

    with warnings_left_to_the_server():
        point = resume_point(Path(out_dir))
    if point.checkpoint is not None and (
        problem := resume_problem(point.checkpoint, build_strategy(cfg).settings, Path(out_dir) / point.source)
    ):
        raise ConfigError(problem)
    ckpt = point.checkpoint
    if ckpt is None or ckpt.pending is not None or ckpt.round < cfg.num_server_rounds:
        return None
    return complete_summary(Path(out_dir), ckpt.round)


@contextlib.contextmanager
def warnings_left_to_the_server() -> Iterator[None]:
    """headway's warnings silenced: the ServerApp finds the resume point again and says each warning
    (a checkpoint skipped as unreadable, a run starting again from round 1) once; errors still show."""
    headway_log = logging.getLogger("headway")
    level = headway_log.level
    headway_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        headway_log.setLevel(level)


def preflight(cfg: Settings, out_dir: str | Path, overwrite: bool = False) -> None:
    """Every check that can stop a run before the simulation engine starts; changes nothing
    on disk. Raises ConfigError (the config against the data set's spec, and whatever the
    method's strategy refuses: ``headway.server.app.check_strategy``), ResultsFolderError (``out_dir``
    holds files and ``overwrite`` is not set) or DatasetMissingError."""
    if cfg.dataset == LOCAL:
        raise ConfigError(
            "run-config key 'dataset' is 'local', which is for a deployment where every SuperNode reads its own data; "
            "in simulation give the path of your source as dataset, and it is split over the clients like a built-in"
        )
    check_out_dir(out_dir, overwrite)
    load_run_dataset(cfg)  # a missing data set or an unreadable source fails here, once
    check_against_spec(cfg, run_spec(cfg))
    if cfg.ray_address == "auto":
        ray_address("auto")  # no cluster to join: stop here, not in ray.init
    from headway.server.app import check_strategy

    check_strategy(cfg)


class _ErrorLog(logging.Handler):
    """Keeps the last ERROR that Flower logs, as the reason of a run that ends without a summary."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.last: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage().strip()
        except Exception:  # a bad log call must not break the run
            return
        if text and not text.startswith("Traceback"):
            self.last = text.splitlines()[0]


def _reason(exc: BaseException) -> str:
    """'Type: message' of the exception at the root of ``exc``'s cause chain (Flower wraps
    the ServerApp's exception in 'RuntimeError: An error was encountered')."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = str(root).strip()
    return f"{type(root).__name__}: {text}" if text else type(root).__name__


def _ensure_summary(cfg: Settings, out_dir: Path, started: float, status: str, reason: str) -> dict[str, Any]:
    """summary.json as it is, or, when the run left none, one with ``status`` and ``reason``
    beside the rounds it completed (the last resort: the ServerApp writes its own)."""
    path = out_dir / "summary.json"
    if path.exists():
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError:
            pass  # torn by the stop: write it again
    return Recorder.reopen(out_dir, cfg, started=started).finish(status=status, reason=reason)


def ray_address(value: str) -> str:
    """The ``address`` for ``ray.init``: "local" for ``ray-address`` empty (a private Ray, so that
    neither RAY_ADDRESS nor a `ray start` cluster on this machine is joined by chance); for
    "auto", RAY_ADDRESS, else the cluster the last `ray start` on this machine recorded
    (ConfigError when neither: not Ray's fallback of joining any Ray found running here);
    else ``value`` as given."""
    if not value:
        return "local"
    if value != "auto":
        return value
    from ray._private.utils import read_ray_address  # the file `ray start` writes for ray.init(address="auto")

    found = os.environ.get("RAY_ADDRESS") or read_ray_address()
    if not found:
        raise ConfigError(
            "run-config key 'ray-address' is 'auto' but neither RAY_ADDRESS nor a `ray start` cluster on this machine was found"
        )
    return found


class _DeprecationBanner(logging.Filter):
    """Drops Flower's one warning that run_simulation is deprecated, and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # a record that cannot be formatted is not the banner
            return True
        return not all(part in text for part in DEPRECATION_BANNER)


@contextlib.contextmanager
def quiet_engine(verbose: bool) -> Iterator[None]:
    """For the run (unless ``verbose``): without Flower's banner that ``run_simulation`` is
    deprecated and Ray's FutureWarning about GPU visibility; every other warning stays.
    The supported entry point Flower names, `flwr run`, goes through a SuperLink and a
    separate flwr-simulation process that loads the apps from a FAB: it cannot take this
    process's ServerApp and ClientApp built from the resolved config (with --out and
    --overwrite), nor run with the engine fixes (:mod:`headway.simulation.flower_fixes`), the
    signal handling and the error capture that live here; so the runner keeps
    ``run_simulation`` (still in Flower 1.39) and hides only its banner. Flower's DEBUG
    lines are its console handler's business: ``verbose_logging`` turns them on."""
    if verbose:
        yield
        return
    flwr_log = logging.getLogger("flwr")
    banner = _DeprecationBanner()
    flwr_log.addFilter(banner)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=RAY_GPU_TIP, category=FutureWarning)
            yield
    finally:
        flwr_log.removeFilter(banner)


def quiet_ray(verbose: bool) -> None:
    """The environment Ray reads when it is imported, set for this process and the Ray processes
    it starts (unless the user set them): log lines not folded into "[repeated Nx across cluster]" with Ray's
    advice; and, unless ``verbose``, no C++ "*** SIGTERM received ... PC: @ 0x..." dump on a stop
    by signal (Ray's failure signal handler; the runner's own handler says what happened)."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not verbose:
        os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")


def simulate(
    cfg: Settings, out_dir: str | Path, verbose: bool = False, overwrite: bool = False, *, check: bool = True, resume: bool = False
) -> dict[str, Any]:
    """Run ``cfg`` with ``num-clients`` virtual SuperNodes; returns summary.json's content.

    ``resume``: continue the run in ``out_dir`` from its last checkpoint (its folder holds results already).
    ``check`` runs :func:`preflight` first (its errors are raised before Ray starts);
    ``overwrite`` then removes an earlier run's result files from ``out_dir``. A run that
    ends without the ServerApp writing summary.json gets one here: status "failed" with the
    reason found (the exception, else the last error Flower logged), or "interrupted" on
    Ctrl-C; the exception is raised again.
    """
    out = Path(out_dir)
    if check:
        preflight(cfg, out, overwrite or resume)
        if resume:
            resume_preflight(cfg, out)
    if overwrite and not resume and out.is_dir():
        removed = clear_results(out)
        if removed:
            print(f"--overwrite: removed {', '.join(removed)} of an earlier run from {out}", file=sys.stderr)

    quiet_ray(verbose)  # effective where Ray is not imported yet (main() calls it first): Ray reads these when imported
    from flwr.simulation import run_simulation
    from headway.client.app import build_client_app
    from headway.server.app import build_server_app
    from headway.simulation.flower_fixes import faster_simulation_engine

    address = ray_address(cfg.ray_address)
    if cfg.ray_address:  # config.json names the cluster the run ran on ("auto" resolved)
        cfg = replace(cfg, ray_address=address)
    backend: dict[str, Any] = {  # Flower sizes its actor pool from the resources of every node of the cluster
        "client_resources": {"num_cpus": cfg.client_num_cpus, "num_gpus": cfg.client_num_gpus},
        # log_to_driver: the clients' own output (their tracebacks, Flower's actor lines) only with --verbose; the server
        # reports every client failure with its reason itself
        "init_args": {"address": address, "include_dashboard": False, "logging_level": logging.WARNING, "log_to_driver": verbose},
    }
    config = cfg.to_config()  # the apps' run config: run_simulation takes no run config, so it is their overrides
    errors = _ErrorLog()
    flwr_log = logging.getLogger("flwr")
    flwr_log.addHandler(errors)
    started = time.monotonic()
    headway_log = logging.getLogger("headway")
    level = headway_log.level
    show_headway_log(logging.DEBUG if verbose else logging.INFO)  # DEBUG: the method's settings, among others
    try:
        # faster: Flower 1.39's extractor pass and poll waits, and its ids drawn from the seed so that reruns and resumes
        # ship the same bytes (docs/flower-extractor.md); quiet: two banners, unless --verbose
        with faster_simulation_engine(cfg.seed), quiet_engine(verbose):
            run_simulation(
                server_app=build_server_app(config, out, overwrite=overwrite, resume=resume),
                # with checkpoints, clients keep their local state in the results folder: a resumed run's clients find it
                client_app=build_client_app(config, state_dir=out / "client-state" if cfg.checkpoint_keep > 0 else None),
                num_supernodes=cfg.num_clients,
                backend_config=backend,
                verbose_logging=verbose,
            )
    except KeyboardInterrupt:
        _ensure_summary(cfg, out, started, "interrupted", INTERRUPTED)
        raise
    except SystemExit as exc:  # Ray's driver turns SIGTERM into sys.exit(15) (where the runner's own handler is not installed)
        terminated = exc.code == signal.SIGTERM
        _ensure_summary(cfg, out, started, "interrupted" if terminated else "failed", TERMINATED if terminated else _reason(exc))
        raise
    except BaseException as exc:
        _ensure_summary(cfg, out, started, "failed", _reason(exc))
        raise
    finally:
        flwr_log.removeHandler(errors)
        if verbose:
            headway_log.setLevel(level)
    why = f"last error Flower logged: {errors.last}" if errors.last else "see the log above"
    return _ensure_summary(cfg, out, started, "failed", f"the simulation ended without the ServerApp writing summary.json ({why})")


def _report_interrupted(out: Path, summary: dict[str, Any]) -> None:
    print(
        f"interrupted: {out / 'summary.json'} has status {summary.get('status')!r} after {summary.get('rounds')} round(s)", file=sys.stderr
    )


def _descendants(pid: int) -> list[int]:
    """Process ids under ``pid`` (Ray's processes); empty if it is gone."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


# Run detached by stop_processes: waits up to argv[1] seconds for the pids after it to end, then SIGKILLs those left.
# psutil.Process keeps each one's start time, so a pid reused meanwhile is not killed.
_REAPER = """
import sys, psutil
procs = []
for pid in sys.argv[2:]:
    try:
        procs.append(psutil.Process(int(pid)))
    except psutil.Error:
        pass
_, alive = psutil.wait_procs(procs, timeout=float(sys.argv[1]))
for proc in alive:
    try:
        proc.kill()
    except psutil.Error:
        pass
"""


def stop_processes(pids: list[int], grace: float = STOP_GRACE) -> subprocess.Popen[bytes] | None:
    """SIGTERM each of ``pids`` now, and leave a detached helper that SIGKILLs those still alive
    after ``grace`` seconds (Ray's agents, gcs_server and dashboard may take long to go after
    a SIGTERM, or stay). The caller need not wait: waiting here, inside the run, let Ray's dying raylet
    abort the driver (exit -6) before it exited with its own code. Returns the helper."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    if not pids:
        return None
    try:
        return subprocess.Popen(
            [sys.executable, "-c", _REAPER, str(grace), *map(str, pids)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # not in the terminal's group: a second Ctrl-C does not stop it
        )
    except OSError:  # no helper: the SIGTERM above is all that is done
        return None


def _stop_on_signal(cfg: Settings, out: Path, started: float) -> Callable[[int, FrameType | None], None]:
    """A SIGINT/SIGTERM handler for the command line: write the interrupted summary (and
    plots) with the rounds done, at once, stop Ray's processes and end the process with
    128 + the signal (130 for Ctrl-C, 143 for SIGTERM: what `timeout`, `docker stop` and
    schedulers send). Letting the signal unwind as an exception instead (KeyboardInterrupt,
    or Ray's SIGTERM handler's sys.exit(15)) makes Flower shut Ray down under its own worker
    threads, which can abort the process before a summary is written, and leaves its
    ServerApp thread, not a daemon, waiting for replies that never come."""

    def handler(signum: int, frame: FrameType | None) -> None:
        for sig in STOP_REASONS:  # a second signal ends the process at once
            signal.signal(sig, signal.SIG_DFL)
        _report_interrupted(
            out, _ensure_summary(cfg, out, started, "interrupted", STOP_REASONS.get(signum, f"interrupted by signal {signum}"))
        )
        sys.stdout.flush()
        sys.stderr.flush()
        stop_processes(_descendants(os.getpid()))  # Ray's processes; its agents would outlive us by a minute
        os._exit(128 + signum)

    return handler


def _keep_sigterm_handler() -> Callable[[], None]:
    """Stop ``ray.init`` from replacing the runner's SIGTERM handler with Ray's own (which
    raises SystemExit(15) in the middle of Flower's engine); returns the undo. Ray installs
    it through ``ray._private.utils.set_sigterm_handler``, looked up at call time."""
    try:
        from ray._private import utils as ray_utils
    except ImportError:  # no Ray (or another layout): the SystemExit(15) fallback in simulate() still records the stop
        return lambda: None
    original = getattr(ray_utils, "set_sigterm_handler", None)
    if original is None:
        return lambda: None
    ray_utils.set_sigterm_handler = lambda handler: None

    def undo() -> None:
        ray_utils.set_sigterm_handler = original

    return undo


def main(argv: list[str] | None = None, prog: str = "headway run") -> int:
    """The command line (``headway run``); returns the exit code: 0 complete, 1 failed, 2 stopped by a
    pre-flight check (one ``error:`` line on stderr), 130 interrupted by Ctrl-C (SIGINT),
    143 by SIGTERM (a stop by signal ends the process with that code at once)."""
    parser = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, epilog=EPILOG.format(prog=prog), formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "config", nargs="?", metavar="CONFIG.toml", help="TOML file of run-config keys (optional: defaults and --set alone)"
    )
    parser.add_argument(
        "--out", metavar="DIR", help="results folder to write: new or empty, unless --overwrite (with --resume: that folder)"
    )
    parser.add_argument(
        "--resume",
        metavar="DIR",
        help="continue the run in results folder DIR from its last checkpoint (its config.json, with --set overriding "
        "keys that may change, e.g. a larger num-server-rounds to extend a complete run)",
    )
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a run-config key (repeatable)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier run's result files in --out (nothing else there)")
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="also print Flower's and headway's DEBUG lines (the method's settings), the clients' own output (through Ray), "
        "Flower's deprecation banner, Ray's FutureWarning, and a failed run's traceback",
    )
    args = parser.parse_args(argv)
    if args.resume and (args.config or args.overwrite or (args.out and Path(args.out) != Path(args.resume))):
        parser.error(
            "--resume DIR takes the run's config from DIR/config.json and writes into DIR: leave out CONFIG.toml, --overwrite and --out"
        )
    if not args.out and not args.resume:
        parser.error("the following arguments are required: --out (or --resume DIR)")
    args.out = args.out or args.resume
    quiet_ray(args.verbose)  # before anything imports Ray: it reads RAY_DISABLE_FAILURE_SIGNAL_HANDLER when it is imported
    show_headway_log()  # before preflight: reading a user source may say what it left out (headway.core.sources)
    try:
        if args.resume:
            cfg = load_resume_config(args.resume, args.set)
            preflight(cfg, args.out, overwrite=True)  # the folder holds the run's results: that is what is continued
            if (done := resume_preflight(cfg, args.out)) is not None:
                print(f"the run in {args.out} is already complete ({plural(int(done['rounds']), 'round')}): nothing to do", file=sys.stderr)
                return 0
        else:
            cfg = load_config(args.config, args.set)
            preflight(cfg, args.out, args.overwrite)
    except (*PREFLIGHT_ERRORS, OSError, tomllib.TOMLDecodeError) as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr)
        return EXIT_PREFLIGHT
    except KeyboardInterrupt:
        print("interrupted before the run started; nothing written", file=sys.stderr)
        return EXIT_INTERRUPTED
    out = Path(args.out)
    # our SIGINT and SIGTERM handler, unless main runs off the main thread; not for a signal that is ignored (SIGINT in a background job)
    main_thread = threading.current_thread() is threading.main_thread()
    owned = [sig for sig in STOP_REASONS if main_thread and signal.getsignal(sig) is not signal.SIG_IGN]
    handler = _stop_on_signal(cfg, out, time.monotonic())
    previous = {sig: signal.signal(sig, handler) for sig in owned}
    undo_ray = _keep_sigterm_handler() if signal.SIGTERM in owned else (lambda: None)
    try:
        summary = simulate(cfg, out, args.verbose, args.overwrite, check=False, resume=bool(args.resume))
    except Exception as exc:  # the run failed (simulate wrote summary.json): its one-line reason below; the traceback with --verbose
        if args.verbose:
            traceback.print_exc()
        summary = _ensure_summary(cfg, out, time.monotonic(), "failed", _reason(exc))
    except KeyboardInterrupt:  # where the handler could not be installed: simulate wrote the summary
        _report_interrupted(out, _ensure_summary(cfg, out, time.monotonic(), "interrupted", INTERRUPTED))
        return EXIT_INTERRUPTED
    except SystemExit as exc:
        if exc.code != signal.SIGTERM:
            raise
        _report_interrupted(out, _ensure_summary(cfg, out, time.monotonic(), "interrupted", TERMINATED))
        return EXIT_TERMINATED
    finally:
        undo_ray()
        for sig, before in previous.items():
            signal.signal(sig, before if before is not None else signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    print(json.dumps(significant(summary), indent=2))  # 4 significant digits on screen; summary.json keeps them whole
    if summary.get("status", "complete") != "complete":
        rounds = plural(int(summary.get("rounds") or 0), "round")
        print(f"error: the run {summary.get('status')} after {rounds}: {summary.get('reason')}", file=sys.stderr)
        return EXIT_FAILED
    return 0
