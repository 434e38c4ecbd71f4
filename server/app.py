"""The headway ServerApp: validate the run config, build the method's strategy with its
services, run it on the round engine, and write the results folder (also when the run
fails or is interrupted)."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from headway.core.config import LOCAL, ConfigError, check_against_spec, check_bodies, fit_body, resolve_settings
from headway.core.console import plural, score, show_headway_log
from headway.core.extractors import input_spec
from headway.core.methods import METHODS
from headway.core.rounds import short_rounds_note
from headway.core.run_data import dataset_label, run_spec
from headway.core.settings import Settings
from headway.server.checkpoint import resume_problem
from headway.server.results import Recorder
from headway.server.resume import Checkpoints, Resume, complete_summary, resume_point
from headway.server.tracking import check_trackers
from headway.strategies.base import HeadwayStrategy
from headway.strategies.discovery import DiscoveryFailed, discover
from headway.strategies.engine import RoundFailed
from headway.strategies.registry import STRATEGIES, check_capabilities
from headway.strategies.round_loop import RoundLoop
from headway.strategies.services import Services

log = logging.getLogger("headway")


def default_out_dir(cfg: Settings) -> Path:
    """A fresh results folder named by method, data set and start time, so runs never overwrite each other."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg.results_dir) / f"{cfg.algorithm}-{dataset_label(cfg)}-{stamp}"


def build_strategy(cfg: Settings, schema: Any = None, described: dict[int, dict[str, Any]] | None = None) -> HeadwayStrategy:
    """The method's strategy for a resolved config; raises ConfigError when they cannot work
    together, before any client is asked: the config against the data set's spec, what the
    method itself checks (its ``check_config``), and (where the server holds the data) the partition.
    ``schema``: with dataset=local, what the nodes' descriptions fixed (:mod:`headway.strategies.discovery`),
    and ``described`` those descriptions by node id (a node may not declare more at registration)."""
    data_spec = run_spec(cfg, schema)
    check_against_spec(cfg, data_spec)
    spec = input_spec(cfg, data_spec)
    cfg = fit_body(cfg, spec.input_shape)  # body=auto: the body that fits these inputs (the strategy's settings: config.json records it)
    check_bodies(cfg, spec.input_shape)
    method = STRATEGIES[cfg.algorithm]
    method.check_config(cfg, spec)
    strategy = method(cfg, spec, Services(cfg, schema, dict(described or {})))
    if cfg.dataset != LOCAL:
        check_partition(cfg, strategy.services.data.dataset)
    return strategy


def check_partition(cfg: Settings, dataset: Any) -> None:
    """ConfigError when the data set (None: the server holds no copy; nothing to check)
    cannot be partitioned as configured: a server holdout (FedProf's ``fedprof-val-size``,
    ``server-holdout``) must leave, after ``train-fraction``, at least as many training rows
    as clients (in total: a partition scheme may still leave a client empty); and whatever else the partition refuses (e.g. a natural partition's source
    count) is refused here, before any client loads its share."""
    if dataset is None:
        return
    import math

    from headway.core.partition import make_partition, server_holdout

    key = METHODS[cfg.algorithm].holdout_key
    rows, holdout, clients, fraction = len(dataset.y_train), server_holdout(cfg), cfg.num_clients, cfg.train_fraction
    most = rows - math.ceil(clients / fraction)  # the largest holdout that leaves train-fraction x the rest >= one row per client
    refusal = (
        f"run-config key '{key}' is {holdout}, but data set '{cfg.dataset}' has {rows} training rows, and "
        f"train-fraction={fraction:g} of what the holdout leaves must be at least one row per client ({clients}): "
        + (f"set {key} <= {most}" if most >= 0 else "no holdout fits: lower num-clients or raise train-fraction")
    )
    if holdout >= rows or (holdout > 0 and (rows - holdout) * fraction < clients):  # the holdout's fault: name its key
        raise ConfigError(refusal)
    try:
        part = make_partition(dataset, cfg)
    except ValueError as exc:
        raise ConfigError(f"run-config: the data cannot be partitioned as configured: {exc}") from None
    if holdout > 0 and sum(len(t) for t in part.train) < clients:
        raise ConfigError(refusal)


