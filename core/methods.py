"""Every federated method, declared once: its name and summary, its run-config keys (a typed
settings class), the wire names only it uses, where its strategy and its client procedure live,
and its own rules (value combinations it refuses, rows the server holds out, how many clients a
round asks, whether it builds the config's body).

The config schema and the typed settings (core/settings.py), the run-config checks, the
partition's holdout, the generated ``[tool.flwr.app.config]`` block and docs/configuration.md
all read these declarations; ``strategies/registry.py`` and ``client/registry.py`` load the
classes named here. The classes are named relative to their package (``"fedavg:FedAvg"`` is
``headway.strategies.fedavg.FedAvg``) so that ``core`` never imports or names a layer above it. What a
strategy can do (secure sums, robust rules) is read from the strategy class itself
(``strategies/capabilities.py``), never declared here. docs/methods.md says what adding a
method touches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

from headway.core.schema import ConfigError, Key, keys_of, non_negative, positive, setting

if TYPE_CHECKING:  # headway.core.settings builds Settings from these declarations: only the type is needed here
    from headway.core.settings import Settings


def no_rules(cfg: Settings) -> None:
    """A method whose keys combine freely."""


@dataclass(frozen=True)
class Method:
    """One method's declaration."""

    name: str
    summary: str
    strategy: str  # its server strategy: "module:Class" in the strategies package (strategies/registry.py loads it)
    procedure: str  # its client procedure: "module:Class" in headway.client.procedures (client/registry.py loads it)
    settings: type | None = None  # its own keys: a frozen dataclass of headway.core.schema.setting fields, one per key
    prefix: str = ""  # what its keys start with, before a '-'; empty: its name
    records: object | None = None  # a frozen dataclass of the wire names only it uses (payload arrays; phases as phase_*)
    # raises ConfigError naming the key when the resolved config combines its values in a way the method cannot run
    # (checked on the typed settings: headway.core.config.resolve_settings builds them before it checks how values combine)
    validate: Callable[[Settings], None] = no_rules
    holdout_key: str = "server-holdout"  # the key counting the training rows the server keeps from every client
    every_client: bool = False  # a training round asks every client (else a fraction-train sample of them)
    builds_body: bool = True  # clients build the config's body (False: the method brings its own feature map)
    client_sampling: bool = False  # honours the client-sampling key (the others draw their clients their own way)
    # client-evaluation=with-next-train gives the same scores as the evaluation exchange: a client's evaluation of the model a
    # train message brings, before it trains, is the one it would have made in the exchange after the previous round
    scores_with_train: bool = False
    server_combines: str = ""  # what its server does instead of averaging model updates (the aggregation key's refusal says it)
    title: str = ""  # its name in prose (FedPFT, LG-FedAvg); empty: its name
    # other methods' run-config keys its strategy or procedure reads too (its own it always reads): key names, or
    # '<prefix>-*' for a whole group. A method key it does not read, set away from its default, is refused at start
    # (headway.core.config), so this must be true: tests/test_key_scope.py finds every read in the source and holds them equal
    reads: tuple[str, ...] = ()

    @property
    def attr(self) -> str:
        """Its attribute on the typed settings (headway.core.settings.Settings): its name with '-' as '_'."""
        return self.name.replace("-", "_")

    @property
    def key_prefix(self) -> str:
        """What its keys start with (before a '-')."""
        return self.prefix or self.name

    @property
    def keys(self) -> dict[str, Key]:
        """Its own run-config keys, from its settings class: field ``rest`` is key ``<prefix>-rest`` ('_' as '-')."""
        return keys_of(self.settings, self.key_prefix)

    @property
    def display(self) -> str:
        """Its name in prose: its title, else its name."""
        return self.title or self.name

    def record_names(self) -> dict[str, str]:
        """Field -> wire name of the names only it uses (empty: it sends only shared records)."""
        if self.records is None:
            return {}
        return {f.name: getattr(self.records, f.name) for f in fields(self.records)}  # type: ignore[arg-type]

    def holdout(self, cfg: Settings) -> int:
        """Training rows the server keeps for itself before partitioning."""
        return int(cfg.value(self.holdout_key))


# ------------------------------------------------------------------ wire names only one method uses


@dataclass(frozen=True)
class FedLogRecords:
    """FedLog's payload arrays and its statistics round."""

    eta: str = "eta"  # the global head η (server -> client)
    stats: str = "stats"  # a client's sufficient statistic T = Σ φ⊗e_y (client -> server)
    stats_sum: str = "stats-sum"  # FedLog-C: the aggregate Φ (server -> client)
    stats_rows: str = "stats-rows"  # sparse uplink: [class index, row of T] for each class a client holds
    phase_stats: str = "stats"  # fedlog-init=stats: statistics of the untrained bodies


