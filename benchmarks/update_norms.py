"""How far honest clients move the model they are sent: the relative update norm
‖w_k − w‖ / max(‖w‖, 1) that ``max-update-norm`` bounds, measured on real runs.

    .venv/bin/python -m benchmarks.update_norms                       # Table 1 (MNIST, CIFAR-10), MNIST IID, FedProf's setups
    .venv/bin/python -m benchmarks.update_norms --setups mnist --rounds 10
    .venv/bin/python -m benchmarks.update_norms --local-sizes 1000 4000 20000   # in-process, bigger clients
    .venv/bin/python -m benchmarks.update_norms --summarize-only

Every model-averaging method of FedLog's Table 1 (FedAvg, FedProx, LG-FedAvg, FedPer,
FedRep) runs with the bound switched off (``max-update-norm=1e9``, so no honest reply is
refused and none is missing from the figures), and each round's ``update_norm_max`` (the
largest of the round's accepted replies) is read back from rounds.jsonl. A sign-flipped
model (−w) has norm 2 and a ×10 model 9; the default bound must sit above every honest
figure here with a margin, and below 2. Runs go to ``benchmarks/results/update-norms[-TAG]/
<setup>-<method>/`` (resumable: finished runs are skipped) and the table to ``table.md``.
"""

from __future__ import annotations

import argparse
import json

from benchmarks.runner import add_run_arguments, finished, load_run, results_root, simulate

SETUPS: dict[str, tuple[str, dict[str, object]]] = {
    "mnist": ("mnist", {}),  # FedLog Table 1: 50 clients, 2 classes each, 5 local epochs of Adam
    "mnist-iid3": ("mnist", {"num-clients": 3, "partition": "iid"}),  # the sign-flip attack's setup
    "cifar10": ("cifar10", {}),  # FedLog Table 1: 100 clients, 2 classes each, 1 local epoch
    # FedProf's setups (FedAvg arm: the same client training), noisy clients included: SGD, more local steps
    "fedprof-mnist": ("benchmarks/configs/fedprof-mnist.toml", {"algorithm": "fedavg"}),
    "fedprof-gasturbine": ("benchmarks/configs/fedprof-gasturbine.toml", {"algorithm": "fedavg"}),
    # ShuffleNet V2 with BatchNorm, 6 epochs of SGD over ~4,000 images: the most local steps here (2 clients a round, to fit a CPU)
    "fedprof-cifar10": ("benchmarks/configs/fedprof-cifar10.toml", {"algorithm": "fedavg", "fraction-train": 0.2}),
}
ONLY_FEDAVG = ("fedprof-mnist", "fedprof-gasturbine", "fedprof-cifar10")  # FedProf's papers compare it with FedAvg
METHODS: dict[str, dict[str, object]] = {
    "fedavg": {"algorithm": "fedavg"},
    "fedprox": {"algorithm": "fedprox"},
    "lg-fedavg": {"algorithm": "lg-fedavg", "lg-global-layers": 2},
    "fedper": {"algorithm": "fedper", "fedper-local-layers": 2},
    "fedrep": {"algorithm": "fedrep", "fedrep-local-layers": 1},
}
ROUNDS = {
    "mnist": 10,
    "mnist-iid3": 10,
    "cifar10": 3,
    "fedprof-mnist": 10,
    "fedprof-gasturbine": 10,
    "fedprof-cifar10": 2,
}  # the largest updates come first: round 1 moves furthest


