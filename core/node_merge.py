"""Merging the nodes' data descriptions of a ``dataset=local`` run so that a minority of lying
nodes cannot stop the run or change how the honest nodes encode their rows (issue 37, item 4).

A description is the node's own word: its row counts, column moments and names. The rules:

- **rows** count for nothing in the schema: every node's moments weigh the same, and one that
  declares more examples than ``max-client-examples`` allows is left out at once;
- **numeric columns**: the centre is the median of the nodes' means, the scale the median over
  the nodes whose values vary about that centre of the root of their second moment about it
  (``var_i + (mean_i - centre)^2``; nodes constant at the centre encode 0 whatever the scale, so
  they do not pull it to 0 and get a node with a real spread left out). With 3 or more descriptions,
  a column that fewer than :data:`MIN_COLUMN_NODES` of them hold values of is unused (std 0, encoded
  0 by every node): a median of two would be set by either of them. A node whose mean lies more
  than :data:`OUTLIER_SCALES` scales from the centre, or whose own spread is more than that many
  scales, is left out;
- **class names and categorical levels**: a name enters the schema when at least :data:`SUPPORT`
  descriptions declare it, or when it is one of at most :data:`MAX_NEW_NAMES` names a node alone
  declares (a site may hold classes no other holds; a node with more lone names adds none of them:
  its classes make it left out, its levels are dropped). For levels the cap is over all of a node's
  categorical columns together, so a liar cannot add it to every column; one description alone
  gives its own names;
- the schema is recomputed without the nodes left out, until no node is left out (a fixpoint), so
  a node that is left out has shaped nothing; registration applies the same checks
  (:func:`description_problem`) to what a node registers with.

Plain functions on profiles (:func:`headway.core.sources.profile`'s dicts) and :class:`DataSchema`; no Flower.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from headway.core.sources import STD_EPS, DataSchema, SourceError, SourceOptions, fits, merge, sort_classes

SUPPORT = 2  # descriptions that declare a class or level for it to enter the schema without counting against a node's cap
MAX_NEW_NAMES = 64  # classes (or levels of one column) one node may add that no other node declares
OUTLIER_SCALES = 100.0  # a node's column mean or spread beyond this many pooled scales: left out
MIN_COLUMN_NODES = 3  # descriptions holding values of a numeric column for a median one of them cannot set


def _moments(spec: Mapping[str, Any]) -> tuple[float, float] | None:
    """(mean, variance) of a numeric column entry, or None when it holds no values."""
    n = spec["n"]
    if not n:
        return None
    mean = spec["sum"] / n
    return mean, max(spec["sumsq"] / n - mean * mean, 0.0)


def robust_moments(moments: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(centre, scale) of one column from the nodes' (mean, variance): the median of the means, and
    the root of the median second moment about it over the nodes whose values vary about it (0 when
    none do); each node weighs the same."""
    if not moments:
        return 0.0, 0.0
    centre = statistics.median(m for m, _ in moments)
    spread = [second for m, v in moments if (second := v + (m - centre) ** 2) > 0]
    return centre, math.sqrt(statistics.median(spread)) if spread else 0.0


def lone_names(names_per_node: Sequence[Sequence[str]]) -> list[set[str]]:
    """Each node's names that no other node declares (none when a single node declares them all)."""
    sets = [set(names) for names in names_per_node]
    if len(sets) == 1:
        return [set()]
    counts = Counter(n for s in sets for n in s)
    return [{n for n in names if counts[n] < SUPPORT} for names in sets]


def supported(names_per_node: Sequence[Sequence[str]], barred: Sequence[bool] = ()) -> set[str]:
    """Names that enter the schema: those at least :data:`SUPPORT` nodes declare, and each node's
    lone names when it has at most :data:`MAX_NEW_NAMES` of them and is not ``barred`` (over its
    budget elsewhere); so one node adds at most that many names, and an honest site's own classes count."""
    lone = lone_names(names_per_node)
    out = set().union(*(set(names) for names in names_per_node)) - set().union(*lone)
    for i, mine in enumerate(lone):
        if len(mine) <= MAX_NEW_NAMES and not (i < len(barred) and barred[i]):
            out |= mine
    return out


