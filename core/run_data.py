"""The data a run works on, wherever it lives: a built-in data set, the user's own source
(a path, split over clients like a built-in in simulation), or each node's own source
(``dataset=local``: a deployment where every SuperNode reads only its own folder).
Plain functions, no Flower; readers and encoding are :mod:`headway.core.sources`."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headway.core.config import LOCAL, ConfigError, dataset_kind
from headway.core.data import NATURAL_COLUMNS, Dataset, DatasetSpec, builtin_spec, load_dataset, spec_of
from headway.core.fairness import parse_protected
from headway.core.settings import Settings

if TYPE_CHECKING:  # headway.core.sources is imported when a user source is read
    from headway.core.sources import RawSource, SourceOptions


def source_options(cfg: Settings) -> SourceOptions:
    """How the run reads a user source (its label column, image size, classes, ...)."""
    from headway.core.sources import options_from_config

    return options_from_config(cfg.to_config())  # the options' own checks, as for a partial config (headway split)


def source_name(path: str | Path) -> str:
    """A short, stable name of a user source: its file or folder name and a hash of its
    absolute path (names results folders and feature caches; never the rows)."""
    full = Path(path).expanduser().absolute()
    return f"{full.stem or 'data'}-{hashlib.sha1(str(full).encode()).hexdigest()[:8]}"


def dataset_label(cfg: Settings) -> str:
    """The data set's name in logs and results folder names: a built-in's name, 'local', or a user source's :func:`source_name`."""
    return source_name(cfg.dataset) if dataset_kind(cfg.dataset) == "path" else str(cfg.dataset)


@lru_cache(maxsize=8)
def _read(path: str, opts: Any, limits: Any = None) -> RawSource:
    """A source read once per process; ``limits``: the node's ReaderLimits (None: the defaults)."""
    from headway.core.sources import ReaderLimits, read_source

    return read_source(path, opts, limits or ReaderLimits())


@lru_cache(maxsize=4)
def _whole_source(path: str, opts: Any) -> tuple[Dataset, Any]:
    from headway.core.sources import encode, merge, profile

    raw = _read(path, opts)
    schema = merge([profile(raw, opts)], opts)
    return encode(raw, schema, opts, source_name(path)), schema


def protected_names(cfg: Settings) -> tuple[str, ...]:
    """The columns ``protected-columns`` names (without their levels)."""
    return tuple(p.column for p in parse_protected(cfg.protected_columns))


def natural_split_problem(cfg: Settings) -> str | None:
    """Why ``partition=natural`` cannot split clients by the column it would use (``natural-column``, else a
    built-in's own): a protected column, so P would be constant on every client and no AUC computable; else None."""
    if cfg.partition != "natural" or cfg.dataset == LOCAL:
        return None
    column = cfg.natural_column or NATURAL_COLUMNS.get(str(cfg.dataset), "")
    if column not in protected_names(cfg):
        return None
    return (
        f"run-config key 'protected-columns' names column {column!r}, by which partition=natural splits the clients "
        "(P would be the same on every client and the adversary's AUC undefined): set natural-column to another column, or choose another partition"
    )


def check_natural_split(cfg: Settings) -> None:
    """ConfigError (one line) from :func:`natural_split_problem`."""
    if problem := natural_split_problem(cfg):
        raise ConfigError(problem)


def load_run_dataset(cfg: Settings) -> Dataset:
    """The whole data set of a run that one machine holds: a built-in, or the user's source
    at the path ``dataset`` (read, its class names and scaling fixed from all of it, encoded)."""
    check_natural_split(cfg)
    kind = dataset_kind(cfg.dataset)
    if kind == "builtin":
        return load_dataset(cfg.dataset, cfg.data_dir, cfg.seed, protected_names(cfg))
    if kind == "path":
        return _whole_source(str(Path(cfg.dataset).expanduser()), source_options(cfg))[0]
    raise ConfigError(
        "run-config key 'dataset' is 'local': every SuperNode reads its own data (--node-config data=PATH), "
        "so there is no one data set to load or partition; in simulation give the path of a source instead"
    )


def local_spec(schema: Any) -> DatasetSpec:
    """The spec of a ``dataset=local`` run, from the schema the nodes agreed on."""
    return DatasetSpec("classification", len(schema.classes), tuple(schema.input_shape))


def run_spec(cfg: Settings, schema: Any = None) -> DatasetSpec:
    """What models of the run take in and put out: a built-in's spec, a user source's (read
    once), or with ``dataset=local`` the nodes' agreed ``schema``."""
    check_natural_split(cfg)
    kind = dataset_kind(cfg.dataset)
    if kind == "builtin":
        try:
            return builtin_spec(cfg.dataset, protected_names(cfg))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if kind == "path":
        return spec_of(load_run_dataset(cfg))
    if schema is None:
        raise ConfigError("dataset='local': the run's classes and input shape come from the nodes' registrations; none arrived yet")
    return local_spec(schema)


MAX_PROFILE_CHARS = 1_000_000  # a profile is class names, counts, column moments and levels: far below this


def read_profile(text: Any) -> dict[str, Any]:
    """A node's profile as sent (JSON text, untrusted): parsed, bounded in size, a JSON
    object; ValueError saying what is wrong. Its content is checked by merge and fits."""
    if not isinstance(text, str):
        raise ValueError(f"the data profile is {type(text).__name__}, expected JSON text")
    if len(text) > MAX_PROFILE_CHARS:
        raise ValueError(f"the data profile has {len(text)} characters, more than {MAX_PROFILE_CHARS}")
    profile = json.loads(text)
    if not isinstance(profile, dict) or not isinstance(profile.get("classes"), dict):
        raise ValueError("the data profile is not a JSON object with 'classes'")
    return profile


def node_profile(path: str, cfg: Settings, limits: Any = None) -> dict[str, Any]:
    """What a node declares about its own source (classes and counts, columns and their
    summed moments; no rows), for the server to fix the run's schema; ``limits``: the node's ReaderLimits."""
    from headway.core.sources import profile

    opts = source_options(cfg)
    return profile(_read(str(Path(path).expanduser()), opts, limits), opts)


@lru_cache(maxsize=4)
def _node_data(path: str, schema_json: str, opts: Any, limits: Any = None) -> Dataset:
    from headway.core.sources import DataSchema, encode

    return encode(_read(path, opts, limits), DataSchema.from_json(schema_json), opts, source_name(path))


def load_node_data(path: str, cfg: Settings, schema_json: str, limits: Any = None) -> Dataset:
    """A node's own source, encoded with the run's agreed schema (its JSON); ``limits``: the node's ReaderLimits."""
    return _node_data(str(Path(path).expanduser()), schema_json, source_options(cfg), limits)


def load_server_data(cfg: Settings, schema: Any) -> Dataset | None:
    """``server-data`` of a ``dataset=local`` run, encoded with the nodes' schema; None when unset."""
    if not cfg.server_data:
        return None
    return load_node_data(cfg.server_data, cfg, schema.to_json())


__all__ = [
    "LOCAL",
    "dataset_label",
    "read_profile",
    "load_node_data",
    "load_run_dataset",
    "load_server_data",
    "local_spec",
    "node_profile",
    "run_spec",
    "source_name",
    "source_options",
]
