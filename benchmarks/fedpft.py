"""FedPFT benchmarks (Beitollahi et al. 2024) on CIFAR-10 with EfficientNet-Lite0 features.

    python -m benchmarks.fedpft table5 [--seeds 0 1 2] [--arms ...]   # §5.2 / Table 5 shape
    python -m benchmarks.fedpft chain [--seeds 0 1 2]                  # §5.4: 5 clients in a line
    python -m benchmarks.fedpft chain-streams [--seeds 0 1 2 3 4]      # the chain's heads under other head seeds
    python -m benchmarks.fedpft labelshift [--seeds 0 1 2]             # Table 2, disjoint label shift
    python -m benchmarks.fedpft em-speed                               # our EM against scikit-learn
    python -m benchmarks.fedpft fig7 [--seeds 0 1 2] [--ks 1 2 5]      # Fig. 7: accuracy against values sent, by K
    python -m benchmarks.fedpft dp-study [--train-rows 10000]          # where DP-FedPFT's accuracy goes
    python -m benchmarks.fedpft report                                 # tables from what finished

FedPFT arms and the chain run through the Flower simulation (their bytes are measured
messages), and so does ``fedavg-head-flower``: FedAvg of the linear head with
``inputs=features``. The baselines (Centralized, Ensemble, AVG, FedAvg of the head, KD) are
computed here, in one process, on the very same cached features of the same partition;
their bytes are computed from what they would send (float32 heads, float16 raw features),
not measured. Runs resume: a finished result is skipped.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from headway.client.env import client_env
from headway.core import privacy
from headway.core import protocol as P
from headway.core import seeds as salts
from headway.core.data import load_dataset, to_tensors
from headway.core.fedpft import (
    ClassMixture,
    capped_counts,
    encode,
    features,
    fit_class_mixtures,
    head_logits,
    initial_head,
    normalize,
    privatize,
    synthesize,
    train_head,
)
from headway.core.gmm import SPARSE_PASSES
from headway.core.partition import split_by_class
from headway.core.settings import Settings
from headway.simulation.runner import load_config

from benchmarks.em_quality import EM_PAUSE, em_clusters
from benchmarks.runner import ROOT, results_root, simulate

CONFIG = "benchmarks/configs/fedpft-cifar10.toml"
ARMS: dict[str, dict[str, Any]] = {
    "fedpft-spherical-k1": {"fedpft-covariance": "spherical", "fedpft-components": 1},
    "fedpft-spherical-k10": {"fedpft-covariance": "spherical", "fedpft-components": 10},
    "fedpft-diag-k10": {"fedpft-covariance": "diag", "fedpft-components": 10},
    "dp-fedpft-spherical-k1-eps1": {"fedpft-covariance": "spherical", "fedpft-components": 1, "fedpft-dp": "on", "fedpft-epsilon": 1.0},
    "fedpft-full-k1": {"fedpft-covariance": "full", "fedpft-components": 1},
    # FedAvg of the linear head as a real Flower run on the same cached features (inputs=features,
    # body=linear), set like the in-process baseline "fedavg-head": 50 rounds of one local epoch,
    # every client every round, Adam 1e-4 (the baseline's AdamW without its weight decay), batch 32
    "fedavg-head-flower": {
        "algorithm": "fedavg",
        "inputs": "features",
        "body": "linear",
        "num-server-rounds": 50,
        "local-epochs": 1,
        "optimizer": "adam",
        "lr": 1e-4,
        "batch-size": 32,
        "fraction-train": 1.0,
        "eval-every": 0,
    },
}
BASELINES = ("centralized", "ensemble", "avg", "fedavg-head")
FEDAVG_HEAD_ROUNDS = 50  # one local epoch a round: as many passes over the data as the one-shot heads get
FEDAVG_HEAD_EPOCHS = 1


def config(seed: int, sets: list[str]) -> Settings:
    """The benchmark's settings for ``seed``, with ``--set`` overrides."""
    return load_config(str(ROOT / CONFIG), [*sets, f"seed={seed}"])


def head_settings(cfg: Settings) -> dict[str, Any]:
    return {
        "optimizer": cfg.fedpft.head_optimizer,
        "lr": cfg.fedpft.head_lr,
        "epochs": cfg.fedpft.head_epochs,
        "batch_size": cfg.fedpft.head_batch_size,
    }


def client_features(cfg: Settings) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every client's (features, labels): the same rows and the same cache entries as the clients of a run."""
    out = []
    for pid in range(cfg.num_clients):
        env = client_env(cfg.to_config(), {"partition-id": pid})
        out.append((features(cfg, env.data.name, env.x_train), env.y_train))
    return out


def test_features(cfg: Settings) -> tuple[torch.Tensor, torch.Tensor]:
    ds = load_dataset(cfg.dataset, cfg.data_dir, cfg.seed)
    x, y = to_tensors(ds, ds.x_test, ds.y_test)
    return features(cfg, ds.name, x), y


def accuracy(logits: torch.Tensor, y: torch.Tensor) -> float:
    return float((logits.argmax(1) == y).float().mean())


def head_bytes(classes: int, dim: int) -> int:
    return 4 * classes * (dim + 1)


