"""The headway ServerApp: validate the run config, build the method's strategy, run it,
and write the results folder."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Mapping

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from core.config import resolve
from core.data import SPECS
from server.evaluation import global_model_evaluator
from server.results import Recorder
from strategies.registry import STRATEGIES

log = logging.getLogger("headway")


def default_out_dir(cfg: Mapping[str, Any]) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(cfg["results-dir"]) / f"{cfg['algorithm']}-{cfg['dataset']}-{stamp}"


def run_server(grid: Grid, run_config: Mapping[str, Any], out_dir: str | Path | None = None) -> dict[str, Any]:
    """Run one experiment on ``grid`` and return its summary (also written to ``out_dir``)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    cfg = resolve(run_config)
    out = Path(out_dir) if out_dir else default_out_dir(cfg)
    spec = SPECS[cfg["dataset"]]
    strategy = STRATEGIES[cfg["algorithm"]](cfg)
    strategy.check(spec)
    recorder = Recorder(out, cfg)
    log.info("headway: %s on %s, %d clients, %d rounds -> %s", cfg["algorithm"], cfg["dataset"], cfg["num-clients"], cfg["num-server-rounds"], out)
    evaluate_fn = global_model_evaluator(cfg) if strategy.has_global_model and cfg["global-eval"] else None
    strategy.start(
        grid=grid,
        initial_arrays=strategy.initial_arrays(spec),
        num_rounds=cfg["num-server-rounds"],
        timeout=cfg["round-timeout"],
        evaluate_fn=evaluate_fn,
        on_round=recorder.round,
    )
    summary = recorder.finish(strategy.summary_extra())
    log.info("headway: final accuracy %s, best %s, total bytes %d, %.1f s", summary["final_accuracy"], summary["best_accuracy"], summary["total_bytes"], summary["wall_seconds"])
    return summary


def build_server_app(overrides: Mapping[str, Any] | None = None, out_dir: str | Path | None = None) -> ServerApp:
    """A ServerApp running :func:`run_server` with the Flower run config plus ``overrides``."""
    overrides = dict(overrides or {})
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, {**dict(context.run_config), **overrides}, out_dir)

    return server_app


app = build_server_app()