@dataclass(frozen=True)
class LGFedAvgRecords:
    """LG-FedAvg's new test."""

    phase_upload: str = "upload-model"  # a client sends its whole local model once
    class_auc: str = "class-auc"  # metric: ROC AUC of the classifier's class-1 probability on the local test split (2 classes)
    adv_auc: str = "adv-auc"  # metric: ROC AUC of the local adversary r_k reading P from the representation (protected-columns)
    posthoc_adv_auc: str = "posthoc-adv-auc"  # metric: the same for a fresh adversary fitted on the frozen representations


@dataclass(frozen=True)
class FedProfRecords:
    """FedProf's profiles."""

    profile: str = "profile"  # per unit (mean, variance) of the profiled layer (client -> server)
    phase_profile: str = "profile"  # before round 1: every client profiles the initial model, no training


@dataclass(frozen=True)
class FedProtoRecords:
    """FedProto's payload arrays."""

    prototypes: str = "prototypes"
    class_counts: str = "class-counts"


@dataclass(frozen=True)
class FedPFTRecords:
    """FedPFT's payload arrays (core/fedpft.py describes them) and its chain."""

    gmm_classes: str = "gmm-classes"  # int32 (m, 3): label, examples, components of each class sent
    gmm_weights: str = "gmm-weights"
    gmm_means: str = "gmm-means"
    gmm_covariances: str = "gmm-covariances"
    head_weight: str = "head-weight"  # the linear head (server -> client)
    head_bias: str = "head-bias"
    phase_chain: str = "chain"  # decentralized: a client gets the previous client's mixtures, relayed


@dataclass(frozen=True)
class FedDBERecords:
    """FedDBE's mean features."""

    feature_mean: str = "feature-mean"  # a client's mean body feature over its training rows (client -> server)
    global_mean: str = "global-mean"  # the count-weighted mean of those (server -> client), MR's target


FEDLOG_RECORDS = FedLogRecords()
LG_FEDAVG_RECORDS = LGFedAvgRecords()
FEDPROF_RECORDS = FedProfRecords()
FEDPROTO_RECORDS = FedProtoRecords()
FEDPFT_RECORDS = FedPFTRecords()
FEDDBE_RECORDS = FedDBERecords()


# ------------------------------------------------------------------ each method's own keys


@dataclass(frozen=True)
class FedProxSettings:
    """fedprox's own run-config keys (fedprox-*)."""

    mu: float = setting(non_negative("FedProx: proximal term weight mu", 0.01))


@dataclass(frozen=True)
class FedLogSettings:
    """fedlog's own run-config keys (fedlog-*)."""

    prior_nu: float = setting(non_negative("prior strength nu of the conjugate prior", 1.0))
    prior_chi: float = setting(Key(0.0, "prior chi (every entry)"))
    init: str = setting(Key("stats", "first head: one statistics round on untrained bodies, or random", choices=("stats", "random")))
    alpha: float = setting(non_negative("FedLog-C auxiliary loss weight; 0: plain FedLog", 0.0))
    beta: float = setting(
        non_negative(
            "FedLog-C repulsion weight (AAAI Eq. 15): pushes features away from the other classes' global means; "
            "needs fedlog-clip > 0 or beta x (classes - 1) < fedlog-alpha, else the loss has no minimum; 0: off",
            0.0,
        )
    )
    c_downlink: str = setting(
        Key(
            "eta-and-stats",
            "FedLog-C: the server sends the head eta and the statistics Phi, or Phi alone (float32), "
            "from which each client solves the same eta itself (stats: not with fedlog-wire-dtype=float16)",
            choices=("eta-and-stats", "stats"),
        )
    )
    dp: str = setting(
        Key(
            "off",
            "differential privacy of the statistics: local (each client noises its own), central (the server noises the sum), "
            "distributed (each client adds its share of the central noise under secure-aggregation; docs/trust-and-dp.md)",
            choices=("off", "local", "central", "distributed"),
        )
    )
    dp_withholding: int = setting(
        non_negative(
            "fedlog-dp=distributed: how many clients of a round may withhold their noise share (dishonest or broken); "
            "each share is σ/√(min-replies − this), so any accepted sum keeps σ with that many missing; must be < min-replies",
            0,
        )
    )
    epsilon: float = setting(positive("DP epsilon", 1.0))
    delta: float = setting(Key(0.01, "DP delta", check=lambda v: 0 < v < 1, rule="in (0, 1)"))
    clip: float = setting(non_negative("clip body features to [-b, b]; 0: no clip (required > 0 with DP)", 0.0))
    mean_cut: float = setting(
        Key(
            5.0,  # headway.core.fedlog.CLASS_MEAN_NORM_FACTOR (tests/test_attacks.py holds them equal)
            "FedLog: each client's class mean (feature sums / count) is cut to this × an honest reference norm (the median "
            "over the clients of the round), so one lying client cannot inflate the head; honest runs reached 3.3-5.2 x: raise "
            "it where rounds.jsonl's fedlog_mean_norm_ratio often exceeds it; 0: no cut (not applied under fedlog-dp or "
            "secure aggregation)",
            check=lambda v: v == 0 or v >= 1,
            rule="0 (no cut) or >= 1",
        )
    )
    uplink: str = setting(
        Key(
            "dense",
            "FedLog: statistics sent dense (classes × m) or sparse (only the rows of the classes a client holds, with their indices: lossless; not with fedlog-dp=local)",
            choices=("dense", "sparse"),
        )
    )
    wire_dtype: str = setting(
        Key(
            "float32",
            "FedLog: dtype of the head η (and FedLog-C's class means) sent to clients; the server adds and solves in float64",
            choices=("float32", "float16"),
        )
    )
    uplink_dtype: str = setting(
        Key(
            "float32",
            "FedLog: dtype of the statistics sent up; float16 sends each class as [count, feature means] (the same rows in float32 for a client with a class above 2048 examples); the server rebuilds the sums in float64; not with fedlog-dp local or central",
            choices=("float32", "float16"),
        )
    )


