"""DP-FedLog's privacy-utility trade-off (fedlog-extended §4.5, Figure 3 right): FedLog on
the CIFAR-10 Table 1 setup with features clipped to b, δ fixed and ε swept, for central
DP (noise once on the server's sum) and local DP (noise on every client's statistics),
beside the same clipped run without noise.

    .venv/bin/python -m benchmarks.dp_sweep --set num-server-rounds=20 --tag r20

Writes ``benchmarks/results/dp-cifar10[-<tag>]/<mode>-eps<ε>-seed<N>/`` (and
``off-seed<N>/``), resumably, then ``table.md`` and ``accuracy_vs_epsilon.png``. σ is
Theorem 7's for k = every release of the run (rounds + the statistics round that starts
the head), so a shorter run gets less noise for the same ε.
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from pathlib import Path

import numpy as np

from benchmarks.runner import add_run_arguments, finished, fmt_mean_se, load_run, mean_se, results_root, simulate

EPSILONS = (0.1, 0.5, 1.0, 5.0, 10.0)
MODES = ("central", "local")


def run_name(mode: str, epsilon: float | None, seed: int) -> str:
    return f"off-seed{seed}" if mode == "off" else f"{mode}-eps{epsilon:g}-seed{seed}"


def collect(root: Path) -> dict[tuple[str, float | None], list[tuple[dict, list[dict]]]]:
    """(mode, ε) -> finished runs; ε is None for the run without noise."""
    runs: dict = defaultdict(list)
    for path in sorted(root.glob("*/summary.json")):
        if not finished(path.parent):
            continue
        summary, rounds = load_run(path.parent)
        dp = summary.get("dp")
        runs[(dp["mode"], float(dp["epsilon"])) if dp else ("off", None)].append((summary, rounds))
    return runs


def table(runs: dict) -> str:
    lines = [
        "| mode | ε | δ | b | k | σ | seeds | rounds | final accuracy % | best % | failures |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for mode, eps in sorted(runs, key=lambda k: ((("off",) + MODES).index(k[0]), k[1] or 0.0)):
        items = runs[(mode, eps)]
        dp = items[0][0].get("dp") or {}
        final = fmt_mean_se([s["final_accuracy"] for s, _ in items])
        best = np.mean([s["best_accuracy"] for s, _ in items]) * 100
        sigma = f"{dp['sigma']:.4g}" if dp else "0"
        lines.append(
            f"| {mode} | {eps if eps is not None else '–'} | {dp.get('delta', '–')} | {items[0][0].get('clip', '–')} | {dp.get('k', '–')} | {sigma} "
            f"| {len(items)} | {items[0][0]['rounds']} | {final} | {best:.2f} | {sum(s['failures'] for s, _ in items)} |"
        )
    return "\n".join(lines)


def plot(runs: dict, out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in MODES:
        pts = sorted((eps, mean_se([s["final_accuracy"] for s, _ in items])) for (m, eps), items in runs.items() if m == mode)
        if pts:
            xs = [e for e, _ in pts]
            means = np.array([ms[0] for _, ms in pts])
            ses = np.nan_to_num(np.array([ms[1] for _, ms in pts]))
            ax.plot(xs, means, marker="o", label=f"{mode} DP")
            ax.fill_between(xs, means - ses, means + ses, alpha=0.2)
    if ("off", None) in runs:
        ax.axhline(np.mean([s["final_accuracy"] for s, _ in runs[("off", None)]]), color="grey", ls="--", label="no noise (clipped)")
    ax.set_xscale("log")
    ax.set_xlabel("privacy budget ε")
    ax.set_ylabel("final mean client test accuracy")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_epsilon.png", dpi=120)
    plt.close(fig)


def summarize(root: Path) -> str:
    runs = collect(root)
    if not runs:
        raise SystemExit(f"no finished runs (*/summary.json) under {root}")
    md = table(runs)
    (root / "table.md").write_text(md + "\n")
    plot(runs, root, "DP-FedLog on CIFAR-10 (Table 1 setup)")
    return md


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.dp_sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--clip", type=float, default=2.0, help="b, the feature bound (paper: 2)")
    p.add_argument("--delta", type=float, default=0.01, help="δ (paper: 0.01)")
    add_run_arguments(p)
    args = p.parse_args(argv)
    root = results_root("dp-cifar10", args.tag)
    if not args.summarize_only:
        for seed in args.seeds:
            base = {"algorithm": "fedlog", "seed": seed, "fedlog-clip": args.clip, "fedlog-delta": args.delta}
            simulate("cifar10", root / run_name("off", None, seed), base, args.set)
            for mode in args.modes:
                for eps in args.epsilons:
                    simulate("cifar10", root / run_name(mode, eps, seed), {**base, "fedlog-dp": mode, "fedlog-epsilon": eps}, args.set)
    print(summarize(root))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
