"""Validation of the run config against its schema (core/settings.py: every key, its
default, its allowed values) and the checks of how values combine.

Server and clients both read the Flower run config through :func:`resolve`, so a bad
value fails at start with a message naming the key and what is allowed. What needs the
method's strategy class (whether it can aggregate a secure sum, or take a robust rule) is
checked where that class is known, before any client is asked (strategies/registry.py).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from headway.core.aggregate import SELECTING, replies_needed
from headway.core.methods import METHODS, method_keys, reads, unread_problem
from headway.core.schema import ConfigError, Key  # ConfigError: here for callers; the method rules raise it too
from headway.core.settings import (  # the schema and the values it names live with the typed settings; callers import them from here too
    AUTO_BODY,
    BUILTIN_TRAIN_FRACTION,
    LOCAL,
    MAX_FEATURE_DIM,  # noqa: F401
    MAX_SEED,  # noqa: F401
    SCHEMA,
    Settings,
    dataset_kind,
)


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
    """Return the full run config: defaults overlaid with ``run_config``, checked; the
    dict form of :func:`resolve_settings` (config.json, Flower's run config, the simulation's overrides)."""
    return resolve_settings(run_config, import_bodies).to_config()


def resolve_settings(run_config: Mapping[str, Any] | None = None, import_bodies: bool = True) -> Settings:
    """The typed settings of ``run_config``: defaults overlaid with it, checked.

    Raises :class:`ConfigError` naming the key and the allowed values on an unknown
    key or a bad value. ``import_bodies=False`` (a client, which builds only its own body)
    checks the form of import-path and torchvision bodies without importing them.

    Each key's own value is checked on the dict, as it is coerced (a bad one cannot become a
    typed field); how values combine (:func:`_check_combinations`, the methods' ``validate``)
    is checked on the :class:`Settings` built from them, so those rules read typed attributes.
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
    settings = Settings.from_config(out)
    settings = replace(settings, train_fraction=train_fraction(settings))
    _check_combinations(settings, import_bodies)
    return settings


def train_fraction(cfg: Settings) -> float:
    """The share of the training rows a run uses: ``train-fraction`` as set, or where it is 0 (the
    default) all of a user's own data (a path, dataset=local) and BUILTIN_TRAIN_FRACTION of a built-in,
    so a user's folder is never silently cut to the papers' 5 %."""
    value = float(cfg.train_fraction)
    if value > 0:
        return value
    return BUILTIN_TRAIN_FRACTION if dataset_kind(cfg.dataset) == "builtin" else 1.0


def _check_combinations(cfg: Settings, import_bodies: bool = True) -> None:
    _check_keys_read(cfg)  # first: a key the method ignores would only mislead the checks below
    from headway.core.models import BodyError, body_factory, is_custom_body  # local import: models pulls in torch

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
        fault_ids(cfg.fault_clients)
    except ValueError:
        raise ConfigError(f"run-config key 'fault-clients' must be a comma list of partition ids, got {cfg.fault_clients!r}") from None
    from headway.core.noise import parse_client_noise  # local import: keeps the schema light

    try:
        parse_client_noise(cfg.client_noise)
    except ValueError as exc:
        raise ConfigError(f"run-config key 'client-noise': {exc}") from None
    _check_joining(cfg)
    _check_goals(cfg)
    method = METHODS[cfg.algorithm]
    most = max_replies(cfg)
    if cfg.min_replies > most:
        asked = (
            "every client"
            if method.every_client
            else f"K = max(1, round(fraction-train x num-clients)) = max(1, round({cfg.fraction_train:g} x {cfg.num_clients}))"
        )
        raise ConfigError(
            f"run-config key 'min-replies' is {cfg.min_replies}, but a round of {cfg.algorithm} asks {asked} = {most} "
            f"client(s), so no round could ever update the model: set min-replies <= {most}"
        )
    if cfg.server_data and cfg.dataset != LOCAL:
        raise ConfigError(
            f"run-config key 'server-data' applies to dataset='local' (each node holds its own data); with dataset={cfg.dataset!r} "
            "the server reads the data set itself: leave server-data empty"
        )
    if cfg.client_sampling != "uniform" and not method.client_sampling:
        honour = " and ".join(m.name for m in METHODS.values() if m.client_sampling)
        raise ConfigError(
            f"run-config key 'client-sampling' is {cfg.client_sampling!r}, which only {honour} implement; "
            f"{cfg.algorithm} draws its clients its own way: leave it 'uniform'"
        )
    if cfg.aggregation != "mean":
        _check_aggregation(cfg, most)
    if cfg.client_size_std > 0 and cfg.client_size_mean <= 0:
        raise ConfigError("run-config key 'client-size-std' needs 'client-size-mean' > 0: the sizes are drawn from N(mean, std²)")
    if cfg.client_size_mean > 0 and cfg.partition not in ("iid", "dominant"):
        raise ConfigError(f"run-config key 'client-size-mean' applies to partition iid or dominant, not {cfg.partition!r}")
    if cfg.partition_sizes:
        _check_partition_sizes(cfg)
    if cfg.client_evaluation != "exchange":
        _check_scores_with_train(cfg, method)
    if cfg.secure_aggregation != "off":
        _check_secure_aggregation(cfg)
    method.validate(cfg)  # the chosen method's own rules (core/methods.py)


def unread_keys(cfg: Settings) -> list[str]:
    """The method keys set away from their default that algorithm=cfg.algorithm does not read (headway.core.methods.reads):
    a run would silently ignore them. Keys at their default pass: pyproject.toml's [tool.flwr.app.config] sends every key."""
    values, method = cfg.to_config(), METHODS[cfg.algorithm]
    return [name for name, key in method_keys().items() if values[name] != key.default and not reads(method, name, cfg.inputs)]


def _check_keys_read(cfg: Settings) -> None:
    """ConfigError in one line naming the first method key the run would ignore (:func:`unread_keys`), and the others."""
    unread = unread_keys(cfg)
    if not unread:
        return
    values = cfg.to_config()
    first = unread_problem(unread[0], values[unread[0]], cfg.algorithm, cfg.inputs)
    more = f"; it would ignore {', '.join(unread[1:])} too" if len(unread) > 1 else ""
    raise ConfigError(f"{first}{more}")


def _check_scores_with_train(cfg: Settings, method: Any) -> None:
    """client-evaluation=with-next-train only where a score sent with the next train reply measures what the exchange would."""
    if not method.scores_with_train:
        able = ", ".join(m.name for m in METHODS.values() if m.scores_with_train)
        raise ConfigError(
            f"run-config key 'client-evaluation' is {cfg.client_evaluation!r}, which only {able} implement: {cfg.algorithm} "
            "evaluates what a train message does not bring (its own or a personal model, prototypes, a one-shot head): leave it 'exchange'"
        )
    if cfg.algorithm == "fedlog" and cfg.fedlog.dp == "local":
        raise ConfigError(
            "run-config key 'client-evaluation' must be 'exchange' with fedlog-dp='local': a train reply then releases nothing "
            "but the noised statistics"
        )


def _check_secure_aggregation(cfg: Settings) -> None:
    """What secure-aggregation needs of the round (whether the method's strategy can aggregate a sum alone
    is checked where that class is known: headway.strategies.registry.check_capabilities)."""
    if (most := max_replies(cfg)) < 3:  # core/secagg.py MIN_CLIENTS (no import: config stays free of the crypto)
        raise ConfigError(
            f"run-config key 'secure-aggregation' is {cfg.secure_aggregation!r}, but a round of {cfg.algorithm} asks {most} "
            "client(s), and a secure sum needs at least 3 (each client's secrets are split among at least 2 others, and it never "
            "reveals a share of its own): set num-clients (and fraction-train) for 3 or more clients a round, or secure-aggregation='off'"
        )
    if cfg.client_evaluation != "exchange":
        raise ConfigError(
            "run-config key 'client-evaluation' must be 'exchange' with secure-aggregation: a train reply then holds only the masked sum share"
        )
    if cfg.aggregation != "mean":
        raise ConfigError(
            f"run-config key 'aggregation' is {cfg.aggregation!r}, which needs each client's update; secure-aggregation gives the "
            "server only their sum: use aggregation='mean', or secure-aggregation='off'"
        )
    if cfg.client_sampling != "uniform":
        raise ConfigError(
            "run-config key 'client-sampling' must be 'uniform' with secure-aggregation: data-ratio weighs each client by how often "
            "it was drawn, which its masked update cannot carry"
        )


def _check_aggregation(cfg: Settings, most: int) -> None:
    """A robust aggregation rule only when a full round (``most`` replies) is enough for it against
    malicious-clients (whether the method's strategy averages model updates, the step the rule replaces,
    is checked where that class is known: headway.strategies.registry.check_capabilities)."""
    rule, f = cfg.aggregation, cfg.malicious_clients
    if rule == "trimmed-mean":
        _check_trimmed_mean(cfg.trimmed_mean_beta, most)
    if rule not in SELECTING:
        return
    need = replies_needed(rule, f)
    if most < need:
        formula = "4f + 3" if rule == "bulyan" else "2f + 3"
        raise ConfigError(
            f"run-config key 'malicious-clients' is {f}, but aggregation={rule} needs at least {formula} = {need} valid replies "
            f"a round and a round of {cfg.algorithm} asks {most} client(s): lower malicious-clients or ask more clients"
        )
    if rule == "multi-krum" and cfg.multi_krum_select > most - f:
        raise ConfigError(
            f"run-config key 'multi-krum-select' is {cfg.multi_krum_select}, but a round asks {most} client(s), of which "
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


def scores_with_train(cfg: Settings, server_round: int) -> bool:
    """Whether round ``server_round``'s train replies carry the test scores of the model its train message brings, i.e. of
    round ``server_round - 1``'s model: client-evaluation=with-next-train, and that round was due an evaluation and was not
    the last (the last one is always evaluated by an exchange)."""
    scored = server_round - 1
    if cfg.client_evaluation != "with-next-train" or not 1 <= scored < cfg.num_server_rounds:
        return False
    return bool(cfg.eval_every) and scored % cfg.eval_every == 0


def max_replies(cfg: Settings) -> int:
    """The most training replies one round can get: every client for a method that asks
    every client, else the round's sample K = max(1, round(fraction-train x num-clients))."""
    from headway.core.sampling import sample_size

    n = int(cfg.num_clients)
    return n if METHODS[cfg.algorithm].every_client else min(n, sample_size(n, cfg.fraction_train))


def _check_joining(cfg: Settings) -> None:
    """The join and client-transform keys (core/joining.py, core/noise.py): ConfigError in one line naming the key."""
    from headway.core.joining import join_problem
    from headway.core.noise import parse_client_transform

    try:
        problem = join_problem(
            cfg.join_clients,
            cfg.join_round,
            cfg.num_clients,
            cfg.num_server_rounds,
            cfg.dataset == LOCAL,
            cfg.client_sampling == "data-ratio",
        )
        turned = parse_client_transform(cfg.client_transform)
    except ValueError as exc:
        raise ConfigError(str(exc) if str(exc).startswith("run-config key") else f"run-config key 'client-transform': {exc}") from None
    if problem is not None:
        raise ConfigError(problem)
    outside = sorted(p for p in turned if p >= cfg.num_clients)
    if outside:
        raise ConfigError(
            f"run-config key 'client-transform': partition id {outside[0]} is outside 0..{cfg.num_clients - 1} (num-clients={cfg.num_clients})"
        )


def _check_partition_sizes(cfg: Settings) -> None:
    """partition-sizes (core/partition.py) in one line: its form, the partition ids against num-clients, the scheme."""
    from headway.core.partition import parse_partition_sizes, sizes_problem

    try:
        problem = sizes_problem(cfg.partition_sizes, cfg.num_clients, cfg.partition)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if problem is not None:
        raise ConfigError(problem)
    if cfg.dataset == LOCAL and parse_partition_sizes(cfg.partition_sizes):
        raise ConfigError(
            "run-config key 'partition-sizes' splits a data set the run loads; dataset='local' nodes hold their own: leave it empty"
        )


def _check_goals(cfg: Settings) -> None:
    """goal-accuracy and lg-warmup-goal decide at the end of an evaluated round (core/goal.py): ConfigError in one line
    where no round before the last would be scored in time."""
    for name, goal in (("goal-accuracy", cfg.goal_accuracy), ("lg-warmup-goal", cfg.lg_fedavg.warmup_goal)):
        if goal <= 0:
            continue
        if cfg.client_evaluation == "with-next-train":
            raise ConfigError(
                f"run-config key '{name}' is decided from a round's own scores, but client-evaluation=with-next-train reports them "
                "a round later: set client-evaluation=exchange"
            )
        if not cfg.eval_every:
            raise ConfigError(
                f"run-config key '{name}' is checked on evaluated rounds, but eval-every=0 scores only the last: set eval-every=1"
            )
    if cfg.lg_fedavg.rounds > 0 and cfg.client_evaluation == "with-next-train":
        raise ConfigError(
            "run-config key 'lg-rounds' ends the run early, but client-evaluation=with-next-train scores a round with the next "
            "round's replies, which never come after the last: set client-evaluation=exchange"
        )
    lg = cfg.lg_fedavg
    if cfg.algorithm == "lg-fedavg" and lg.warmup_goal <= 0 and lg.warmup_rounds >= cfg.num_server_rounds:
        raise ConfigError(
            f"run-config key 'lg-warmup-rounds' is {lg.warmup_rounds}, but the run has {cfg.num_server_rounds} rounds: every round would be "
            "a FedAvg warm-up round; lower it or raise num-server-rounds"
        )


def check_against_spec(cfg: Settings, spec: Any) -> None:
    """Checks that need the data set's spec (a ``headway.core.data.DatasetSpec``); ConfigError naming the key."""
    if cfg.lg_fedavg.ensemble == "probabilities" and spec.task != "classification":
        raise ConfigError(
            f"run-config key 'lg-ensemble' is 'probabilities', but this data set's task is {spec.task}: use 'logits' or 'median'"
        )
    if cfg.partition == "dominant" and spec.task != "classification":
        raise ConfigError(
            f"run-config key 'partition' is 'dominant', which needs class labels; data set '{cfg.dataset}' is a regression task: use iid"
        )
    if cfg.partition == "pathological" and cfg.classes_per_client > spec.num_classes:
        raise ConfigError(
            f"run-config key 'classes-per-client' is {cfg.classes_per_client}, but data set '{cfg.dataset}' has {spec.num_classes} classes"
        )
    from headway.core.noise import IMAGE_KINDS, parse_client_noise

    image = len(spec.input_shape) == 3
    if cfg.inputs == "features" and not image and cfg.fedpft.extractor != "identity":
        raise ConfigError(
            f"run-config key 'inputs' is 'features', but fedpft-extractor {cfg.fedpft.extractor!r} takes images and "
            f"data set '{cfg.dataset}' is tabular: use fedpft-extractor=identity, or inputs=raw"
        )
    if cfg.client_transform and not (image and spec.input_shape[1] == spec.input_shape[2]):
        raise ConfigError(
            f"run-config key 'client-transform' turns square images, and data set '{cfg.dataset}' has inputs of shape {tuple(spec.input_shape)}"
        )
    for kind, _ in parse_client_noise(cfg.client_noise):
        if (kind in IMAGE_KINDS) != image:
            raise ConfigError(
                f"run-config key 'client-noise': kind {kind!r} is for {'images' if kind in IMAGE_KINDS else 'tabular data'}, "
                f"and data set '{cfg.dataset}' is {'images' if image else 'tabular'}"
            )


def check_bodies(cfg: Settings, input_shape: tuple[int, ...]) -> None:
    """Build every body the config names once (as clients will: feature-dim, seed, body-dropout)
    and run it on a 2-row zero batch of ``input_shape``: ConfigError naming the key when its
    module cannot be imported, its factory raises, it outputs no (batch, width) tensor, or its
    width differs from feature-dim. Nothing for a method that builds no body (FedPFT: a frozen
    extractor and a linear head)."""
    if not METHODS[cfg.algorithm].builds_body:
        return
    from headway.core.models import BodyError, build_body, output_width

    shape = tuple(input_shape)
    for body in [fitted_body(cfg, shape) if b == AUTO_BODY else b for b in body_names(cfg)]:
        try:
            built = build_body(body, shape, cfg.feature_dim, cfg.seed, cfg.body_dropout)
            output_width(body, built, shape, cfg.feature_dim)
        except BodyError as exc:
            raise ConfigError(f"run-config key '{body_key(cfg, body)}': {exc}{_fitting_note(cfg, shape)}") from None
        except Exception as exc:  # a registry body that refuses these inputs or this feature-dim
            text = " ".join(str(exc).split())
            raise ConfigError(
                f"run-config key '{body_key(cfg, body)}': body {body!r} cannot be built for inputs of shape {shape} "
                f"with feature-dim={cfg.feature_dim}: {type(exc).__name__}: {text}{_fitting_note(cfg, shape)}"
            ) from None


def _fitting_note(cfg: Settings, shape: tuple[int, ...]) -> str:
    """The tail of a body refusal: which built-in bodies do fit ``shape`` (and feature-dim), and that leaving body unset picks one."""
    from headway.core.models import fitting_bodies

    fitting = fitting_bodies(shape, cfg.feature_dim)
    if not fitting:
        return f"; no built-in body fits inputs of shape {shape} with feature-dim={cfg.feature_dim}"
    return f"; bodies that fit inputs of shape {shape}: {', '.join(fitting)} (or leave body unset: body=auto picks one)"


def fitted_body(cfg: Settings, input_shape: tuple[int, ...]) -> str:
    """The run's ``body``: as named, or for body=auto the one that fits ``input_shape`` (headway.core.models.auto_body:
    the same on the server and every client, since all see the same input shape); ConfigError when none does."""
    if cfg.body != AUTO_BODY:
        return str(cfg.body)
    from headway.core.models import BodyError, auto_body

    try:
        return auto_body(tuple(input_shape), cfg.feature_dim)
    except BodyError as exc:
        raise ConfigError(f"run-config key 'body': {exc}") from None


def fit_body(cfg: Settings, input_shape: tuple[int, ...]) -> Settings:
    """``cfg`` with body=auto replaced by :func:`fitted_body` (so config.json names the body that ran)."""
    return replace(cfg, body=fitted_body(cfg, input_shape))


def body_key(cfg: Settings, body: str) -> str:
    """The run-config key that names ``body``: 'bodies' where its comma list does, else 'body'."""
    return "bodies" if body in [b.strip() for b in str(cfg.bodies).split(",")] else "body"


def body_names(cfg: Settings) -> list[str]:
    """The distinct body names a config refers to."""
    names = [b.strip() for b in str(cfg.bodies).split(",") if b.strip()]
    return sorted(set(names) | {cfg.body})


def body_for(cfg: Settings, partition_id: int, override: str | None = None) -> str:
    """The body a client runs: a node-config override, else `bodies` cycled, else `body`."""
    if override:
        return override
    names = [b.strip() for b in str(cfg.bodies).split(",") if b.strip()]
    if not names:
        return cfg.body
    return names[partition_id % len(names)]


def fault_ids(fault_clients: str) -> set[int]:
    """Partition ids named in 'fault-clients' (a comma list)."""
    return {int(p) for p in str(fault_clients).split(",") if p.strip()}


def defaults() -> dict[str, Any]:
    """Every key with its default value."""
    return {name: key.default for name, key in SCHEMA.items()}