def check_strategy(cfg: Settings) -> None:
    """Every check that needs no client: what the method's strategy implements (secure sum, robust rule),
    the config against the data set's spec and the method (bodies, feature widths, shared layers), and the
    trackers it names (mlflow installed).
    Raises ConfigError naming the key."""
    check_capabilities(cfg)
    check_trackers(cfg)
    build_strategy(cfg)


def run_server(
    grid: Grid, run_config: Mapping[str, Any], out_dir: str | Path | None = None, overwrite: bool = False, resume: bool = False
) -> dict[str, Any]:
    """Run one experiment on ``grid`` and return its summary (also written to ``out_dir``).

    A run that stops early still writes summary.json, with status "failed" or
    "interrupted" and the reason, beside the rounds it completed. ``resume`` (or the run
    config's ``resume-dir``, which names the folder): continue the run in that folder from
    its last checkpoint (docs/checkpoints.md).
    """
    show_headway_log()  # headway's lines at INFO; not basicConfig(INFO): it turned on every library's INFO (httpx: a line per request)
    cfg = resolve_settings(run_config)  # the run's settings, built once; what the strategy fixes (body=auto) it holds
    check_capabilities(cfg)  # what the method's strategy cannot do (a secure sum, a robust rule): before any node is asked
    check_trackers(cfg)  # before discovery: a missing mlflow is said at once, not after the nodes are asked
    if cfg.resume_dir:
        out_dir, resume = cfg.resume_dir, True
    out = Path(out_dir) if out_dir else default_out_dir(cfg)
    point = resume_point(out) if resume else Resume(None, "")
    try:
        found = discover(grid, cfg) if cfg.dataset == LOCAL else None  # nodes that own their data agree on a schema first
    except DiscoveryFailed as exc:  # no node's description could be used: summary.json says why, node by node
        if not resume:  # a resumed run's folder keeps its results and checkpoints: it can be resumed again
            Recorder(out, cfg, overwrite=overwrite).finish(exc.summary(), status="failed", reason=str(exc))
        log.error("run failed before round 1: %s", exc)
        raise
    strategy = build_strategy(cfg, None, None) if found is None else build_strategy(cfg, found.schema, found.described)
    ckpt = point.checkpoint
    if ckpt is not None and (problem := resume_problem(ckpt, strategy.settings, out / point.source)):
        raise ConfigError(problem)
    ended = ckpt is not None and (ckpt.round >= cfg.num_server_rounds or ckpt.state.end is not None)  # all rounds, or stopped at a goal
    done = complete_summary(out, ckpt.round) if ckpt is not None and ended and ckpt.pending is None else None
    if ckpt is not None and done is not None:
        log.info("the run in %s is already complete (%s); nothing to do", out, plural(ckpt.round, "round"))
        return done
    if ckpt is None:
        recorder = Recorder(out, strategy.settings, overwrite=overwrite or resume)  # config.json: the body body=auto became
    else:
        note = {"after_round": ckpt.round, "from": point.source}
        recorder = Recorder.resume(out, strategy.settings, ckpt.rounds, ckpt.elapsed, note)
        log.info("resuming the run in %s after round %d (%s)", out, ckpt.round, point.source)
    log.info("%s", header(cfg, out, None if found is None else found.nodes))
    engine = strategy.connect(grid)  # kept here: who took part goes into summary.json even when the run raises
    if found is not None:
        engine.waited = True  # discovery waited sample-timeout for the nodes already: no second wait, no second warning
    # the key the nodes file their saved state under: drawn from OS entropy, so that only this run's server (and
    # whoever holds its checkpoints) can name that state to a node; another run cannot make a node load it
    run_key = secrets.token_hex(16) if ckpt is None else ckpt.run_key
    if ckpt is not None:
        engine.restore(ckpt.engine)
    engine.file_state_under(run_key)
    saver = Checkpoints(out, strategy.settings, engine, recorder, run_key)
    loop = RoundLoop(strategy, engine, on_round=recorder.round, on_checkpoint=saver)  # its state: what summary.json reports
    try:
        if ckpt is None:
            loop.run(strategy.initial_state(), cfg.num_server_rounds)
        else:
            loop.state = ckpt.state
            if ckpt.round < cfg.num_server_rounds or ckpt.pending is not None:
                loop.run(ckpt.state, cfg.num_server_rounds, ckpt.round + 1, ckpt.pending, ckpt.elapsed)
    except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C, a stop signal (Flower exits 0), or Flower exiting on an error
        status, why = "interrupted", "interrupted (Ctrl-C, or a stop signal: e.g. the SuperLink shutting down)"
        if isinstance(exc, SystemExit) and exc.code not in (0, None):
            status, why = "failed", f"Flower exited with code {exc.code} (e.g. the SuperLink became unreachable)"
        summary = recorder.finish(
            {**strategy.summary_extra(engine, loop.state), **strategy.participants(engine), **saver.summary()},
            status=status,
            reason=why,
            unfinished_failures=len(engine.meter.failures),  # the round under way: its record was never written
        )
        log.error("run %s after %s: %s; results so far are in %s", status, plural(summary["rounds"], "round"), why, out)
        raise
    except Exception as exc:
        summary = recorder.finish(
            {**strategy.summary_extra(engine, loop.state), **strategy.participants(engine), **saver.summary()},
            status="failed",
            reason=f"{type(exc).__name__}: {exc}",
            unfinished_failures=len(engine.meter.failures),  # e.g. round 1's, when every client failed in it
        )
        log.error("run failed after %s: %s", plural(summary["rounds"], "round"), summary["reason"])
        raise
    extra = {
        **strategy.summary_extra(engine, loop.state),
        **strategy.participants(engine),
        "aggregated_rounds": sum(bool(r.get("aggregated")) for r in recorder.rounds),
        **({} if found is None else found.summary()),
        **server_data_note(strategy),
        **saver.summary(),
    }
    never = never_aggregated(recorder.rounds, cfg.min_replies)
    if never:  # the rounds ran, but the model (or head) never moved from where it started: not a complete run
        summary = recorder.finish(extra, status="failed", reason=never)
        log.error("run failed after %s: %s", plural(summary["rounds"], "round"), never)
        return summary
    summary = recorder.finish(extra)
    log.info(
        "final accuracy %s, best %s, total bytes %d, %.1f s%s",
        score(summary["final_accuracy"]),
        score(summary["best_accuracy"]),
        summary["total_bytes"],
        summary["wall_seconds"],
        short_rounds_note(summary),
    )
    return summary


