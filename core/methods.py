"""Every federated method, declared once: its name, a one-line summary, its run-config keys,
and its own rules (value combinations it refuses, rows the server holds out, how many clients
a round asks, whether it builds the config's body).

The config schema, the run-config checks, the partition's holdout, the generated
``[tool.flwr.app.config]`` block and docs/configuration.md all read these declarations.
Nothing here names the strategy or the client procedure: each registers itself under the
method's name in its own package (``strategies/registry.py``, ``client/registry.py``), so
``core`` never refers to either side. Adding a method means one entry here, its strategy
module, its client procedure, and their tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from core.schema import ConfigError, Key, non_negative, positive


def no_rules(cfg: Mapping[str, Any]) -> None:
    """A method whose keys combine freely."""


@dataclass(frozen=True)
class Method:
    """One method's declaration."""

    name: str
    summary: str
    keys: dict[str, Key] = field(default_factory=dict)
    # raises ConfigError naming the key when the resolved config combines its values in a way the method cannot run
    validate: Callable[[Mapping[str, Any]], None] = no_rules
    holdout_key: str = "server-holdout"  # the key counting the training rows the server keeps from every client
    every_client: bool = False  # a training round asks every client (else a fraction-train sample of them)
    builds_body: bool = True  # clients build the config's body (False: the method brings its own feature map)
    client_sampling: bool = False  # honours the client-sampling key (the others draw their clients their own way)
    # client-evaluation=with-next-train gives the same scores as the evaluation exchange: a client's evaluation of the model a
    # train message brings, before it trains, is the one it would have made in the exchange after the previous round
    scores_with_train: bool = False
    # honours the aggregation key: its server averages the round's model updates, the step a robust rule replaces
    robust_aggregation: bool = False
    server_combines: str = ""  # what its server does instead (the aggregation key's refusal says it)
    # secure-aggregation=secagg+: the server needs only the sum of the training replies (core/secagg.py)
    secure_sum: bool = False

    def holdout(self, cfg: Mapping[str, Any]) -> int:
        """Training rows the server keeps for itself before partitioning."""
        return int(cfg[self.holdout_key])


def _fedlog_rules(cfg: Mapping[str, Any]) -> None:
    """fedlog-dp needs fedlog-clip > 0; fedlog-dp=local needs fedlog-uplink=dense; any fedlog-dp needs fedlog-uplink-dtype=float32."""
    if cfg["fedlog-dp"] != "off" and cfg["fedlog-clip"] <= 0:
        raise ConfigError(
            "run-config key 'fedlog-clip' must be > 0 when 'fedlog-dp' is "
            f"{cfg['fedlog-dp']!r}: the noise scale needs a bound on the features"
        )
    if cfg["fedlog-dp"] == "local" and cfg["fedlog-uplink"] == "sparse":
        raise ConfigError(
            "run-config key 'fedlog-uplink' must be 'dense' with fedlog-dp='local': the noise must cover every row, "
            "and leaving out the rows of absent classes would release which classes a client holds"
        )
    if cfg["fedlog-dp"] != "off" and cfg["fedlog-uplink-dtype"] == "float16":
        raise ConfigError(
            f"run-config key 'fedlog-uplink-dtype' must be 'float32' with fedlog-dp={cfg['fedlog-dp']!r}: float16 sends "
            "class means, the server rebuilds sums as count x mean, so rounding grows with the count and one example "
            "can move a sum by more than the clip b the noise is calibrated to (and under local DP the counts are noised)"
        )
    _fedlog_withholding_rule(cfg)
    _fedlog_secure_rules(cfg)


def _fedlog_withholding_rule(cfg: Mapping[str, Any]) -> None:
    """fedlog-dp-withholding applies to distributed DP only and must leave one noising client in a sum of min-replies."""
    w = cfg["fedlog-dp-withholding"]
    if w and cfg["fedlog-dp"] != "distributed":
        raise ConfigError(
            f"run-config key 'fedlog-dp-withholding' is {w}, but fedlog-dp is {cfg['fedlog-dp']!r}: only distributed DP has clients' noise shares; leave it 0"
        )
    if w >= cfg["min-replies"] and cfg["fedlog-dp"] == "distributed":
        raise ConfigError(
            f"run-config key 'fedlog-dp-withholding' is {w}, but must be below min-replies={cfg['min-replies']}: at least one client of the smallest accepted sum must add noise"
        )


