"""FedProf on 28×28 grayscale data it was not tuned on (issue 42, part D): each
``fedprof-aggregation`` (and each profiled layer) against FedAvg with the same aggregation,
on the same noisy clients (``configs/fedprof-untuned.toml``: 20 iid clients, 30 % irrelevant,
20 % salt-and-pepper, mnist-cnn, 12 rounds, K/N = 0.25, α = 10).

The FedAvg arm is FedProf with ``fedprof-alpha=0``: uniform selection, FedProf's aggregation.
Data sets: ``cifar10-gray`` and ``mnist`` (built in), and ``digits``: scikit-learn's bundled
UCI optical digits (1,797 8×8 images) upsampled to 28×28 and written as a user's own ``.npz``
(docs/your-data.md) to ``results/digits28/`` in the checkout (ignored by git; relative, so
config.json names no machine path).

    headway bench fedprof_untuned --datasets cifar10-gray mnist digits --modes full partial full-cache --seeds 0 1
    headway bench fedprof_untuned --datasets cifar10-gray --modes partial --layers body body.fcs.0 --seeds 0 1
    headway bench fedprof_untuned --summarize-only

Results: ``benchmarks/results/fedprof-untuned[-<tag>]/<data>/<mode>[@<layer>]/<method>-s<seed>/``
and ``table.md`` beside them (final and best accuracy, rounds per client by noise kind, and
the AUC of the last divergences: P(a noisy client diverges more than a clean one)).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
from headway.strategies.fedprof import SECRET_ENV

from benchmarks.runner import ROOT, add_run_arguments, finished, load_run, results_root, simulate

CONFIG = "benchmarks/configs/fedprof-untuned.toml"
MODES = ("full", "partial", "full-cache")
METHODS: dict[str, dict[str, Any]] = {"fedprof": {}, "fedavg": {"fedprof-alpha": 0.0}}
DIGITS_TEST = 297  # of scikit-learn's 1,797 digits; the other 1,500 are training rows
DIGITS_VAL = 300  # fedprof-val-size for digits: the default 1,000 would leave 25 rows a client


DIGITS_FOLDER = Path("results") / "digits28"  # relative to the checkout, where simulate runs


def upsample(images: np.ndarray, side: int) -> np.ndarray:
    """``images`` (n, h, w) with values in [0, 16] as uint8 (n, side, side) in [0, 255], bilinear."""
    import torch

    x = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)
    y = torch.nn.functional.interpolate(x, size=(side, side), mode="bilinear", align_corners=False)
    return (y.squeeze(1).clamp(0, 1) * 255).round().to(torch.uint8).numpy()


def write_digits(folder: Path) -> Path:
    """scikit-learn's digits upsampled to 28×28 as ``folder/digits28.npz`` (x_train, y_train,
    x_test, y_test; a fixed shuffle); written once, the path returned."""
    path = folder / "digits28.npz"
    if path.exists():
        return path
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    x, y = upsample(digits.images[order], 28), digits.target[order].astype(np.int64)
    folder.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, x_train=x[DIGITS_TEST:], y_train=y[DIGITS_TEST:], x_test=x[:DIGITS_TEST], y_test=y[:DIGITS_TEST])
    return path


def dataset_overrides(name: str) -> dict[str, Any]:
    """Run-config keys of the data set ``name``."""
    if name == "digits":
        write_digits(ROOT / DIGITS_FOLDER)
        return {"dataset": f"{DIGITS_FOLDER / 'digits28.npz'}", "fedprof-val-size": DIGITS_VAL}
    return {"dataset": name}


def folder_name(mode: str, layer: str) -> str:
    """``mode``, or ``mode@layer`` for a layer other than the default ``body``."""
    return mode if layer == "body" else f"{mode}@{layer}"


def divergence_auc(divs: dict[str, float], noise: dict[int, str]) -> float | None:
    """P(div of a noisy client > div of a clean one), ties half: 1 is a perfect ranking."""
    clean = [d for p, d in divs.items() if noise.get(int(p), "clean") == "clean"]
    noisy = [d for p, d in divs.items() if noise.get(int(p), "clean") != "clean"]
    if not clean or not noisy:
        return None
    pairs = [(n > c) + 0.5 * (n == c) for n in noisy for c in clean]
    return float(np.mean(pairs))


def run_row(folder: Path) -> dict[str, Any]:
    """Final and best accuracy, the accuracy curve, rounds per client by noise kind, AUC of one run."""
    from headway.core.noise import noise_assignment

    summary, rounds = load_run(folder)
    cfg = json.loads((folder / "config.json").read_text())
    noise = noise_assignment(cfg["client-noise"], int(cfg["num-clients"]), int(cfg["seed"]))
    return {
        "final": summary.get("final_accuracy"),
        "best": summary.get("best_accuracy"),
        "curve": [r.get("accuracy") for r in rounds],
        "participation": summary.get("participation_by_noise", {}),
        "auc": divergence_auc(summary.get("fedprof_last_divergence") or {}, noise),
    }


def _ms(values: list[float]) -> str:
    v = [x for x in values if x is not None]
    if not v:
        return "–"
    return f"{np.mean(v):.3f}" + (f" ± {np.std(v):.3f}" if len(v) > 1 else "")


def report(root: Path) -> list[dict[str, Any]]:
    """table.md and figures.json of every finished run under ``root``."""
    rows: list[dict[str, Any]] = []
    for data in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        for mode in sorted(p for p in data.iterdir() if p.is_dir()):
            runs: dict[str, list[dict[str, Any]]] = {}
            for run in sorted(mode.iterdir()):
                if finished(run):
                    runs.setdefault(run.name.rsplit("-s", 1)[0], []).append({"seed": run.name.rsplit("-s", 1)[1], **run_row(run)})
            for method, got in sorted(runs.items()):
                kinds = sorted({k for g in got for k in g["participation"]})
                rows.append(
                    {
                        "data": data.name,
                        "mode": mode.name,
                        "method": method,
                        "seeds": [g["seed"] for g in got],
                        "final": [g["final"] for g in got],
                        "best": [g["best"] for g in got],
                        "participation": {k: float(np.mean([g["participation"].get(k, 0.0) for g in got])) for k in kinds},
                        "auc": [g["auc"] for g in got],
                        "curves": [g["curve"] for g in got],
                    }
                )
    if not rows:
        print(f"no runs under {root}")
        return rows
    lines = [
        "| data | aggregation[@layer] | method | seeds | final accuracy | best accuracy | rounds per client by kind | divergence AUC |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        part = ", ".join(f"{k} {v:.2f}" for k, v in r["participation"].items())
        auc = _ms(r["auc"]) if r["method"] == "fedprof" else "–"
        lines.append(
            f"| {r['data']} | {r['mode']} | {r['method']} | {','.join(r['seeds'])} | {_ms(r['final'])} | {_ms(r['best'])} | {part} | {auc} |"
        )
    (root / "table.md").write_text("\n".join(lines) + "\n")
    (root / "figures.json").write_text(json.dumps(rows, indent=1) + "\n")
    print("\n".join(lines))
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="headway bench fedprof_untuned", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--datasets", nargs="+", default=["cifar10-gray", "mnist", "digits"], choices=["cifar10-gray", "mnist", "digits"])
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--methods", nargs="+", choices=sorted(METHODS), default=list(METHODS))
    p.add_argument(
        "--layers", nargs="+", default=["body"], help="fedprof-layer values (body: the default; body.fcs.0: mnist-cnn's pre-activation)"
    )
    add_run_arguments(p)
    args = p.parse_args(argv)
    os.environ.setdefault(SECRET_ENV, "headway-benchmarks")  # a benchmark's D^V must be repeatable
    root = results_root("fedprof-untuned", args.tag)
    if not args.summarize_only:
        for seed in args.seeds:
            for data in args.datasets:
                for layer in args.layers:
                    for mode in args.modes:
                        for method in args.methods:
                            overrides = {
                                **dataset_overrides(data),
                                "fedprof-aggregation": mode,
                                "fedprof-layer": layer,
                                "seed": seed,
                                **METHODS[method],
                            }
                            simulate(CONFIG, root / data / folder_name(mode, layer) / f"{method}-s{seed}", overrides, args.set)
    report(root)


if __name__ == "__main__":
    main()
