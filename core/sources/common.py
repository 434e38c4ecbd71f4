"""What every stage of reading a user source shares: its error, the cell values read as
"no value", and how labels, categories and names read from data are spelled and ordered."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any, Literal, overload

import numpy as np

MISSING = frozenset({"", "?", "na", "n/a", "nan", "null", "none"})  # table cells read as "no value"
KINDS = ("image", "table", "vector")
# control characters (C0, DEL, C1), line/paragraph separators and bidi overrides: never in a class, column or level name
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class SourceError(ValueError):
    """A user data source cannot be read or does not fit the run (one line: what, where, what to do)."""


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _label_name(value: Any) -> str:
    """A label or category as text: whole numbers without a decimal point ('3', not '3.0'), text stripped."""
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return str(int(value))
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).strip()


def _is_missing(value: Any) -> bool:
    """A cell without a value: None, NaN, or a marker such as '', '?' or 'NA'."""
    if value is None:
        return True
    if isinstance(value, (float, np.floating)):
        return math.isnan(value)
    return isinstance(value, str) and value.strip().lower() in MISSING


def sort_classes(names: Iterable[str]) -> list[str]:
    """Class names in index order: numerically when every name is a whole number ('2' < '10'), else as text."""
    unique = set(names)
    if unique and all(re.fullmatch(r"[+-]?\d+", n) for n in unique):
        return sorted(unique, key=lambda n: (int(n), n))
    return sorted(unique)


def _column_key(name: str) -> tuple:
    """Sort key of a column name: by name, digit runs compared as numbers (x2 before x10)."""
    parts = re.split(r"(\d+)", name)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), name


def _control_problem(name: str, what: str) -> str | None:
    """Why a name read from data (a class, column or level) cannot be one: a control character
    (NUL, an ANSI escape, a newline...) that would end up in logs, results and every node's schema."""
    bad = CONTROL.search(name)
    if bad is None:
        return None
    return f"{what} {_one_line(ascii(name))[:80]} holds the control character {ascii(bad.group())}: remove it from the data"


@overload
def _numbers(values: Any, strict: Literal[False]) -> np.ndarray: ...
@overload
def _numbers(values: Any, strict: bool) -> np.ndarray | None: ...
def _numbers(values: Any, strict: bool) -> np.ndarray | None:
    """A column as float64 with NaN for missing cells; None when `strict` and a cell is no number
    (not strict: such a cell is NaN too)."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "biuf":
        out = values.astype(np.float64)
        out[~np.isfinite(out)] = np.nan
        return out
    out = np.full(len(values), np.nan)
    for i, v in enumerate(values):
        if _is_missing(v):
            continue
        if isinstance(v, (bool, np.bool_)):
            number = None
        elif isinstance(v, (int, float, np.integer, np.floating)):
            number = float(v)
        else:
            try:
                number = float(v)
            except (TypeError, ValueError):
                number = None
        if number is None:
            if strict:
                return None
            continue
        out[i] = number if math.isfinite(number) else np.nan
    return out
