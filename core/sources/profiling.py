"""What a node declares about its data (no rows): :func:`profile` describes a raw source in a
small JSON-able dict, and :func:`profile_problem` says why a profile sent by a node that need
not be trusted is malformed."""

from __future__ import annotations

import math
from typing import Any, TypeGuard

import numpy as np
from headway.core.sources.common import (
    KINDS,
    SourceError,
    _column_key,
    _control_problem,
    _is_missing,
    _label_name,
    _numbers,
    _one_line,
    sort_classes,
)
from headway.core.sources.options import SourceOptions
from headway.core.sources.reading import RawSource

GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
MAX_NAMES = 10_000  # classes, columns, or levels of one column that one profile may declare
MAX_NAME_LEN = 1_000  # characters of one class, column or level name in a profile
MAX_MEAN_SQUARE = 1e30  # of a numeric column (values up to about 1e15): beyond it, not data a float32 encoder keeps


def _column_profile(values: Any, col: str = "", where: str = "") -> dict:
    """A numeric column's count, sum and sum of squares, or a categorical column's sorted levels;
    SourceError (naming ``where``, the column and its largest value's row) when the sums are not finite
    or their mean square passes MAX_MEAN_SQUARE: the node refuses what the server would leave out."""
    numbers = _numbers(values, strict=True)
    if numbers is not None:
        present = numbers[~np.isnan(numbers)]
        with np.errstate(over="ignore"):
            total, squares = float(present.sum()), float((present * present).sum())
        if not (math.isfinite(total) and math.isfinite(squares)) or (len(present) and squares / len(present) > MAX_MEAN_SQUARE):
            row = int(np.nanargmax(np.abs(numbers)))
            raise SourceError(
                f"{where}: row {row}, column '{col}' holds {numbers[row]:g}: its column's sum of squares is {squares:g}, beyond "
                f"{MAX_MEAN_SQUARE:g} a row (values up to about 1e15 are kept): fix or drop the value"
            )
        return {"type": "numeric", "n": int(len(present)), "sum": total, "sumsq": squares}
    return {"type": "categorical", "levels": sorted({_label_name(v) for v in values if not _is_missing(v)})}


def _image_profile(raw: RawSource) -> tuple[int, list[int] | None]:
    """Channels (1 when every image is grayscale) and the common [h, w] (None when sizes differ)."""
    if isinstance(raw.train.x, np.ndarray):
        arrays = [x for x in (raw.train.x, raw.test.x) if len(x)] or [raw.train.x]
        sizes = {tuple(int(s) for s in x.shape[2:]) for x in arrays}
        return max(int(x.shape[1]) for x in arrays), list(sizes.pop()) if len(sizes) == 1 else None
    info = raw.train.image_info + raw.test.image_info
    channels = 1 if all(mode in GRAY_MODES for mode, _ in info) else 3
    sizes = {size for _, size in info}
    return channels, list(sizes.pop()) if len(sizes) == 1 else None


def profile(raw: RawSource, opts: SourceOptions) -> dict:
    """What a node declares about its data, JSON-able and without rows: kind, format, rows per class
    [n_train, n_test], and for images channels and size, for tables and vectors every feature
    column's moments (numeric) or levels (categorical), of the training split only."""
    counts: dict[str, list[int]] = {}
    for split, j in ((raw.train, 0), (raw.test, 1)):
        for name in split.labels:
            counts.setdefault(name, [0, 0])[j] += 1
    out: dict[str, Any] = {"kind": raw.kind, "format": raw.format, "classes": {c: counts[c] for c in sort_classes(counts)}}
    if raw.kind == "image":
        out["channels"], out["size"] = _image_profile(raw)
    else:
        where = f"{raw.path} (train)"
        out["columns"] = {c: _column_profile(raw.train.x[c], c, where) for c in sorted(raw.train.x, key=_column_key)}
    return out