def _layer_spec_form(value: str) -> bool:
    """lg-global-layers' form: a whole number > 0, or patterns none of which is empty (checked against the body in the strategy)."""
    text = str(value).strip()
    if text.isdigit():
        return int(text) > 0
    return bool(text) and all(p.strip() for p in text.split(","))


ENSEMBLES = ("logits", "probabilities", "median")  # how the new test combines models (headway.core.training.ensemble_outputs)


@dataclass(frozen=True)
class LGFedAvgSettings:
    """lg-fedavg's own run-config keys (lg-*)."""

    global_layers: str = setting(
        Key(
            "1",
            "LG-FedAvg: the global (averaged) layers: a whole number k is the top k layers (1 or 2 in FedLog's Table 1); "
            "else a comma list of glob patterns over layer names, e.g. 'convs.*' (the paper's two convolutions; docs/methods.md)",
            check=_layer_spec_form,
            rule="a whole number > 0 or a comma list of layer-name patterns",
        )
    )
    warmup_rounds: int = setting(non_negative("LG-FedAvg: first rounds run as FedAvg on the whole model before bodies go local", 0))
    warmup_goal: float = setting(
        Key(
            0.0,
            "LG-FedAvg: the warm-up (FedAvg on whole models) ends after the first evaluated round whose accuracy reaches this "
            "(lg-warmup-rounds > 0 caps it); 0: lg-warmup-rounds alone",
            check=lambda v: 0 <= v <= 1,
            rule="in [0, 1]",
        )
    )
    rounds: int = setting(non_negative("LG-FedAvg: the run ends this many rounds after the warm-up ended; 0: at num-server-rounds", 0))
    new_test: bool = setting(
        Key(
            True,
            "LG-FedAvg: after the last round clients upload their models once and the server scores their logit ensemble on the whole test set",
        )
    )
    ensemble: str = setting(
        Key(
            "logits",
            "LG-FedAvg and local-only: how the new test combines the uploaded models' outputs. logits: their mean (the paper's; one client "
            "with extreme logits decides every prediction); probabilities: the mean softmax (one client moves a class by at most 1/K); "
            "median: coordinate-wise, which no minority of clients can move arbitrarily",
            choices=ENSEMBLES,
        )
    )
    adversary_weight: float = setting(
        non_negative(
            "LG-FedAvg: λ of Eq. 6: each client's model minimises its task loss minus λ times the loss of a local adversary that reads "
            "protected-columns from the body's output (trained alternately, never sent); 0: the adversary is trained and scored but not fought",
            0.0,
        )
    )
    adversary_steps: int = setting(
        positive(
            "LG-FedAvg: adversary steps on each batch's detached representation before the model's step on it (Louppe et al. keep the "
            "adversary near its optimum; the authors run a whole epoch of adversary steps per classifier step)",
            5,
        )
    )
    aux_model: bool = setting(
        Key(
            False,
            "LG-FedAvg §3 Eqs 1-3: each client also trains a local auxiliary head a_k on the body's output and minimises "
            "L_f(a_k) + lg-aux-weight · L_g (the global model's loss); the aux head stays local",
        )
    )
    aux_weight: float = setting(
        non_negative("LG-FedAvg: λ of Eq. 3, the global loss's weight beside the local auxiliary loss (lg-aux-model)", 1.0)
    )