def _fedlog_secure_rules(cfg: Mapping[str, Any]) -> None:
    """Under secure-aggregation the statistics are summed in fixed point: bounded (fedlog-clip > 0), dense float32, not locally noised."""
    if cfg["secure-aggregation"] == "off":
        if cfg["fedlog-dp"] == "distributed":
            raise ConfigError(
                "run-config key 'fedlog-dp' is 'distributed', which needs secure-aggregation='secagg+': each client's share of the "
                "noise is too small to protect its statistics alone, so the server must see only their sum"
            )
        return
    if cfg["fedlog-clip"] <= 0:
        raise ConfigError(
            "run-config key 'fedlog-clip' must be > 0 with secure-aggregation: the fixed-point sum needs a bound on every feature to rule out overflow"
        )
    if cfg["fedlog-uplink"] != "dense" or cfg["fedlog-uplink-dtype"] != "float32":
        raise ConfigError(
            "run-config keys 'fedlog-uplink' and 'fedlog-uplink-dtype' must be 'dense' and 'float32' with secure-aggregation: "
            "every client adds the same classes x m sums"
        )
    if cfg["fedlog-dp"] == "local":
        raise ConfigError(
            "run-config key 'fedlog-dp' cannot be 'local' with secure-aggregation: the server already sees only the sum; "
            "use 'central' (the server noises the sum) or 'distributed' (the clients do)"
        )
    from core.secagg import SecAggError, fraction_bits  # local import: the cryptography libraries only when asked for

    most = cfg["num-clients"] * (cfg["max-client-examples"] or 1_000_000)  # every client at the reply cap (the round checks its real bound)
    try:
        fraction_bits(most * max(cfg["fedlog-clip"], 1.0))
    except SecAggError as exc:
        raise ConfigError(f"run-config key 'fedlog-clip' is {cfg['fedlog-clip']:g} with secure-aggregation: {exc}") from None


def _lg_fedavg_rules(cfg: Mapping[str, Any]) -> None:
    """Under secure-aggregation no client may send its whole model: lg-new-test must be off."""
    if cfg["secure-aggregation"] != "off" and cfg["lg-new-test"]:
        raise ConfigError(
            "run-config key 'lg-new-test' must be false with secure-aggregation: the new test has every client upload its "
            "whole model, which the server would then hold one by one"
        )


def _fedprof_rules(cfg: Mapping[str, Any]) -> None:
    """dataset=local needs server-data: the server's training rows are the validation set D^V."""
    if cfg["dataset"] == "local" and not cfg["server-data"]:
        raise ConfigError(
            "run-config key 'server-data' is empty, but fedprof with dataset='local' needs a validation set D^V on the server: "
            "set server-data to a source the server holds (its training rows become D^V)"
        )