def header(cfg: Settings, out: Path, joined: int | None = None) -> str:
    """The run's first line: method, data, clients, rounds and results folder. With
    dataset=local (``joined``: how many nodes discovery kept) the data is each node's own and
    the clients are those that joined, of the num-clients asked for."""
    rounds = plural(int(cfg.num_server_rounds), "round")
    if cfg.dataset != LOCAL:
        return f"{cfg.algorithm} on {cfg.dataset}, {plural(int(cfg.num_clients), 'client')}, {rounds} -> {out}"
    clients = f"{joined} of num-clients={cfg.num_clients} joined" if joined is not None else f"num-clients={cfg.num_clients}"
    return f"{cfg.algorithm} on node-local data, clients: {clients}, {rounds} -> {out}"


def server_data_note(strategy: HeadwayStrategy) -> dict[str, Any]:
    """Where the server holds no data, summary.json says what that leaves out."""
    if strategy.services.data.test_tensors() is not None:
        return {}
    return {"server_data": "none: no global score (global_* figures), no LG-FedAvg new test; accuracy is the clients' own test splits"}


def never_aggregated(rounds: list[dict[str, Any]], min_replies: int) -> str | None:
    """Why a run whose rounds all ran is not complete: no round aggregated anything (each
    had fewer valid replies than ``min_replies``, so every round kept the starting model);
    None when some round did, or when rounds do not say (no ``aggregated`` flag)."""
    flags = [r["aggregated"] for r in rounds if "aggregated" in r]
    if not flags or any(flags):
        return None
    most = max((int(r.get("clients") or 0) for r in rounds), default=0)
    if most >= min_replies:  # replies enough, and still every round kept the model: say why, from the rounds' own reasons
        first = next((r["failure_reasons"][0] for r in rounds if r.get("failure_reasons")), "no reason recorded")
        return (
            f"no round aggregated: each of the {len(rounds)} rounds kept the model it started from (first reason: {first}); "
            "see failure_reasons in rounds.jsonl"
        )
    return (
        f"no round aggregated: in each of the {len(rounds)} rounds fewer than min-replies={min_replies} valid replies arrived "
        f"(at most {most}), so the model never changed from its initialization; see failure_reasons in rounds.jsonl"
    )