@dataclass(frozen=True)
class FedPerSettings:
    """fedper's own run-config keys (fedper-*)."""

    local_layers: int = setting(positive("FedPer: top layers kept local; the rest are averaged", 2))


@dataclass(frozen=True)
class FedRepSettings:
    """fedrep's own run-config keys (fedrep-*)."""

    local_layers: int = setting(positive("FedRep: top layers kept local (the head); the rest are averaged", 1))
    head_epochs: int = setting(non_negative("FedRep: epochs training the local head (body fixed) before the body epochs", 10))


@dataclass(frozen=True)
class FedBABUSettings:
    """fedbabu's own run-config keys (fedbabu-*)."""

    finetune_epochs: int = setting(
        non_negative(
            "FedBABU: epochs each client fine-tunes on its training rows before it scores (the fine-tuned model is "
            "used for that score only); 0: score the global body on the fixed head",
            5,
        )
    )
    finetune_part: str = setting(
        Key(
            "full",
            "FedBABU: what fine-tuning trains: the whole model, the head only or the body only",
            choices=("full", "head", "body"),
        )
    )


@dataclass(frozen=True)
class FedDBESettings:
    """feddbe's own run-config keys (feddbe-*)."""

    kappa: float = setting(
        non_negative(
            "FedDBE: weight κ of the mean regularization ½·mean((local mean feature − global mean feature)²); "
            "1: the best of 0, 1 and 50 on FedLog's MNIST Table 1 setup (FedLog's paper grid-searches its baselines); "
            "50: the authors' run script for their 4-layer CNN; 0: no pull (the bias vector still trains)",
            1.0,
        )
    )
    momentum: float = setting(
        Key(
            1.0,
            "FedDBE: μ of the local running mean (1 − μ)·previous + μ·batch mean that MR regularizes, reset every round; "
            "1: the batch's own mean (the authors' run script; their library's default is 0.1)",
            check=lambda v: 0 < v <= 1,
            rule="in (0, 1]",
        )
    )
    global_mean: str = setting(
        Key(
            "first-round",
            "FedDBE: when clients send their mean feature for the server's global mean: first-round (the authors' "
            "initialization: once, then fixed) or every-round (the global mean follows the bodies)",
            choices=("first-round", "every-round"),
        )
    )


@dataclass(frozen=True)
class FedProtoSettings:
    """fedproto's own run-config keys (fedproto-*)."""

    lambda_: float = setting(non_negative("FedProto: weight of the pull of features towards the global prototypes", 1.0))
    predict: str = setting(
        Key(
            "head",
            "FedProto: the accuracy reported first: local head, or nearest global prototype (both are recorded)",
            choices=("head", "prototype"),
        )
    )


@dataclass(frozen=True)
class FedProfSettings:
    """fedprof's own run-config keys (fedprof-*)."""

    layer: str = setting(
        Key(
            "body",
            "FedProf: the module whose outputs are profiled (a name from the model's named_modules; body: the feature layer, "
            "after its ReLU; pre-activation: the body's last Linear or convolution, before its activation)",
        )
    )
    alpha: float = setting(non_negative("FedProf: penalty alpha of the score exp(-alpha * div); 0: uniform selection", 10.0))
    val_size: int = setting(
        positive(
            "FedProf: training rows the server holds out (never given to a client); its validation set D^V for baseline profiles is a private random half of them",
            1000,
        )
    )
    aggregation: str = setting(
        Key(
            "partial",
            "FedProf: partial (scheme II of Li et al. 2020: the selected clients' models, the mean for equal sizes), full "
            "(unselected clients count with the previous global model) or full-cache (unselected clients count with their "
            "last local model, which the server keeps)",
            choices=("full", "full-cache", "partial"),
        )
    )


