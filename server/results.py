"""The results folder of a run: config.json, rounds.jsonl, summary.json and plots."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

from headway.core.goal import first_round_reaching
from headway.core.rounds import clients_note, eval_note, short_rounds
from headway.core.settings import Settings
from headway.server.tracking import EVENT_FILE_GLOB, Trackers

log = logging.getLogger("headway")

# What a run writes into its folder; --overwrite removes these, and nothing else.
RESULT_FILES = ("config.json", "rounds.jsonl", "summary.json", "accuracy_vs_round.png", "accuracy_vs_bytes.png")
# Folders a run writes into its folder (its checkpoints, and in simulation its clients' local state); --overwrite removes them too.
RESULT_FOLDERS = ("checkpoints", "client-state")
STATUSES = ("complete", "failed", "interrupted")


class ResultsFolderError(FileExistsError):
    """The results folder already holds files (and overwriting was not asked for), or is not a folder."""


def check_out_dir(out_dir: str | Path, overwrite: bool = False) -> None:
    """Raise :class:`ResultsFolderError` unless ``out_dir`` is new, an empty folder, or
    ``overwrite`` is set. Changes nothing on disk."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise ResultsFolderError(f"results folder {str(out)!r} is a file, not a folder; choose another folder")
    if overwrite or not out.exists():
        return
    held = sorted(p.name for p in out.iterdir())
    if held:
        shown = ", ".join(held[:5]) + (f", ... ({len(held)} entries)" if len(held) > 5 else "")
        raise ResultsFolderError(
            f"results folder {str(out)!r} already holds files ({shown}); pass --overwrite to replace "
            "an earlier run's results, or choose another folder"
        )


def clear_results(out_dir: str | Path) -> list[str]:
    """Remove an earlier run's result files (:data:`RESULT_FILES`) and folders (:data:`RESULT_FOLDERS`: its
    checkpoints would otherwise resume the wrong run) from ``out_dir``; other files and subfolders stay.
    Returns the names removed."""
    import shutil

    out = Path(out_dir)
    removed = []
    for path in [out / name for name in RESULT_FILES] + sorted(out.glob(EVENT_FILE_GLOB)):
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(path.name)
    for name in RESULT_FOLDERS:
        if (out / name).is_dir() and not (out / name).is_symlink():
            shutil.rmtree(out / name)
            removed.append(name + "/")
    return removed