def _fedpft_rules(cfg: Mapping[str, Any]) -> None:
    """inputs must stay raw: FedPFT always works on its extractor's features."""
    if cfg["inputs"] == "features":
        raise ConfigError("run-config key 'inputs' is 'features', but fedpft always works on its extractor's features: leave inputs 'raw'")


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "fedavg",
            "whole-model averaging weighted by n_k (McMahan et al. 2017)",
            client_sampling=True,
            scores_with_train=True,
            secure_sum=True,
            robust_aggregation=True,
        ),
        Method(
            "fedprox",
            "FedAvg with the proximal term (mu/2)|w - w_global|^2 (Li et al. 2020)",
            {"fedprox-mu": non_negative("FedProx: proximal term weight mu", 0.01)},
            client_sampling=True,
            scores_with_train=True,
            secure_sum=True,
            robust_aggregation=True,
        ),
        Method(
            "fedlog",
            "per-class feature sums and the exact MAP head of Eq. 12 (FedLog, FedLog-C, DP-FedLog)",
            {
                "fedlog-prior-nu": non_negative("prior strength nu of the conjugate prior", 1.0),
                "fedlog-prior-chi": Key(0.0, "prior chi (every entry)"),
                "fedlog-init": Key("stats", "first head: one statistics round on untrained bodies, or random", choices=("stats", "random")),
                "fedlog-alpha": non_negative("FedLog-C auxiliary loss weight; 0: plain FedLog", 0.0),
                "fedlog-dp": Key(
                    "off",
                    "differential privacy of the statistics: local (each client noises its own), central (the server noises the sum), "
                    "distributed (each client adds its share of the central noise under secure-aggregation; docs/trust-and-dp.md)",
                    choices=("off", "local", "central", "distributed"),
                ),
                "fedlog-dp-withholding": non_negative(
                    "fedlog-dp=distributed: how many clients of a round may withhold their noise share (dishonest or broken); "
                    "each share is σ/√(min-replies − this), so any accepted sum keeps σ with that many missing; must be < min-replies",
                    0,
                ),
                "fedlog-epsilon": positive("DP epsilon", 1.0),
                "fedlog-delta": Key(0.01, "DP delta", check=lambda v: 0 < v < 1, rule="in (0, 1)"),
                "fedlog-clip": non_negative("clip body features to [-b, b]; 0: no clip (required > 0 with DP)", 0.0),
                "fedlog-uplink": Key(
                    "dense",
                    "FedLog: statistics sent dense (classes × m) or sparse (only the rows of the classes a client holds, with their indices: lossless; not with fedlog-dp=local)",
                    choices=("dense", "sparse"),
                ),
                "fedlog-wire-dtype": Key(
                    "float32",
                    "FedLog: dtype of the head η (and FedLog-C's class means) sent to clients; the server adds and solves in float64",
                    choices=("float32", "float16"),
                ),
                "fedlog-uplink-dtype": Key(
                    "float32",
                    "FedLog: dtype of the statistics sent up; float16 sends each class as [count, feature means] (the same rows in float32 for a client with a class above 2048 examples); the server rebuilds the sums in float64; not with fedlog-dp local or central",
                    choices=("float32", "float16"),
                ),
            },
            validate=_fedlog_rules,
            scores_with_train=True,
            server_combines="adds per-class feature statistics and solves for the head, with no model update to average",
            secure_sum=True,
        ),
        Method(
            "lg-fedavg",
            "local bodies, averaged top layers (Liang et al. 2020, Alg. 1)",
            {
                "lg-global-layers": positive("LG-FedAvg: top layers that are global and averaged (1 or 2 in FedLog's Table 1)", 1),
                "lg-warmup-rounds": non_negative("LG-FedAvg: first rounds run as FedAvg on the whole model before bodies go local", 0),
                "lg-new-test": Key(
                    True,
                    "LG-FedAvg: after the last round clients upload their models once and the server scores their logit ensemble on the whole test set",
                ),
            },
            validate=_lg_fedavg_rules,
            robust_aggregation=True,
            secure_sum=True,
        ),
        Method(
            "fedper",
            "averaged bodies, local top layers (Arivazhagan et al. 2019)",
            {"fedper-local-layers": positive("FedPer: top layers kept local; the rest are averaged", 2)},
            robust_aggregation=True,
            secure_sum=True,
        ),
        Method(
            "fedrep",
            "averaged body, local head fitted first (Collins et al. 2021)",
            {
                "fedrep-local-layers": positive("FedRep: top layers kept local (the head); the rest are averaged", 1),
                "fedrep-head-epochs": non_negative("FedRep: epochs training the local head (body fixed) before the body epochs", 10),
            },
            robust_aggregation=True,
            secure_sum=True,
        ),
        Method(
            "fedproto",
            "per-class mean features averaged by class counts (Tan et al. 2022)",
            {
                "fedproto-lambda": non_negative("FedProto: weight of the pull of features towards the global prototypes", 1.0),
                "fedproto-predict": Key(
                    "head",
                    "FedProto: the accuracy reported first: local head, or nearest global prototype (both are recorded)",
                    choices=("head", "prototype"),
                ),
            },
            server_combines="averages per-class prototypes by class counts while models stay local",
            secure_sum=True,
        ),
        Method(
            "fedprof",
            "FedAvg with clients sampled by exp(-alpha * KL) of their representation profiles (Wu et al. 2023)",
            {
                "fedprof-layer": Key(
                    "body",
                    "FedProf: the module whose outputs are profiled (a name from the model's named_modules; body: the feature layer)",
                ),
                "fedprof-alpha": non_negative("FedProf: penalty alpha of the score exp(-alpha * div); 0: uniform selection", 10.0),
                "fedprof-val-size": positive(
                    "FedProf: training rows the server holds out (never given to a client); its validation set D^V for baseline profiles is a private random half of them",
                    1000,
                ),
                "fedprof-aggregation": Key(
                    "full",
                    "FedProf: full (unselected clients count with the previous global model), full-cache (unselected clients count with "
                    "their last local model, which the server keeps) or partial (scheme II of Li et al. 2020)",
                    choices=("full", "full-cache", "partial"),
                ),
            },
            validate=_fedprof_rules,
            holdout_key="fedprof-val-size",
            server_combines="averages every client's model, sampled this round or not (fedprof-aggregation), not the round's replies alone",
        ),
        Method(
            "fedpft",
            "per-class Gaussian mixtures of frozen-extractor features; the server trains a head on samples of them, one shot (Beitollahi et al. 2024)",
            {
                "fedpft-extractor": Key(
                    "efficientnet-lite0",
                    "FedPFT: frozen pretrained feature extractor shared by all clients (identity: the raw input)",
                    choices=("efficientnet-lite0", "resnet18", "resnet50", "vit_b_16", "identity"),
                ),
                "fedpft-extractor-weights": Key(
                    "",
                    "FedPFT: state-dict file of the extractor's weights; empty: the packaged (efficientnet-lite0) or downloaded (torchvision) ones",
                ),
                "fedpft-resolution": non_negative(
                    "FedPFT: side in pixels images are resized to before extraction; 0: the extractor's own (224)", 0
                ),
                "fedpft-cache-dir": Key(
                    "", "FedPFT: feature cache folder; empty: $HEADWAY_CACHE_DIR/features or the user cache; none: no cache"
                ),
                "fedpft-components": positive(
                    "FedPFT: K, Gaussian components per class (a class with n < 2K examples gets max(1, n // 2))", 1
                ),
                "fedpft-covariance": Key("spherical", "FedPFT: covariance family of the mixtures", choices=("spherical", "diag", "full")),
                "fedpft-min-class-examples": positive(
                    "FedPFT: classes with fewer local examples are not sent (a 1-example mixture would be the raw feature)", 2
                ),
                "fedpft-em-init": Key("kmeans", "FedPFT: EM initialization", choices=("kmeans", "k-means++", "random")),
                "fedpft-em-tol": positive("FedPFT: EM stops when a class's mean log-likelihood changes less than this", 1e-3),
                "fedpft-em-max-iter": positive("FedPFT: EM iterations at most", 100),
                "fedpft-reg-covar": positive("FedPFT: added to every variance in EM", 1e-6),
                "fedpft-topology": Key(
                    "centralized",
                    "FedPFT: centralized (the server trains the head) or chain (clients pass mixtures along partition ids, relayed by the server)",
                    choices=("centralized", "chain"),
                ),
                "fedpft-dp": Key(
                    "off", "FedPFT: DP-FedPFT (Theorem 4.1; K = 1, features scaled to the unit sphere)", choices=("off", "on")
                ),
                "fedpft-epsilon": positive("FedPFT: DP epsilon per class", 1.0),
                "fedpft-delta": Key(0.0, "FedPFT: DP delta per class; 0: 1/n of each class", check=lambda v: 0 <= v < 1, rule="in [0, 1)"),
                "fedpft-max-synthetic": positive(
                    "FedPFT: most synthetic features drawn at once (server, or a chain client); larger claimed counts are scaled down proportionally",
                    500_000,
                ),
                "fedpft-head-optimizer": Key(
                    "adamw",
                    "FedPFT: optimizer of the head (adamw: the authors' Flower baseline; adam: the paper)",
                    choices=("adamw", "adam"),
                ),
                "fedpft-head-lr": positive("FedPFT: learning rate of the head", 1e-4),
                "fedpft-head-epochs": positive("FedPFT: epochs of head training", 50),
                "fedpft-head-batch-size": positive("FedPFT: batch size of head training", 32),
            },
            validate=_fedpft_rules,
            every_client=True,
            server_combines="trains a head once on samples of the clients' Gaussian mixtures, with no average to replace",
            builds_body=False,
        ),
    )
}