def baselines(cfg: Settings, seed: int) -> dict[str, dict[str, float]]:
    """Centralized (raw features), Ensemble and AVG of local heads, FedAvg of the head."""
    clients = client_features(cfg)
    ftest, ytest = test_features(cfg)
    c, d = 10, ftest.shape[1]
    hs = head_settings(cfg)
    out: dict[str, dict[str, float]] = {}
    t0 = time.perf_counter()
    x = torch.cat([f for f, _ in clients])
    y = torch.cat([t for _, t in clients])
    w, b = train_head(x, y, c, seed=seed, **hs)
    out["centralized"] = {
        "global_accuracy": accuracy(head_logits(ftest, w, b), ytest),
        "bytes": 2 * x.numel() + 4 * len(y) + head_bytes(c, d) * len(clients),
        "seconds": time.perf_counter() - t0,
    }
    t0 = time.perf_counter()
    heads = [train_head(f, t, c, seed=seed + 1 + i, **hs) for i, (f, t) in enumerate(clients)]
    probs = torch.stack([torch.softmax(head_logits(ftest, hw, hb), 1) for hw, hb in heads])
    n = np.array([len(t) for _, t in clients], dtype=float)
    up = head_bytes(c, d) * len(clients)
    out["ensemble"] = {"global_accuracy": _ensemble(probs, ytest), "bytes": up, "seconds": time.perf_counter() - t0}
    wa = sum(ni * hw for ni, (hw, _) in zip(n, heads)) / n.sum()
    ba = sum(ni * hb for ni, (_, hb) in zip(n, heads)) / n.sum()
    out["avg"] = {
        "global_accuracy": accuracy(head_logits(ftest, wa, ba), ytest),
        "bytes": up + head_bytes(c, d) * len(clients),
        "seconds": out["ensemble"]["seconds"],
    }
    t0 = time.perf_counter()
    gw, gb = initial_head(d, c, torch.Generator().manual_seed(seed))
    for rnd in range(FEDAVG_HEAD_ROUNDS):
        local_hs = {**hs, "epochs": FEDAVG_HEAD_EPOCHS}  # FedAvg's local step: from the global head
        local = [train_head(f, t, c, seed=seed + 1000 * rnd + i, init=(gw, gb), **local_hs) for i, (f, t) in enumerate(clients)]
        gw = sum(ni * lw for ni, (lw, _) in zip(n, local)) / n.sum()
        gb = sum(ni * lb for ni, (_, lb) in zip(n, local)) / n.sum()
    out["fedavg-head"] = {
        "global_accuracy": accuracy(head_logits(ftest, gw, gb), ytest),
        "bytes": 2 * FEDAVG_HEAD_ROUNDS * head_bytes(c, d) * len(clients),
        "seconds": time.perf_counter() - t0,
        "rounds": FEDAVG_HEAD_ROUNDS,
        "local_epochs": FEDAVG_HEAD_EPOCHS,
    }
    return out


def _ensemble(probs: torch.Tensor, y: torch.Tensor) -> float:
    """The most confident client's class wins (highest probability over all heads)."""
    k, n, c = probs.shape
    flat = probs.permute(1, 0, 2).reshape(n, k * c)
    return float(((flat.argmax(1) % c) == y).float().mean())


def run_table5(args: argparse.Namespace) -> None:
    root = results_root("fedpft-cifar10", args.tag)
    for seed in args.seeds:
        for arm in args.arms:
            out = root / f"{arm}-s{seed}"
            if arm in ARMS:
                simulate(CONFIG, out, {**ARMS[arm], "seed": seed}, args.set)
            elif arm in BASELINES:
                path = root / f"baselines-s{seed}.json"
                if path.is_file():
                    continue
                res = baselines(config(seed, args.set), seed)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(res, indent=1))
                print("baselines", seed, res, flush=True)


def run_chain(args: argparse.Namespace) -> None:
    root = results_root("fedpft-chain", args.tag)
    setup = {"num-clients": 5, "partition": "iid", "train-fraction": 0.01, "fedpft-topology": "chain"}
    for seed in args.seeds:
        simulate(CONFIG, root / f"chain-s{seed}", {**setup, "seed": seed}, args.set)
        path = root / f"centralized-s{seed}.json"
        if not path.is_file():  # the reference: one head on all five clients' real features, same settings
            cfg = config(seed, [*args.set, *(f"{k}={v}" for k, v in setup.items())])
            clients = client_features(cfg)
            ftest, ytest = test_features(cfg)
            w, b = train_head(torch.cat([f for f, _ in clients]), torch.cat([t for _, t in clients]), 10, seed=seed, **head_settings(cfg))
            path.write_text(json.dumps({"global_accuracy": accuracy(head_logits(ftest, w, b), ytest)}))


CHAIN_STREAMS = (1, 2, 3, 4)  # chain-streams: head seeds scored beside each client's own