def _is_count(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _is_real(v: Any) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _name_problem(name: Any, what: str) -> str | None:
    if not isinstance(name, str) or len(name) > MAX_NAME_LEN:
        return f"{what} {_one_line(repr(name))[:80]} is not a string of at most {MAX_NAME_LEN} characters"
    return _control_problem(name, what)


def _column_problem(col: str, spec: Any, rows: int) -> str | None:
    """Why one column entry of a profile is malformed, or None. Moments must be ones that
    ``rows`` (the training rows the profile declares) real values could give: n <= rows,
    nothing summed over no rows, sum² <= n·sumsq (Cauchy-Schwarz), a bounded mean square."""
    if not isinstance(spec, dict) or spec.get("type") not in ("numeric", "categorical"):
        return f"column '{col}' needs a 'type' of numeric or categorical"
    if spec["type"] == "numeric":
        n, total, squares = spec.get("n"), spec.get("sum"), spec.get("sumsq")
        if not _is_count(n) or n > rows:
            return f"column '{col}': 'n' must be a count of at most the {rows} training rows declared, got {_one_line(repr(n))[:40]}"
        if not (_is_real(total) and _is_real(squares)) or squares < 0:
            return f"column '{col}': 'sum' and 'sumsq' must be finite numbers (sumsq >= 0), got {total!r}, {squares!r}"
        if n == 0 and (total or squares):
            return f"column '{col}': sums over n = 0 values must be 0"
        if n and (float(total) ** 2 > n * float(squares) * (1 + 1e-9) + 1e-9 or squares / n > MAX_MEAN_SQUARE):
            return f"column '{col}': no {n} real values have sum {total:g} and sum of squares {squares:g} (or their mean square exceeds {MAX_MEAN_SQUARE:g})"
        return None
    levels = spec.get("levels")
    if not isinstance(levels, list) or len(levels) > MAX_NAMES:
        return f"column '{col}': 'levels' must be a list of at most {MAX_NAMES} strings"
    return next((p for p in (_name_problem(v, f"column '{col}' level") for v in levels) if p), None)


def profile_problem(prof: Any) -> str | None:
    """Why a profile (sent by a node that need not be trusted) is malformed, or None."""
    if not isinstance(prof, dict):
        return f"a profile must be a dict, got {type(prof).__name__}"
    if prof.get("kind") not in KINDS:
        return f"'kind' must be one of {', '.join(KINDS)}, got {_one_line(repr(prof.get('kind')))[:80]}"
    classes = prof.get("classes")
    if not isinstance(classes, dict) or len(classes) > MAX_NAMES:
        return f"'classes' must be a dict of at most {MAX_NAMES} class names"
    for name, counts in classes.items():
        problem = _name_problem(name, "class")
        if problem:
            return problem
        if not (isinstance(counts, (list, tuple)) and len(counts) == 2 and all(_is_count(c) for c in counts)):
            return f"class '{name}': counts must be [n_train, n_test] of whole numbers >= 0, got {_one_line(repr(counts))[:80]}"
    if prof["kind"] == "image":
        if prof.get("channels") not in (1, 3) or isinstance(prof.get("channels"), bool):
            return f"'channels' must be 1 or 3, got {prof.get('channels')!r}"
        size = prof.get("size")
        if size is not None and not (
            isinstance(size, (list, tuple)) and len(size) == 2 and all(_is_count(s) and 0 < s <= 10**6 for s in size)
        ):
            return f"'size' must be [h, w] of positive whole numbers or null, got {_one_line(repr(size))[:80]}"
        return None
    columns = prof.get("columns")
    if not isinstance(columns, dict) or not columns or len(columns) > MAX_NAMES:
        return f"'columns' must be a dict of 1 to {MAX_NAMES} columns"
    rows = sum(counts[0] for counts in classes.values())
    for col, spec in columns.items():
        problem = _name_problem(col, "column") or _column_problem(col, spec, rows)
        if problem:
            return problem
    return None
