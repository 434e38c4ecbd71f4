"""The run-config schema: every key, its default, its allowed values, and validation.

Server and clients both read the Flower run config through :func:`resolve`, so a bad
value fails at start with a message naming the key and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from core.aggregate import AGGREGATIONS, SELECTING, replies_needed
from core.methods import ALGORITHMS, METHODS, method_keys
from core.schema import ConfigError, Key, fraction, non_negative, positive  # ConfigError: here for callers; the method rules raise it too

DATASETS = (
    "mnist",
    "fashion-mnist",
    "cifar10",
    "cifar10-gray",
    "cifar100",
    "uci-adult",
    "uci-gas-turbine",
    "circle",
)
PARTITIONS = ("iid", "pathological", "shards", "dirichlet", "natural", "dominant")
OPTIMIZERS = ("adam", "sgd")
DEVICES = ("auto", "cpu", "cuda")
SAMPLINGS = ("uniform", "data-ratio")
FAULT_MODES = (
    "drop-after-keys",
    "nan",
    "wrong-shape",
    "negative-count",
    "scaled",
    "error",
    "list-metric",
    "huge-count",
    "zero-model",
    "int-arrays",
    "extra-array",
    "oversized",
    "huge-values",
    "bad-eval",
    "silent",
    "string-metric",
    "sign-flip",
)


# Bounds checked before anything starts (and without allocating anything):
MAX_SEED = (
    2**32 - 1
)  # numpy's RandomState / np.random.seed and sklearn's random_state take 0..2**32-1; torch.manual_seed and default_rng take more
MAX_IMAGE_SIZE = 1024  # image-size: 1024² x 3 B = 3 MiB an image; 8000 had Ray's workers killed for memory, 60000 overflowed
MAX_FEATURE_DIM = 16384  # 12x the widest body here (EfficientNet-Lite0, 1280); a FedLog reply is classes x (m+1) floats

LOCAL = "local"  # dataset value: every SuperNode reads its own data (node config 'data')
BUILTIN_TRAIN_FRACTION = 0.05  # train-fraction=0 on a built-in data set: FedLog's Table 1 subset (5 % of MNIST), not a user's data
AUTO_BODY = "auto"  # body value: the body that fits the data's input shape (core.models.auto_body), fixed once the shape is known
PATH_SUFFIXES = (".csv", ".parquet", ".npz")


def dataset_kind(name: str) -> str | None:
    """'builtin', 'path' (the user's own source), 'local' (each node's own), or None when
    ``name`` is none of these (an unknown built-in name)."""
    if name in DATASETS:
        return "builtin"
    if name == LOCAL:
        return "local"
    if "/" in name or "\\" in name or name.startswith((".", "~")) or name.lower().endswith(PATH_SUFFIXES):
        return "path"
    return None


SCHEMA: dict[str, Key] = {
    # what runs
    "algorithm": Key("fedlog", "federated method", choices=ALGORITHMS),
    "dataset": Key(
        "mnist",
        "data set: a built-in name, a path to your own data (image folders, a CSV/Parquet table, an .npz, a saved "
        "Hugging Face dataset; docs/your-data.md), or 'local': in a deployment every SuperNode reads its own (--node-config data=PATH)",
        check=lambda v: dataset_kind(v) is not None,
        rule=f"a built-in name ({', '.join(DATASETS)}), a path (containing '/', or ending in .csv, .parquet or .npz), or 'local'",
    ),
    "data-dir": Key("", "data directory of the built-in data sets; empty: $HEADWAY_DATA_DIR, else the user cache"),
    # your own data (docs/your-data.md): how a path source, or every node's own source (dataset=local), is read
    "classes": Key(
        "",
        "comma list of the run's class names, in index order; empty: the sorted union of the names the data holds "
        "(every node's, with dataset=local)",
    ),
    "label-column": Key("label", "the label column of a table or Hugging Face dataset"),
    "image-size": Key(
        0,
        "side in pixels every image is resized to; 0: the images' own, where all share one",
        check=lambda v: 0 <= v <= MAX_IMAGE_SIZE,
        rule=f"in [0, {MAX_IMAGE_SIZE}] (a decoded image of side S takes S² x 3 bytes in every client's memory, per image)",
    ),
    "channels": Key(
        0,
        "image channels (1: grayscale, 3: RGB); 0: 1 when every image is grayscale, else 3",
        check=lambda v: v in (0, 1, 3),
        rule="0, 1 or 3",
    ),
    "test-fraction": Key(
        0.2, "share of a source's rows held out, seeded, as its test split when it has none", check=lambda v: 0 < v < 1, rule="in (0, 1)"
    ),
    "server-data": Key(
        "",
        "dataset=local: a source the server itself holds (its test split scores the global model and LG-FedAvg's new test, "
        "its training rows are FedProf's D^V); empty: the server holds no data",
    ),
    "num-clients": positive("number of clients (partitions)", 50),
    "partition": Key("pathological", "how data is split over clients", choices=PARTITIONS),
    "classes-per-client": positive("classes per client (pathological); shards per client (shards)", 2),
    "dirichlet-alpha": positive("Dirichlet concentration (dirichlet)", 0.5),
    "dominant-class-fraction": Key(
        0.6,
        "share of each client's data from its one dominant class (dominant); dominant classes are dealt evenly over clients",
        check=lambda v: 0 <= v <= 1,
        rule="in [0, 1]",
    ),
    "client-size-mean": non_negative(
        "mean of clients' local data sizes, drawn from a normal distribution (iid, dominant); 0: equal shares of the data", 0.0
    ),
    "client-size-std": non_negative("standard deviation of clients' local data sizes (with client-size-mean)", 0.0),
    "natural-column": Key("", "column that names a client's source (natural); empty: the data set's own"),
    "server-holdout": non_negative(
        "training rows kept from every client before partitioning (FedProf uses fedprof-val-size instead); set it equal to compare a method with FedProf on the same client data",
        0,
    ),
    "train-fraction": Key(
        0.0,
        "fraction of the training rows used, drawn (stratified) before partitioning; 0: all the rows of your own data (a path, "
        f"or dataset=local), {BUILTIN_TRAIN_FRACTION:g} of a built-in data set's (FedLog's Table 1 setting). config.json shows the value used",
        check=lambda v: 0 <= v <= 1,
        rule="in (0, 1], or 0 for the data set's default",
    ),
    "num-server-rounds": positive("federated rounds", 100),
    "fraction-train": fraction("fraction of clients sampled per round", 1.0),
    "client-sampling": Key(
        "uniform",
        "fedavg/fedprox: how the round's K clients are drawn. uniform: without replacement, updates weighted by n_k (McMahan et al.); "
        "data-ratio: K draws with replacement with probability n_k/n, each draw weighted equally (scheme I of Li et al. 2020, FedProx's sampling)",
        choices=SAMPLINGS,
    ),
    "aggregation": Key(
        "mean",
        "fedavg, fedprox, lg-fedavg, fedper, fedrep: how the round's accepted model updates are combined, by Flower's own rules. "
        "mean: weighted by n_k; median: coordinate-wise (Yin et al. 2018); trimmed-mean: coordinate-wise, trimmed-mean-beta cut "
        "at each end; krum: the one update nearest its n-f-2 closest (Blanchard et al. 2017); multi-krum: the n_k-weighted mean "
        "of the multi-krum-select best by that score; bulyan: multi-krum keeps n-2f, then each coordinate is the mean of the "
        "n-4f nearest their median (El Mhamdi et al. 2018). f is malicious-clients; docs/trust-and-dp.md says what each tolerates",
        choices=AGGREGATIONS,
    ),
    "trimmed-mean-beta": Key(
        0.2,
        "aggregation=trimmed-mean: fraction of a round's replies cut at each end of every coordinate (floor(beta x n) each side); "
        "refused unless a full round cuts at least one, and a round too small to cut one keeps the previous model",
        check=lambda v: 0 <= v < 0.5,
        rule="in [0, 0.5)",
    ),
    "malicious-clients": non_negative(
        "aggregation=krum, multi-krum, bulyan: f, the poisoned replies a round is built to withstand; "
        "a round needs n >= 2f+3 valid replies (krum, multi-krum) or n >= 4f+3 (bulyan), else it keeps the previous model",
        1,
    ),
    "multi-krum-select": non_negative(
        "aggregation=multi-krum: m, how many of the best-scored replies are averaged (at most n-f of a round's n); 0: n-f", 0
    ),
    "min-available-clients": non_negative("clients to wait for before sampling; 0: num-clients", 0),
    "sample-timeout": non_negative("seconds to wait, once before round 1, for min-available-clients to connect", 120.0),
    "local-epochs": non_negative("local epochs per round", 5),
    "batch-size": positive("local batch size", 10),
    "lr": positive("local learning rate", 1e-3),
    "lr-decay": Key(1.0, "learning rate of round r: lr · lr-decay^(r-1)", check=lambda v: 0 < v <= 1, rule="in (0, 1]"),
    "optimizer": Key("adam", "local optimizer", choices=OPTIMIZERS),
    "body": Key(
        "auto",
        "body architecture; auto: the one that fits the data (images: mnist-cnn at 28×28, MNIST's, cifar-cnn at 32×32, "
        "image-cnn at other sizes; tables: mlp), recorded in config.json",
    ),
    "inputs": Key(
        "raw",
        "what clients train and are scored on: raw (the data set's inputs) or features (the frozen fedpft-extractor's features of them, "
        "at fedpft-resolution, cached in fedpft-cache-dir as FedPFT's are; give body=linear for a linear model on them, or mlp)",
        choices=("raw", "features"),
    ),
    "feature-dim": Key(
        0,
        "m, the number of features a body outputs; 0: the body's own width",
        check=lambda v: 0 <= v <= MAX_FEATURE_DIM,
        rule=f"in [0, {MAX_FEATURE_DIM}] (0: the body's own width; the widest body here has 1280 features)",
    ),
    "body-dropout": Key(
        0.5,
        "dropout in training of the papers' CNN bodies (mnist-cnn: after conv2 and on the features; cifar-cnn: on the features), as their authors train them; 0: off",
        check=lambda v: 0 <= v < 1,
        rule="in [0, 1)",
    ),
    "bodies": Key("", "comma list of bodies cycled over partition ids; empty: every client runs `body`"),
    "body-init": Key(
        "shared",
        "initial client models: one seed for all, or a seed per partition id (different initializations)",
        choices=("shared", "per-client"),
    ),
    "seed": Key(
        0,
        "seed of partitions, initialization and sampling",
        check=lambda v: 0 <= v <= MAX_SEED,
        rule=f"in [0, 2**32 - 1 = {MAX_SEED}] (what numpy's legacy seeding and sklearn accept; torch and numpy's Generator take these too)",
    ),
    "target-accuracy": Key(0.0, "accuracy for bytes_to_target; 0: none", check=lambda v: 0 <= v <= 1, rule="in [0, 1]"),
    "device": Key("auto", "torch device of clients", choices=DEVICES),
    "round-timeout": positive(
        "deadline in seconds of each exchange of a round; a client that misses it is not waited for again that round", 600.0
    ),
    "eval-every": non_negative(
        "clients score themselves on their test splits every this many rounds and after the last; 0: only after the last", 1
    ),
    "client-evaluation": Key(
        "exchange",
        "how clients report their test scores of the global model: an evaluation exchange after each evaluated round, or "
        "with-next-train: in the next round's train reply, scored before training (one exchange after the last round)",
        choices=("exchange", "with-next-train"),
    ),
    # secure aggregation (core/secagg.py; docs/secure-aggregation.md)
    "secure-aggregation": Key(
        "off",
        "secagg+: the server learns only the sum of the clients' replies, never one of them (SecAgg+; sum-shaped methods only)",
        choices=("off", "secagg+"),
    ),
    "secagg-shares": non_negative(
        "SecAgg+: clients each one shares its secrets with, itself included (odd; capped at the round's clients); 0: 2*ceil(log2 n)+1", 0
    ),
    "secagg-threshold": Key(
        0.5,
        "SecAgg+: a secret is rebuilt from more than this fraction of its shares; a round with fewer survivors among a client's "
        "neighbours fails and keeps the previous model",
        check=lambda v: 0.5 <= v < 1,
        rule="in [0.5, 1): a majority of a client's shares, so no two disjoint groups of its neighbours can each rebuild its secrets",
    ),
    "global-eval": Key(True, "also evaluate a single global model on the whole test set, where one exists"),
    "results-dir": Key("results", "where `flwr run` writes its results folder"),
    "tensorboard": Key(
        True, "write each round's figures as TensorBoard event files into the results folder (`tensorboard --logdir results/`)"
    ),
    "mlflow-tracking-uri": Key(
        "",
        "also log each round's figures to MLflow at this tracking URI (e.g. http://host:5000, sqlite:///results/mlflow.db); empty: "
        "no MLflow. Needs the mlflow extra: pip install -e '.[mlflow]' in headway's checkout",
    ),
    "client-num-cpus": positive("CPUs per virtual client (simulation)", 1.0),
    "client-num-gpus": non_negative("GPU share per virtual client (simulation)", 0.0),
    "ray-address": Key(
        "",
        "Ray cluster the simulation runs on: host:port of its head (GCS), auto (RAY_ADDRESS, else the `ray start` cluster on this machine) "
        "or empty: a private Ray started for the run (RAY_ADDRESS ignored); see docs/ray-cluster.md",
        check=lambda v: "://" not in v,
        rule="host:port, auto or empty (not a ray:// Ray Client address: run headway on a node of the cluster)",
    ),
    # data quality: some clients' training data is corrupted (core/noise.py)
    "client-noise": Key(
        "",
        "comma list kind:fraction of clients whose training data is corrupted: irrelevant, blur, salt-pepper (images), polluted, noisy (tabular)",
    ),
    # robustness testing: chosen clients corrupt their training replies
    "fault-clients": Key("", "comma list of partition ids whose replies are corrupted (robustness tests)"),
    "fault-mode": Key("nan", "how faulty clients corrupt replies (see README, Robustness testing)", choices=FAULT_MODES),
    # what a reply may be: bounds the server enforces on every client reply
    "min-replies": positive("valid replies a round needs at its deadline; fewer and the round keeps the previous model", 1),
    "max-update-norm": positive(
        "model-averaging methods, from round 2: largest ‖w_client − w_global‖ accepted, relative to max(‖w_global‖, 1); "
        "a sign-flipped model is 2; honest clients measured up to 0.95 after round 1 (20,000 examples each; Table 1 setups 0.48) (benchmarks/results/update-norms)",
        1.5,
    ),
    "max-first-update-norm": positive(
        "the same bound in round 1, whose updates start from the seeded random model and move furthest "
        "(measured: 1.0 with 1,000 examples a client, 1.55 with 4,000, 2.7 with 20,000): raise it for clients that train that long, "
        "knowing a sign flip (about 2.2 there) then passes round 1",
        1.5,
    ),
    "max-feature-value": positive("largest |feature| a reply's feature sums or prototypes may imply (FedLog without clip, FedProto)", 1e4),
    "max-client-examples": non_negative(
        "largest num-examples a reply may claim when the server holds no data to compute partition sizes; 0: 1,000,000", 0
    ),
    **method_keys(),
}


def _coerce(name: str, key: Key, value: Any) -> Any:
    default = key.default
    if isinstance(default, bool):
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0"):
            return value.lower() in ("true", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise ConfigError(f"run-config key '{name}' must be true or false, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, bool):
            raise ConfigError(f"run-config key '{name}' must be an integer, got {value!r}")
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        if isinstance(value, int):
            return value
        raise ConfigError(f"run-config key '{name}' must be an integer, got {value!r}")
    if isinstance(default, float):
        if isinstance(value, bool):
            raise ConfigError(f"run-config key '{name}' must be a number, got {value!r}")
        try:
            out = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"run-config key '{name}' must be a number, got {value!r}") from None
        if not math.isfinite(out):
            raise ConfigError(f"run-config key '{name}' must be finite, got {value!r}")
        return out
    return str(value)


def resolve(run_config: Mapping[str, Any] | None = None, import_bodies: bool = True) -> dict[str, Any]:
    """Return the full run config: defaults overlaid with ``run_config``, checked.

    Raises :class:`ConfigError` naming the key and the allowed values on an unknown
    key or a bad value. ``import_bodies=False`` (a client, which builds only its own body)
    checks the form of import-path and torchvision bodies without importing them.
    """
    run_config = dict(run_config or {})
    unknown = sorted(set(run_config) - set(SCHEMA))
    if unknown:
        raise ConfigError(f"unknown run-config key(s) {unknown}; known keys: {', '.join(sorted(SCHEMA))}")
    out: dict[str, Any] = {}
    for name, key in SCHEMA.items():
        value = _coerce(name, key, run_config.get(name, key.default))
        if key.choices is not None and value not in key.choices:
            raise ConfigError(f"run-config key '{name}' is {value!r}; allowed values: {', '.join(key.choices)}")
        if key.check is not None and not key.check(value):
            raise ConfigError(f"run-config key '{name}' is {value!r}; it must be {key.rule}")
        out[name] = value
    out["train-fraction"] = train_fraction(out)
    _check_combinations(out, import_bodies)
    return out


def train_fraction(cfg: Mapping[str, Any]) -> float:
    """The share of the training rows a run uses: ``train-fraction`` as set, or where it is 0 (the
    default) all of a user's own data (a path, dataset=local) and BUILTIN_TRAIN_FRACTION of a built-in,
    so a user's folder is never silently cut to the papers' 5 %."""
    value = float(cfg["train-fraction"])
    if value > 0:
        return value
    return BUILTIN_TRAIN_FRACTION if dataset_kind(cfg["dataset"]) == "builtin" else 1.0


def _check_combinations(cfg: Mapping[str, Any], import_bodies: bool = True) -> None:
    from core.models import BodyError, body_factory, is_custom_body  # local import: models pulls in torch

    for body in body_names(cfg):  # a registry name, torchvision:<arch>[@weights] or an import path that imports
        if body == AUTO_BODY and body_key(cfg, body) == "body":
            continue  # chosen from the data's shape once it is known (fit_body)
        if not import_bodies and is_custom_body(body):
            continue  # built, and so imported, only by the clients that run it
        try:
            body_factory(body)
        except BodyError as exc:
            raise ConfigError(f"run-config key '{body_key(cfg, body)}': {exc}") from None
    try:
        fault_ids(cfg)
    except ValueError:
        raise ConfigError(f"run-config key 'fault-clients' must be a comma list of partition ids, got {cfg['fault-clients']!r}") from None
    from core.noise import parse_client_noise  # local import: keeps the schema light

    try:
        parse_client_noise(cfg["client-noise"])
    except ValueError as exc:
        raise ConfigError(f"run-config key 'client-noise': {exc}") from None
    method = METHODS[cfg["algorithm"]]
    most = max_replies(cfg)
    if cfg["min-replies"] > most:
        asked = (
            "every client"
            if method.every_client
            else f"K = max(1, round(fraction-train x num-clients)) = max(1, round({cfg['fraction-train']:g} x {cfg['num-clients']}))"
        )
        raise ConfigError(
            f"run-config key 'min-replies' is {cfg['min-replies']}, but a round of {cfg['algorithm']} asks {asked} = {most} "
            f"client(s), so no round could ever update the model: set min-replies <= {most}"
        )
    if cfg["server-data"] and cfg["dataset"] != LOCAL:
        raise ConfigError(
            f"run-config key 'server-data' applies to dataset='local' (each node holds its own data); with dataset={cfg['dataset']!r} "
            "the server reads the data set itself: leave server-data empty"
        )
    if cfg["client-sampling"] != "uniform" and not method.client_sampling:
        honour = " and ".join(m.name for m in METHODS.values() if m.client_sampling)
        raise ConfigError(
            f"run-config key 'client-sampling' is {cfg['client-sampling']!r}, which only {honour} implement; "
            f"{cfg['algorithm']} draws its clients its own way: leave it 'uniform'"
        )
    if cfg["aggregation"] != "mean":
        _check_aggregation(cfg, method, most)
    if cfg["client-size-std"] > 0 and cfg["client-size-mean"] <= 0:
        raise ConfigError("run-config key 'client-size-std' needs 'client-size-mean' > 0: the sizes are drawn from N(mean, std²)")
    if cfg["client-size-mean"] > 0 and cfg["partition"] not in ("iid", "dominant"):
        raise ConfigError(f"run-config key 'client-size-mean' applies to partition iid or dominant, not {cfg['partition']!r}")
    if cfg["client-evaluation"] != "exchange":
        _check_scores_with_train(cfg, method)
    if cfg["secure-aggregation"] != "off":
        _check_secure_aggregation(cfg, method)
    method.validate(cfg)  # the chosen method's own rules (core/methods.py)


def _check_scores_with_train(cfg: Mapping[str, Any], method: Any) -> None:
    """client-evaluation=with-next-train only where a score sent with the next train reply measures what the exchange would."""
    if not method.scores_with_train:
        able = ", ".join(m.name for m in METHODS.values() if m.scores_with_train)
        raise ConfigError(
            f"run-config key 'client-evaluation' is {cfg['client-evaluation']!r}, which only {able} implement: {cfg['algorithm']} "
            "evaluates what a train message does not bring (its own or a personal model, prototypes, a one-shot head): leave it 'exchange'"
        )
    if cfg["algorithm"] == "fedlog" and cfg["fedlog-dp"] == "local":
        raise ConfigError(
            "run-config key 'client-evaluation' must be 'exchange' with fedlog-dp='local': a train reply then releases nothing "
            "but the noised statistics"
        )


def _check_secure_aggregation(cfg: Mapping[str, Any], method: Any) -> None:
    """secure-aggregation only for methods whose server needs nothing but the sum of the replies."""
    if not method.secure_sum:
        able = ", ".join(m.name for m in METHODS.values() if m.secure_sum)
        raise ConfigError(
            f"run-config key 'secure-aggregation' is {cfg['secure-aggregation']!r}, which only {able} implement: {cfg['algorithm']}'s "
            "server needs what each client sends (profiles to select by, mixtures to sample from, models to compare), not only their sum"
        )
    if (most := max_replies(cfg)) < 3:  # core/secagg.py MIN_CLIENTS (no import: config stays free of the crypto)
        raise ConfigError(
            f"run-config key 'secure-aggregation' is {cfg['secure-aggregation']!r}, but a round of {cfg['algorithm']} asks {most} "
            "client(s), and a secure sum needs at least 3 (each client's secrets are split among at least 2 others, and it never "
            "reveals a share of its own): set num-clients (and fraction-train) for 3 or more clients a round, or secure-aggregation='off'"
        )
    if cfg["client-evaluation"] != "exchange":
        raise ConfigError(
            "run-config key 'client-evaluation' must be 'exchange' with secure-aggregation: a train reply then holds only the masked sum share"
        )
    if cfg["aggregation"] != "mean":
        raise ConfigError(
            f"run-config key 'aggregation' is {cfg['aggregation']!r}, which needs each client's update; secure-aggregation gives the "
            "server only their sum: use aggregation='mean', or secure-aggregation='off'"
        )
    if cfg["client-sampling"] != "uniform":
        raise ConfigError(
            "run-config key 'client-sampling' must be 'uniform' with secure-aggregation: data-ratio weighs each client by how often "
            "it was drawn, which its masked update cannot carry"
        )


def _check_aggregation(cfg: Mapping[str, Any], method: Any, most: int) -> None:
    """A robust aggregation rule only where the server averages the round's model updates, and
    only when a full round (``most`` replies) is enough for it against malicious-clients."""
    rule, f = cfg["aggregation"], cfg["malicious-clients"]
    if not method.robust_aggregation:
        able = ", ".join(m.name for m in METHODS.values() if m.robust_aggregation)
        raise ConfigError(
            f"run-config key 'aggregation' is {rule!r}, which only {able} implement (it replaces their average of the round's "
            f"model updates); {cfg['algorithm']} {method.server_combines}: leave it 'mean'"
        )
    if rule == "trimmed-mean":
        _check_trimmed_mean(cfg["trimmed-mean-beta"], most)
    if rule not in SELECTING:
        return
    need = replies_needed(rule, f)
    if most < need:
        formula = "4f + 3" if rule == "bulyan" else "2f + 3"
        raise ConfigError(
            f"run-config key 'malicious-clients' is {f}, but aggregation={rule} needs at least {formula} = {need} valid replies "
            f"a round and a round of {cfg['algorithm']} asks {most} client(s): lower malicious-clients or ask more clients"
        )
    if rule == "multi-krum" and cfg["multi-krum-select"] > most - f:
        raise ConfigError(
            f"run-config key 'multi-krum-select' is {cfg['multi-krum-select']}, but a round asks {most} client(s), of which "
            f"malicious-clients={f} may be poisoned: multi-krum averages at most {most - f} (0: n - f)"
        )


def _check_trimmed_mean(beta: float, most: int) -> None:
    """trimmed-mean only when a full round of ``most`` replies cuts at least one at each end
    (floor(beta x most) >= 1); else it trims nothing and is the plain mean under another name."""
    if math.floor(beta * most) >= 1:
        return
    ways = []
    if beta > 0:
        ways.append(f"a round of at least {max(3, math.ceil(1 / beta - 1e-12))} clients (num-clients x fraction-train)")
    if 1 / most < 0.5:
        ways.append(f"trimmed-mean-beta >= {math.ceil(1e4 / most) / 1e4:g}")
    raise ConfigError(
        f"run-config key 'trimmed-mean-beta' is {beta:g}: a full round of {most} replies cuts floor({beta:g} x {most}) = 0 at each end, "
        f"so trimmed-mean would be the plain mean; set {' or '.join(ways) or 'a round of at least 3 clients'}, or use aggregation=mean"
    )


def scores_with_train(cfg: Mapping[str, Any], server_round: int) -> bool:
    """Whether round ``server_round``'s train replies carry the test scores of the model its train message brings, i.e. of
    round ``server_round - 1``'s model: client-evaluation=with-next-train, and that round was due an evaluation and was not
    the last (the last one is always evaluated by an exchange)."""
    scored = server_round - 1
    if cfg["client-evaluation"] != "with-next-train" or not 1 <= scored < cfg["num-server-rounds"]:
        return False
    return bool(cfg["eval-every"]) and scored % cfg["eval-every"] == 0


def max_replies(cfg: Mapping[str, Any]) -> int:
    """The most training replies one round can get: every client for a method that asks
    every client, else the round's sample K = max(1, round(fraction-train x num-clients))."""
    from core.sampling import sample_size

    n = int(cfg["num-clients"])
    return n if METHODS[cfg["algorithm"]].every_client else min(n, sample_size(n, cfg["fraction-train"]))