def run_chain_streams(args: argparse.Namespace) -> None:
    """The chain replayed hop by hop in this process with the client procedure's own functions and derived seeds
    (client/procedures/fedpft.py), each hop's head also trained with the seeds ``CHAIN_STREAMS``: how far a chain
    head's test count moves with the head's seed alone, beside what the seed of the run moves it. One line a seed in
    results/fedpft-chain/streams.jsonl (resumes: a seed written is skipped)."""
    out = results_root("fedpft-chain", args.tag) / "streams.jsonl"
    done = {json.loads(line)["seed"] for line in out.read_text().splitlines()} if out.is_file() else set()
    setup = ["num-clients=5", "partition=iid", "train-fraction=0.01", "fedpft-topology=chain"]
    for seed in args.seeds:
        if seed in done:
            continue
        cfg = config(seed, [*args.set, *setup])
        fp, hops = cfg.fedpft, []
        received: list[ClassMixture] = []
        for pid in range(cfg.num_clients):
            env = client_env(cfg.to_config(), {"partition-id": pid})
            f, y = features(cfg, env.data.name, env.x_train), env.y_train.numpy()
            if received:
                synthetic_seed = env.seed_for(0, salts.FEDPFT_SYNTHESIS)
                xs, ys = synthesize(received, torch.Generator().manual_seed(synthetic_seed), capped_counts(received, fp.max_synthetic))
                f, y = torch.cat([f, xs.to(f.dtype)]), np.concatenate([y, ys.numpy()])
            ftest, ytest = features(cfg, env.data.name, env.x_test), env.y_test
            own = env.seed_for(0, salts.FEDPFT_CHAIN_HEAD)
            correct = {}
            for stream in (own, *CHAIN_STREAMS):
                w, b = train_head(f, torch.as_tensor(y), env.outputs, seed=stream, **head_settings(cfg))
                correct["own" if stream == own else str(stream)] = int((head_logits(ftest, w, b).argmax(1) == ytest).sum())
            hops.append({"client": pid + 1, "train_rows": len(y), "test_rows": len(ytest), "correct": correct})
            mixtures_seed = env.seed_for(0, salts.FEDPFT_MIXTURES)
            c = (fp.components, fp.covariance, fp.min_class_examples, fp.reg_covar, fp.em_tol, fp.em_max_iter, fp.em_init)
            received, _ = fit_class_mixtures(f, y, *c, mixtures_seed, "cpu", fp.em_restarts)
        with open(out, "a") as fh:
            fh.write(json.dumps({"seed": seed, "hops": hops}) + "\n")
        print("chain-streams", seed, [h["correct"] for h in hops], flush=True)


def _shift_accuracies(x: torch.Tensor, y: torch.Tensor, weight: np.ndarray, bias: np.ndarray) -> dict[str, float]:
    """Test accuracy of the head (``weight``, ``bias``) on the source classes (0–4), the destination's (5–9) and all."""
    logits, src, dst = head_logits(x, weight, bias), y < 5, y >= 5
    return {
        "source_test": accuracy(logits[src], y[src]),
        "destination_test": accuracy(logits[dst], y[dst]),
        "all_test": accuracy(logits, y),
    }


def run_labelshift(args: argparse.Namespace) -> None:
    """Table 2, disjoint label shift: the source holds classes 0–4, the destination 5–9
    (each half of those classes' training rows of a 2-client iid split); the source sends
    its mixtures once; the destination trains its head on its own features plus samples.
    Computed in one process with the same core functions as a chain run of two hops."""
    root = results_root("fedpft-labelshift", args.tag)
    for seed in args.seeds:
        path = root / f"labelshift-s{seed}.json"
        if path.is_file():
            continue
        cfg = config(seed, [*args.set, "num-clients=1", "partition=iid"])
        env = client_env(cfg.to_config(), {"partition-id": 0})
        f, y = features(cfg, env.data.name, env.x_train), env.y_train
        src, dst = y < 5, y >= 5
        ftest, ytest = test_features(cfg)
        tsrc, tdst = ytest < 5, ytest >= 5
        hs = head_settings(cfg)
        res: dict[str, Any] = {}

        hsrc = train_head(f[src], y[src], 10, seed=seed, **hs)
        hdst = train_head(f[dst], y[dst], 10, seed=seed + 1, **hs)
        res["centralized"] = _shift_accuracies(ftest, ytest, *train_head(f, y, 10, seed=seed, **hs))
        res["local-destination"] = _shift_accuracies(ftest, ytest, *hdst)
        probs = torch.stack([torch.softmax(head_logits(ftest, *h), 1) for h in (hsrc, hdst)])
        ens = _ensemble(probs, ytest)
        res["ensemble"] = {
            "all_test": ens,
            "source_test": _ensemble(probs[:, tsrc], ytest[tsrc]),
            "destination_test": _ensemble(probs[:, tdst], ytest[tdst]),
        }
        res["avg"] = _shift_accuracies(ftest, ytest, (hsrc[0] + hdst[0]) / 2, (hsrc[1] + hdst[1]) / 2)
        res["kd"] = _shift_accuracies(ftest, ytest, *_distill(f[dst], y[dst], hsrc, hs, seed))
        for cov, k in (("spherical", 1), ("diag", 10)):
            mix, _ = fit_class_mixtures(
                f[src],
                y[src].numpy(),
                k,
                cov,
                2,
                cfg.fedpft.reg_covar,
                cfg.fedpft.em_tol,
                cfg.fedpft.em_max_iter,
                cfg.fedpft.em_init,
                seed,
            )
            payload = encode(mix, f.shape[1], cov)
            sent = [
                ClassMixture(
                    m.label,
                    m.count,
                    m.weights.astype(np.float16).astype(np.float64),
                    m.means.astype(np.float16).astype(np.float64),
                    m.covariances.astype(np.float16).astype(np.float64),
                    cov,
                )
                for m in mix
            ]
            xs, ys = synthesize(sent, torch.Generator().manual_seed(seed))
            r = _shift_accuracies(ftest, ytest, *train_head(torch.cat([f[dst], xs]), torch.cat([y[dst], ys]), 10, seed=seed + 2, **hs))
            r["bytes"] = int(sum(v.nbytes for v in payload.values()))
            res[f"fedpft-{cov}-k{k}"] = r
        res["kd"]["bytes"] = head_bytes(10, f.shape[1])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1))
        print("labelshift", seed, json.dumps(res), flush=True)