@dataclass(frozen=True)
class FedPFTSettings:
    """fedpft's own run-config keys (fedpft-*)."""

    extractor: str = setting(
        Key(
            "efficientnet-lite0",
            "FedPFT: frozen pretrained feature extractor shared by all clients (identity: the raw input)",
            choices=("efficientnet-lite0", "resnet18", "resnet50", "vit_b_16", "identity"),
        )
    )
    extractor_weights: str = setting(
        Key(
            "",
            "FedPFT: state-dict file of the extractor's weights; empty: the packaged (efficientnet-lite0) or downloaded (torchvision) ones",
        )
    )
    resolution: int = setting(
        non_negative("FedPFT: side in pixels images are resized to before extraction; 0: the extractor's own (224)", 0)
    )
    cache_dir: str = setting(Key("", "FedPFT: feature cache folder; empty: $HEADWAY_CACHE_DIR/features or the user cache; none: no cache"))
    components: int = setting(positive("FedPFT: K, Gaussian components per class (a class with n < 2K examples gets max(1, n // 2))", 1))
    covariance: str = setting(Key("spherical", "FedPFT: covariance family of the mixtures", choices=("spherical", "diag", "full")))
    min_class_examples: int = setting(
        positive("FedPFT: classes with fewer local examples are not sent (a 1-example mixture would be the raw feature)", 2)
    )
    em_init: str = setting(Key("kmeans", "FedPFT: EM initialization", choices=("kmeans", "k-means++", "random")))
    em_tol: float = setting(positive("FedPFT: EM stops when a class's mean log-likelihood changes less than this", 1e-3))
    em_max_iter: int = setting(positive("FedPFT: EM iterations at most", 100))
    em_restarts: int = setting(
        Key(
            3,  # headway.core.gmm.RESTARTS (tests/test_fedpft_em_restarts.py holds them equal; headway.core.gmm would import torch here)
            "FedPFT: EM starts each class mixture with K > 1 is fitted from (each drawn as fedpft-em-init says), the likeliest "
            "kept, as scikit-learn's n_init; 1: a single start, about a third of the EM time; each start holds another copy "
            "of the class's points in memory, hence the cap",
            check=lambda v: 1 <= v <= 10,
            rule="in 1..10 (1: a single start; each start holds another copy of a class's points)",
        )
    )
    reg_covar: float = setting(positive("FedPFT: added to every variance in EM", 1e-6))
    topology: str = setting(
        Key(
            "centralized",
            "FedPFT: centralized (the server trains the head) or chain (clients pass mixtures along partition ids, relayed by the server)",
            choices=("centralized", "chain"),
        )
    )
    dp: str = setting(Key("off", "FedPFT: DP-FedPFT (Theorem 4.1; K = 1, features scaled to the unit sphere)", choices=("off", "on")))
    epsilon: float = setting(positive("FedPFT: DP epsilon per class", 1.0))
    delta: float = setting(Key(0.0, "FedPFT: DP delta per class; 0: 1/n of each class", check=lambda v: 0 <= v < 1, rule="in [0, 1)"))
    max_synthetic: int = setting(
        positive(
            "FedPFT: most synthetic features drawn at once (server, or a chain client); larger claimed counts are scaled down proportionally",
            500_000,
        )
    )
    head_optimizer: str = setting(
        Key(
            "adamw",
            "FedPFT: optimizer of the head (adamw: the authors' Flower baseline; adam: the paper)",
            choices=("adamw", "adam"),
        )
    )
    head_lr: float = setting(positive("FedPFT: learning rate of the head", 1e-4))
    head_epochs: int = setting(positive("FedPFT: epochs of head training", 50))
    head_batch_size: int = setting(positive("FedPFT: batch size of head training", 32))


# ------------------------------------------------------------------ each method's own rules


def _fedlog_rules(cfg: Settings) -> None:
    """fedlog-dp needs fedlog-clip > 0; fedlog-dp=local needs fedlog-uplink=dense; any fedlog-dp needs fedlog-uplink-dtype=float32;
    a non-default fedlog-c-downlink needs FedLog-C (fedlog-alpha or fedlog-beta > 0)."""
    if cfg.fedlog.dp != "off" and cfg.fedlog.clip <= 0:
        raise ConfigError(
            f"run-config key 'fedlog-clip' must be > 0 when 'fedlog-dp' is {cfg.fedlog.dp!r}: the noise scale needs a bound on the features"
        )
    if cfg.fedlog.dp == "local" and cfg.fedlog.uplink == "sparse":
        raise ConfigError(
            "run-config key 'fedlog-uplink' must be 'dense' with fedlog-dp='local': the noise must cover every row, "
            "and leaving out the rows of absent classes would release which classes a client holds"
        )
    if cfg.fedlog.dp != "off" and cfg.fedlog.uplink_dtype == "float16":
        raise ConfigError(
            f"run-config key 'fedlog-uplink-dtype' must be 'float32' with fedlog-dp={cfg.fedlog.dp!r}: float16 sends "
            "class means, the server rebuilds sums as count x mean, so rounding grows with the count and one example "
            "can move a sum by more than the clip b the noise is calibrated to (and under local DP the counts are noised)"
        )
    if cfg.fedlog.c_downlink == "stats" and cfg.fedlog.wire_dtype == "float16":
        raise ConfigError(
            "run-config key 'fedlog-c-downlink' is 'stats', which sends Phi as float32 sums (clients solve eta from them): "
            "set fedlog-wire-dtype=float32 or fedlog-c-downlink=eta-and-stats"
        )
    _fedlog_c_downlink_rule(cfg)
    _fedlog_withholding_rule(cfg)
    _fedlog_secure_rules(cfg)


