"""How a run-config key is described: its default (which fixes its type), help text,
allowed values and a value rule; the error a bad value raises; and how a field of a typed
settings class declares its key. Shared by the common keys and the method declarations."""

from __future__ import annotations

import keyword
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any


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


def positive(help: str, default: Any) -> Key:
    """A key whose value must be > 0."""
    return Key(default, help, check=lambda v: v > 0, rule="> 0")


def non_negative(help: str, default: Any) -> Key:
    """A key whose value must be >= 0."""
    return Key(default, help, check=lambda v: v >= 0, rule=">= 0")


def fraction(help: str, default: float) -> Key:
    """A key whose value must be in (0, 1]."""
    return Key(default, help, check=lambda v: 0 < v <= 1, rule="in (0, 1]")


KEY = "headway-key"  # where a settings field keeps its Key (dataclasses.field metadata)


def setting(key: Key) -> Any:
    """A field of a settings class declared by its run-config key: the field's default is the
    key's, and the key (help, choices, rule) rides in the field's metadata, so the schema, the
    generated docs and the typed settings come from this one declaration."""
    return field(default=key.default, metadata={KEY: key})


def key_name(prefix: str, attr: str) -> str:
    """The run-config key of settings field ``attr``: its name with ``_`` as ``-`` (less the
    trailing ``_`` of a Python keyword: ``lambda_``), after ``prefix-`` where there is a prefix."""
    rest = (attr[:-1] if attr.endswith("_") and keyword.iskeyword(attr[:-1]) else attr).replace("_", "-")
    return f"{prefix}-{rest}" if prefix else rest


def field_name(rest: str) -> str:
    """The settings field of a key's part after its prefix: ``-`` as ``_``, and a trailing ``_`` where that is a Python keyword."""
    name = rest.replace("-", "_")
    return f"{name}_" if keyword.iskeyword(name) else name


def keys_of(settings: type | None, prefix: str = "") -> dict[str, Key]:
    """Run-config key -> Key of every field of the settings class ``settings`` (a dataclass of
    :func:`setting` fields), in field order; TypeError naming a field declared without one."""
    if settings is None:
        return {}
    out = {}
    for f in fields(settings):
        if KEY not in f.metadata:
            raise TypeError(f"{settings.__qualname__}.{f.name} is not declared with headway.core.schema.setting(Key(...))")
        out[key_name(prefix, f.name)] = f.metadata[KEY]
    return out