def robust_schema(profiles: Sequence[dict], opts: SourceOptions) -> DataSchema:
    """The schema of ``profiles`` (already found to agree on kind and columns by
    :func:`headway.core.sources.merge`) under the rules above: classes and levels by support, numeric
    columns by the median rules. SourceError when nothing is left to train on."""
    base = merge(list(profiles), opts)
    classes = opts.classes or tuple(sort_classes(supported([list(p["classes"]) for p in profiles])))
    if not classes:
        raise SourceError(
            f"no class name is declared by {SUPPORT} nodes or within one node's cap of {MAX_NEW_NAMES} lone names: "
            "list the classes in run-config key 'classes'"
        )
    if base.kind == "image":
        return replace(base, classes=tuple(classes))
    numeric = []
    for col, _, _ in base.numeric:
        found = [m for p in profiles if (m := _moments(p["columns"][col])) is not None]
        if not found or len(found) < MIN_COLUMN_NODES <= len(profiles):
            numeric.append((col, 0.0, 0.0))  # unused: too few nodes hold values for a median no one node sets
            continue
        centre, scale = robust_moments(found)
        numeric.append((col, centre, scale + STD_EPS))
    levels_of = {col: [p["columns"][col]["levels"] for p in profiles] for col, _ in base.categorical}
    lone_levels = [sum(len(lone_names(per_node)[i]) for per_node in levels_of.values()) for i in range(len(profiles))]
    barred = [count > MAX_NEW_NAMES for count in lone_levels]  # the cap is over all of a node's columns together
    categorical = [(col, tuple(sorted(supported(per_node, barred)))) for col, per_node in levels_of.items()]
    width = len(numeric) + sum(len(levels) for _, levels in categorical)
    if width == 0:
        raise SourceError("no numeric column, and no level of a categorical column is declared by enough nodes: nothing to train on")
    return replace(base, classes=tuple(classes), input_shape=(width,), numeric=tuple(numeric), categorical=tuple(categorical))


def moments_problem(profile: Mapping[str, Any], schema: DataSchema) -> str | None:
    """Why a (well-formed, fitting) table profile's numeric columns are out of the range the
    schema's centre and scale allow (:data:`OUTLIER_SCALES`), or None."""
    for col, centre, scale in schema.numeric:
        found = _moments(profile["columns"][col])
        if found is None or scale == 0:  # no values here, or a column the run leaves unused
            continue
        mean, var = found
        allowed = OUTLIER_SCALES * max(scale, 1e-9 * (1.0 + abs(centre)))
        if abs(mean - centre) > allowed or math.sqrt(var) > allowed:
            return (
                f"column '{col}' has mean {mean:.6g} and spread {math.sqrt(var):.6g}, more than {OUTLIER_SCALES:g} scales "
                f"({scale:.6g}) from the run's centre {centre:.6g}"
            )
    return None


def examples_problem(profile: Mapping[str, Any], cap: int) -> str | None:
    """Why a profile declares more examples (train and test) than ``cap``, or None."""
    total = sum(a + b for a, b in profile["classes"].values())
    if total > cap:
        return f"it declares {total} examples, more than max-client-examples={cap} allows: raise that key if the node truly holds them"
    return None


def description_problem(profile: dict, schema: DataSchema, cap: int | None = None) -> str | None:
    """Why a node with ``profile`` cannot take part in a run with ``schema``: it does not fit
    (:func:`headway.core.sources.fits`), declares more than ``cap`` examples, or its column moments are
    out of range; None when it can."""
    problem = fits(profile, schema)
    if problem is not None:
        return problem
    if cap is not None and (problem := examples_problem(profile, cap)) is not None:
        return problem
    return None if schema.kind == "image" else moments_problem(profile, schema)


def _class_hint(problem: str, count: int) -> str:
    if count >= 2 and problem.startswith("classes not in the run's list"):
        return (
            f"{problem}; a node may add at most {MAX_NEW_NAMES} classes no other node declares "
            "(list them in run-config key 'classes' if one site truly holds more)"
        )
    return problem


def merge_robustly(profiles: Mapping[int, dict], opts: SourceOptions, cap: int) -> tuple[DataSchema | None, dict[int, str]]:
    """The schema of the descriptions ``profiles`` (node id -> profile, agreeing on kind and
    columns) and the nodes left out, each with why: nodes beyond ``cap`` examples first, then,
    until none is left out, every node whose description does not fit the schema of the rest
    (:func:`description_problem`). (None, reasons) when no description is left."""
    out = {n: why for n, p in profiles.items() if (why := examples_problem(p, cap)) is not None}
    left = {n: p for n, p in profiles.items() if n not in out}
    while left:
        try:
            schema = robust_schema(list(left.values()), opts)
        except SourceError as exc:
            out.update({n: f"the descriptions cannot be merged: {exc}" for n in left})
            return None, out
        problems = {n: why for n, p in left.items() if (why := description_problem(p, schema)) is not None}
        if not problems:
            return schema, out
        if len(problems) == len(left):  # no node fits the schema of all: none can take part
            out.update({n: _class_hint(why, len(left)) for n, why in problems.items()})
            return None, out
        out.update({n: _class_hint(why, len(left)) for n, why in problems.items()})
        left = {n: p for n, p in left.items() if n not in problems}
    return None, out