def _fedlog_c_downlink_rule(cfg: Settings) -> None:
    """fedlog-c-downlink is read by FedLog-C only (fedlog-alpha or fedlog-beta > 0): plain FedLog sends no Φ down."""
    default = FedLogSettings().c_downlink
    if cfg.fedlog.c_downlink != default and cfg.fedlog.alpha <= 0 and cfg.fedlog.beta <= 0:
        raise ConfigError(
            f"run-config key 'fedlog-c-downlink' is {cfg.fedlog.c_downlink!r}, but plain FedLog (fedlog-alpha = fedlog-beta = 0) "
            f"sends no statistics Phi down and would ignore it (only FedLog-C does: fedlog-alpha > 0): leave it {default!r}"
        )


def _fedlog_withholding_rule(cfg: Settings) -> None:
    """fedlog-dp-withholding applies to distributed DP only and must leave one noising client in a sum of min-replies."""
    w = cfg.fedlog.dp_withholding
    if w and cfg.fedlog.dp != "distributed":
        raise ConfigError(
            f"run-config key 'fedlog-dp-withholding' is {w}, but fedlog-dp is {cfg.fedlog.dp!r}: only distributed DP has clients' noise shares; leave it 0"
        )
    if w >= cfg.min_replies and cfg.fedlog.dp == "distributed":
        raise ConfigError(
            f"run-config key 'fedlog-dp-withholding' is {w}, but must be below min-replies={cfg.min_replies}: at least one client of the smallest accepted sum must add noise"
        )


def _fedlog_secure_rules(cfg: Settings) -> None:
    """Under secure-aggregation the statistics are summed in fixed point: bounded (fedlog-clip > 0), dense float32, not locally noised."""
    if cfg.secure_aggregation == "off":
        if cfg.fedlog.dp == "distributed":
            raise ConfigError(
                "run-config key 'fedlog-dp' is 'distributed', which needs secure-aggregation='secagg+': each client's share of the "
                "noise is too small to protect its statistics alone, so the server must see only their sum"
            )
        return
    if cfg.fedlog.clip <= 0:
        raise ConfigError(
            "run-config key 'fedlog-clip' must be > 0 with secure-aggregation: the fixed-point sum needs a bound on every feature to rule out overflow"
        )
    if cfg.fedlog.uplink != "dense" or cfg.fedlog.uplink_dtype != "float32":
        raise ConfigError(
            "run-config keys 'fedlog-uplink' and 'fedlog-uplink-dtype' must be 'dense' and 'float32' with secure-aggregation: "
            "every client adds the same classes x m sums"
        )
    if cfg.fedlog.dp == "local":
        raise ConfigError(
            "run-config key 'fedlog-dp' cannot be 'local' with secure-aggregation: the server already sees only the sum; "
            "use 'central' (the server noises the sum) or 'distributed' (the clients do)"
        )
    from headway.core.secagg import SecAggError, fraction_bits  # local import: the cryptography libraries only when asked for

    most = cfg.num_clients * (cfg.max_client_examples or 1_000_000)  # every client at the reply cap (the round checks its real bound)
    try:
        fraction_bits(most * max(cfg.fedlog.clip, 1.0))
    except SecAggError as exc:
        raise ConfigError(f"run-config key 'fedlog-clip' is {cfg.fedlog.clip:g} with secure-aggregation: {exc}") from None


def _lg_fedavg_rules(cfg: Settings) -> None:
    """Under secure-aggregation no client may send its whole model: lg-new-test must be off. An adversary needs protected columns."""
    if cfg.lg_fedavg.adversary_weight > 0 and not cfg.protected_columns:
        raise ConfigError(
            f"run-config key 'lg-adversary-weight' is {cfg.lg_fedavg.adversary_weight:g}, but 'protected-columns' is empty: "
            'name the columns the adversary must not read (e.g. protected-columns = "race,sex" on uci-adult)'
        )
    if cfg.secure_aggregation != "off" and cfg.lg_fedavg.new_test:
        raise ConfigError(
            "run-config key 'lg-new-test' must be false with secure-aggregation: the new test has every client upload its "
            "whole model, which the server would then hold one by one"
        )


