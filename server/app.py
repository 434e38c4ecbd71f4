"""The headway ServerApp: validate the run config, build the method's strategy with its
services, run it on the round engine, and write the results folder (also when the run
fails or is interrupted)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from core.config import check_against_spec, resolve
from core.data import SPECS
from core.extractors import input_spec
from server.results import Recorder
from strategies.base import HeadwayStrategy
from strategies.registry import STRATEGIES
from strategies.services import Services

log = logging.getLogger("headway")


def default_out_dir(cfg: Mapping[str, Any]) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg["results-dir"]) / f"{cfg['algorithm']}-{cfg['dataset']}-{stamp}"


def build_strategy(cfg: dict[str, Any]) -> HeadwayStrategy:
    """The method's strategy for a resolved config; raises ConfigError when they cannot work together."""
    check_against_spec(cfg, SPECS[cfg["dataset"]])
    return STRATEGIES[cfg["algorithm"]](cfg, input_spec(cfg), Services(cfg))


def preflight(cfg: dict[str, Any]) -> None:
    """Every check that needs no client: the config against the data set's spec and the
    method (bodies, feature widths, shared layers). Raises ConfigError naming the key."""
    build_strategy(cfg)


def run_server(grid: Grid, run_config: Mapping[str, Any], out_dir: str | Path | None = None, overwrite: bool = False) -> dict[str, Any]:
    """Run one experiment on ``grid`` and return its summary (also written to ``out_dir``).

    A run that stops early still writes summary.json, with status "failed" or
    "interrupted" and the reason, beside the rounds it completed.
    """
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = resolve(run_config)
    out = Path(out_dir) if out_dir else default_out_dir(cfg)
    strategy = build_strategy(cfg)
    recorder = Recorder(out, cfg, overwrite=overwrite)
    log.info("headway: %s on %s, %d clients, %d rounds -> %s", cfg["algorithm"], cfg["dataset"], cfg["num-clients"], cfg["num-server-rounds"], out)
    try:
        strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=cfg["num-server-rounds"], on_round=recorder.round)
    except (KeyboardInterrupt, SystemExit) as exc:  # Ctrl-C, a stop signal (Flower exits 0), or Flower exiting on an error
        status, why = "interrupted", "interrupted (Ctrl-C, or a stop signal: e.g. the SuperLink shutting down)"
        if isinstance(exc, SystemExit) and exc.code not in (0, None):
            status, why = "failed", f"Flower exited with code {exc.code} (e.g. the SuperLink became unreachable)"
        summary = recorder.finish({**strategy.summary_extra(), **strategy.participants()}, status=status, reason=why)
        log.error("headway: run %s after %d rounds: %s; results so far are in %s", status, summary["rounds"], why, out)
        raise
    except Exception as exc:
        summary = recorder.finish({**strategy.summary_extra(), **strategy.participants()}, status="failed", reason=f"{type(exc).__name__}: {exc}")
        log.error("headway: run failed after %d rounds: %s", summary["rounds"], summary["reason"])
        raise
    summary = recorder.finish({**strategy.summary_extra(), **strategy.participants()})
    log.info("headway: final accuracy %s, best %s, total bytes %d, %.1f s", summary["final_accuracy"], summary["best_accuracy"], summary["total_bytes"], summary["wall_seconds"])
    return summary


def build_server_app(overrides: Mapping[str, Any] | None = None, out_dir: str | Path | None = None, overwrite: bool = False) -> ServerApp:
    """A ServerApp running :func:`run_server` with the Flower run config plus ``overrides``."""
    overrides = dict(overrides or {})
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, {**dict(context.run_config), **overrides}, out_dir, overwrite)

    return server_app


app = build_server_app()
