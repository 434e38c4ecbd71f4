"""The schema every node encodes with: :func:`merge` makes one :class:`DataSchema` out of every
node's profile (class labels agree by name, table scaling uses moments summed over the nodes,
column order is the schema's), and :func:`fits` says why a profile cannot take part in a run."""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass

from headway.core.console import HEADWAY_LOGGER
from headway.core.sources.common import KINDS, SourceError, _column_key, _one_line, sort_classes
from headway.core.sources.options import MAX_IMAGE_SIZE, SourceOptions
from headway.core.sources.profiling import profile_problem

log = logging.getLogger(HEADWAY_LOGGER)
STD_EPS = 1e-8  # added to every federated std, as headway.core.data does for its tables
MAX_INPUT_WIDTH = 16_384  # features a table may encode to, one-hot levels included (headway.core.config's widest feature-dim)


@dataclass(frozen=True)
class DataSchema:
    """Everything every node must agree on to encode its rows alike (JSON round-trips)."""

    kind: str  # image | table | vector
    classes: tuple[str, ...]
    input_shape: tuple[int, ...]  # (C, S, S) images; (width,) tables/vectors after encoding
    # tables/vectors: numeric columns (sorted by name) with federated mean/std (std 0: the column is unused and
    # encodes as 0 for every node; core/node_merge.py), then categorical
    # columns (sorted by name) one-hot over their sorted levels (an unseen level: all zeros)
    numeric: tuple[tuple[str, float, float], ...] = ()
    categorical: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def to_json(self) -> str:
        """The schema as JSON text (floats round-trip exactly)."""
        return json.dumps(
            {
                "kind": self.kind,
                "classes": list(self.classes),
                "input_shape": list(self.input_shape),
                "numeric": [list(n) for n in self.numeric],
                "categorical": [[c, list(levels)] for c, levels in self.categorical],
            }
        )

    @staticmethod
    def from_json(text: str) -> DataSchema:
        """A schema from :meth:`to_json`'s text; SourceError when it is malformed."""
        try:
            d = json.loads(text)
            schema = DataSchema(
                kind=str(d["kind"]),
                classes=tuple(str(c) for c in d["classes"]),
                input_shape=tuple(int(s) for s in d["input_shape"]),
                numeric=tuple((str(c), float(m), float(s)) for c, m, s in d["numeric"]),
                categorical=tuple((str(c), tuple(str(v) for v in levels)) for c, levels in d["categorical"]),
            )
        except (TypeError, ValueError, KeyError) as exc:
            raise SourceError(f"data schema JSON is malformed ({_one_line(exc)})") from None
        if schema.kind not in KINDS:
            raise SourceError(f"data schema JSON: kind {schema.kind!r} is not one of {', '.join(KINDS)}")
        return schema

    @property
    def columns(self) -> dict[str, str]:
        """Every feature column and its type, in encoding order."""
        return {**{c: "numeric" for c, _, _ in self.numeric}, **{c: "categorical" for c, _ in self.categorical}}


def _merge_images(profiles: list[dict], opts: SourceOptions) -> tuple[int, int, int]:
    """(C, S, S): channels from the key or the data (3 if any node has color), size from the key or the images."""
    channels = opts.channels or (1 if all(p["channels"] == 1 for p in profiles) else 3)
    if opts.image_size:
        return channels, opts.image_size, opts.image_size
    sizes = [p.get("size") for p in profiles]
    if any(s is None for s in sizes):
        i = sizes.index(None)
        raise SourceError(
            f"images differ in size within node data {i} and run-config key 'image-size' is 0: set image-size (e.g. image-size=32)"
        )
    distinct = sorted({tuple(s) for s in sizes if s is not None})
    if len(distinct) > 1:
        shown = ", ".join(f"{h}x{w}" for h, w in distinct[:5])
        raise SourceError(
            f"images differ in size across nodes ({shown}) and run-config key 'image-size' is 0: set image-size (e.g. image-size={distinct[0][0]})"
        )
    h, w = distinct[0]
    if max(h, w) > MAX_IMAGE_SIZE:
        raise SourceError(
            f"images are {h}x{w}, larger than {MAX_IMAGE_SIZE} pixels a side, and run-config key 'image-size' is 0: set image-size (e.g. image-size=224)"
        )
    if h != w:
        raise SourceError(
            f"images are {h}x{w}, not square, and run-config key 'image-size' is 0: set image-size (e.g. image-size={max(h, w)})"
        )
    return channels, h, w