def _distill(
    x: torch.Tensor, y: torch.Tensor, teacher: tuple[np.ndarray, np.ndarray], hs: dict[str, Any], seed: int, temperature: float = 2.0
) -> tuple[np.ndarray, np.ndarray]:
    """KD baseline: the destination trains its head on its own labels plus the source head's
    soft labels (temperature 2, equal weights) on the destination's features."""
    soft = torch.softmax(head_logits(x, *teacher) / temperature, 1)

    def kd(logits: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.kl_div(torch.log_softmax(logits / temperature, 1), soft[idx], reduction="batchmean") * temperature**2

    return train_head(x, y, 10, seed=seed, extra_loss=kd, **hs)


EM_SEEDS = tuple(range(20))  # every case is fitted from these seeds by both; the table gives means (with 5, which start
# k-means happens to draw moved the mean iterations by a quarter)


EM_VARIANTS = {"sparse EM": SPARSE_PASSES, "plain EM": 0}  # ours as shipped and without sparse passes (fit_gmm's sparse_passes)


def _em_case(name: str, x: np.ndarray, truth: np.ndarray | None, cov: str, k: int, devices: list[str]) -> list[dict[str, Any]]:
    """One case: scikit-learn and ours (each of EM_VARIANTS) from each of EM_SEEDS, seconds
    (ours after a warm-up), mean log-likelihood, iterations and, with ``truth``, adjusted
    Rand indices."""
    from headway.core.gmm import fit_gmm, predict
    from sklearn.metrics import adjusted_rand_score
    from sklearn.mixture import GaussianMixture

    rows = []
    xt = torch.from_numpy(x)
    for seed in EM_SEEDS:
        time.sleep(EM_PAUSE)
        t0 = time.perf_counter()
        g = GaussianMixture(k, covariance_type=cov, tol=1e-3, max_iter=100, random_state=seed, reg_covar=1e-6).fit(x)
        sk_seconds = time.perf_counter() - t0
        sk_labels = g.predict(x)
        base = {"case": name, "covariance": cov, "n": len(x), "d": x.shape[1], "k": k, "seed": seed}
        rows.append(
            {
                **base,
                "impl": "scikit-learn",
                "device": "cpu",
                "seconds": sk_seconds,
                "log_likelihood": float(g.score(x)),
                "iterations": int(g.n_iter_),
            }
        )
        if truth is not None:
            rows[-1]["ari_truth"] = adjusted_rand_score(truth, sk_labels)
        for dev, variant in itertools.product(devices, EM_VARIANTS):
            fit_gmm([xt], k, cov, tol=1e-3, max_iter=2, seed=seed, device=dev)  # warm-up (CUDA context, kernels, allocator)
            if dev == "cuda":
                torch.cuda.synchronize()
            time.sleep(EM_PAUSE)
            t0 = time.perf_counter()
            r = fit_gmm([xt], k, cov, tol=1e-3, max_iter=100, seed=seed, device=dev, sparse_passes=EM_VARIANTS[variant])
            if dev == "cuda":
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            rows.append(
                {
                    **base,
                    "impl": "headway",
                    "variant": variant,
                    "device": dev,
                    "seconds": seconds,
                    "log_likelihood": float(r.log_likelihood[0]),
                    "iterations": r.iterations,
                    "passes": r.passes,
                }
            )
            if truth is not None:
                labels = predict(r.mixture, [xt.to(dev)])[0].cpu().numpy()
                rows[-1]["ari_truth"] = adjusted_rand_score(truth, labels)
                rows[-1]["ari_sklearn"] = adjusted_rand_score(sk_labels, labels)
    return rows


def _em_classes_case(name: str, groups: list[np.ndarray], cov: str, k: int) -> list[dict[str, Any]]:
    """FedPFT's own workload: one mixture per class of a client. scikit-learn fits the
    classes one after another; ours fits them as one batch (:func:`headway.core.gmm.fit_gmm`). The
    log-likelihood is the mean over classes of each class's mean per point; iterations are
    the sum over classes for scikit-learn and the batch's for ours."""
    from headway.core.gmm import fit_gmm
    from sklearn.mixture import GaussianMixture

    rows = []
    tensors = [torch.from_numpy(g) for g in groups]
    base = {"case": name, "covariance": cov, "n": sum(len(g) for g in groups), "d": groups[0].shape[1], "k": k}
    for seed in EM_SEEDS:
        time.sleep(EM_PAUSE)
        t0 = time.perf_counter()
        fits = [GaussianMixture(k, covariance_type=cov, tol=1e-3, max_iter=100, random_state=seed, reg_covar=1e-6).fit(g) for g in groups]
        sk_seconds = time.perf_counter() - t0
        sk_ll = float(np.mean([f.score(g) for f, g in zip(fits, groups, strict=True)]))
        rows.append(
            {
                **base,
                "seed": seed,
                "impl": "scikit-learn",
                "device": "cpu",
                "seconds": sk_seconds,
                "log_likelihood": sk_ll,
                "iterations": sum(f.n_iter_ for f in fits),
            }
        )
        fit_gmm(tensors, k, cov, tol=1e-3, max_iter=2, seed=seed)  # warm-up
        for variant in EM_VARIANTS:
            time.sleep(EM_PAUSE)
            t0 = time.perf_counter()
            r = fit_gmm(tensors, k, cov, tol=1e-3, max_iter=100, seed=seed, sparse_passes=EM_VARIANTS[variant])
            seconds = time.perf_counter() - t0
            rows.append(
                {
                    **base,
                    "seed": seed,
                    "impl": "headway",
                    "variant": variant,
                    "device": "cpu",
                    "seconds": seconds,
                    "log_likelihood": float(np.mean(r.log_likelihood)),
                    "iterations": r.iterations,
                    "passes": r.passes,
                }
            )
    return rows


def em_table(rows: list[dict[str, Any]]) -> list[str]:
    """Markdown: per case and device, mean seconds of ours and scikit-learn's, the speed-up
    (of the means, and the geometric mean of the per-seed ratios), mean iterations (ours:
    with the passes over all points; the rest scored only unsettled rows) and
    milliseconds an iteration (the start included), mean
    log-likelihoods, their relative gap with the standard error of its mean over seeds
    (paired by seed: how much of the gap is which start k-means drew) and the adjusted
    Rand indices."""
    out = [
        "| case | covariance | n × d, K | device | ours s | scikit-learn s | speed-up (per seed) | iterations (full passes) ours / sklearn | ms an iteration ours / sklearn | ours log-lik. | scikit-learn log-lik. | gap ± s.e. | ARI ours/truth | ARI sklearn/truth | ARI ours/sklearn |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = list(dict.fromkeys((r["case"], r["covariance"]) for r in rows))
    for case, cov in keys:
        these = [r for r in rows if r["case"] == case and r["covariance"] == cov]
        sk = [r for r in these if r["impl"] == "scikit-learn"]
        for dev, variant in dict.fromkeys((r["device"], r.get("variant", "")) for r in these if r["impl"] == "headway"):
            ours = [r for r in these if r["impl"] == "headway" and r["device"] == dev and r.get("variant", "") == variant]
            mean = lambda rs, key: float(np.mean([r[key] for r in rs])) if all(key in r for r in rs) else float("nan")  # noqa: E731
            so, ss, lo, ls = mean(ours, "seconds"), mean(sk, "seconds"), mean(ours, "log_likelihood"), mean(sk, "log_likelihood")
            ari = " | ".join(
                f"{mean(rs, key):.3f}" if not np.isnan(mean(rs, key)) else "–"
                for rs, key in ((ours, "ari_truth"), (sk, "ari_truth"), (ours, "ari_sklearn"))
            )
            io, isk = mean(ours, "iterations"), mean(sk, "iterations")
            passes = f" ({mean(ours, 'passes'):.1f})" if not np.isnan(mean(ours, "passes")) else ""
            per_seed = float(np.exp(np.mean([np.log(s["seconds"] / o["seconds"]) for o, s in zip(ours, sk, strict=True)])))
            paired = np.array([o["log_likelihood"] - s["log_likelihood"] for o, s in zip(ours, sk, strict=True)])  # same seed
            se = float(paired.std(ddof=1) / np.sqrt(len(paired))) if len(paired) > 1 else float("nan")
            per = f"{1000 * so / io:.1f} / {1000 * ss / isk:.1f}"  # start included: seconds / iterations
            out.append(
                f"| {case} | {cov} | {sk[0]['n']} × {sk[0]['d']}, {sk[0]['k']} | {dev}{', ' + variant if variant else ''} | {so:.3f} | {ss:.3f} | {ss / so:.1f}× ({per_seed:.1f}×) | "
                f"{io:.1f}{passes} / {isk:.1f} | {per} | {lo:.2f} | {ls:.2f} | "
                f"{(lo - ls) / abs(ls) * 100:+.3f} % ± {se / abs(ls) * 100:.3f} | {ari} |"
            )
    return out


def run_em_speed(args: argparse.Namespace) -> None:
    """Our batched EM against scikit-learn's GaussianMixture, both from seeds 0–19 (EM_SEEDS): CIFAR-10
    EfficientNet-Lite0 features of one client (n = 5,000, d = 1280; diag and spherical
    with K = 10, full with K = 1 as FedPFT's full arm) and synthetic clusters of known
    structure (d = 512 diag and spherical, d = 64 full, K = 10). Both fit the float32
    features in float32. Prints the table and writes every run's row."""
    root = results_root("fedpft-em-speed", args.tag)
    root.mkdir(parents=True, exist_ok=True)
    cfg = config(0, [*args.set, "num-clients=10", "partition=iid"])
    env = client_env(cfg.to_config(), {"partition-id": 0})
    f = features(cfg, env.data.name, env.x_train)[:5000].float().numpy()
    labels = env.y_train[:5000].numpy()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows: list[dict[str, Any]] = []
    for cov, k in (("diag", 10), ("spherical", 10), ("full", 1)):
        rows += _em_case("cifar10 features", f, None, cov, k, devices)
    per_class = [f[labels == c] for c in np.unique(labels)]
    for cov in ("diag", "spherical"):
        rows += _em_classes_case(f"cifar10 features, {len(per_class)} classes", per_class, cov, 10)
    x, y = em_clusters(0)
    for cov in ("diag", "spherical"):
        rows += _em_case("10 clusters", x, y, cov, 10, devices)
    x, y = em_clusters(0, d=64)
    rows += _em_case("10 clusters", x, y, "full", 10, devices)
    table = em_table(rows)
    print("\n".join(table), flush=True)
    (root / f"em-speed-{'gpu' if len(devices) > 1 else 'cpu'}.json").write_text(json.dumps(rows, indent=1))


STUDY_SAMPLE = (12345, 12000)  # (seed, size): the seeded sample of CIFAR-10 training rows the in-process studies draw from
# where the study sample's rows are cut into feature-cache entries: a larger study reuses a smaller one's
# entry (3,000 rows: the default --train-rows) and extracts only the rows past it
STUDY_CHUNKS = (3000, 10000)
FIG7_KS = (1, 2, 5, 10, 20, 50)


def study_features(cfg: Settings, n_train: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The in-process studies' (train features, labels, test features, labels): the first ``n_train``
    rows (in row order) of a seeded sample of CIFAR-10's training rows (STUDY_SAMPLE) and the whole
    test set, through the same feature cache as a run, in STUDY_CHUNKS pieces (raw features: the
    studies normalize themselves)."""
    seed, size = STUDY_SAMPLE
    if not 0 < n_train <= size:
        raise SystemExit(f"--train-rows {n_train}: the study sample holds {size} CIFAR-10 training rows; give 1 to {size}")
    ds = load_dataset(cfg.dataset, cfg.data_dir, cfg.seed)
    rows = np.sort(np.random.default_rng(seed).permutation(len(ds.y_train))[:size])[:n_train]
    raw = replace(cfg, fedpft=replace(cfg.fedpft, dp="off"))
    pieces = np.split(rows, [c for c in STUDY_CHUNKS if c < n_train])
    x = [to_tensors(ds, ds.x_train[r], ds.y_train[r]) for r in pieces]
    xt, yt = to_tensors(ds, ds.x_test, ds.y_test)
    f = torch.cat([features(raw, ds.name, xp) for xp, _ in x])
    return f, torch.cat([yp for _, yp in x]), features(raw, ds.name, xt), yt


def _as_sent(mixtures: list[ClassMixture]) -> list[ClassMixture]:
    """``mixtures`` rounded through float16, as the wire carries them."""
    r = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    return [ClassMixture(m.label, m.count, r(m.weights), r(m.means), np.maximum(r(m.covariances), 0.0), m.covariance) for m in mixtures]


def synthetic_head_accuracy(mixtures: list[ClassMixture], ftest: torch.Tensor, ytest: torch.Tensor, hs: dict[str, Any], seed: int) -> float:
    """Test accuracy of a head trained on |F_c| float16-rounded synthetic features of every class mixture."""
    xs, ys = synthesize(_as_sent(mixtures), torch.Generator().manual_seed(seed))
    return accuracy(head_logits(ftest, *train_head(xs, ys, 10, seed=seed, **hs)), ytest)


def run_fig7(args: argparse.Namespace) -> None:
    """Fig. 7 (left): a head on synthetic features from one GMM per class (K components,
    spherical or diag; full K = 1) against a head on the real features, with the float16
    values a client would send for them; centralized, on ``--train-rows`` rows of the study sample."""
    root = results_root("fedpft-fig7", args.tag)
    root.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        cfg = config(seed, args.set)
        hs = head_settings(cfg)
        ftr, ytr, fte, yte = study_features(cfg, args.train_rows)
        path = root / f"fig7-s{seed}.json"
        res: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        if "raw" not in res:
            res["raw"] = {
                "accuracy": accuracy(head_logits(fte, *train_head(ftr, ytr, 10, seed=seed, **hs)), yte),
                "values": int(ftr.numel()),
            }
        arms = [(cov, k) for cov in ("spherical", "diag") for k in args.ks]
        if int(np.bincount(ytr.numpy()).min()) > ftr.shape[1]:  # fewer points than dimensions: a singular full covariance
            arms.append(("full", 1))
        for cov, k in arms:
            name = f"{cov}-k{k}"
            if name in res:
                continue
            t0 = time.perf_counter()
            mix, ll = fit_class_mixtures(
                ftr, ytr.numpy(), k, cov, 2, cfg.fedpft.reg_covar, cfg.fedpft.em_tol, cfg.fedpft.em_max_iter, cfg.fedpft.em_init, seed
            )
            fit_s = time.perf_counter() - t0
            payload = encode(mix, ftr.shape[1], cov)
            res[name] = {
                "accuracy": synthetic_head_accuracy(mix, fte, yte, hs, seed),
                "values": int(sum(payload[n].size for n in (P.GMM_WEIGHTS, P.GMM_MEANS, P.GMM_COVARIANCES))),
                "bytes": int(sum(v.nbytes for v in payload.values())),
                "components": int(sum(len(m.weights) for m in mix)),
                "log_likelihood": float(np.mean(ll)),
                "fit_seconds": fit_s,
            }
            res["train_rows"], res["test_rows"] = len(ytr), len(yte)
            path.write_text(json.dumps(res, indent=1))
            print("fig7", seed, name, res[name], flush=True)


def _split(y: np.ndarray, clients: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    """Rows of each client: Dirichlet(``alpha``) class shares, or equal iid shares when ``alpha`` is 0."""
    if alpha <= 0:
        return [np.sort(p) for p in np.array_split(rng.permutation(len(y)), clients)]
    return split_by_class(y, rng.dirichlet(np.full(clients, alpha), size=10).T, rng)


def dp_mixtures(
    f: torch.Tensor, y: np.ndarray, epsilon: float, noise: str, min_n: int, rng: np.random.Generator, delta: float = 0.0
) -> list[ClassMixture]:
    """One client's per-class Gaussians (spherical, K = 1) on unit-norm features ``f``:
    ``noise`` = "both" releases them as DP-FedPFT does (:func:`headway.core.fedpft.privatize`), "mean"
    noises only the mean (true variance), "variance" only the variance (true mean), "none" none;
    classes of fewer than ``min_n`` examples are not sent."""
    out = []
    for c in np.unique(y):
        fc = f[torch.as_tensor(y == c)]
        if len(fc) < max(min_n, 2):
            continue
        exact_mean = fc.double().mean(0)
        mean, var = exact_mean.numpy()[None], np.array([float(((fc.double() - exact_mean) ** 2).mean())])
        if noise != "none":
            noised, _, _ = privatize(fc, int(c), "spherical", epsilon, delta, rng)
            mean = noised.means if noise in ("both", "mean") else mean
            var = noised.covariances if noise in ("both", "variance") else var
        out.append(ClassMixture(int(c), len(fc), np.ones(1), mean, var, "spherical"))
    return out


DP_STUDY = {  # name: (clients, Dirichlet alpha (0: iid), epsilon, noise, classes sent from n examples); most telling first
    "dp eps=1 (as shipped)": (10, 0.1, 1.0, "both", 2),
    "dp eps=1, variance noise only": (10, 0.1, 1.0, "variance", 2),
    "dp eps=1, mean noise only": (10, 0.1, 1.0, "mean", 2),
    "non-dp, unit-norm features": (10, 0.1, 0.0, "none", 2),
    "non-dp, raw features": (10, 0.1, 0.0, "raw", 2),
    "dp eps=1, classes of n >= 50 only": (10, 0.1, 1.0, "both", 50),
    "dp eps=1, 10 iid clients": (10, 0.0, 1.0, "both", 2),
    "dp eps=1, 1 client": (1, 0.0, 1.0, "both", 2),
    "dp eps=1, delta=1e-5": (10, 0.1, 1.0, "both-delta", 2),
    "dp eps=10": (10, 0.1, 10.0, "both", 2),
}


def run_dp_study(args: argparse.Namespace) -> None:
    """Where DP-FedPFT's accuracy goes (spherical K = 1, one Gaussian per class and client):
    DP_STUDY's variants on ``--train-rows`` rows of the study sample, the server's head on the
    union of every client's synthetic features, scored on the unit-norm test features. DP noise
    comes from OS entropy (as in a run); each variant is repeated per seed (split and head)."""
    root = results_root("fedpft-dp-study", args.tag)
    root.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        cfg = config(seed, args.set)
        hs = head_settings(cfg)
        ftr, ytr, fte, yte = study_features(cfg, args.train_rows)
        unit_tr, unit_te = normalize(ftr), normalize(fte)
        path = root / f"dp-study-s{seed}.json"
        res: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {}
        for name, (clients, alpha, eps, noise, min_n) in DP_STUDY.items():
            if name in res:
                continue
            parts = _split(ytr.numpy(), clients, alpha, np.random.default_rng([seed, clients]))
            rng = np.random.default_rng()  # DP noise: OS entropy, as the clients draw it
            mix: list[ClassMixture] = []
            for rows in parts:
                f, y = (ftr, unit_tr)[noise != "raw"][rows], ytr.numpy()[rows]
                if noise == "raw":
                    mix += fit_class_mixtures(f, y, 1, "spherical", 2, cfg.fedpft.reg_covar, 1e-3, 100, "kmeans", seed)[0]
                else:
                    kind = "both" if noise == "both-delta" else noise
                    mix += dp_mixtures(f, y, eps, kind, min_n, rng, 1e-5 if noise == "both-delta" else 0.0)
            test = fte if noise == "raw" else unit_te
            n = [m.count for m in mix]
            var = [float(m.covariances[0]) for m in mix]
            res[name] = {
                "accuracy": synthetic_head_accuracy(mix, test, yte, hs, seed),
                "clients": clients,
                "alpha": alpha,
                "epsilon": eps,
                "classes_sent": len(mix),
                "n_per_class_median": float(np.median(n)),
                "n_per_class_min": int(min(n)),
                "share_of_examples_in_classes_under_50": float(sum(c for c in n if c < 50) / sum(n)),
                "sigma_median": float(np.median([privacy.fedpft_sigma(c, eps, privacy.fedpft_delta(c, 0.0)) for c in n])) if eps else 0.0,
                "released_variance_median": float(np.median(var)),
            }
            path.write_text(json.dumps(res, indent=1))
            print("dp-study", seed, name, res[name], flush=True)


def report(args: argparse.Namespace) -> None:
    """Tables (markdown) from every finished result."""
    lines = []
    root = results_root("fedpft-cifar10", args.tag)
    if root.is_dir():
        rows: dict[str, list[dict[str, float]]] = {}
        for folder in sorted(root.glob("*-s*")):
            if folder.is_dir() and (folder / "summary.json").is_file():
                s = json.loads((folder / "summary.json").read_text())
                if s.get("status") != "complete":
                    continue
                arm = folder.name.rsplit("-s", 1)[0]
                rows.setdefault(arm, []).append(
                    {
                        "global_accuracy": s.get("global_final"),
                        "local_accuracy": s.get("final_accuracy"),
                        "bytes": s.get("total_bytes"),
                        "seconds": s.get("wall_seconds"),
                    }
                )
        for path in sorted(root.glob("baselines-s*.json")):
            for arm, r in json.loads(path.read_text()).items():
                rows.setdefault(arm, []).append(r)
        lines += [
            "## Table 5 shape: CIFAR-10, 50 clients, Dirichlet β = 0.1, EfficientNet-Lite0 features",
            "",
            "| method | global test accuracy (mean ± sd) | seeds | bytes (MB) | seconds |",
            "|---|---|---|---|---|",
        ]
        order = [*BASELINES, *ARMS]
        for arm in sorted(rows, key=lambda a: order.index(a) if a in order else 99):
            acc = np.array([r["global_accuracy"] for r in rows[arm]], dtype=float)
            mb = np.mean([r["bytes"] for r in rows[arm]]) / 1e6
            sec = np.mean([r.get("seconds", float("nan")) for r in rows[arm]])
            lines.append(f"| {arm} | {acc.mean() * 100:.2f} ± {acc.std() * 100:.2f} | {len(acc)} | {mb:.2f} | {sec:.0f} |")
        lines.append("")
    for name, title in (
        ("fedpft-chain", "§5.4 chain: 5 clients, 100 iid examples each"),
        ("fedpft-labelshift", "Table 2: disjoint label shift (source 0–4, destination 5–9)"),
        ("fedpft-em-speed", "EM: headway against scikit-learn"),
    ):
        r = results_root(name, args.tag)
        if not r.is_dir():
            continue
        lines += [f"## {title}", ""]
        if name == "fedpft-chain":
            lines += [
                "| seed | client 1 | 2 | 3 | 4 | 5 | local-only heads (mean) | centralized (500 real) | MB |",
                "|---|---|---|---|---|---|---|---|---|",
            ]
            for folder in sorted(r.glob("chain-s*")):
                rec = (
                    [json.loads(x) for x in (folder / "rounds.jsonl").read_text().splitlines()]
                    if (folder / "rounds.jsonl").is_file()
                    else []
                )
                if not rec:
                    continue
                last = rec[-1]
                accs = [last.get(f"accuracy_p{i}") for i in range(5)]
                ref = r / f"centralized-s{folder.name[-1]}.json"
                central = json.loads(ref.read_text())["global_accuracy"] * 100 if ref.is_file() else float("nan")
                lines.append(
                    f"| {folder.name[-1]} | "
                    + " | ".join(f"{a * 100:.1f}" if a is not None else "–" for a in accs)
                    + f" | {last.get('accuracy_local', float('nan')) * 100:.1f} | {central:.1f} | {(last['bytes_down'] + last['bytes_up']) / 1e6:.2f} |"
                )
        elif name == "fedpft-labelshift":
            res = [json.loads(p.read_text()) for p in sorted(r.glob("labelshift-s*.json"))]
            if res:
                lines += ["| method | source test | destination test | all | bytes |", "|---|---|---|---|---|"]
                for arm in res[0]:
                    src = np.mean([x[arm]["source_test"] for x in res]) * 100
                    dst = np.mean([x[arm]["destination_test"] for x in res]) * 100
                    al = np.mean([x[arm]["all_test"] for x in res]) * 100
                    lines.append(f"| {arm} | {src:.2f} | {dst:.2f} | {al:.2f} | {res[0][arm].get('bytes', '')} |")
        else:
            for p in sorted(r.glob("*.json")):
                lines += [*em_table(json.loads(p.read_text())), ""]
        lines.append("")
    text = "\n".join(lines)
    out = results_root("fedpft-cifar10", args.tag).parent / "fedpft-tables.md"
    out.write_text(text)
    print(text)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("table5", "chain", "chain-streams", "labelshift", "em-speed", "fig7", "dp-study", "report"))
    p.add_argument("--seeds", type=int, nargs="+", default=[0])
    p.add_argument("--arms", nargs="+", default=[*BASELINES, *ARMS], choices=[*BASELINES, *ARMS])
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--tag", default="")
    p.add_argument("--train-rows", type=int, default=3000, help="fig7, dp-study: rows of the study sample to train on")
    p.add_argument("--ks", type=int, nargs="+", default=list(FIG7_KS), help="fig7: components per class")
    args = p.parse_args()
    {
        "table5": run_table5,
        "chain": run_chain,
        "chain-streams": run_chain_streams,
        "labelshift": run_labelshift,
        "em-speed": run_em_speed,
        "fig7": run_fig7,
        "dp-study": run_dp_study,
        "report": report,
    }[args.what](args)


if __name__ == "__main__":
    main()
