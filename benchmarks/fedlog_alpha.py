"""FedLog-C's α ablation (fedlog-extended App. D.1): accuracy and Henze–Zirkler normality per α.

    headway bench fedlog_alpha --set num-server-rounds=10 --tag r10
    headway bench fedlog_alpha cifar10 --set num-server-rounds=5 --tag cifar10-r5

Runs FedLog-C (``algorithm=fedlog``, ``fedlog-alpha`` = α) on the dataset's Table 1 config for
each α of App. D.1's range (0.001 to 0.1; α = 0 is plain FedLog), one folder per (α, seed)
under ``benchmarks/results/fedlog-alpha[-TAG]/`` (resumable: finished runs are skipped). Then,
from the bodies the clients kept (the run's ``client-state/``, last training round), it maps
every client's training rows through its own body and asks the Henze–Zirkler test (pingouin,
the optional ``bench`` extra: ``.venv/bin/pip install -e '.[bench]'``) whether each class's
features, pooled over the clients that hold the class, are multivariate normal: the Gaussian
mixture FedLog's head assumes. Writes ``hz.json`` per run and prints and writes ``table.md``:
final and best accuracy, mean HZ statistic, mean p-value and the share of classes with p > 0.05.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.runner import add_run_arguments, finished, fmt_mean_se, load_run, results_root, simulate

ALPHAS = (0.0, 0.001, 0.003, 0.01, 0.03, 0.1)  # App. D.1: "from 0.001 to 0.1"; 0: FedLog without the auxiliary loss
HZ_FILE = "hz.json"
PINGOUIN_MISSING = (
    "the Henze-Zirkler test needs pingouin, the optional 'bench' extra: run `.venv/bin/pip install -e '.[bench]'` "
    "(or `.venv/bin/pip install pingouin`), then `headway bench fedlog_alpha --summarize-only` with the same --tag"
)


def run_name(alpha: float, seed: int) -> str:
    """The result folder of one (α, seed) run, e.g. ``alpha0.01-seed0``."""
    return f"alpha{alpha:g}-seed{seed}"


def hz_summary(per_class: Sequence[dict[str, Any]], space: str = "full") -> dict[str, float]:
    """Mean HZ statistic, mean p-value, the share of classes not rejected at 5 % (p > 0.05) and the mean axes tested,
    over the classes tested in ``space`` ("full": the full-rank principal subspace, "2d": the
    first two principal axes); NaN entries left out."""
    rows = [r for r in per_class if r.get("space", "full") == space and np.isfinite(r["hz"]) and np.isfinite(r["p"])]
    if not rows:
        return {"hz": float("nan"), "p": float("nan"), "normal_share": float("nan"), "classes": 0, "dims": float("nan")}
    return {
        "dims": float(np.mean([r.get("dims", np.nan) for r in rows])),
        "hz": float(np.mean([r["hz"] for r in rows])),
        "p": float(np.mean([r["p"] for r in rows])),
        "normal_share": float(np.mean([r["p"] > 0.05 for r in rows])),
        "classes": len(rows),
    }


def principal(rows: np.ndarray, k: int = 0, rel_tol: float = 1e-6) -> np.ndarray:
    """``rows`` centred and projected on their principal axes whose variance exceeds ``rel_tol`` ×
    the largest (the full-rank subspace: post-ReLU features have dead and collinear units, whose
    singular covariance pingouin scores as p = 0 whatever the rest), the first ``k`` only if k > 0."""
    centred = rows - rows.mean(axis=0)
    _, s, vt = np.linalg.svd(centred, full_matrices=False)
    keep = int(np.sum(s**2 > rel_tol * s[0] ** 2)) if len(s) and s[0] > 0 else 0
    if k > 0:
        keep = min(keep, k)
    return centred @ vt[:keep].T


def class_features(features: np.ndarray, labels: np.ndarray, k: int = 0) -> dict[int, np.ndarray]:
    """Each class's rows of ``features`` in their :func:`principal` subspace (``k`` axes at most),
    for the classes with at least 2 axes and more rows than axes (else no full-rank covariance)."""
    out = {}
    for c in np.unique(labels):
        rows = principal(features[labels == c], k)
        if rows.shape[1] >= 2 and len(rows) > rows.shape[1]:
            out[int(c)] = rows
    return out


def latest_states(run: Path) -> dict[int, Path]:
    """partition id -> its newest saved training state in ``run/client-state`` (the body after its last local training)."""
    found: dict[int, tuple[int, Path]] = {}
    for path in run.glob("client-state/run-*/partition-*/round-*-train.state"):
        pid = int(path.parent.name.split("-")[1])
        rnd = int(path.name.split("-")[1])
        if pid not in found or rnd > found[pid][0]:
            found[pid] = (rnd, path)
    return {pid: path for pid, (_, path) in found.items()}


def client_features(run: Path) -> tuple[np.ndarray, np.ndarray]:
    """(features without the constant first one, labels) of every client's training rows, each
    mapped by the body it kept, in eval mode, as the statistics it sends are computed."""
    import torch
    from flwr.common.serde import recorddict_from_proto
    from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict
    from headway.client.env import client_env
    from headway.client.procedures.fedlog import BODY_STATE, feature_map
    from headway.core.training import predict

    config: dict[str, Any] = json.loads((run / "config.json").read_text())
    states = latest_states(run)
    if not states:
        raise FileNotFoundError(f"{run} holds no client-state/ (was it run with checkpoint-keep=0, or cleaned?)")
    feats, labels = [], []
    for pid, path in sorted(states.items()):
        proto = ProtoRecordDict()
        proto.ParseFromString(path.read_bytes())
        body_state = recorddict_from_proto(proto).array_records[BODY_STATE].to_torch_state_dict()
        env = client_env(config, {"partition-id": pid, "num-partitions": int(config["num-clients"])})
        fmap = feature_map(env, body_state).eval()
        with torch.no_grad():
            phi = predict(fmap, env.x_train, device=env.device).double().numpy()
        feats.append(phi[:, 1:])
        labels.append(env.y_train.numpy())
    return np.concatenate(feats), np.concatenate(labels)


def henze_zirkler(run: Path) -> list[dict[str, float]]:
    """pingouin's Henze-Zirkler test on each class's pooled features of ``run`` (one dict per class)."""
    try:
        import pingouin
    except ImportError:
        raise SystemExit(PINGOUIN_MISSING) from None
    x, y = client_features(run)
    out = []
    for k, space in ((0, "full"), (2, "2d")):
        for c, rows in class_features(x, y, k).items():
            res = pingouin.multivariate_normality(rows, alpha=0.05)
            out.append({"class": c, "rows": len(rows), "dims": rows.shape[1], "hz": float(res.hz), "p": float(res.pval), "space": space})
    return out


def hz_cells(hz: Sequence[dict[str, float]]) -> list[str]:
    """Three table cells from per-seed :func:`hz_summary` results: mean ± s.e. HZ statistic,
    mean p-value, and the share of classes with p > 0.05."""
    return [
        fmt_mean_se([h["hz"] for h in hz], 1.0),
        f"{np.mean([h['p'] for h in hz]):.3g}",
        f"{np.mean([h['normal_share'] for h in hz]) * 100:.0f} % of {int(np.mean([h['classes'] for h in hz]))}",
    ]


def table(root: Path, alphas: Sequence[float], seeds: Sequence[int]) -> str:
    """The markdown table of the finished runs under ``root``, one row per α."""
    lines = [
        "| α | seeds | rounds | final accuracy (%) | best accuracy (%) | feature axes per class (full rank, of 50) "
        "| HZ statistic, full rank (mean over classes) | HZ p (mean) "
        "| classes with p > 0.05 | HZ statistic, 2 principal axes | HZ p (mean) | classes with p > 0.05 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for alpha in alphas:
        folders = [root / run_name(alpha, s) for s in seeds if finished(root / run_name(alpha, s))]
        if not folders:
            continue
        runs = [load_run(f) for f in folders]
        tests = [json.loads((f / HZ_FILE).read_text()) for f in folders if (f / HZ_FILE).is_file()]
        cells = ["–"] * 7
        if tests:
            axes = f"{np.mean([hz_summary(t)['dims'] for t in tests]):.1f}"
            cells = [axes] + [cell for space in ("full", "2d") for cell in hz_cells([hz_summary(t, space) for t in tests])]
        lines.append(
            f"| {alpha:g} | {len(runs)} | {len(runs[0][1])} | {fmt_mean_se([s['final_accuracy'] for s, _ in runs])} | "
            f"{fmt_mean_se([s['best_accuracy'] for s, _ in runs])} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="headway bench fedlog_alpha", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("dataset", nargs="?", default="mnist", choices=("mnist", "cifar10"))
    p.add_argument("--alphas", type=float, nargs="+", default=list(ALPHAS), help="the α values (default: App. D.1's range and 0)")
    add_run_arguments(p)
    args = p.parse_args(argv)
    root = results_root("fedlog-alpha", args.tag)
    if not args.summarize_only:
        for seed in args.seeds:
            for alpha in args.alphas:
                keys = {"algorithm": "fedlog", "fedlog-alpha": alpha, "seed": seed}
                simulate(args.dataset, root / run_name(alpha, seed), keys, args.set)
    for seed in args.seeds:
        for alpha in args.alphas:
            folder = root / run_name(alpha, seed)
            if finished(folder) and not (folder / HZ_FILE).is_file():
                (folder / HZ_FILE).write_text(json.dumps(henze_zirkler(folder), indent=1) + "\n")
    text = table(root, args.alphas, args.seeds)
    root.mkdir(parents=True, exist_ok=True)
    (root / "table.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