def _clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class Recorder:
    """Writes one run's results as rounds arrive, and the summary and plots at the end.

    ``out_dir`` must be new or empty; with ``overwrite`` an earlier run's result files
    there are removed first. Otherwise :class:`ResultsFolderError` is raised and nothing
    is written. Each round record and the summary also go to the run's trackers
    (:mod:`headway.server.tracking`: TensorBoard event files here, MLflow where configured).
    """

    def __init__(self, out_dir: str | Path, cfg: Settings, overwrite: bool = False):
        self.out = Path(out_dir)
        check_out_dir(self.out, overwrite)
        if overwrite:
            clear_results(self.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self.rounds: list[dict[str, Any]] = []
        self.resumed: list[dict[str, Any]] = []  # summary.json's resumed list: empty for a run that never stopped
        self.resume_note: dict[str, Any] | None = None
        self.cumulative = 0
        self.bytes_to_target: int | None = None
        self.round_to_target: int | None = None
        self.started = time.monotonic()
        (self.out / "config.json").write_text(json.dumps(_clean(cfg.to_config()), indent=2, sort_keys=True))
        (self.out / "rounds.jsonl").write_text("")
        self.trackers = Trackers.for_run(self.out, cfg)

    @classmethod
    def reopen(cls, out_dir: str | Path, cfg: Settings, started: float | None = None) -> Recorder:
        """A Recorder over a folder a run already wrote into (its rounds.jsonl is read back,
        a torn last line skipped), so that :meth:`finish` can write the summary of a run
        whose own Recorder never did. Writes config.json and rounds.jsonl only where they
        are missing. ``started`` is the run's ``time.monotonic()`` start, for wall_seconds."""
        self = cls.__new__(cls)
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self.rounds, self.cumulative = [], 0
        self.resumed, self.resume_note = [], None
        self.bytes_to_target = self.round_to_target = None
        self.started = time.monotonic() if started is None else started
        self.trackers = Trackers([])  # the run's own Recorder fed its trackers the rounds; a second run there would only confuse them
        if not (self.out / "config.json").exists():
            (self.out / "config.json").write_text(json.dumps(_clean(cfg.to_config()), indent=2, sort_keys=True))
        path = self.out / "rounds.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        if not path.exists():
            path.write_text("")
        target = cfg.target_accuracy
        for line in lines:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            self.cumulative = record.get("cumulative_bytes", self.cumulative + record.get("bytes_down", 0) + record.get("bytes_up", 0))
            acc = record.get("accuracy")
            if target > 0 and self.bytes_to_target is None and acc is not None and acc >= target:
                self.bytes_to_target, self.round_to_target = self.cumulative, record.get("round")
            self.rounds.append(record)
        return self

    @classmethod
    def resume(cls, out_dir: str | Path, cfg: Settings, rounds: list[dict[str, Any]], elapsed: float, resumed: dict[str, Any]) -> Recorder:
        """A Recorder going on with the run in ``out_dir`` from a checkpoint: rounds.jsonl rewritten from its
        ``rounds`` (a round recorded after the checkpoint is redone, so every round appears once), config.json
        from ``cfg`` (e.g. a larger num-server-rounds), wall seconds going on from ``elapsed``. ``resumed`` (after
        which round, from which file) joins summary.json's ``resumed`` list and the next round's record."""
        self = cls.__new__(cls)
        self.out = Path(out_dir)
        self.cfg = cfg
        self.rounds, self.cumulative = [], 0
        self.bytes_to_target = self.round_to_target = None
        self.started = time.monotonic() - elapsed
        (self.out / "summary.json").unlink(missing_ok=True)  # an extended run's old summary would pass for this one's if it stops
        (self.out / "config.json").write_text(json.dumps(_clean(cfg.to_config()), indent=2, sort_keys=True))
        (self.out / "rounds.jsonl").write_text("".join(json.dumps(_clean(r)) + "\n" for r in rounds))
        for record in rounds:
            self._count(record)
            self.rounds.append(record)
        # every resume of this run: those before are named in the first record each one wrote
        self.resumed = [dict(r["resumed"]) for r in rounds if isinstance(r.get("resumed"), dict)] + [dict(resumed)]
        self.resume_note = dict(resumed)  # added to the next record written
        self.trackers = Trackers.for_run(self.out, cfg)
        return self

    def _count(self, record: dict[str, Any]) -> None:
        """Add ``record`` to the running byte count (its ``cumulative_bytes``) and the target check."""
        self.cumulative += record["bytes_down"] + record["bytes_up"]
        record["cumulative_bytes"] = self.cumulative
        acc = record.get("accuracy")
        target = self.cfg.target_accuracy
        if target > 0 and self.bytes_to_target is None and acc is not None and acc >= target:
            self.bytes_to_target, self.round_to_target = self.cumulative, record["round"]

    def elapsed(self) -> float:
        """Wall seconds the run has used (those before a resume included)."""
        return time.monotonic() - self.started

    def round(self, record: dict[str, Any]) -> None:
        """Add a round's record to the running byte count and target check, and append it to rounds.jsonl at once so a crash keeps it."""
        self._count(record)
        acc = record.get("accuracy")
        if self.resume_note is not None:  # the first round after a resume: its re-registration bytes and where it resumed from
            note, self.resume_note = self.resume_note, None
            note.update({k: record[k] for k in ("resume_bytes_down", "resume_bytes_up") if k in record})
            self.resumed[-1] = note
            record["resumed"] = note
        self.rounds.append(record)
        with open(self.out / "rounds.jsonl", "a") as fh:
            fh.write(json.dumps(_clean(record)) + "\n")
        self.trackers.round(_clean(record))
        acc_s = "n/a" if acc is None else f"{acc:.4f}"
        log.info(
            "round %d/%d  accuracy %s%s  %s  bytes %d (cumulative %d)  failures %d  %.1f s  %s",
            record["round"],
            self.cfg.num_server_rounds,
            acc_s,
            eval_note(record),  # headway.core.rounds: accuracy over fewer clients' test splits than registered
            clients_note(record),  # headway.core.rounds: clients used of wanted, and who is missing
            record["bytes_down"] + record["bytes_up"],
            self.cumulative,
            record["failures"],
            record["seconds"],
            progress(self.rounds, self.cfg.num_server_rounds, time.monotonic() - self.started),
        )

    def finish(
        self, extra: dict[str, Any] | None = None, status: str = "complete", reason: str | None = None, unfinished_failures: int = 0
    ) -> dict[str, Any]:
        """Write summary.json (and the plots, when there are rounds) and return the summary.
        ``unfinished_failures``: client failures of a round that stopped the run before its record
        was written (e.g. every client failed in round 1); they count in ``failures``.

        ``status`` is "complete", "failed" or "interrupted"; ``reason`` says why a run did
        not complete (null when complete). Safe after a failure: zero rounds, or rounds
        without accuracy, give null accuracies and zero bytes.
        """
        if status not in STATUSES:
            raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        if status == "complete":
            reason = None
        elif not reason:
            reason = "unknown"
        accs = [r["accuracy"] for r in self.rounds if r.get("accuracy") is not None]
        summary = {
            "algorithm": self.cfg.algorithm,
            "dataset": self.cfg.dataset,
            "num_clients": self.cfg.num_clients,
            "rounds": len(self.rounds),
            "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(accs) if accs else None,
            "total_bytes": self.cumulative,
            "total_bytes_down": sum(r.get("bytes_down", 0) for r in self.rounds),
            "total_bytes_up": sum(r.get("bytes_up", 0) for r in self.rounds),
            "total_eval_bytes": sum(r.get("eval_bytes_down", 0) + r.get("eval_bytes_up", 0) for r in self.rounds),
            "target_accuracy": self.cfg.target_accuracy or None,
            "bytes_to_target": self.bytes_to_target,
            "round_to_target": self.round_to_target,
            "failures": sum(r.get("failures", 0) for r in self.rounds) + unfinished_failures,
            "wall_seconds": time.monotonic() - self.started,
        }
        if self.cfg.goal_accuracy > 0:  # the round the run stopped at its goal (core/goal.py); null: never reached
            summary["goal_round"] = first_round_reaching(self.rounds, self.cfg.goal_accuracy)
        summary.update(values_totals(self.rounds, self.round_to_target))
        summary.update(params_totals(self.rounds))
        summary.update(short_rounds(self.rounds))  # headway.core.rounds: rounds that ran without some client
        summary.update(global_progress(self.rounds, self.cfg.target_accuracy))
        if self.cfg.client_noise:
            summary["participation_by_noise"] = participation_by_noise(self.rounds, self.cfg)
        if accs:
            best_round = max((r for r in self.rounds if r.get("accuracy") is not None), key=lambda r: r["accuracy"])
            summary["bytes_to_best"] = best_round.get("cumulative_bytes")
        if self.resumed:
            summary["resumed"] = self.resumed
        summary.update(extra or {})
        summary["status"], summary["reason"] = status, reason  # after extra: never overridden
        (self.out / "summary.json").write_text(json.dumps(_clean(summary), indent=2))
        self.trackers.finish(_clean(summary))
        if self.rounds:
            try:
                plot_curves(
                    {self.cfg.algorithm: self.rounds},
                    self.out,
                    plot_title(self.cfg.algorithm, self.cfg.dataset),
                    target=self.cfg.target_accuracy or None,
                )
            except Exception as exc:  # a plot must never lose a run's numbers
                log.warning("plotting failed: %s", exc)
        return summary


def format_duration(seconds: float) -> str:
    """A duration as a person reads it: 42 s, 3 min 05 s, 2 h 07 min."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def progress(rounds: list[dict[str, Any]], total: int, elapsed: float) -> str:
    """The round line's tail: time since the run began and, while rounds remain, the time
    left at the pace (mean ``seconds``) of the last five rounds after round 1. Round 1 gives no
    estimate: it carries the start-up (workers, data loading, FedLog's statistics round), which
    can outweigh many later rounds, so the time left appears from round 2's line on."""
    done = len(rounds)
    shown = f"elapsed {format_duration(elapsed)}"
    if done >= total or done < 2:
        return shown
    recent = rounds[1:][-5:]
    pace = sum(float(r.get("seconds") or 0.0) for r in recent) / len(recent)
    return f"{shown}, about {format_duration(pace * (total - done))} left"


def params_totals(rounds: list[dict[str, Any]]) -> dict[str, int | None]:
    """Parameters (array elements) communicated in the run: the training exchanges both ways plus LG-FedAvg's
    one new-test upload (the paper counts it, its footnote 1), evaluation left out; None for results written before."""
    if not rounds or any("params_down" not in r for r in rounds):
        return {"params_communicated": None}
    train = sum(r["params_down"] + r["params_up"] for r in rounds)
    upload = sum(r.get("params_upload_up", 0) for r in rounds)  # the models sent up once (the request's layers: training's)
    return {"params_communicated": train + upload, "params_communicated_training": train}


def values_totals(rounds: list[dict[str, Any]], round_to_target: int | None) -> dict[str, int | None]:
    """Array-value bytes alone (no framing: what papers count), in total and to the target
    round; None where a round lacks them (results written before they were recorded)."""
    if not rounds or any("values_bytes_down" not in r for r in rounds):
        return {"total_values_bytes": None, "values_bytes_to_target": None}
    total, to_target = 0, None
    for r in rounds:
        total += r["values_bytes_down"] + r["values_bytes_up"]
        if round_to_target is not None and r.get("round") == round_to_target:
            to_target = total
    return {"total_values_bytes": total, "values_bytes_to_target": to_target}


def global_progress(rounds: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """The single global model's score on the whole test set (accuracy, or R² for a
    regression task): best, final, and the round and cumulative bytes where it first
    reached ``target``. Empty when no round scored a global model."""
    name = next((k for k in ("global_accuracy", "global_r2") if any(r.get(k) is not None for r in rounds)), None)
    if name is None:
        return {}
    scored = [r for r in rounds if r.get(name) is not None]
    best = max(scored, key=lambda r: r[name])
    hit = next((r for r in scored if target > 0 and r[name] >= target), None)
    return {
        "global_metric": name,
        "global_final": scored[-1][name],
        "global_best": best[name],
        "global_best_round": best["round"],
        "global_round_to_target": None if hit is None else hit["round"],
        "global_bytes_to_target": None if hit is None else hit.get("cumulative_bytes"),
    }


def participation_by_noise(rounds: list[dict[str, Any]], cfg: Settings) -> dict[str, float]:
    """Per client-noise kind (and ``clean``): the mean number of rounds its clients trained in."""
    from headway.core.noise import noise_assignment

    kinds = noise_assignment(cfg.client_noise, cfg.num_clients, cfg.seed)
    members: dict[str, list[int]] = {}
    for pid in range(cfg.num_clients):
        members.setdefault(kinds.get(pid, "clean"), []).append(pid)
    taken = {pid: 0 for pid in range(cfg.num_clients)}
    for record in rounds:
        for pid in record.get("selected", []):
            if pid in taken:
                taken[pid] += 1
    return {kind: sum(taken[p] for p in pids) / len(pids) for kind, pids in sorted(members.items())}


ACCURACY_LABEL = "test accuracy (sample-weighted over clients' test splits)"


def plot_title(algorithm: str, dataset: str) -> str:
    """What the user ran: the method on a built-in data set's name, their data's folder or file
    name, or "node-local data" where every node read its own (dataset=local)."""
    from headway.core.config import dataset_kind

    name = str(dataset)
    kind = dataset_kind(name)
    data = {"local": "node-local data", "path": Path(name.rstrip("/\\")).name or name}.get(kind or "", name)
    return f"{algorithm} on {data}"


def troubled_rounds(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scored rounds in which some client failed, was refused, or was missing (registered, not connected)."""
    return [r for r in rounds if r.get("accuracy") is not None and (r.get("failures") or r.get("absent"))]


def plot_curves(series: dict[str, list[dict[str, Any]]], out: Path, title: str, target: float | None = None) -> dict[str, Any]:
    """accuracy_vs_round.png and accuracy_vs_bytes.png in ``out``, one line per series;
    ``target`` (an accuracy) is drawn as a labelled dashed line, and rounds with failed or
    missing clients are marked. Returns the two figures by file name (closed; for tests)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import EngFormatter, LogLocator, MaxNLocator, NullFormatter

    figures = {}
    for key, name, label in (
        ("round", "accuracy_vs_round.png", "round"),
        ("cumulative_bytes", "accuracy_vs_bytes.png", "cumulative bytes, up + down"),
    ):
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        xs_all: list[float] = []
        marked = False
        for label_s, rounds in series.items():
            pts = [(r[key], r["accuracy"]) for r in rounds if r.get("accuracy") is not None]
            if not pts:
                continue
            xs, ys = zip(*pts)
            xs_all += xs
            ax.plot(xs, ys, label=label_s, marker="." if len(xs) < 40 else None)
            bad = troubled_rounds(rounds)
            if bad:
                ax.plot(
                    [r[key] for r in bad],
                    [r["accuracy"] for r in bad],
                    linestyle="none",
                    marker="x",
                    color="tab:red",
                    markersize=8,
                    label=None if marked else "client failed or missing",
                    gid="troubled",
                )
                marked = True
        if target:
            ax.axhline(target, linestyle="--", color="tab:gray", linewidth=1, label=f"target {target:g}", gid="target")
        ax.set_xlabel(label)
        ax.set_ylabel(ACCURACY_LABEL, fontsize=9)
        if key == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        elif xs_all and min(xs_all) > 0 and max(xs_all) / min(xs_all) >= 10:  # a log axis only where it spans a decade
            ax.set_xscale("log")
            ax.set_xlabel(label + " (log scale)")
            decades = math.log10(max(xs_all) / min(xs_all))
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0) if decades <= 3 else (1.0,), numticks=12))
            ax.xaxis.set_minor_locator(LogLocator(base=10, subs=tuple(range(1, 10)), numticks=12))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.xaxis.set_major_formatter(EngFormatter(unit="B", places=0, sep=" "))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(nbins=5))
            ax.xaxis.set_major_formatter(EngFormatter(unit="B", sep=" "))
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if len(series) > 1 or target or marked:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        figures[name] = fig
    return figures
