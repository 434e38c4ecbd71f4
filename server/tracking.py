"""Experiment trackers fed by the Recorder: each round's record and the final summary, the
same records rounds.jsonl and summary.json hold, go to TensorBoard event files in the results
folder (run-config ``tensorboard``, on by default) and to MLflow (``mlflow-tracking-uri``).

A tracker that fails mid-run is warned about once and dropped: it never stops the run."""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from headway.core.config import ConfigError
from headway.core.settings import Settings

log = logging.getLogger("headway")

MLFLOW_EXTRA = "pip install -e '.[mlflow]' in headway's checkout"  # not 'headway[mlflow]': PyPI's "headway" is another project
# what MLflow prints on every run with a SQLite store, none of it the user's to act on: SQLAlchemy 2's deprecation of a
# loader MLflow's store uses (with a site-packages path), and two INFO lines as it creates or upgrades its tables
MLFLOW_DEPRECATION = r"The ``noload`` loader strategy is deprecated"
MLFLOW_CHATTY_LOGGERS = ("mlflow.store.db.utils", "alembic.runtime.migration")
EVENT_FILE_GLOB = "events.out.tfevents.*"  # what SummaryWriter writes (--overwrite removes them with the other result files)
_FIXED_GROUP = {
    "clients": "clients",
    "selected": "clients",
    "failures": "clients",
    "absent": "clients",
    "aggregated": "clients",
    "eval_clients": "clients",
    "seconds": "time",
    "elapsed_seconds": "time",
}


class Sink(Protocol):
    """Where a run's records go besides the results folder's JSON files."""

    name: str

    def round(self, record: Mapping[str, Any]) -> None:
        """Record one round's figures; a failure here is caught by Trackers and ends only this sink."""

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Record the run's summary and close, since no more rounds follow."""


def scalar_tag(name: str) -> str:
    """A record field's tag, grouped so a tracker shows like figures together:
    accuracy/, loss/, bytes/, clients/, time/, privacy/, other/."""
    if name in _FIXED_GROUP:
        group = _FIXED_GROUP[name]
    elif "bytes" in name:
        group = "bytes"
    elif "accuracy" in name or name.endswith("_r2"):
        group = "accuracy"
    elif "loss" in name:
        group = "loss"
    elif "epsilon" in name:
        group = "privacy"
    elif "seconds" in name or "_cpu_" in name:
        group = "time"
    else:
        group = "other"
    return f"{group}/{name}"


def _number(value: Any) -> float | None:
    """A finite float for a number or a bool (aggregated: 1/0); None for anything else."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def round_scalars(record: Mapping[str, Any]) -> dict[str, float]:
    """Every number of a round record by its tag (``selected`` counted); lists, dicts,
    strings and null or non-finite values are left out (histograms are separate)."""
    out: dict[str, float] = {}
    for name, value in record.items():
        if name == "round":
            continue
        if name == "selected" and isinstance(value, list):
            value = len(value)
        number = _number(value)
        if number is not None:
            out[scalar_tag(name)] = number
    return out


def round_histograms(record: Mapping[str, Any]) -> dict[str, list[float]]:
    """The round's per-client figures worth a histogram: FedProf's scores (partition -> score)."""
    scores = record.get("fedprof_scores")
    if not isinstance(scores, Mapping):
        return {}
    values = [v for v in (_number(s) for s in scores.values()) if v is not None]
    return {"fedprof/scores": values} if values else {}


def summary_scalars(summary: Mapping[str, Any]) -> dict[str, float]:
    """The summary's numbers under summary/, and the DP figures (ε, ε by the RDP accountant, δ) under privacy/."""
    out = {f"summary/{k}": v for k, v in ((k, _number(v)) for k, v in summary.items()) if v is not None}
    dp = summary.get("dp")
    if isinstance(dp, Mapping):
        for key in ("epsilon", "epsilon_rdp", "delta", "sigma", "noise_multiplier"):
            value = _number(dp.get(key))
            if value is not None:
                out[f"privacy/{key}"] = value
    return out


def _flat_params(cfg: Mapping[str, Any]) -> dict[str, str]:
    """The run config as MLflow params (strings, within MLflow's 6000-character value limit)."""
    return {k: str(v)[:6000] for k, v in sorted(cfg.items())}