def _local_only_rules(cfg: Settings) -> None:
    """Nothing is summed: secure-aggregation has no sum to hide."""
    if cfg.secure_aggregation != "off":
        raise ConfigError(
            f"run-config key 'secure-aggregation' is {cfg.secure_aggregation!r}, but local-only sends no arrays to sum: leave it 'off'"
        )


def _fedprof_rules(cfg: Settings) -> None:
    """dataset=local needs server-data: the server's training rows are the validation set D^V."""
    if cfg.dataset == "local" and not cfg.server_data:
        raise ConfigError(
            "run-config key 'server-data' is empty, but fedprof with dataset='local' needs a validation set D^V on the server: "
            "set server-data to a source the server holds (its training rows become D^V)"
        )


def _fedpft_rules(cfg: Settings) -> None:
    """inputs must stay raw: FedPFT always works on its extractor's features."""
    if cfg.inputs == "features":
        raise ConfigError("run-config key 'inputs' is 'features', but fedpft always works on its extractor's features: leave inputs 'raw'")


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "fedavg",
            "whole-model averaging weighted by n_k (McMahan et al. 2017)",
            strategy="fedavg:FedAvg",
            procedure="fedavg:FedAvgClient",
            title="FedAvg",
            client_sampling=True,
            scores_with_train=True,
        ),
        Method(
            "fedprox",
            "FedAvg with the proximal term (mu/2)|w - w_global|^2 (Li et al. 2020)",
            strategy="fedprox:FedProx",
            procedure="fedavg:FedProxClient",
            title="FedProx",
            settings=FedProxSettings,
            client_sampling=True,
            scores_with_train=True,
        ),
        Method(
            "fedlog",
            "per-class feature sums and the exact MAP head of Eq. 12 (FedLog, FedLog-C, DP-FedLog)",
            strategy="fedlog:FedLog",
            procedure="fedlog:FedLogClient",
            title="FedLog",
            settings=FedLogSettings,
            records=FEDLOG_RECORDS,
            validate=_fedlog_rules,
            scores_with_train=True,
            server_combines="adds per-class feature statistics and solves for the head, with no model update to average",
        ),
        Method(
            "lg-fedavg",
            "local bodies, averaged top layers (Liang et al. 2020, Alg. 1)",
            strategy="lg_fedavg:LGFedAvg",
            procedure="lg_fedavg:LGFedAvgClient",
            title="LG-FedAvg",
            settings=LGFedAvgSettings,
            prefix="lg",
            records=LG_FEDAVG_RECORDS,
            validate=_lg_fedavg_rules,
        ),
        Method(
            "local-only",
            "every client trains its whole model alone, nothing averaged or sent but config (LG-FedAvg's Table 1 baseline)",
            strategy="local_only:LocalOnly",
            procedure="local_only:LocalOnlyClient",
            reads=("lg-ensemble",),  # its new test combines the uploaded models as lg-ensemble says
            validate=_local_only_rules,
            server_combines="averages nothing: every model stays on its client",
        ),
        Method(
            "fedper",
            "averaged bodies, local top layers (Arivazhagan et al. 2019)",
            strategy="fedper:FedPer",
            procedure="layer_sharing:SharedLayersClient",
            title="FedPer",
            settings=FedPerSettings,
        ),
        Method(
            "fedrep",
            "averaged body, local head fitted first (Collins et al. 2021)",
            strategy="fedrep:FedRep",
            procedure="fedrep:FedRepClient",
            title="FedRep",
            settings=FedRepSettings,
        ),
        Method(
            "fedbabu",
            "averaged bodies on a fixed random head, fine-tuned on each client before it scores (Oh et al. 2022)",
            strategy="fedbabu:FedBABU",
            procedure="fedbabu:FedBABUClient",
            title="FedBABU",
            settings=FedBABUSettings,
        ),
        Method(
            "feddbe",
            "averaged bodies and heads, a local bias vector on the features and a pull to the global mean feature (Zhang et al. 2023)",
            strategy="feddbe:FedDBE",
            procedure="feddbe:FedDBEClient",
            title="FedDBE",
            settings=FedDBESettings,
            records=FEDDBE_RECORDS,
        ),
        Method(
            "fedproto",
            "per-class mean features averaged by class counts (Tan et al. 2022)",
            strategy="fedproto:FedProto",
            procedure="fedproto:FedProtoClient",
            title="FedProto",
            settings=FedProtoSettings,
            records=FEDPROTO_RECORDS,
            server_combines="averages per-class prototypes by class counts while models stay local",
        ),
        Method(
            "fedprof",
            "FedAvg with clients sampled by exp(-alpha * KL) of their representation profiles (Wu et al. 2023)",
            strategy="fedprof:FedProf",
            procedure="fedprof:FedProfClient",
            title="FedProf",
            settings=FedProfSettings,
            records=FEDPROF_RECORDS,
            validate=_fedprof_rules,
            holdout_key="fedprof-val-size",
            server_combines=(
                "scores each client by its own profile; its full rules average every client's model, sampled this round or not "
                "(fedprof-aggregation), not the round's replies alone"
            ),
        ),
        Method(
            "fedpft",
            "per-class Gaussian mixtures of frozen-extractor features; the server trains a head on samples of them, one shot (Beitollahi et al. 2024)",
            strategy="fedpft:FedPFT",
            procedure="fedpft:FedPFTClient",
            title="FedPFT",
            settings=FedPFTSettings,
            records=FEDPFT_RECORDS,
            validate=_fedpft_rules,
            every_client=True,
            server_combines="trains a head once on samples of the clients' Gaussian mixtures, with no average to replace",
            builds_body=False,
        ),
    )
}

