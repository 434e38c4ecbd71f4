"""How a run-config key is described: its default (which fixes its type), help text,
allowed values and a value rule; and the error a bad value raises. Shared by the common
keys and the method declarations."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
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
