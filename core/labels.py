"""A node's own rule for the label column a run asks it to use (issue 37, item 5).

With ``dataset=local`` the run config names ``label-column`` and a node sends every distinct
value of it with its count (its description), then per-class sums (its replies). A server that
names a sensitive column (income, an id) would learn it, so the node checks the column itself,
before anything is sent, by rules its operator sets in the node config:

- ``label-column``: pins the column; a run that asks for another is refused;
- ``max-label-values`` (default 100): more distinct values than this is no class column;
- ``max-numeric-label-values`` (default 20): where every value is a number, at most this many,
  and all whole (a value like 3.5 is a measurement).

Only where the run config names the column (tables, Hugging Face data sets); an image folder's
classes are its folder names. Plain functions, no Flower.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

DEFAULT_MAX_LABEL_VALUES = 100
DEFAULT_MAX_NUMERIC_LABEL_VALUES = 20
CHOSEN_LABEL_FORMATS = ("csv", "parquet", "huggingface")  # sources whose label column the run config names
NODE_LABEL_KEYS = ("label-column", "max-label-values", "max-numeric-label-values")


def _number(text: str) -> float | None:
    """``text`` as a finite number, or None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def label_problem(labels: Iterable[str], column: str, max_values: int, max_numeric: int) -> str | None:
    """Why the values ``labels`` of ``column`` are no classes by the node's rule (more than
    ``max_values`` distinct; or all numbers, and some not whole or more than ``max_numeric``
    distinct), or None."""
    distinct = set(labels)
    fix = "set run-config key 'label-column' to a column of classes (a node operator who means it raises {key} in the node config)"
    if len(distinct) > max_values:
        return f"label column '{column}' has {len(distinct)} distinct values, more than max-label-values={max_values}: " + fix.format(
            key="max-label-values"
        )
    numbers = [x for v in distinct if (x := _number(v)) is not None]
    if not distinct or len(numbers) < len(distinct):
        return None
    fractional = sorted(x for x in numbers if not x.is_integer())
    if fractional:
        return f"label column '{column}' holds numbers that are not whole (e.g. {fractional[0]:g}), a measurement: " + fix.format(
            key="nothing: such a column is never classes; pin label-column"
        )
    if len(numbers) > max_numeric:
        return (
            f"label column '{column}' holds {len(numbers)} distinct numbers, more than max-numeric-label-values={max_numeric}: "
            + fix.format(key="max-numeric-label-values")
        )
    return None


def node_limit(node_config: Mapping[str, Any], key: str, default: int) -> int:
    """A whole number >= 1 from the node config (``key``, else ``default``); ValueError naming the key."""
    value = node_config.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"node config '{key}' must be a whole number >= 1, got {value!r}")
    return value


def pinned_problem(wanted: str, node_config: Mapping[str, Any]) -> str | None:
    """Why the run's label column ``wanted`` is not the one this node's operator pinned, or None."""
    pinned = str(node_config.get("label-column", "") or "").strip()
    if pinned and pinned != wanted:
        return f"this node pins label-column='{pinned}' in its node config and the run asks for '{wanted}': submit the run with label-column='{pinned}'"
    return None


def check_label_column(path: str, cfg: Mapping[str, Any], node_config: Mapping[str, Any]) -> None:
    """The node's check of the run's ``label-column`` on its own source at ``path`` (read as its
    description and encoding read it) before it describes, registers or answers: the pinned
    column, then :func:`label_problem`. ValueError in one line saying what to change."""
    wanted = str(cfg.get("label-column", "label")).strip()
    problem = pinned_problem(wanted, node_config)
    if problem is None:
        max_values = node_limit(node_config, "max-label-values", DEFAULT_MAX_LABEL_VALUES)
        max_numeric = node_limit(node_config, "max-numeric-label-values", DEFAULT_MAX_NUMERIC_LABEL_VALUES)
        from core.run_data import _read, source_options
        from core.sources import limits_from_node_config

        raw = _read(str(Path(path).expanduser()), source_options(cfg), limits_from_node_config(node_config))
        if raw.format in CHOSEN_LABEL_FORMATS:
            problem = label_problem([*raw.train.labels, *raw.test.labels], wanted, max_values, max_numeric)
    if problem is not None:
        raise ValueError(f"this node refuses the run's label column: {problem}")