class RunFailed(RuntimeError):
    """A run that ended without raising but whose summary.json says it failed (e.g. no round aggregated)."""


REPORTED = "headway_reported"  # set on an exception whose one-line reason headway logged: Flower need not print its traceback
SERVERAPP_EXCEPTION = 201  # Flower's exit code for a ServerApp that raised (flwr.supercore.exit.ExitCode.SERVERAPP_EXCEPTION)


def expected(exc: BaseException) -> bool:
    """Whether ``exc`` ends a run for a reason headway states in one line (a config it refuses,
    no usable reply or description, a run whose summary says failed): not a bug, no traceback."""
    return isinstance(exc, ConfigError | RoundFailed | RunFailed)


class FlowerExitLines(logging.Filter):
    """On Flower's logger in a deployed ServerApp's process: Flower logs a ServerApp's exception
    with its traceback ("ServerApp raised an exception") and then "Exit Code: 201 ... An unhandled
    exception occurred"; for an exception headway reported in one line (``REPORTED``) both are
    dropped; the run still fails (Flower sets its status from the exception, not from its log).
    Also drops the empty INFO line Flower's exit logs after a run that succeeded."""

    def __init__(self) -> None:
        super().__init__()
        self.reported = False

    def filter(self, record: logging.LogRecord) -> bool:
        """Keep a log record unless it is one of the exit lines this filter exists to drop."""
        try:
            text = record.getMessage()
        except Exception:  # not one of these lines
            return True
        if not text.strip():
            return False
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and getattr(exc, REPORTED, False):
            self.reported = True
            return False
        if self.reported and text.startswith(f"Exit Code: {SERVERAPP_EXCEPTION}"):
            self.reported = False  # the exit message of that exception, once
            return False
        return True


def quiet_flower_exit() -> None:
    """:class:`FlowerExitLines` on Flower's logger, once per process."""
    flwr_log = logging.getLogger("flwr")
    if not any(isinstance(f, FlowerExitLines) for f in flwr_log.filters):
        flwr_log.addFilter(FlowerExitLines())


def serve(
    grid: Grid, run_config: Mapping[str, Any], out_dir: str | Path | None, overwrite: bool, strict: bool, resume: bool = False
) -> None:
    """:func:`run_server` as the ServerApp runs it; ``strict``: a summary that is not complete
    raises :class:`RunFailed`. An expected failure (:func:`expected`) is logged in one line
    (where run_server did not already) and marked ``REPORTED`` before it goes on to Flower."""
    try:
        summary = run_server(grid, run_config, out_dir, overwrite, resume)
    except Exception as exc:
        if expected(exc):
            if isinstance(exc, ConfigError):  # refused before any round: run_server logged nothing
                log.error("run refused: %s", " ".join(str(exc).split()))
            setattr(exc, REPORTED, True)
        raise
    if strict and summary.get("status", "complete") != "complete":
        failed = RunFailed(f"headway: the run {summary.get('status')}: {summary.get('reason')}")
        setattr(failed, REPORTED, True)  # run_server logged why
        raise failed


def build_server_app(
    overrides: Mapping[str, Any] | None = None,
    out_dir: str | Path | None = None,
    overwrite: bool = False,
    strict: bool = False,
    resume: bool = False,
) -> ServerApp:
    """A ServerApp running :func:`run_server` with the Flower run config plus ``overrides``;
    ``strict``: a summary that is not complete raises :class:`RunFailed`, so that Flower's run
    status (`flwr ls`, `headway submit`) says failed too, not completed; and Flower's traceback of
    an expected failure is left out of the stream (:class:`FlowerExitLines`); ``resume``: continue the run in
    ``out_dir`` from its last checkpoint (``headway run --resume``)."""
    overrides = dict(overrides or {})
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        if strict:  # a deployment's ServerApp process: an expected failure ends with headway's one line, not Flower's traceback
            quiet_flower_exit()
        serve(grid, {**dict(context.run_config), **overrides}, out_dir, overwrite, strict, resume)

    return server_app


app = build_server_app(strict=True)  # deployments and `flwr run`: Flower's status follows summary.json