def check_against_spec(cfg: Mapping[str, Any], spec: Any) -> None:
    """Checks that need the data set's spec (a ``core.data.DatasetSpec``); ConfigError naming the key."""
    if cfg["partition"] == "dominant" and spec.task != "classification":
        raise ConfigError(
            f"run-config key 'partition' is 'dominant', which needs class labels; data set '{cfg['dataset']}' is a regression task: use iid"
        )
    if cfg["partition"] == "pathological" and cfg["classes-per-client"] > spec.num_classes:
        raise ConfigError(
            f"run-config key 'classes-per-client' is {cfg['classes-per-client']}, but data set '{cfg['dataset']}' has {spec.num_classes} classes"
        )
    from core.noise import IMAGE_KINDS, parse_client_noise

    image = len(spec.input_shape) == 3
    if cfg["inputs"] == "features" and not image and cfg["fedpft-extractor"] != "identity":
        raise ConfigError(
            f"run-config key 'inputs' is 'features', but fedpft-extractor {cfg['fedpft-extractor']!r} takes images and "
            f"data set '{cfg['dataset']}' is tabular: use fedpft-extractor=identity, or inputs=raw"
        )
    for kind, _ in parse_client_noise(cfg["client-noise"]):
        if (kind in IMAGE_KINDS) != image:
            raise ConfigError(
                f"run-config key 'client-noise': kind {kind!r} is for {'images' if kind in IMAGE_KINDS else 'tabular data'}, "
                f"and data set '{cfg['dataset']}' is {'images' if image else 'tabular'}"
            )


