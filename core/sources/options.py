"""How a user source is read: the run's options (label column, image size, classes, ...,
from run-config keys) and a node's own reader limits (from its --node-config, never the run's)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from headway.core.sources.common import SourceError

MAX_IMAGE_SIZE = 1_024  # pixels a side the images' own size may set (image-size=0); larger: set image-size
DEFAULT_MAX_IMAGE_PIXELS = 8_192 * 8_192  # of one image (h x w), from its header: 192 MiB decoded as RGB, one image at a time
DEFAULT_MAX_ARRAY_BYTES = 256 * 2**20  # decompressed bytes of one npz array, one CSV file, one Parquet file or HF table split


@dataclass(frozen=True)
class SourceOptions:
    """How a user source is read; every field comes from a run-config key (named in brackets)."""

    label_column: str = "label"  # [label-column] tables and HF datasets
    image_size: int = 0  # [image-size] 0: the images' own size when all share one, else refuse naming the key
    channels: int = 0  # [channels] 0: from the data (1 if every image is grayscale, else 3)
    test_fraction: float = 0.2  # [test-fraction] held out (seeded) where a source has no test split
    seed: int = 0  # [seed]
    natural_column: str = ""  # [natural-column] a table column kept as a per-row attribute, not a feature
    classes: tuple[str, ...] = ()  # [classes] the run's class list (fixed order = indices); empty: sorted union
    protected_columns: tuple[str, ...] = ()  # [protected-columns] table columns held as protected attributes: never features, never sent


@dataclass(frozen=True)
class ReaderLimits:
    """What a node's readers may allocate, checked from headers before anything is decoded, and whether
    they follow symbolic links out of the data folder. The node's own settings (--node-config, named in
    brackets), never the run config's: a server must not raise what a node reads."""

    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # [max-image-pixels] h x w of one image, any reader
    max_array_bytes: int = DEFAULT_MAX_ARRAY_BYTES  # [max-array-bytes] one npz array, CSV file, Parquet file or HF split
    follow_symlinks: bool = False  # [follow-symlinks] read links whose target lies outside the data folder


DEFAULT_LIMITS = ReaderLimits()  # a node's limits when its --node-config sets none

NODE_LIMIT_KEYS = ("max-image-pixels", "max-array-bytes", "follow-symlinks")


def limits_from_node_config(node_config: Mapping[str, Any]) -> ReaderLimits:
    """A node's reader limits from its --node-config (keys it lacks keep their defaults); SourceError naming a bad key."""
    out = {}
    for key, field_name in zip(NODE_LIMIT_KEYS[:2], ("max_image_pixels", "max_array_bytes")):
        value = node_config.get(key, getattr(ReaderLimits, field_name))
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise SourceError(f"node-config key '{key}' must be a whole number > 0, got {value!r}")
        out[field_name] = value
    follow = node_config.get("follow-symlinks", False)
    if isinstance(follow, str) and follow.strip().lower() in ("true", "false"):
        follow = follow.strip().lower() == "true"
    if not isinstance(follow, bool):
        raise SourceError(f"node-config key 'follow-symlinks' must be true or false, got {follow!r}")
    return ReaderLimits(out["max_image_pixels"], out["max_array_bytes"], follow)


def _option(cfg: Mapping[str, Any], key: str, default: Any, convert: type, what: str) -> Any:
    """One run-config value converted to its option type, or SourceError naming the key."""
    value = cfg.get(key, default)
    try:
        if convert is int and isinstance(value, float) and not value.is_integer():
            raise ValueError
        return convert(value)
    except (TypeError, ValueError):
        raise SourceError(f"run-config key '{key}' must be {what}, got {value!r}") from None


def _class_list(value: Any) -> tuple[str, ...]:
    """The [classes] key as names: a comma list in a string, or a sequence."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    names = tuple(str(v).strip() for v in items if str(v).strip())
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise SourceError(f"run-config key 'classes' names {dupes} more than once: list every class once")
    return names


def _protected_list(value: Any) -> tuple[str, ...]:
    """The [protected-columns] key's column names (their levels are the client's business: headway.core.fairness)."""
    from headway.core.fairness import ProtectedError, parse_protected

    try:
        return tuple(p.column for p in parse_protected(str(value or "")))
    except ProtectedError as exc:
        raise SourceError(str(exc)) from None


def options_from_config(cfg: Mapping[str, Any]) -> SourceOptions:
    """The source options of a run config (keys it lacks keep their defaults); SourceError naming a bad key."""
    opts = SourceOptions(
        label_column=_option(cfg, "label-column", "label", str, "a column name").strip(),
        image_size=_option(cfg, "image-size", 0, int, "an integer"),
        channels=_option(cfg, "channels", 0, int, "0, 1 or 3"),
        test_fraction=_option(cfg, "test-fraction", 0.2, float, "a number"),
        seed=_option(cfg, "seed", 0, int, "an integer"),
        natural_column=_option(cfg, "natural-column", "", str, "a column name").strip(),
        classes=_class_list(cfg.get("classes", ())),
        protected_columns=_protected_list(cfg.get("protected-columns", "")),
    )
    if not 0 <= opts.image_size <= MAX_IMAGE_SIZE:
        raise SourceError(
            f"run-config key 'image-size' is {opts.image_size}; it must be in [0, {MAX_IMAGE_SIZE}] (0: the images' own size)"
        )
    if opts.channels not in (0, 1, 3):
        raise SourceError(f"run-config key 'channels' is {opts.channels}; allowed values: 0 (from the data), 1, 3")
    if not 0 <= opts.test_fraction < 1:
        raise SourceError(f"run-config key 'test-fraction' is {opts.test_fraction}; it must be in [0, 1)")
    if not opts.label_column:
        raise SourceError("run-config key 'label-column' is empty: name the column that holds the class labels")
    return opts


def is_path_source(name: str) -> bool:
    """True when run-config `dataset` names a path (contains '/' or '\\', starts with '.' or '~',
    or ends in .csv/.parquet/.npz), False for a built-in name."""
    from headway.core.config import dataset_kind  # the one rule, shared with the run-config check

    return dataset_kind(name) == "path"
