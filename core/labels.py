"""A node's own rule for the label column a run asks it to use (issue 37, item 5).

With ``dataset=local`` the run config names ``label-column`` and a node sends every distinct
value of it with its count (its description), then per-class sums (its replies). A server that
names a sensitive column (income, an id) would learn it, so the node checks the column itself,
before anything is sent, by rules its operator sets in the node config:

- ``label-column``: pins the column; a run that asks for another is refused;
- ``max-label-values`` (default 100): more distinct values than this is no class column;
- ``max-numeric-label-values`` (default 20): where at least 90 % of the distinct values are numbers
  (also written ``122,177``, ``$5``, ``15%`` or top-coded ``90+``), at most this many, and all whole (a
  value like 3.5 is a measurement); and whatever the type, more distinct values than this that are
  also more than half the rows is an identifier, no class column.

Only where the run config names the column (tables, Hugging Face data sets); an image folder's
classes are its folder names. Plain functions, no Flower.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from headway.core.settings import Settings

DEFAULT_MAX_LABEL_VALUES = 100
DEFAULT_MAX_NUMERIC_LABEL_VALUES = 20
CHOSEN_LABEL_FORMATS = ("csv", "parquet", "huggingface")  # sources whose label column the run config names
NODE_LABEL_KEYS = ("label-column", "max-label-values", "max-numeric-label-values")


CURRENCY = "$€£¥₹"
THOUSANDS = re.compile(r"[-+]?\d{1,3}(?:[,'_ ]\d{3})+(?:\.\d+)?")  # 122,177 / 1'234'567.5 / 1 000
NUMERIC_SHARE = 0.9  # a column whose distinct values are at least this share numbers-like is held to the numeric rule


def _number(text: str) -> float | None:
    """``text`` as a finite number, or None."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def number_like(text: str) -> float | None:
    """``text`` as a number once written the way people write amounts: thousands separators
    (``122,177``), a currency sign, a trailing ``%`` or a top-coding ``+`` (``90+``); else None."""
    t = text.strip().strip(CURRENCY).strip().removesuffix("%").removesuffix("+").strip().lstrip(CURRENCY)
    if THOUSANDS.fullmatch(t):
        t = re.sub(r"[,'_ ]", "", t)
    return _number(t)


def label_problem(labels: Iterable[str], column: str, max_values: int, max_numeric: int) -> str | None:
    """Why the values ``labels`` (one a row) of ``column`` are no classes by the node's rule, or None:
    more than ``max_values`` distinct; more than ``max_numeric`` distinct that are also more than half
    the rows (an identifier, whatever its type); or at least NUMERIC_SHARE of the distinct values
    numbers-like (:func:`number_like`) and some of those not whole or more than ``max_numeric`` of them."""
    rows = list(labels)
    distinct = set(rows)
    fix = "set run-config key 'label-column' to a column of classes (a node operator who means it raises {key} in the node config)"
    if len(distinct) > max_values:
        return f"label column '{column}' has {len(distinct)} distinct values, more than max-label-values={max_values}: " + fix.format(
            key="max-label-values"
        )
    if len(distinct) > max_numeric and 2 * len(distinct) > len(rows):
        return (
            f"label column '{column}' has {len(distinct)} distinct values in {len(rows)} rows (more than half the rows, and more "
            f"than max-numeric-label-values={max_numeric}), an identifier or a measurement: " + fix.format(key="max-numeric-label-values")
        )
    numbers = [x for v in distinct if (x := number_like(v)) is not None]
    if not distinct or len(numbers) < NUMERIC_SHARE * len(distinct):
        return None
    fractional = sorted(x for x in numbers if not x.is_integer())
    if fractional:
        return f"label column '{column}' holds numbers that are not whole (e.g. {fractional[0]:g}), a measurement: " + fix.format(
            key="nothing: such a column is never classes; pin label-column"
        )
    if len(numbers) > max_numeric:
        return (
            f"label column '{column}' holds {len(numbers)} distinct numbers (of {len(distinct)} distinct values; written with "
            f"separators, signs or '+' they count too), more than max-numeric-label-values={max_numeric}: "
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


def check_label_column(path: str, cfg: Settings, node_config: Mapping[str, Any]) -> None:
    """The node's check of the run's ``label-column`` on its own source at ``path`` (read as its
    description and encoding read it) before it describes, registers or answers: the pinned
    column, then :func:`label_problem`. ValueError in one line saying what to change."""
    wanted = cfg.label_column.strip()
    problem = pinned_problem(wanted, node_config)
    if problem is None:
        max_values = node_limit(node_config, "max-label-values", DEFAULT_MAX_LABEL_VALUES)
        max_numeric = node_limit(node_config, "max-numeric-label-values", DEFAULT_MAX_NUMERIC_LABEL_VALUES)
        from headway.core.run_data import _read, source_options
        from headway.core.sources import limits_from_node_config

        raw = _read(str(Path(path).expanduser()), source_options(cfg), limits_from_node_config(node_config))
        if raw.format in CHOSEN_LABEL_FORMATS:
            problem = label_problem([*raw.train.labels, *raw.test.labels], wanted, max_values, max_numeric)
    if problem is not None:
        raise ValueError(f"this node refuses the run's label column: {problem}")
