"""The run-config schema: every key, its default, its allowed values, and validation.

Server and clients both read the Flower run config through :func:`resolve`, so a bad
value fails at start with a message naming the key and what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

ALGORITHMS = ("fedavg", "fedprox", "fedlog", "lg-fedavg", "fedper", "fedrep", "fedproto")
DATASETS = (
    "mnist",
    "fashion-mnist",
    "cifar10",
    "cifar100",
    "uci-adult",
    "uci-gas-turbine",
    "circle",
)
PARTITIONS = ("iid", "pathological", "dirichlet", "natural")
OPTIMIZERS = ("adam", "sgd")
DEVICES = ("auto", "cpu", "cuda")


class ConfigError(ValueError):
    """A run-config key is unknown or has a value outside what it allows."""


@dataclass(frozen=True)
class Key:
    """One run-config key: its default (which fixes its type) and a value check."""

    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    check: Callable[[Any], bool] | None = None
    rule: str = ""


def _positive(v: float) -> bool:
    return v > 0


def _non_negative(v: float) -> bool:
    return v >= 0


def _fraction(v: float) -> bool:
    return 0 < v <= 1


SCHEMA: dict[str, Key] = {
    # what runs
    "algorithm": Key("fedlog", "federated method", choices=ALGORITHMS),
    "dataset": Key("mnist", "data set", choices=DATASETS),
    "data-dir": Key("", "data directory; empty: $HEADWAY_DATA_DIR, else the user cache"),
    "num-clients": Key(50, "number of clients (partitions)", check=_positive, rule="> 0"),
    "partition": Key("pathological", "how data is split over clients", choices=PARTITIONS),
    "classes-per-client": Key(2, "classes per client (pathological)", check=_positive, rule="> 0"),
    "dirichlet-alpha": Key(0.5, "Dirichlet concentration (dirichlet)", check=_positive, rule="> 0"),
    "natural-column": Key("", "column that names a client's source (natural); empty: the data set's own"),
    "train-fraction": Key(0.05, "fraction of the training set used, drawn before partitioning", check=_fraction, rule="in (0, 1]"),
    "num-server-rounds": Key(100, "federated rounds", check=_positive, rule="> 0"),
    "fraction-train": Key(1.0, "fraction of clients sampled per round", check=_fraction, rule="in (0, 1]"),
    "min-available-clients": Key(0, "clients to wait for before sampling; 0: num-clients", check=_non_negative, rule=">= 0"),
    "sample-timeout": Key(120.0, "seconds to wait for min-available-clients before sampling what is there", check=_non_negative, rule=">= 0"),
    "local-epochs": Key(5, "local epochs per round", check=_non_negative, rule=">= 0"),
    "batch-size": Key(10, "local batch size", check=_positive, rule="> 0"),
    "lr": Key(1e-3, "local learning rate", check=_positive, rule="> 0"),
    "optimizer": Key("adam", "local optimizer", choices=OPTIMIZERS),
    "body": Key("mnist-cnn", "default body architecture"),
    "feature-dim": Key(0, "m, the number of features a body outputs; 0: the body's own width", check=_non_negative, rule=">= 0"),
    "bodies": Key("", "comma list of bodies cycled over partition ids; empty: every client runs `body`"),
    "body-init": Key("shared", "initial client models: one seed for all, or a seed per partition id (different initializations)", choices=("shared", "per-client")),
    "seed": Key(0, "seed of partitions, initialization and sampling"),
    "target-accuracy": Key(0.0, "accuracy for bytes_to_target; 0: none", check=lambda v: 0 <= v <= 1, rule="in [0, 1]"),
    "device": Key("auto", "torch device of clients", choices=DEVICES),
    "round-timeout": Key(600.0, "seconds to wait for replies each round", check=_positive, rule="> 0"),
    "global-eval": Key(True, "also evaluate a single global model on the whole test set, where one exists"),
    "results-dir": Key("results", "where `flwr run` writes its results folder"),
    "client-num-cpus": Key(1.0, "CPUs per virtual client (simulation)", check=_positive, rule="> 0"),
    "client-num-gpus": Key(0.0, "GPU share per virtual client (simulation)", check=_non_negative, rule=">= 0"),
    # robustness testing: chosen clients corrupt their training replies
    "fault-clients": Key("", "comma list of partition ids whose training replies are corrupted (robustness tests)"),
    "fault-mode": Key("nan", "how faulty clients corrupt replies", choices=("nan", "wrong-shape", "negative-count", "scaled", "error")),
    # FedLog family
    "fedlog-prior-nu": Key(1.0, "prior strength nu of the conjugate prior", check=_non_negative, rule=">= 0"),
    "fedlog-prior-chi": Key(0.0, "prior chi (every entry)"),
    "fedlog-init": Key("stats", "first head: one statistics round on untrained bodies, or random", choices=("stats", "random")),
    "fedlog-alpha": Key(0.0, "FedLog-C auxiliary loss weight; 0: plain FedLog", check=_non_negative, rule=">= 0"),
    "fedlog-dp": Key("off", "differential privacy of the statistics", choices=("off", "local", "central")),
    "fedlog-epsilon": Key(1.0, "DP epsilon", check=_positive, rule="> 0"),
    "fedlog-delta": Key(0.01, "DP delta", check=lambda v: 0 < v < 1, rule="in (0, 1)"),
    "fedlog-clip": Key(0.0, "clip body features to [-b, b]; 0: no clip (required > 0 with DP)", check=_non_negative, rule=">= 0"),
    # layer-sharing and prototype baselines
    "lg-global-layers": Key(1, "LG-FedAvg: top layers that are global and averaged (1 or 2 in FedLog's Table 1)", check=_positive, rule="> 0"),
    "lg-warmup-rounds": Key(0, "LG-FedAvg: first rounds run as FedAvg on the whole model before bodies go local", check=_non_negative, rule=">= 0"),
    "lg-new-test": Key(True, "LG-FedAvg: after the last round clients upload their models once and the server scores their logit ensemble on the whole test set"),
    "fedper-local-layers": Key(2, "FedPer: top layers kept local; the rest are averaged", check=_positive, rule="> 0"),
    "fedrep-local-layers": Key(1, "FedRep: top layers kept local (the head); the rest are averaged", check=_positive, rule="> 0"),
    "fedrep-head-epochs": Key(10, "FedRep: epochs training the local head (body fixed) before the body epochs", check=_non_negative, rule=">= 0"),
    "fedproto-lambda": Key(1.0, "FedProto: weight of the pull of features towards the global prototypes", check=_non_negative, rule=">= 0"),
    "fedproto-predict": Key("head", "FedProto: the accuracy reported first: local head, or nearest global prototype (both are recorded)", choices=("head", "prototype")),
    "fedprox-mu": Key(0.01, "FedProx: proximal term weight mu", check=_non_negative, rule=">= 0"),
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


def resolve(run_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Return the full run config: defaults overlaid with ``run_config``, checked.

    Raises :class:`ConfigError` naming the key and the allowed values on an unknown
    key or a bad value.
    """
    run_config = dict(run_config or {})
    unknown = sorted(set(run_config) - set(SCHEMA))
    if unknown:
        raise ConfigError(
            f"unknown run-config key(s) {unknown}; known keys: {', '.join(sorted(SCHEMA))}"
        )
    out: dict[str, Any] = {}
    for name, key in SCHEMA.items():
        value = _coerce(name, key, run_config.get(name, key.default))
        if key.choices is not None and value not in key.choices:
            raise ConfigError(
                f"run-config key '{name}' is {value!r}; allowed values: {', '.join(key.choices)}"
            )
        if key.check is not None and not key.check(value):
            raise ConfigError(f"run-config key '{name}' is {value!r}; it must be {key.rule}")
        out[name] = value
    _check_combinations(out)
    return out


def _check_combinations(cfg: Mapping[str, Any]) -> None:
    from core.models import BODIES  # local import: models pulls in torch

    for body in body_names(cfg):
        if body not in BODIES:
            raise ConfigError(
                f"run-config key 'body'/'bodies' names unknown body {body!r}; "
                f"allowed values: {', '.join(sorted(BODIES))}"
            )
    try:
        fault_ids(cfg)
    except ValueError:
        raise ConfigError(f"run-config key 'fault-clients' must be a comma list of partition ids, got {cfg['fault-clients']!r}") from None
    if cfg["fedlog-dp"] != "off" and cfg["fedlog-clip"] <= 0:
        raise ConfigError(
            "run-config key 'fedlog-clip' must be > 0 when 'fedlog-dp' is "
            f"{cfg['fedlog-dp']!r}: the noise scale needs a bound on the features"
        )


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
