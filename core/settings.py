"""The typed settings of a run: the keys every method reads (:class:`CommonSettings`, one
field per key, declared with its :class:`~headway.core.schema.Key`), each method's own (its settings
class in core/methods.py) and :class:`Settings`, the frozen, typed value of a resolved run
config. The run-config schema (:data:`SCHEMA`, which core/config.py checks configs against and
headway/generate.py documents) is derived from these classes: one source.

Key to attribute: a common key ``fraction-train`` is ``settings.fraction_train``; a method key
``<prefix>-<rest>`` is ``settings.<method>.<rest>`` with ``-`` as ``_`` (:func:`attribute_path`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from headway.core.aggregate import AGGREGATIONS
from headway.core.fairness import protected_problem
from headway.core.methods import (
    ALGORITHMS,
    METHODS,
    FedBABUSettings,
    FedDBESettings,
    FedLogSettings,
    FedPerSettings,
    FedPFTSettings,
    FedProfSettings,
    FedProtoSettings,
    FedProxSettings,
    FedRepSettings,
    LGFedAvgSettings,
    method_keys,
)
from headway.core.schema import Key, field_name, fraction, key_name, keys_of, non_negative, positive, setting

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
    "inflated-stats",
)


# Bounds checked before anything starts (and without allocating anything):
MAX_SEED = (
    2**32 - 1
)  # numpy's RandomState / np.random.seed and sklearn's random_state take 0..2**32-1; torch.manual_seed and default_rng take more
MAX_IMAGE_SIZE = 1024  # image-size: 1024² x 3 B = 3 MiB an image; 8000 had Ray's workers killed for memory, 60000 overflowed
MAX_FEATURE_DIM = 16384  # 12x the widest body here (EfficientNet-Lite0, 1280); a FedLog reply is classes x (m+1) floats

LOCAL = "local"  # dataset value: every SuperNode reads its own data (node config 'data')
BUILTIN_TRAIN_FRACTION = 0.05  # train-fraction=0 on a built-in data set: FedLog's Table 1 subset (5 % of MNIST), not a user's data
AUTO_BODY = "auto"  # body value: the body that fits the data's input shape (headway.core.models.auto_body), fixed once the shape is known
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


@dataclass(frozen=True)
class CommonSettings:
    """The run-config keys every method reads, one field each (key ``fraction-train``: field ``fraction_train``)."""

    # what runs
    algorithm: str = setting(Key("fedlog", "federated method", choices=ALGORITHMS))
    dataset: str = setting(
        Key(
            "mnist",
            "data set: a built-in name, a path to your own data (image folders, a CSV/Parquet table, an .npz, a saved "
            "Hugging Face dataset; docs/your-data.md), or 'local': in a deployment every SuperNode reads its own (--node-config data=PATH)",
            check=lambda v: dataset_kind(v) is not None,
            rule=f"a built-in name ({', '.join(DATASETS)}), a path (containing '/', or ending in .csv, .parquet or .npz), or 'local'",
        )
    )
    data_dir: str = setting(Key("", "data directory of the built-in data sets; empty: $HEADWAY_DATA_DIR, else the user cache"))
    # your own data (docs/your-data.md): how a path source, or every node's own source (dataset=local), is read
    classes: str = setting(
        Key(
            "",
            "comma list of the run's class names, in index order; empty: the sorted union of the names the data holds "
            "(every node's, with dataset=local)",
        )
    )
    label_column: str = setting(Key("label", "the label column of a table or Hugging Face dataset"))
    image_size: int = setting(
        Key(
            0,
            "side in pixels every image is resized to; 0: the images' own, where all share one",
            check=lambda v: 0 <= v <= MAX_IMAGE_SIZE,
            rule=f"in [0, {MAX_IMAGE_SIZE}] (a decoded image of side S takes S² x 3 bytes in every client's memory, per image)",
        )
    )
    channels: int = setting(
        Key(
            0,
            "image channels (1: grayscale, 3: RGB); 0: 1 when every image is grayscale, else 3",
            check=lambda v: v in (0, 1, 3),
            rule="0, 1 or 3",
        )
    )
    test_fraction: float = setting(
        Key(
            0.2,
            "share of a source's rows held out, seeded, as its test split when it has none",
            check=lambda v: 0 < v < 1,
            rule="in (0, 1)",
        )
    )
    server_data: str = setting(
        Key(
            "",
            "dataset=local: a source the server itself holds (its test split scores the global model and LG-FedAvg's new test, "
            "its training rows are FedProf's D^V); empty: the server holds no data",
        )
    )
    num_clients: int = setting(positive("number of clients (partitions)", 50))
    partition: str = setting(Key("pathological", "how data is split over clients", choices=PARTITIONS))
    classes_per_client: int = setting(positive("classes per client (pathological); shards per client (shards)", 2))
    dirichlet_alpha: float = setting(positive("Dirichlet concentration (dirichlet)", 0.5))
    dominant_class_fraction: float = setting(
        Key(
            0.6,
            "share of each client's data from its one dominant class (dominant); dominant classes are dealt evenly over clients",
            check=lambda v: 0 <= v <= 1,
            rule="in [0, 1]",
        )
    )
    client_size_mean: float = setting(
        non_negative(
            "mean of clients' local data sizes, drawn from a normal distribution (iid, dominant); 0: equal shares of the data", 0.0
        )
    )
    client_size_std: float = setting(non_negative("standard deviation of clients' local data sizes (with client-size-mean)", 0.0))
    natural_column: str = setting(Key("", "column that names a client's source (natural); empty: the data set's own"))
    partition_sizes: str = setting(
        Key(
            "",
            "comma list partition-id:train/test of partitions given exactly that many training and test rows, drawn at random "
            "(seeded) before the others split the rest by `partition` (e.g. LG-FedAvg's new device: '100:3000/500'); empty: none",
        )
    )
    protected_columns: str = setting(
        Key(
            "",
            "comma list of a table's protected columns, each 'column' or 'column=level' (P = 1 where it holds that level; default: "
            "uci-adult's White and Male, else the column's most common level): never features, never sent; the client holds them as P "
            "for LG-FedAvg's adversary (lg-adversary-weight)",
            check=lambda v: protected_problem(v) is None,
            rule="a comma list of 'column' or 'column=level', each column once",
        )
    )
    server_holdout: int = setting(
        non_negative(
            "training rows kept from every client before partitioning (FedProf uses fedprof-val-size instead); set it equal to compare a method with FedProf on the same client data",
            0,
        )
    )
    train_fraction: float = setting(
        Key(
            0.0,
            "fraction of the training rows used, drawn (stratified) before partitioning; 0: all the rows of your own data (a path, "
            f"or dataset=local), {BUILTIN_TRAIN_FRACTION:g} of a built-in data set's (FedLog's Table 1 setting). config.json shows the value used",
            check=lambda v: 0 <= v <= 1,
            rule="in (0, 1], or 0 for the data set's default",
        )
    )
    num_server_rounds: int = setting(positive("federated rounds", 100))
    fraction_train: float = setting(fraction("fraction of clients sampled per round", 1.0))
    client_sampling: str = setting(
        Key(
            "uniform",
            "for the methods that honour it (docs/methods.md's table; the others refuse data-ratio): how the round's K clients are drawn. uniform: without replacement, updates weighted by n_k (McMahan et al.); "
            "data-ratio: K draws with replacement with probability n_k/n, each draw weighted equally (scheme I of Li et al. 2020, FedProx's sampling)",
            choices=SAMPLINGS,
        )
    )
    aggregation: str = setting(
        Key(
            "mean",
            "for the methods that average model updates (docs/methods.md's table; the others refuse a rule other than mean): "
            "how the round's accepted model updates are combined, by Flower's own rules. "
            "mean: weighted by n_k; median: coordinate-wise (Yin et al. 2018); trimmed-mean: coordinate-wise, trimmed-mean-beta cut "
            "at each end; krum: the one update nearest its n-f-2 closest (Blanchard et al. 2017); multi-krum: the n_k-weighted mean "
            "of the multi-krum-select best by that score; bulyan: multi-krum keeps n-2f, then each coordinate is the mean of the "
            "n-4f nearest their median (El Mhamdi et al. 2018). f is malicious-clients; docs/trust-and-dp.md says what each tolerates",
            choices=AGGREGATIONS,
        )
    )
    trimmed_mean_beta: float = setting(
        Key(
            0.2,
            "aggregation=trimmed-mean: fraction of a round's replies cut at each end of every coordinate (floor(beta x n) each side); "
            "refused unless a full round cuts at least one, and a round too small to cut one keeps the previous model",
            check=lambda v: 0 <= v < 0.5,
            rule="in [0, 0.5)",
        )
    )
    malicious_clients: int = setting(
        non_negative(
            "aggregation=krum, multi-krum, bulyan: f, the poisoned replies a round is built to withstand; "
            "a round needs n >= 2f+3 valid replies (krum, multi-krum) or n >= 4f+3 (bulyan), else it keeps the previous model",
            1,
        )
    )
    multi_krum_select: int = setting(
        non_negative("aggregation=multi-krum: m, how many of the best-scored replies are averaged (at most n-f of a round's n); 0: n-f", 0)
    )
    min_available_clients: int = setting(non_negative("clients to wait for before sampling; 0: num-clients", 0))
    sample_timeout: float = setting(non_negative("seconds to wait, once before round 1, for min-available-clients to connect", 120.0))
    local_epochs: int = setting(non_negative("local epochs per round", 5))
    batch_size: int = setting(positive("local batch size", 10))
    lr: float = setting(positive("local learning rate", 1e-3))
    lr_decay: float = setting(Key(1.0, "learning rate of round r: lr · lr-decay^(r-1)", check=lambda v: 0 < v <= 1, rule="in (0, 1]"))
    optimizer: str = setting(Key("adam", "local optimizer", choices=OPTIMIZERS))
    body: str = setting(
        Key(
            "auto",
            "body architecture; auto: the one that fits the data (images: mnist-cnn at 28×28, MNIST's, cifar-cnn at 32×32, "
            "image-cnn at other sizes; tables: mlp), recorded in config.json",
        )
    )
    inputs: str = setting(
        Key(
            "raw",
            "what clients train and are scored on: raw (the data set's inputs) or features (the frozen fedpft-extractor's features of them, "
            "at fedpft-resolution, cached in fedpft-cache-dir as FedPFT's are; give body=linear for a linear model on them, or mlp)",
            choices=("raw", "features"),
        )
    )
    feature_dim: int = setting(
        Key(
            0,
            "m, the number of features a body outputs; 0: the body's own width",
            check=lambda v: 0 <= v <= MAX_FEATURE_DIM,
            rule=f"in [0, {MAX_FEATURE_DIM}] (0: the body's own width; the widest body here has 1280 features)",
        )
    )
    body_dropout: float = setting(
        Key(
            0.5,
            "dropout in training of the papers' CNN bodies (mnist-cnn: after conv2 and on the features; cifar-cnn: on the features), as their authors train them; 0: off",
            check=lambda v: 0 <= v < 1,
            rule="in [0, 1)",
        )
    )
    bodies: str = setting(Key("", "comma list of bodies cycled over partition ids; empty: every client runs `body`"))
    body_init: str = setting(
        Key(
            "shared",
            "initial client models: one seed for all, or a seed per partition id (different initializations)",
            choices=("shared", "per-client"),
        )
    )
    seed: int = setting(
        Key(
            0,
            "seed of partitions, initialization and sampling",
            check=lambda v: 0 <= v <= MAX_SEED,
            rule=f"in [0, 2**32 - 1 = {MAX_SEED}] (what numpy's legacy seeding and sklearn accept; torch and numpy's Generator take these too)",
        )
    )
    target_accuracy: float = setting(Key(0.0, "accuracy for bytes_to_target; 0: none", check=lambda v: 0 <= v <= 1, rule="in [0, 1]"))
    goal_accuracy: float = setting(
        Key(
            0.0,
            "the run stops after the first evaluated round whose accuracy reaches this (summary.json: goal_round), with its final "
            "evaluation; 0: run num-server-rounds",
            check=lambda v: 0 <= v <= 1,
            rule="in [0, 1]",
        )
    )
    device: str = setting(Key("auto", "torch device of clients", choices=DEVICES))
    round_timeout: float = setting(
        positive("deadline in seconds of each exchange of a round; a client that misses it is not waited for again that round", 600.0)
    )
    eval_every: int = setting(
        non_negative("clients score themselves on their test splits every this many rounds and after the last; 0: only after the last", 1)
    )
    client_evaluation: str = setting(
        Key(
            "exchange",
            "how clients report their test scores of the global model: an evaluation exchange after each evaluated round, or "
            "with-next-train: in the next round's train reply, scored before training (one exchange after the last round)",
            choices=("exchange", "with-next-train"),
        )
    )
    # secure aggregation (core/secagg.py; docs/secure-aggregation.md)
    secure_aggregation: str = setting(
        Key(
            "off",
            "secagg+: the server learns only the sum of the clients' replies, never one of them (SecAgg+; sum-shaped methods only)",
            choices=("off", "secagg+"),
        )
    )
    secagg_shares: int = setting(
        non_negative(
            "SecAgg+: clients each one shares its secrets with, itself included (odd; capped at the round's clients); 0: 2*ceil(log2 n)+1",
            0,
        )
    )
    secagg_threshold: float = setting(
        Key(
            0.5,
            "SecAgg+: a secret is rebuilt from more than this fraction of its shares; a round with fewer survivors among a client's "
            "neighbours fails and keeps the previous model",
            check=lambda v: 0.5 <= v < 1,
            rule="in [0.5, 1): a majority of a client's shares, so no two disjoint groups of its neighbours can each rebuild its secrets",
        )
    )
    global_eval: bool = setting(Key(True, "also evaluate a single global model on the whole test set, where one exists"))
    results_dir: str = setting(Key("results", "where `flwr run` writes its results folder"))
    checkpoint_keep: int = setting(
        non_negative(
            "how many round checkpoints to keep in the results folder's checkpoints/ (the newest; one is written after every round); 0: none",
            3,
        )
    )
    resume_dir: str = setting(
        Key(
            "",
            "a results folder whose run this deployment run continues from its last checkpoint, writing into that folder; empty: a new run",
        )
    )
    tensorboard: bool = setting(
        Key(True, "write each round's figures as TensorBoard event files into the results folder (`tensorboard --logdir results/`)")
    )
    mlflow_tracking_uri: str = setting(
        Key(
            "",
            "also log each round's figures to MLflow at this tracking URI (e.g. http://host:5000, sqlite:///results/mlflow.db); empty: "
            "no MLflow. Needs the mlflow extra: pip install -e '.[mlflow]' in headway's checkout",
        )
    )
    client_num_cpus: float = setting(positive("CPUs per virtual client (simulation)", 1.0))
    client_num_gpus: float = setting(non_negative("GPU share per virtual client (simulation)", 0.0))
    ray_address: str = setting(
        Key(
            "",
            "Ray cluster the simulation runs on: host:port of its head (GCS), auto (RAY_ADDRESS, else the `ray start` cluster on this machine) "
            "or empty: a private Ray started for the run (RAY_ADDRESS ignored); see docs/ray-cluster.md",
            check=lambda v: "://" not in v,
            rule="host:port, auto or empty (not a ray:// Ray Client address: run headway on a node of the cluster)",
        )
    )
    # data quality: some clients' training data is corrupted (core/noise.py)
    client_noise: str = setting(
        Key(
            "",
            "comma list kind:fraction of clients whose training data is corrupted: irrelevant, blur, salt-pepper (images), polluted, noisy (tabular)",
        )
    )
    client_transform: str = setting(
        Key(
            "",
            "comma list partition-id:kind of clients whose train and test images are transformed (another domain, e.g. LG-FedAvg's "
            "rotated MNIST: '100:rotate90'); kinds rotate90, rotate180, rotate270 (counter-clockwise), hflip; square images only",
        )
    )
    # new devices joining a running federation (LG-FedAvg Table 3; core/joining.py)
    join_clients: str = setting(
        Key(
            "",
            "comma list of partition ids that take no part (not registered, sampled or evaluated) until round join-round + 1, "
            "then join with their own data and a fresh local model; empty: every client from round 1",
        )
    )
    join_round: int = setting(non_negative("the last round before join-clients join (they take part from round join-round + 1)", 0))
    join_fraction_old: float = setting(
        Key(
            -1.0,
            "after the join each round trains every joined client plus this fraction of the others (0: the joined ones alone); "
            "-1: fraction-train",
            check=lambda v: v == -1 or 0 <= v <= 1,
            rule="in [0, 1], or -1 for fraction-train",
        )
    )
    # robustness testing: chosen clients corrupt their training replies
    fault_clients: str = setting(Key("", "comma list of partition ids whose replies are corrupted (robustness tests)"))
    fault_mode: str = setting(Key("nan", "how faulty clients corrupt replies (see README, Robustness testing)", choices=FAULT_MODES))
    # what a reply may be: bounds the server enforces on every client reply
    min_replies: int = setting(positive("valid replies a round needs at its deadline; fewer and the round keeps the previous model", 1))
    max_update_norm: float = setting(
        positive(
            "model-averaging methods, from round 2: largest ‖w_client − w_global‖ accepted, relative to max(‖w_global‖, 1); "
            "a sign-flipped model is 2; honest clients measured up to 0.95 after round 1 (20,000 examples each; Table 1 setups 0.48) (benchmarks/results/update-norms)",
            1.5,
        )
    )
    max_first_update_norm: float = setting(
        positive(
            "the same bound in round 1, whose updates start from the seeded random model and move furthest "
            "(measured: 1.0 with 1,000 examples a client, 1.55 with 4,000, 2.7 with 20,000): raise it for clients that train that long, "
            "knowing a sign flip (about 2.2 there) then passes round 1",
            1.5,
        )
    )
    max_feature_value: float = setting(
        positive("largest |feature| a reply's feature sums or prototypes may imply (FedLog without clip, FedProto)", 1e4)
    )
    max_client_examples: int = setting(
        non_negative("largest num-examples a reply may claim when the server holds no data to compute partition sizes; 0: 1,000,000", 0)
    )


@dataclass(frozen=True)
class Settings(CommonSettings):
    """A resolved run config as one frozen, typed value: the common keys as fields, and each
    method's own keys under its attribute (its name with '-' as '_'). Every declared method with
    keys has its attribute here (checked at import)."""

    fedprox: FedProxSettings = field(default_factory=FedProxSettings)
    fedlog: FedLogSettings = field(default_factory=FedLogSettings)
    lg_fedavg: LGFedAvgSettings = field(default_factory=LGFedAvgSettings)
    fedper: FedPerSettings = field(default_factory=FedPerSettings)
    fedrep: FedRepSettings = field(default_factory=FedRepSettings)
    fedbabu: FedBABUSettings = field(default_factory=FedBABUSettings)
    feddbe: FedDBESettings = field(default_factory=FedDBESettings)
    fedproto: FedProtoSettings = field(default_factory=FedProtoSettings)
    fedprof: FedProfSettings = field(default_factory=FedProfSettings)
    fedpft: FedPFTSettings = field(default_factory=FedPFTSettings)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Settings:
        """The settings of a resolved run config (headway.core.config.resolve); KeyError naming a schema key it lacks."""
        common = {f.name: cfg[key_name("", f.name)] for f in fields(CommonSettings)}
        own = {
            m.attr: m.settings(**{f.name: cfg[key_name(m.key_prefix, f.name)] for f in fields(m.settings)})
            for m in METHODS.values()
            if m.settings is not None
        }
        return cls(**common, **own)

    def value(self, key: str) -> Any:
        """The value of run-config ``key`` (:func:`attribute_path`), for a key held as data (a method's
        ``holdout_key``); code that names the key reads the attribute. KeyError when no schema key."""
        value: Any = self
        for name in attribute_path(key).split("."):
            value = getattr(value, name)
        return value

    def to_config(self) -> dict[str, Any]:
        """Run-config key -> value, in schema order: what :meth:`from_config` was built from."""
        out = {key_name("", f.name): getattr(self, f.name) for f in fields(CommonSettings)}
        for m in METHODS.values():
            if m.settings is not None:
                own = getattr(self, m.attr)
                out.update({key_name(m.key_prefix, f.name): getattr(own, f.name) for f in fields(m.settings)})
        return out


def _check_method_attributes() -> None:
    """Settings holds one attribute per declared method with keys, of that method's settings class."""
    have = {f.name: f.type for f in fields(Settings) if f.name not in {c.name for c in fields(CommonSettings)}}
    want = {m.attr: m.settings.__name__ for m in METHODS.values() if m.settings is not None}
    if have != want:
        lines = [f"add '{a}: {t} = field(default_factory={t})'" for a, t in want.items() if a not in have]
        lines += [
            f"'{a}' is typed {have[a]}, but its method's settings class is {t}" for a, t in want.items() if a in have and have[a] != t
        ]
        lines += [f"remove '{a}': no declared method with keys has that attribute name" for a in have if a not in want]
        raise RuntimeError("headway.core.settings.Settings must hold one attribute per method with keys: " + "; ".join(lines))


_check_method_attributes()

SCHEMA: dict[str, Key] = {**keys_of(CommonSettings), **method_keys()}


def attribute_path(key: str) -> str:
    """Where run-config ``key`` lives on :class:`Settings`: ``fraction-train`` -> ``fraction_train``, a method key
    ``<prefix>-<rest>`` -> ``<method attr>.<rest>`` ('-' as '_'; ``fedproto-lambda`` -> ``fedproto.lambda_``); KeyError when no schema key."""
    for method in METHODS.values():
        if key in method.keys:
            return f"{method.attr}.{field_name(key.removeprefix(method.key_prefix + '-'))}"
    if key not in SCHEMA:
        raise KeyError(f"{key!r} is no run-config key")
    return field_name(key)