def check_bodies(cfg: Mapping[str, Any], input_shape: tuple[int, ...]) -> None:
    """Build every body the config names once (as clients will: feature-dim, seed, body-dropout)
    and run it on a 2-row zero batch of ``input_shape``: ConfigError naming the key when its
    module cannot be imported, its factory raises, it outputs no (batch, width) tensor, or its
    width differs from feature-dim. Nothing for a method that builds no body (FedPFT: a frozen
    extractor and a linear head)."""
    if not METHODS[cfg["algorithm"]].builds_body:
        return
    from core.models import BodyError, build_body, output_width

    shape = tuple(input_shape)
    for body in [fitted_body(cfg, shape) if b == AUTO_BODY else b for b in body_names(cfg)]:
        try:
            built = build_body(body, shape, cfg["feature-dim"], cfg["seed"], cfg["body-dropout"])
            output_width(body, built, shape, cfg["feature-dim"])
        except BodyError as exc:
            raise ConfigError(f"run-config key '{body_key(cfg, body)}': {exc}{_fitting_note(cfg, shape)}") from None
        except Exception as exc:  # a registry body that refuses these inputs or this feature-dim
            text = " ".join(str(exc).split())
            raise ConfigError(
                f"run-config key '{body_key(cfg, body)}': body {body!r} cannot be built for inputs of shape {shape} "
                f"with feature-dim={cfg['feature-dim']}: {type(exc).__name__}: {text}{_fitting_note(cfg, shape)}"
            ) from None


