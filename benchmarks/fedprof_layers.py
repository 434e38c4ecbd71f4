"""Which layer FedProf should profile (issue 42, part D item 2): for the global models a
finished run checkpointed, each client's divergence from the baseline at each layer, without
training. Proposition 1's Gaussian premise concerns a linear operator's pre-activations (``pre-activation``,
mnist-cnn's ``body.fcs.0``); the default ``body`` is that layer after its ReLU.

Reported per layer and model: the AUC of the divergences (P(a noisy client diverges more than a
clean one)) and the share of the α-scores λ = exp(−α·div) the clean clients hold (the chance
that one draw picks a clean client), α from the run.

    headway bench fedprof_layers benchmarks/results/fedprof-untuned/cifar10-gray/partial/fedprof-s0
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from headway.strategies.fedprof import SECRET_ENV

from benchmarks.fedprof_untuned import divergence_auc

LAYERS = ("body", "pre-activation")


def clean_share(divs: dict[str, float], noise: dict[int, str], alpha: float) -> float:
    """Σ_clean λ / Σ λ with λ = exp(−α·div): the chance that a draw by score picks a clean client."""
    lam = {p: float(np.exp(-alpha * d)) for p, d in divs.items()}
    total = sum(lam.values())
    return sum(v for p, v in lam.items() if noise.get(int(p), "clean") == "clean") / total if total > 0 else float("nan")


def layer_study(run: Path, layers: tuple[str, ...] = LAYERS) -> list[dict[str, Any]]:
    """Per checkpointed global model (and the initial one) and layer: AUC and the clean share of λ."""
    from headway.client.env import _env
    from headway.core.config import resolve_settings
    from headway.core.models import build_model
    from headway.core.noise import noise_assignment
    from headway.core.profiles import divergence, model_profile, private_validation_rows
    from headway.server.checkpoint import checkpoint_files, read_checkpoint
    from headway.strategies.fedprof import validation_stream
    from headway.strategies.services import ServerData

    cfg = resolve_settings(json.loads((run / "config.json").read_text()))
    noise = noise_assignment(cfg.client_noise, cfg.num_clients, cfg.seed)
    held = ServerData(cfg).validation_tensors()
    if held is None:
        raise SystemExit(f"{run}: the server holds no validation rows for this run's data set")
    rng, _ = validation_stream(cfg.seed, os.environ.get(SECRET_ENV))
    xv = held[0][private_validation_rows(len(held[0]), rng)]
    clients = {p: _env(cfg, p, "").x_train for p in range(cfg.num_clients)}
    model = build_model(cfg.body, tuple(xv.shape[1:]), cfg.feature_dim, int(held[1].max()) + 1, cfg.seed, cfg.body_dropout)
    states: list[tuple[int, dict[str, torch.Tensor] | None]] = [(0, None)]
    states += [(r, read_checkpoint(path, r).state.arrays.to_torch_state_dict()) for r, path in checkpoint_files(run / "checkpoints")]
    rows = []
    for round_, state in sorted(states, key=lambda s: s[0]):
        if state is not None:
            model.load_state_dict(state)
        for layer in layers:
            baseline = model_profile(model, layer, xv)
            divs = {str(p): divergence(model_profile(model, layer, x), baseline) for p, x in clients.items()}
            rows.append(
                {
                    "round": round_,
                    "layer": layer,
                    "auc": divergence_auc(divs, noise),
                    "clean_share": clean_share(divs, noise, cfg.fedprof.alpha),
                    "clean_fraction": sum(1 for p in clients if p not in noise) / len(clients),
                }
            )
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="headway bench fedprof_layers", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("runs", nargs="+", type=Path, help="finished FedProf run folders with checkpoints")
    p.add_argument("--layers", nargs="+", default=list(LAYERS))
    p.add_argument("--out", type=Path, help="append the rows as JSON lines to this file")
    args = p.parse_args(argv)
    os.environ.setdefault(SECRET_ENV, "headway-benchmarks")  # the benchmarks' D^V
    for run in args.runs:
        for row in layer_study(run, tuple(args.layers)):
            row = {"run": str(run), **row}
            print(json.dumps(row), flush=True)
            if args.out:
                with args.out.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