def local_sizes(size: int, rounds: int, data_dir: str = "") -> list[dict]:
    """FedAvg of 3 IID MNIST clients of ``size`` examples each, in this process (no Flower,
    the project's own training with the run defaults: mnist-cnn, Adam 1e-3, batch 10, 5
    epochs): each round's relative update norms. Bigger clients move further from the
    random initial model in round 1; this is what ``max-first-update-norm`` must admit."""
    import numpy as np
    import torch
    from headway.core.aggregate import relative_update_norm, weighted_average
    from headway.core.config import resolve_settings
    from headway.core.data import load_dataset, to_tensors
    from headway.core.models import build_model
    from headway.core.training import task_loss, train_epochs

    cfg = resolve_settings({"body": "mnist-cnn"})
    ds = load_dataset("mnist", data_dir, 0)
    order = np.random.default_rng(0).permutation(len(ds.y_train))
    clients = [to_tensors(ds, ds.x_train[order[i * size : (i + 1) * size]], ds.y_train[order[i * size : (i + 1) * size]]) for i in range(3)]

    def model() -> torch.nn.Module:
        return build_model(cfg.body, (1, 28, 28), cfg.feature_dim, 10, cfg.seed, cfg.body_dropout)

    glob = {k: v.detach().numpy().copy() for k, v in model().state_dict().items()}
    out = []
    for rnd in range(1, rounds + 1):
        trained = []
        for x, y in clients:
            m = model()
            m.load_state_dict({k: torch.as_tensor(v) for k, v in glob.items()})
            train_epochs(
                m,
                list(m.parameters()),
                x,
                y,
                epochs=cfg.local_epochs,
                batch_size=cfg.batch_size,
                lr=cfg.lr,
                optimizer=cfg.optimizer,
                loss_fn=task_loss("classification"),
                seed=rnd,
                modules=[m],
            )
            trained.append({k: v.detach().numpy().copy() for k, v in m.state_dict().items()})
        out.append({"size": size, "round": rnd, "norms": [relative_update_norm(glob, w) for w in trained]})
        print(json.dumps(out[-1]), flush=True)
        glob = weighted_average(trained, [1.0] * len(trained), like=glob)
    return out


def table(root) -> str:
    """Markdown: per run, the largest and median per-round maximum, and round 1's."""
    lines = [
        "| setup | method | rounds | max over rounds | median of round maxima | round 1 | last round |",
        "|---|---|---|---|---|---|---|",
    ]
    overall = 0.0
    for folder in sorted(p for p in root.iterdir() if p.is_dir()):
        if not finished(folder):
            continue
        _, rounds = load_run(folder)
        norms = [r["update_norm_max"] for r in rounds if "update_norm_max" in r]
        if not norms:
            continue
        overall = max(overall, max(norms))
        ordered = sorted(norms)
        setup, method = folder.name.split("--")
        lines.append(
            f"| {setup} | {method} | {len(norms)} | {max(norms):.3f} | {ordered[len(ordered) // 2]:.3f} | {norms[0]:.3f} | {norms[-1]:.3f} |"
        )
    lines.append(f"\nLargest honest relative update norm seen in these runs: {overall:.3f}")
    local = root / "local-sizes.jsonl"
    if local.exists():
        lines += [
            "",
            "In-process FedAvg, 3 IID MNIST clients of N examples, run defaults (`--local-sizes`):",
            "",
            "| examples a client | round | relative update norms |",
            "|---|---|---|",
        ]
        for line in local.read_text().splitlines():
            r = json.loads(line)
            lines.append(f"| {r['size']} | {r['round']} | {', '.join(f'{n:.3f}' for n in r['norms'])} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.update_norms", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    p.add_argument("--rounds", type=int, default=0, help="rounds per run; 0: 10 on MNIST, 3 on CIFAR-10")
    p.add_argument(
        "--local-sizes",
        type=int,
        nargs="*",
        default=[],
        metavar="N",
        help="instead of the simulations: in-process FedAvg of 3 MNIST clients of N examples each, 3 rounds",
    )
    add_run_arguments(p)
    args = p.parse_args(argv)
    root = results_root("update-norms", args.tag)
    root.mkdir(parents=True, exist_ok=True)
    if args.local_sizes:
        with (root / "local-sizes.jsonl").open("a") as f:
            for size in args.local_sizes:
                for row in local_sizes(size, args.rounds or 3):
                    f.write(json.dumps(row) + "\n")
    elif not args.summarize_only:
        for setup in args.setups:
            dataset, overrides = SETUPS[setup]
            for method in [m for m in args.methods if setup not in ONLY_FEDAVG or m == "fedavg"]:
                for seed in args.seeds:
                    run = {
                        **overrides,
                        **METHODS[method],
                        "seed": seed,
                        "max-update-norm": 1e9,
                        "eval-every": 0,
                        "num-server-rounds": args.rounds or ROUNDS[setup],
                    }
                    simulate(dataset, root / f"{setup}--{method}" if seed == 0 else root / f"{setup}--{method}-seed{seed}", run, args.set)
                    (root / "table.md").write_text(table(root))  # written as runs finish
    text = table(root)
    (root / "table.md").write_text(text)
    print(text)
    (root / "runs.json").write_text(json.dumps({"setups": args.setups, "methods": args.methods}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