def _fitting_note(cfg: Mapping[str, Any], shape: tuple[int, ...]) -> str:
    """The tail of a body refusal: which built-in bodies do fit ``shape`` (and feature-dim), and that leaving body unset picks one."""
    from core.models import fitting_bodies

    fitting = fitting_bodies(shape, cfg["feature-dim"])
    if not fitting:
        return f"; no built-in body fits inputs of shape {shape} with feature-dim={cfg['feature-dim']}"
    return f"; bodies that fit inputs of shape {shape}: {', '.join(fitting)} (or leave body unset: body=auto picks one)"


def fitted_body(cfg: Mapping[str, Any], input_shape: tuple[int, ...]) -> str:
    """The run's ``body``: as named, or for body=auto the one that fits ``input_shape`` (core.models.auto_body:
    the same on the server and every client, since all see the same input shape); ConfigError when none does."""
    if cfg["body"] != AUTO_BODY:
        return str(cfg["body"])
    from core.models import BodyError, auto_body

    try:
        return auto_body(tuple(input_shape), cfg["feature-dim"])
    except BodyError as exc:
        raise ConfigError(f"run-config key 'body': {exc}") from None


def fit_body(cfg: dict[str, Any], input_shape: tuple[int, ...]) -> str:
    """Replace body=auto in ``cfg`` by :func:`fitted_body` (in place, so config.json names the body that ran)."""
    cfg["body"] = fitted_body(cfg, input_shape)
    return cfg["body"]


def body_key(cfg: Mapping[str, Any], body: str) -> str:
    """The run-config key that names ``body``: 'bodies' where its comma list does, else 'body'."""
    return "bodies" if body in [b.strip() for b in str(cfg["bodies"]).split(",")] else "body"


def body_names(cfg: Mapping[str, Any]) -> list[str]:
    """The distinct body names a config refers to."""
    names = [b.strip() for b in str(cfg["bodies"]).split(",") if b.strip()]
    return sorted(set(names) | {cfg["body"]})


def body_for(cfg: Mapping[str, Any], partition_id: int, override: str | None = None) -> str:
    """The body a client runs: a node-config override, else `bodies` cycled, else `body`."""
    if override:
        return override
    names = [b.strip() for b in str(cfg["bodies"]).split(",") if b.strip()]
    if not names:
        return cfg["body"]
    return names[partition_id % len(names)]


def fault_ids(cfg: Mapping[str, Any]) -> set[int]:
    """Partition ids named in 'fault-clients'."""
    return {int(p) for p in str(cfg["fault-clients"]).split(",") if p.strip()}


def defaults() -> dict[str, Any]:
    """Every key with its default value."""
    return {name: key.default for name, key in SCHEMA.items()}