ALGORITHMS: tuple[str, ...] = tuple(METHODS)


def method_keys() -> dict[str, Key]:
    """Every method's own run-config keys, in declaration order; RuntimeError naming a key two
    methods declare, or one whose name does not start with its method's prefix."""
    out: dict[str, Key] = {}
    for method in METHODS.values():
        for name, key in method.keys.items():
            if name in out:
                raise RuntimeError(f"run-config key {name!r} is declared by two methods")
            out[name] = key
    return out


# FedPFT's extractor keys, which every method reads with inputs=features: its clients and server then train on the frozen
# extractor's features (core/extractors.py), as FedPFT's do
FEATURE_KEYS: tuple[str, ...] = ("fedpft-extractor", "fedpft-extractor-weights", "fedpft-resolution", "fedpft-cache-dir")


def key_owner(key: str) -> Method | None:
    """The method whose own key ``key`` is (it declares it in its settings class); None for a general key."""
    return next((m for m in METHODS.values() if key in m.keys), None)


def _named(pattern: str, key: str) -> bool:
    """Whether a ``reads`` entry names ``key``: the key itself, or ``<prefix>-*`` for every key of that group."""
    return key == pattern or (pattern.endswith("-*") and key.startswith(pattern[:-1]))


def reads(method: Method, key: str, inputs: str = "raw") -> bool:
    """Whether a run of ``method`` reads method key ``key``: its own keys, those its declaration ``reads``, and
    :data:`FEATURE_KEYS` with ``inputs=features``."""
    if key in method.keys or any(_named(p, key) for p in method.reads):
        return True
    return inputs == "features" and key in FEATURE_KEYS


def readers(key: str) -> list[str]:
    """The algorithms that read method key ``key`` whatever ``inputs`` is: its owner, then those that declare it in ``reads``."""
    return [m.name for m in METHODS.values() if reads(m, key)]


def keys_not_read(algorithm: str, names: Iterable[str], inputs: str = "raw") -> list[str]:
    """Of run-config keys ``names``, the method keys a run of ``algorithm`` with ``inputs`` does not read (none when
    ``algorithm`` is no method: resolving the config names that value)."""
    method = METHODS.get(algorithm)
    return [] if method is None else [k for k in names if key_owner(k) is not None and not reads(method, k, inputs)]


def unread_problem(key: str, value: object, algorithm: str, inputs: str = "raw") -> str | None:
    """One line saying that method key ``key``, set to ``value``, is one a run of ``algorithm`` does not read (with
    ``inputs``): whose key it is and what would read it; None when it does read it (or ``key`` is a general key)."""
    owner = key_owner(key)
    if owner is None or reads(METHODS[algorithm], key, inputs):
        return None
    users = readers(key)
    fixes = [f"set algorithm={' or '.join(users)}"]
    if key in FEATURE_KEYS:
        fixes.insert(0, "set inputs=features (every method then reads it)")
    return (
        f"run-config key '{key}' is {value!r}, but it is {owner.display}'s ({owner.key_prefix}-*) and algorithm={algorithm} "
        f"does not read it{' with inputs=raw' if key in FEATURE_KEYS else ''}: remove it, or {', or '.join(fixes)}"
    )


def class_path(path: str) -> tuple[str, str]:
    """A declaration's ``"module:Class"`` as (module, class); ValueError when it is not of that form."""
    module, sep, name = path.partition(":")
    if not (sep and module.replace(".", "_").isidentifier() and name.isidentifier()):
        raise ValueError(f"{path!r} is not 'module:Class'")
    return module, name