ALGORITHMS: tuple[str, ...] = tuple(METHODS)


def method_keys() -> dict[str, Key]:
    """Every method's own run-config keys, in declaration order."""
    out: dict[str, Key] = {}
    for method in METHODS.values():
        for name, key in method.keys.items():
            if name in out:
                raise RuntimeError(f"run-config key {name!r} is declared by two methods")
            out[name] = key
    return out


def one_per_method(kind: str, claims: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """Method name -> the one ``kind`` (strategy, client procedure) that claims it, in declaration
    order. RuntimeError naming the names when a declared method has none or several, or a
    claimed name is declared by no method."""
    found: dict[str, list[Any]] = {}
    for name, thing in claims:
        found.setdefault(name, []).append(thing)
    problems = [f"{name!r} has no {kind}" for name in METHODS if name not in found]
    problems += [f"{name!r} has {len(things)} ({', '.join(map(_label, things))})" for name, things in found.items() if len(things) > 1]
    problems += [
        f"{_label(things[0])} claims {name!r}, which core/methods.py does not declare"
        for name, things in found.items()
        if name not in METHODS
    ]
    if problems:
        raise RuntimeError(f"every declared method needs exactly one {kind}: " + "; ".join(problems))
    return {name: found[name][0] for name in METHODS}


def _label(thing: Any) -> str:
    return f"{thing.__module__}.{thing.__qualname__}"