class TensorBoardSink:
    """TensorBoard event files in the results folder, written by torch's SummaryWriter."""

    name = "tensorboard"

    def __init__(self, out: Path, cfg: Mapping[str, Any]):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(out))
        self.writer.add_text("config", "\n".join(f"    {k} = {v!r}" for k, v in sorted(cfg.items())), 0)

    def round(self, record: Mapping[str, Any]) -> None:
        """Write the round's scalars and histograms at its step and flush, so an open TensorBoard sees the round now."""
        step = int(record["round"])
        for tag, value in round_scalars(record).items():
            self.writer.add_scalar(tag, value, step)
        for tag, values in round_histograms(record).items():
            self.writer.add_histogram(tag, np.asarray(values, dtype=np.float64), step)
        self.writer.flush()  # a TensorBoard open during the run sees the round now, not in two minutes

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Write the summary's scalars and the run's status, then close the writer."""
        step = int(summary.get("rounds") or 0)
        for tag, value in summary_scalars(summary).items():
            self.writer.add_scalar(tag, value, step)
        self.writer.add_text("status", f"{summary.get('status')}: {summary.get('reason') or 'complete'}", step)
        self.writer.close()


class MLflowSink:
    """One MLflow run per headway run, at the tracking URI the run config names: the config
    as params, each round's figures as metrics (step = round), the summary's at the end."""

    name = "mlflow"

    def __init__(self, uri: str, out: Path, cfg: Mapping[str, Any]):
        mlflow = require_mlflow()
        from mlflow.tracking import MlflowClient

        quiet_mlflow()
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name("headway")
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment("headway")
        run = self.client.create_run(experiment_id, run_name=out.name, tags={"results_folder": str(out)})
        self.run_id = run.info.run_id
        self.client.log_batch(self.run_id, params=[mlflow.entities.Param(k, v) for k, v in _flat_params(cfg).items()])

    def round(self, record: Mapping[str, Any]) -> None:
        """Log the round's scalars to the MLflow run in one batch; histograms go as min, max and mean, which MLflow can show."""
        import time

        from mlflow.entities import Metric

        step, now = int(record["round"]), int(time.time() * 1000)
        metrics = [Metric(tag, value, now, step) for tag, value in round_scalars(record).items()]
        for tag, values in round_histograms(record).items():  # MLflow has no histogram: its spread
            metrics += [Metric(f"{tag}_{k}", f(values), now, step) for k, f in (("min", min), ("max", max))]
            metrics.append(Metric(f"{tag}_mean", sum(values) / len(values), now, step))
        self.client.log_batch(self.run_id, metrics=metrics)

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Log the summary's scalars and the run's status and reason as tags."""
        import time

        from mlflow.entities import Metric, RunTag

        step, now = int(summary.get("rounds") or 0), int(time.time() * 1000)
        metrics = [Metric(tag, value, now, step) for tag, value in summary_scalars(summary).items()]
        tags = [RunTag("status", str(summary.get("status"))), RunTag("reason", str(summary.get("reason") or ""))]
        self.client.log_batch(self.run_id, metrics=metrics, tags=tags)
        self.client.set_terminated(self.run_id, "FINISHED" if summary.get("status") == "complete" else "FAILED")


def quiet_mlflow() -> None:
    """MLflow's store set-up lines (MLFLOW_CHATTY_LOGGERS) at WARNING, unless set higher already, and SQLAlchemy's
    deprecation warning about MLflow's own code ignored: by its message, from mlflow's modules only."""
    warnings.filterwarnings("ignore", message=MLFLOW_DEPRECATION, module=r"mlflow\.")
    for name in MLFLOW_CHATTY_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level < logging.WARNING:
            logger.setLevel(logging.WARNING)


def require_mlflow() -> Any:
    """The mlflow module, or ConfigError naming the extra that brings it."""
    try:
        import mlflow
        import mlflow.entities  # noqa: F401
    except ImportError:
        raise ConfigError(
            f"run-config key 'mlflow-tracking-uri' is set, but mlflow is not installed: {MLFLOW_EXTRA} "
            "(or pip install mlflow-skinny), or leave the key empty"
        ) from None
    return mlflow


def check_trackers(cfg: Settings) -> None:
    """ConfigError when the run config names a tracker this install cannot write to (mlflow missing)."""
    if cfg.mlflow_tracking_uri:
        require_mlflow()


class Trackers:
    """The run's sinks, fed each round record and the summary; one that raises is warned
    about once and dropped (a tracker must never stop a run or lose its results)."""

    def __init__(self, sinks: list[Sink]):
        self.sinks = list(sinks)

    @classmethod
    def for_run(cls, out: Path, cfg: Settings) -> Trackers:
        """The sinks the run config asks for. A missing mlflow is a ConfigError (the user
        asked for it); a tracker that cannot start is a warning, and the run goes on."""
        sinks: list[Sink] = []
        uri = cfg.mlflow_tracking_uri
        check_trackers(cfg)
        params = cfg.to_config()  # key = value, as config.json lists them
        starts: list[tuple[str, Any]] = []
        if cfg.tensorboard:
            starts.append(("tensorboard", lambda: TensorBoardSink(out, params)))
        if uri:
            starts.append(("mlflow", lambda: MLflowSink(uri, out, params)))
        for name, start in starts:
            try:
                sinks.append(start())
            except Exception as exc:
                log.warning(
                    "%s: not recording this run (%s: %s); rounds.jsonl and summary.json are written as usual", name, type(exc).__name__, exc
                )
        return cls(sinks)

    def _each(self, what: str, payload: Mapping[str, Any]) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, what)(payload)
            except Exception as exc:
                self.sinks.remove(sink)
                log.warning(
                    "%s: writing failed (%s: %s); not recording the rest of this run there (rounds.jsonl and summary.json are unaffected)",
                    sink.name,
                    type(exc).__name__,
                    exc,
                )

    def round(self, record: Mapping[str, Any]) -> None:
        """Pass the round to every sink still working; one that fails is dropped with a warning, never failing the run."""
        self._each("round", record)

    def finish(self, summary: Mapping[str, Any]) -> None:
        """Pass the summary to every sink still working, then drop them all, since the run has ended."""
        self._each("finish", summary)
        self.sinks = []