def _merge_columns(profiles: list[dict]) -> tuple[tuple, tuple]:
    """Numeric columns with mean/std of the summed moments, categorical columns with the union of levels."""
    names = sorted({c for p in profiles for c in p["columns"]}, key=_column_key)
    numeric, categorical = [], []
    for col in names:
        lacking = [i for i, p in enumerate(profiles) if col not in p["columns"]]
        if lacking:
            raise SourceError(
                f"column '{col}' is missing in node data {lacking[:10]} and present elsewhere: every node needs the same columns"
            )
        specs = [p["columns"][col] for p in profiles]
        types = sorted({s["type"] for s in specs})
        if len(types) > 1:
            where = [i for i, s in enumerate(specs) if s["type"] == "categorical"][:10]
            raise SourceError(
                f"column '{col}' is numeric at some nodes and categorical at node data {where} (a value that is no number): "
                "clean the column or make it text everywhere"
            )
        if types == ["numeric"]:
            n = sum(s["n"] for s in specs)
            total, squares = math.fsum(s["sum"] for s in specs), math.fsum(s["sumsq"] for s in specs)
            mean = total / n if n else 0.0
            std = math.sqrt(max(squares / n - mean * mean, 0.0)) if n else 0.0
            numeric.append((col, mean, std + STD_EPS))
        else:
            categorical.append((col, tuple(sorted({v for s in specs for v in s["levels"]}))))
    constant = [c for c, mean, std in numeric if std - STD_EPS <= 1e-12 * max(1.0, abs(mean))]
    constant += [c for c, levels in categorical if len(levels) == 1]
    if constant:
        shown = ", ".join(repr(c) for c in sorted(constant, key=_column_key)[:10])
        log.info("column(s) %s hold one value in every training row: they carry nothing to learn from (drop them from the data)", shown)
    return tuple(numeric), tuple(categorical)


def merge(profiles: list[dict], opts: SourceOptions) -> DataSchema:
    """One schema from every node's profile (federated: summed moments, union of levels). Classes:
    opts.classes if given, else the sorted union of every profile's class names (numerically when
    all are whole numbers). SourceError naming the key or column when profiles are malformed or disagree."""
    if not profiles:
        raise SourceError("no data profiles to merge: at least one node must report its data")
    for i, prof in enumerate(profiles):
        problem = profile_problem(prof)
        if problem:
            raise SourceError(f"node data profile {i} is malformed: {problem}")
    kinds = [p["kind"] for p in profiles]
    if len(set(kinds)) > 1:
        shown = ", ".join(f"{i}: {k}" for i, k in enumerate(kinds[:10]))
        raise SourceError(f"nodes disagree on the kind of data ({shown}): every node needs the same kind (images, a table, or vectors)")
    classes = opts.classes or tuple(sort_classes(c for p in profiles for c in p["classes"]))
    if not classes:
        raise SourceError("no node reported any class label: check run-config key 'label-column' and the nodes' data")
    kind = kinds[0]
    if kind == "image":
        return DataSchema(kind, tuple(classes), _merge_images(profiles, opts))
    numeric, categorical = _merge_columns(profiles)
    width = len(numeric) + sum(len(levels) for _, levels in categorical)
    if width > MAX_INPUT_WIDTH:
        raise SourceError(
            f"the table's columns encode to {width} features (one per numeric column and per level of a categorical one), "
            f"more than {MAX_INPUT_WIDTH}: drop or bucket high-cardinality text columns"
        )
    if width == 0:
        raise SourceError("the feature columns have no values at any node (every categorical column is empty): nothing to train on")
    return DataSchema(kind, tuple(classes), (width,), numeric, categorical)


def fits(prof: dict, schema: DataSchema) -> str | None:
    """Why a node's profile cannot take part in a run with `schema` (one line), or None."""
    problem = profile_problem(prof)
    if problem:
        return f"malformed profile: {problem}"
    if prof["kind"] != schema.kind:
        return f"its data is of kind {prof['kind']} and the run's is {schema.kind}"
    run_classes = set(schema.classes)
    extra = [c for c in sort_classes(prof["classes"]) if c not in run_classes]
    if extra:
        more = f" and {len(extra) - 10} more" if len(extra) > 10 else ""
        return f"classes not in the run's list: {extra[:10]}{more} (the run's classes: {', '.join(schema.classes[:20])})"
    if schema.kind == "image":
        return None
    wanted, have = schema.columns, {c: s["type"] for c, s in prof["columns"].items()}
    missing, surplus = sorted(set(wanted) - set(have), key=_column_key), sorted(set(have) - set(wanted), key=_column_key)
    if missing or surplus:
        return f"other columns than the run's (missing {missing[:10]}, extra {surplus[:10]})"
    other = next((c for c in wanted if wanted[c] != have[c]), None)
    if other is not None:
        return f"column '{other}' is {have[other]} here and {wanted[other]} in the run"
    return None
