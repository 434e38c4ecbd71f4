"""The results folder of a run: config.json, rounds.jsonl, summary.json and plots."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("headway")

# What a run writes into its folder; --overwrite removes these, and nothing else.
RESULT_FILES = ("config.json", "rounds.jsonl", "summary.json", "accuracy_vs_round.png", "accuracy_vs_bytes.png")
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
    """Remove an earlier run's result files (:data:`RESULT_FILES`) from ``out_dir``; other
    files and subfolders stay. Returns the names removed."""
    out = Path(out_dir)
    removed = []
    for name in RESULT_FILES:
        path = out / name
        if path.is_file() or path.is_symlink():
            path.unlink()
            removed.append(name)
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
    is written.
    """

    def __init__(self, out_dir: str | Path, cfg: dict[str, Any], overwrite: bool = False):
        self.out = Path(out_dir)
        check_out_dir(self.out, overwrite)
        if overwrite:
            clear_results(self.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self.rounds: list[dict[str, Any]] = []
        self.cumulative = 0
        self.bytes_to_target: int | None = None
        self.round_to_target: int | None = None
        self.started = time.monotonic()
        (self.out / "config.json").write_text(json.dumps(_clean(cfg), indent=2, sort_keys=True))
        (self.out / "rounds.jsonl").write_text("")

    @classmethod
    def reopen(cls, out_dir: str | Path, cfg: dict[str, Any], started: float | None = None) -> Recorder:
        """A Recorder over a folder a run already wrote into (its rounds.jsonl is read back,
        a torn last line skipped), so that :meth:`finish` can write the summary of a run
        whose own Recorder never did. Writes config.json and rounds.jsonl only where they
        are missing. ``started`` is the run's ``time.monotonic()`` start, for wall_seconds."""
        self = cls.__new__(cls)
        self.out = Path(out_dir)
        self.out.mkdir(parents=True, exist_ok=True)
        self.cfg = cfg
        self.rounds, self.cumulative = [], 0
        self.bytes_to_target = self.round_to_target = None
        self.started = time.monotonic() if started is None else started
        if not (self.out / "config.json").exists():
            (self.out / "config.json").write_text(json.dumps(_clean(cfg), indent=2, sort_keys=True))
        path = self.out / "rounds.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        if not path.exists():
            path.write_text("")
        target = cfg.get("target-accuracy") or 0.0
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

    def round(self, record: dict[str, Any]) -> None:
        self.cumulative += record["bytes_down"] + record["bytes_up"]
        record["cumulative_bytes"] = self.cumulative
        acc = record.get("accuracy")
        target = self.cfg.get("target-accuracy") or 0.0
        if target > 0 and self.bytes_to_target is None and acc is not None and acc >= target:
            self.bytes_to_target, self.round_to_target = self.cumulative, record["round"]
        self.rounds.append(record)
        with open(self.out / "rounds.jsonl", "a") as fh:
            fh.write(json.dumps(_clean(record)) + "\n")
        acc_s = "n/a" if acc is None else f"{acc:.4f}"
        log.info(
            "round %d  accuracy %s  bytes %d (cumulative %d)  failures %d  %.1f s",
            record["round"],
            acc_s,
            record["bytes_down"] + record["bytes_up"],
            self.cumulative,
            record["failures"],
            record["seconds"],
        )

    def finish(self, extra: dict[str, Any] | None = None, status: str = "complete", reason: str | None = None) -> dict[str, Any]:
        """Write summary.json (and the plots, when there are rounds) and return the summary.

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
            "algorithm": self.cfg["algorithm"],
            "dataset": self.cfg["dataset"],
            "num_clients": self.cfg["num-clients"],
            "rounds": len(self.rounds),
            "final_accuracy": accs[-1] if accs else None,
            "best_accuracy": max(accs) if accs else None,
            "total_bytes": self.cumulative,
            "total_bytes_down": sum(r.get("bytes_down", 0) for r in self.rounds),
            "total_bytes_up": sum(r.get("bytes_up", 0) for r in self.rounds),
            "total_eval_bytes": sum(r.get("eval_bytes_down", 0) + r.get("eval_bytes_up", 0) for r in self.rounds),
            "target_accuracy": self.cfg.get("target-accuracy") or None,
            "bytes_to_target": self.bytes_to_target,
            "round_to_target": self.round_to_target,
            "failures": sum(r.get("failures", 0) for r in self.rounds),
            "wall_seconds": time.monotonic() - self.started,
        }
        summary.update(values_totals(self.rounds, self.round_to_target))
        summary.update(global_progress(self.rounds, self.cfg.get("target-accuracy") or 0.0))
        if self.cfg.get("client-noise"):
            summary["participation_by_noise"] = participation_by_noise(self.rounds, self.cfg)
        if accs:
            best_round = max((r for r in self.rounds if r.get("accuracy") is not None), key=lambda r: r["accuracy"])
            summary["bytes_to_best"] = best_round.get("cumulative_bytes")
        summary.update(extra or {})
        summary["status"], summary["reason"] = status, reason  # after extra: never overridden
        (self.out / "summary.json").write_text(json.dumps(_clean(summary), indent=2))
        if self.rounds:
            try:
                plot_curves({self.cfg["algorithm"]: self.rounds}, self.out, f"{self.cfg['algorithm']} on {self.cfg['dataset']}")
            except Exception as exc:  # a plot must never lose a run's numbers
                log.warning("plotting failed: %s", exc)
        return summary


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


def participation_by_noise(rounds: list[dict[str, Any]], cfg: dict[str, Any]) -> dict[str, float]:
    """Per client-noise kind (and ``clean``): the mean number of rounds its clients trained in."""
    from core.noise import noise_assignment

    kinds = noise_assignment(cfg["client-noise"], cfg["num-clients"], cfg["seed"])
    members: dict[str, list[int]] = {}
    for pid in range(cfg["num-clients"]):
        members.setdefault(kinds.get(pid, "clean"), []).append(pid)
    taken = {pid: 0 for pid in range(cfg["num-clients"])}
    for record in rounds:
        for pid in record.get("selected", []):
            if pid in taken:
                taken[pid] += 1
    return {kind: sum(taken[p] for p in pids) / len(pids) for kind, pids in sorted(members.items())}


def plot_curves(series: dict[str, list[dict[str, Any]]], out: Path, title: str) -> None:
    """accuracy_vs_round.png and accuracy_vs_bytes.png in ``out``, one line per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for key, name, label, logx in (
        ("round", "accuracy_vs_round.png", "round", False),
        ("cumulative_bytes", "accuracy_vs_bytes.png", "cumulative bytes (up + down)", True),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for label_s, rounds in series.items():
            pts = [(r[key], r["accuracy"]) for r in rounds if r.get("accuracy") is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, label=label_s, marker="." if len(xs) < 40 else None)
        ax.set_xlabel(label)
        ax.set_ylabel("mean client test accuracy")
        if logx:
            ax.set_xscale("log")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
