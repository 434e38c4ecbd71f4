"""User data sources (issue 24): a node's own files instead of a built-in data set.

Flow: :func:`read_source` reads what is at a path (image folder, CSV or Parquet table, npz
arrays, Hugging Face dataset) without encoding it; :func:`profile` describes it in a small
JSON-able dict (no rows) a node may send; :func:`merge` makes one :class:`DataSchema` out of
every node's profile; :func:`encode` turns a node's rows into a :class:`core.data.Dataset`
the same way at every node. Class labels agree by name, tabular scaling uses moments summed
over the nodes, and column order is the schema's, never a file's.
"""

from __future__ import annotations

import csv
import importlib
import io
import json
import logging
import math
import os
import re
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeGuard, overload

import numpy as np

from core import seeds
from core.console import HEADWAY_LOGGER
from core.data import Dataset

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N", "F"})
MISSING = frozenset({"", "?", "na", "n/a", "nan", "null", "none"})  # table cells read as "no value"
KINDS = ("image", "table", "vector")
STD_EPS = 1e-8  # added to every federated std, as core.data does for its tables
MAX_NAMES = 10_000  # classes, columns, or levels of one column that one profile may declare
MAX_NAME_LEN = 1_000  # characters of one class, column or level name in a profile
MAX_INPUT_WIDTH = 16_384  # features a table may encode to, one-hot levels included (core.config's widest feature-dim)
MAX_IMAGE_SIZE = 1_024  # pixels a side the images' own size may set (image-size=0); larger: set image-size
# control characters (C0, DEL, C1), line/paragraph separators and bidi overrides: never in a class, column or level name
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
DEFAULT_MAX_IMAGE_PIXELS = 8_192 * 8_192  # of one image (h x w), from its header: 192 MiB decoded as RGB, one image at a time
DEFAULT_MAX_ARRAY_BYTES = 256 * 2**20  # decompressed bytes of one npz array, one CSV file, one Parquet file or HF table split
MAX_CELL_BYTES = 131_072  # of one text cell in a table (Python's csv field limit, applied to Parquet and HF tables too)
PARQUET_BATCH_ROWS = 4_096  # rows of a Parquet file decoded at a time (text kept dictionary-encoded until counted)
MAX_MEAN_SQUARE = 1e30  # of a numeric column (values up to about 1e15): beyond it, not data a float32 encoder keeps
INSTALL_HINT = "pip install -e '.[data]'"
# a header pandas gives a frame's index: to_csv writes "" (read back as "Unnamed: 0"), to_parquet "__index_level_0__"
INDEX_HEADER = re.compile(r"|Unnamed: \d+|__index_level_\d+__")
log = logging.getLogger(HEADWAY_LOGGER)


class SourceError(ValueError):
    """A user data source cannot be read or does not fit the run (one line: what, where, what to do)."""


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


@dataclass(frozen=True)
class ReaderLimits:
    """What a node's readers may allocate, checked from headers before anything is decoded, and whether
    they follow symbolic links out of the data folder. The node's own settings (--node-config, named in
    brackets), never the run config's: a server must not raise what a node reads."""

    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS  # [max-image-pixels] h x w of one image, any reader
    max_array_bytes: int = DEFAULT_MAX_ARRAY_BYTES  # [max-array-bytes] one npz array, CSV file, Parquet file or HF split
    follow_symlinks: bool = False  # [follow-symlinks] read links whose target lies outside the data folder


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
    from core.config import dataset_kind  # the one rule, shared with the run-config check

    return dataset_kind(name) == "path"


# ---------------------------------------------------------------------------------------------
# Raw sources: rows as read, labels as class names


@dataclass
class RawSplit:
    """One split's rows as read: class names, and inputs in the form their kind reads them in."""

    labels: list[str]
    # image: a list of files (Path) or PIL images, or a uint8 array (n, C, H, W);
    # table and vector: {column: values}, values a list (cells as read) or a 1-D numeric array
    x: Any
    image_info: list[tuple[str, tuple[int, int]]] = field(default_factory=list)  # (PIL mode, (h, w)) of each listed image
    attrs: list[str] | None = None  # the natural column's value of each row

    def __len__(self) -> int:
        return len(self.labels)

    def take(self, rows: np.ndarray) -> RawSplit:
        """These rows only, in this order (for held-out test rows and for writing partitions)."""
        pick = lambda seq: [seq[i] for i in rows]  # noqa: E731
        if isinstance(self.x, np.ndarray):
            x = self.x[rows]
        elif isinstance(self.x, dict):
            x = {c: v[rows] if isinstance(v, np.ndarray) else pick(v) for c, v in self.x.items()}
        else:
            x = pick(self.x)
        return RawSplit(
            pick(self.labels), x, pick(self.image_info) if self.image_info else [], pick(self.attrs) if self.attrs is not None else None
        )


@dataclass
class RawSource:
    """A source read from disk and not yet encoded; `test` was held out of the training rows when `held_out`."""

    path: str
    kind: str  # image | table | vector
    format: str  # image-folder | csv | parquet | npz | huggingface
    train: RawSplit
    test: RawSplit
    held_out: bool = False


def _one_line(text: Any) -> str:
    return " ".join(str(text).split())


def _require(module: str, path: Path, what: str) -> Any:
    """Import an optional package on first use, or SourceError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise SourceError(f"{path}: reading {what} needs the '{module.split('.')[0]}' package: {INSTALL_HINT}") from None


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


def _labels_of(values: Sequence[Any], where: str) -> list[str]:
    """Class names of a label column; SourceError naming the first row without one (empty, None, NaN or
    a missing-value spelling such as 'NA', '?', 'nan', 'null': never a class) or with a control character."""
    names = []
    for i, v in enumerate(values):
        if _is_missing(v):
            shown = f" ({_one_line(ascii(v))[:20]} reads as missing)" if isinstance(v, str) and v.strip() else ""
            raise SourceError(f"{where}: row {i} has no label{shown}: give every row a class or drop it")
        name = _label_name(v)
        problem = _control_problem(name, f"row {i}: label")
        if problem:
            raise SourceError(f"{where}: {problem}")
        names.append(name)
    return names


# --- image folders ---------------------------------------------------------------------------


def _image_header(file: Any, limits: ReaderLimits, name: str = "") -> tuple[str, tuple[int, int]]:
    """An image's PIL mode and (h, w), from its header only (a path or a binary file object); SourceError
    naming it when it is no image or has more pixels than the node's limit (checked before any decoding)."""
    from PIL import Image

    name = name or str(file)
    try:
        with Image.open(file) as im:
            mode, (w, h) = im.mode, im.size
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise SourceError(f"{name}: not a readable image ({_one_line(exc)}): replace or delete the file") from None
    if h * w > limits.max_image_pixels:
        raise SourceError(
            f"{name}: an image of {w}x{h} = {h * w} pixels, more than this node's limit of {limits.max_image_pixels}: "
            "shrink the image, or raise node-config key 'max-image-pixels'"
        )
    return mode, (h, w)


def _image_files(folder: Path, limits: ReaderLimits) -> RawSplit:
    """Every image under folder/<class>/, in class then file-name order; headers now, pixels in encode."""
    files, labels = [], []
    for cls in sorted(d for d in folder.iterdir() if d.is_dir() and not d.name.startswith(".")):
        problem = _control_problem(cls.name, "class folder name")
        if problem:
            raise SourceError(f"{folder}: {problem}")
        for f in sorted(cls.iterdir()):
            if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES and not f.name.startswith("."):
                files.append(f)
                labels.append(cls.name)
    return RawSplit(labels, files, [_image_header(f, limits) for f in files])


def _has_class_folders(root: Path) -> bool:
    return any(d.is_dir() and any(f.suffix.lower() in IMAGE_SUFFIXES for f in d.iterdir()) for d in root.iterdir())


def _read_image_folder(root: Path, opts: SourceOptions, limits: ReaderLimits) -> tuple[str, str, RawSplit, RawSplit | None]:
    """ROOT/train/<class>/* (and ROOT/test/<class>/*), or ROOT/<class>/* as training rows only."""
    if opts.natural_column:
        raise SourceError(
            f"{root}: run-config key 'natural-column' is {opts.natural_column!r}, but an image folder has no columns: leave it empty"
        )
    if (root / "train").is_dir():
        train = _image_files(root / "train", limits)
        test = _image_files(root / "test", limits) if (root / "test").is_dir() else None
    elif (root / "test").is_dir():
        raise SourceError(f"{root}: has test/ but no train/: put the training images in {root / 'train'}/<class>/")
    else:
        train, test = _image_files(root, limits), None
    if not len(train):
        raise SourceError(
            f"{root}: no training images ({', '.join(IMAGE_SUFFIXES)}) in class folders: expected train/<class>/*.png or <class>/*.png"
        )
    return "image", "image-folder", train, test


# --- tables ----------------------------------------------------------------------------------


def _file_within(file: Path, limits: ReaderLimits, what: str) -> None:
    """SourceError when a file is larger than the node's max-array-bytes (before it is read)."""
    size = file.stat().st_size
    if size > limits.max_array_bytes:
        raise SourceError(
            f"{file}: {what} of {size} bytes, more than this node's limit of {limits.max_array_bytes}: "
            "split the data over nodes, or raise node-config key 'max-array-bytes'"
        )


def _read_csv(file: Path, limits: ReaderLimits) -> dict[str, list[str]]:
    """A CSV file with a header row as {column: cells}; SourceError naming the file and line of a ragged row."""
    _file_within(file, limits, "a CSV file")
    try:
        with open(file, newline="", encoding="utf-8-sig") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader, [])]
            if not header:
                raise SourceError(f"{file}: empty: a CSV needs a header row naming its columns")
            dupes = sorted({h for h in header if header.count(h) > 1})
            if dupes:
                raise SourceError(f"{file}: the header names {dupes} more than once: give every column its own name")
            columns: dict[str, list[str]] = {h: [] for h in header}
            for row in reader:
                if not any(cell.strip() for cell in row):
                    continue  # blank lines
                if len(row) != len(header):
                    raise SourceError(f"{file} line {reader.line_num}: {len(row)} fields, the header has {len(header)}: fix the row")
                for h, cell in zip(header, row):
                    columns[h].append(cell.strip())
            return columns
    except UnicodeDecodeError:
        raise SourceError(f"{file}: not UTF-8 text: save the CSV as UTF-8") from None
    except csv.Error as exc:
        raise SourceError(f"{file}: not a readable CSV ({_one_line(exc)})") from None


def _read_parquet(file: Path, limits: ReaderLimits) -> dict[str, list]:
    """A Parquet file as {column: values}, its decompressed size (from the footer) checked against the
    node's max-array-bytes before any column is read, then read batch by batch with text kept
    dictionary-encoded, each batch's decoded size counted (:func:`_batch_bytes`) before it is expanded:
    a small file whose dictionary repeats one long string is refused before it costs its decoded size.
    pyarrow is imported only here."""
    pq = _require("pyarrow.parquet", file, "Parquet")
    try:
        meta = pq.ParquetFile(str(file)).metadata
        encoded = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        size = max(encoded, meta.num_rows * meta.num_columns * 8)  # run-length encoded zeros still decode to 8 B a cell
        if size <= limits.max_array_bytes:
            return _parquet_columns(pq, file, limits)
    except SourceError:
        raise
    except Exception as exc:  # pyarrow raises its own error types for a damaged file
        raise SourceError(f"{file}: not a readable Parquet file ({_one_line(exc)})") from None
    raise SourceError(
        f"{file}: a Parquet file of {meta.num_rows} rows x {meta.num_columns} columns, at least {size} bytes decoded, more than "
        f"this node's limit of {limits.max_array_bytes}: split the data over nodes, or raise node-config key 'max-array-bytes'"
    )


def _parquet_columns(pq: Any, file: Path, limits: ReaderLimits) -> dict[str, list]:
    """Every column of a Parquet file, read PARQUET_BATCH_ROWS rows at a time with text columns as
    dictionaries; SourceError once the decoded bytes pass max-array-bytes or a text cell passes MAX_CELL_BYTES."""
    import pyarrow as pa

    names = pq.ParquetFile(str(file)).schema_arrow
    text = [f.name for f in names if _is_text_type(pa, f.type)]
    reader = pq.ParquetFile(str(file), read_dictionary=text)
    columns: dict[str, list] = {name: [] for name in reader.schema_arrow.names}
    decoded, first_row = 0, 0
    for batch in reader.iter_batches(batch_size=PARQUET_BATCH_ROWS):
        for name, array in zip(batch.schema.names, batch.columns):
            cells, longest, at = _batch_bytes(pa, array)
            if longest > MAX_CELL_BYTES:
                raise SourceError(
                    f"{file}: row {first_row + at}, column '{name}': a text cell of {longest} bytes, more than {MAX_CELL_BYTES} "
                    "(the CSV reader's field limit): shorten or drop the value, a feature is no document"
                )
            decoded += cells
        if decoded > limits.max_array_bytes:
            raise SourceError(
                f"{file}: decodes to more than {decoded} bytes by row {first_row + batch.num_rows} of {reader.metadata.num_rows}, more "
                f"than this node's limit of {limits.max_array_bytes} (its footer declares less): split the data over nodes, "
                "or raise node-config key 'max-array-bytes'"
            )
        for name, values in batch.to_pydict().items():
            columns[name].extend(values)
        first_row += batch.num_rows
    return columns


def _is_text_type(pa: Any, kind: Any) -> bool:
    """Whether an Arrow type holds variable-length text or bytes (also as a dictionary's values)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return bool(pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind) or pa.types.is_large_binary(kind))


def _batch_bytes(pa: Any, array: Any) -> tuple[int, int, int]:
    """(bytes the column ``array`` of one batch decodes to, its longest text cell, that cell's row in the
    batch): 8 a cell plus each text cell's length, a dictionary's values counted once per row that uses them."""
    import pyarrow.compute as pc

    if not _is_text_type(pa, array.type):
        return 8 * len(array), 0, 0
    if pa.types.is_dictionary(array.type):
        lengths = pc.binary_length(array.dictionary).take(array.indices)
    else:
        lengths = pc.binary_length(array)
    lengths = lengths.fill_null(0)
    if not len(lengths):
        return 0, 0, 0
    longest = int(pc.max(lengths).as_py() or 0)
    at = int(pc.index(lengths, longest).as_py()) if longest > MAX_CELL_BYTES else 0
    return 8 * len(array) + int(pc.sum(lengths).as_py() or 0), longest, at


def _table_split(columns: Mapping[str, Sequence[Any]], where: str, opts: SourceOptions) -> RawSplit:
    """Split a table's columns into labels, the natural column and feature columns."""
    found = ", ".join(columns) or "none"
    if opts.label_column not in columns:
        raise SourceError(f"{where}: no label column '{opts.label_column}' (columns found: {found}): set run-config key 'label-column'")
    if opts.natural_column and opts.natural_column not in columns:
        raise SourceError(f"{where}: no column '{opts.natural_column}' for run-config key 'natural-column' (columns found: {found})")
    labels = _labels_of(columns[opts.label_column], where)
    attrs = [_label_name(v) for v in columns[opts.natural_column]] if opts.natural_column else None
    named = (opts.label_column, opts.natural_column) if opts.natural_column else (opts.label_column,)
    index = _index_columns(columns, named, where)
    x = {c: v for c, v in columns.items() if c not in (*named, *index)}
    if not x:
        raise SourceError(f"{where}: no feature columns besides '{opts.label_column}' (columns found: {found})")
    for col, values in ((c, v) for c, v in columns.items() if c != opts.label_column):
        problem = _control_problem(str(col), "column name") or _text_problem(values, f"column '{col}'")
        if problem:
            raise SourceError(f"{where}: {problem}")
    return RawSplit(labels, x, attrs=attrs)


def _row_numbers(values: Sequence[Any]) -> np.ndarray | None:
    """A column's values as numbers when they are distinct whole numbers (row numbers, shuffled or not); else None."""
    numbers = _numbers(values, strict=True) if len(values) else None
    if numbers is None or np.isnan(numbers).any() or (numbers != np.round(numbers)).any() or len(np.unique(numbers)) != len(numbers):
        return None
    return numbers


def _index_columns(columns: Mapping[str, Sequence[Any]], named: Iterable[str], where: str) -> list[str]:
    """Columns left out of the features, each with one notice: a column with no name (nothing can name it), and
    one pandas wrote from a frame's index (to_csv's default index=True: a header '', 'Unnamed: N' or
    '__index_level_N__' over distinct whole numbers): as a feature, a row's position leaks what the file is sorted by."""
    found = []
    for col, values in columns.items():
        if col in named or not INDEX_HEADER.fullmatch(str(col)):
            continue
        numbers = _row_numbers(values)
        if numbers is None and col:
            continue  # 'Unnamed: 3' over data: a column pandas named, kept
        found.append(col)
        why = (
            f"it holds row numbers ({numbers.min():g}..{numbers.max():g}), the index pandas' to_csv writes by default "
            "(save with to_csv(index=False))"
            if numbers is not None
            else "a column needs a header to be a feature"
        )
        log.info("%s: column %r left out of the features: %s", where, col, why)
    return found


def _text_problem(values: Any, what: str) -> str | None:
    """Why a column's text cells (its categorical levels, or natural-column values) cannot be names: the first
    cell holding a control character or longer than MAX_CELL_BYTES (any table reader), by row; None for numeric
    arrays and clean text."""
    if isinstance(values, np.ndarray) and values.dtype.kind in "biuf":
        return None
    for i, v in enumerate(values):
        text = v.decode("utf-8", "replace") if isinstance(v, bytes) else v
        if isinstance(text, str) and len(text) > MAX_CELL_BYTES:
            return f"{what} row {i}: a text cell of {len(text)} characters, more than {MAX_CELL_BYTES}: shorten or drop the value"
        if isinstance(text, str) and CONTROL.search(text):
            return _control_problem(text, f"{what} row {i}: value")
    return None


def _read_table(
    train_file: Path, test_file: Path | None, opts: SourceOptions, limits: ReaderLimits
) -> tuple[str, str, RawSplit, RawSplit | None]:
    """A .csv or .parquet training file and optionally its test file, with the same columns."""
    read = _read_csv if train_file.suffix.lower() == ".csv" else _read_parquet
    train = _table_split(read(train_file, limits), str(train_file), opts)
    test = _table_split(read(test_file, limits), str(test_file), opts) if test_file is not None else None
    if test is not None and set(test.x) != set(train.x):
        missing, extra = sorted(set(train.x) - set(test.x)), sorted(set(test.x) - set(train.x))
        raise SourceError(f"{test_file}: other columns than {train_file.name} (missing {missing}, extra {extra}): use the same columns")
    return "table", train_file.suffix.lower().lstrip("."), train, test


def _table_files(root: Path) -> tuple[Path, Path | None] | None:
    """train.csv/test.csv or train.parquet/test.parquet in a folder, or None."""
    found = [s for s in (".csv", ".parquet") if (root / f"train{s}").is_file()]
    if len(found) > 1:
        raise SourceError(f"{root}: holds both train.csv and train.parquet: keep one")
    if not found:
        return None
    test = root / f"test{found[0]}"
    return root / f"train{found[0]}", test if test.is_file() else None


# --- npz arrays ------------------------------------------------------------------------------


def _npz_images(x: np.ndarray, where: str) -> np.ndarray:
    """Image arrays as uint8 (n, C, H, W): (n, H, W) gets a channel axis, (n, H, W, C) is transposed."""
    if x.ndim == 3:
        x = x[:, None]
    elif x.shape[1] not in (1, 3) and x.shape[-1] in (1, 3):
        x = x.transpose(0, 3, 1, 2)
    if x.shape[1] not in (1, 3):
        raise SourceError(f"{where}: images of shape {x.shape[1:]}: expected (H, W), (1 or 3, H, W) or (H, W, 1 or 3)")
    if x.dtype != np.uint8:
        if x.dtype.kind not in "iu" or (x.size and (x.min() < 0 or x.max() > 255)):
            raise SourceError(f"{where}: images of dtype {x.dtype}: save them as uint8 in 0..255")
        x = x.astype(np.uint8)
    return np.ascontiguousarray(x)


def _npz_header(data: Any, key: str) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one npz member from its .npy header, without reading (or inflating) its data."""
    names = data.zip.namelist()
    member = key if key in names else f"{key}.npy"
    with data.zip.open(member) as fh:
        version = np.lib.format.read_magic(fh)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0  # 3.0: 2.0's layout
        shape, _, dtype = read(fh)
    return tuple(int(d) for d in shape), np.dtype(dtype)


def _npz_within(data: Any, key: str, where: str, limits: ReaderLimits) -> None:
    """SourceError when an npz member would inflate past the node's max-array-bytes, or holds images of more
    pixels than its max-image-pixels: checked from the member's header before its data is read."""
    shape, dtype = _npz_header(data, key)
    size = math.prod(shape) * dtype.itemsize
    if size > limits.max_array_bytes:
        raise SourceError(
            f"{where}: {key} has shape {shape} of {dtype}, {size} bytes decompressed, more than this node's limit of "
            f"{limits.max_array_bytes}: split the data over nodes, or raise node-config key 'max-array-bytes'"
        )
    if len(shape) in (3, 4):
        channels = 1 if len(shape) == 3 else (shape[1] if shape[1] in (1, 3) else shape[-1])
        pixels = math.prod(shape[1:]) // max(channels, 1)
        if pixels > limits.max_image_pixels:
            raise SourceError(
                f"{where}: {key} holds images of shape {shape[1:]}, {pixels} pixels each, more than this node's limit of "
                f"{limits.max_image_pixels}: shrink the images, or raise node-config key 'max-image-pixels'"
            )


def _npz_split(data: Any, xkey: str, ykey: str, where: str, limits: ReaderLimits) -> RawSplit:
    """One split of an npz: x of ndim 2 is vectors (columns x0..), of ndim 3 or 4 images."""
    for key in (xkey, ykey):
        _npz_within(data, key, where, limits)
    x, y = data[xkey], data[ykey]
    if y.ndim != 1 or len(y) != len(x):
        raise SourceError(f"{where}: {ykey} has shape {y.shape}, expected ({len(x)},): one label per row of {xkey}")
    labels = _labels_of(list(y), f"{where} {ykey}")
    if x.ndim == 2:
        if x.dtype.kind not in "biuf":
            raise SourceError(f"{where}: {xkey} has dtype {x.dtype}: vectors must be numbers")
        return RawSplit(labels, {f"x{j}": x[:, j] for j in range(x.shape[1])})
    if x.ndim in (3, 4):
        return RawSplit(labels, _npz_images(x, f"{where} {xkey}"))
    raise SourceError(f"{where}: {xkey} has {x.ndim} dimensions: expected 2 (vectors), 3 (n, H, W) or 4 (n, C, H, W) images")


def _read_npz(file: Path, opts: SourceOptions, limits: ReaderLimits) -> tuple[str, str, RawSplit, RawSplit | None]:
    """An .npz with x_train, y_train and optionally x_test, y_test (no pickled objects)."""
    if opts.natural_column:
        raise SourceError(
            f"{file}: run-config key 'natural-column' is {opts.natural_column!r}, but an npz has no named columns: leave it empty"
        )
    try:
        with np.load(file, allow_pickle=False) as data:
            keys = set(data.files)
            if not {"x_train", "y_train"} <= keys:
                raise SourceError(
                    f"{file}: npz without x_train and y_train (keys found: {', '.join(sorted(keys)) or 'none'}): save them under those names"
                )
            if ("x_test" in keys) != ("y_test" in keys):
                raise SourceError(f"{file}: npz with only one of x_test and y_test: save both or neither")
            train = _npz_split(data, "x_train", "y_train", str(file), limits)
            test = _npz_split(data, "x_test", "y_test", str(file), limits) if "x_test" in keys else None
    except SourceError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error) as exc:  # not a zip, a damaged member, or pickled objects
        raise SourceError(f"{file}: not a readable npz of plain arrays ({_one_line(exc)})") from None
    kind = "image" if isinstance(train.x, np.ndarray) else "vector"
    if test is not None and isinstance(test.x, np.ndarray) != (kind == "image"):
        raise SourceError(f"{file}: x_train and x_test are of different kinds (images and vectors)")
    if kind == "vector" and test is not None and set(test.x) != set(train.x):
        raise SourceError(f"{file}: x_test has {len(test.x)} columns and x_train {len(train.x)}")
    return kind, "npz", train, test


# --- Hugging Face datasets -------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class HFImage:
    """One row's image of a Hugging Face dataset, decoded only when encoded (as a folder's files are):
    ``table`` is the split with its image column cast to ``Image(decode=False)`` (rows of bytes or a path)."""

    table: Any
    column: str
    row: int
    where: str

    root: Path
    limits: ReaderLimits

    def __str__(self) -> str:
        return f"{self.where} row {self.row} (column '{self.column}')"

    def file(self, cell: Any = None) -> Any:
        """The row's image as a binary file object: its bytes, or its file, which must lie in the data folder."""
        cell = self.table[self.row][self.column] if cell is None else cell
        if not isinstance(cell, dict) or (cell.get("bytes") is None and not cell.get("path")):
            raise SourceError(f"{self}: no image (neither bytes nor a path): drop the row")
        if cell.get("bytes") is not None:
            return io.BytesIO(cell["bytes"])
        path = Path(cell["path"])
        return open(_inside(path if path.is_absolute() else self.root / path, self.root, self.limits, str(self)), "rb")  # noqa: SIM115


def _hf_images(ds: Any, column: str, where: str, root: Path, limits: ReaderLimits, hf: Any) -> RawSplit:
    """The image column as lazy :class:`HFImage` rows, each header read (and checked) one batch at a time,
    never the pixels: a split of large images costs what its headers and one batch of bytes cost."""
    table = ds.cast_column(column, hf.Image(decode=False))
    items: list[HFImage] = []
    info: list[Any] = []
    for batch in table.select_columns([column]).iter(batch_size=32):
        for cell in batch[column]:
            item = HFImage(table, column, len(items), where, root, limits)
            named = f"{item}, file {cell['path']!r}" if isinstance(cell, dict) and cell.get("path") else str(item)
            with item.file(cell) as fh:
                info.append(_image_header(fh, limits, named))
            items.append(item)
    return RawSplit([], items, info)


def _hf_split(ds: Any, where: str, opts: SourceOptions, hf: Any, root: Path, limits: ReaderLimits) -> tuple[str, RawSplit]:
    """One Hugging Face split: an image column makes it images (decoded lazily), else a table whose
    Arrow size is checked against max-array-bytes; ClassLabel ids become names."""
    features = ds.features
    found = ", ".join(features) or "none"
    if opts.label_column not in features:
        raise SourceError(f"{where}: no label column '{opts.label_column}' (columns found: {found}): set run-config key 'label-column'")
    values = list(ds[opts.label_column])
    feature = features[opts.label_column]
    if isinstance(feature, hf.ClassLabel):
        if any(v is None or not 0 <= v < feature.num_classes for v in values):
            raise SourceError(f"{where}: label column '{opts.label_column}' has rows without a class: drop them")
        values = [feature.names[v] for v in values]
    labels = _labels_of(values, where)
    image_col = next((c for c, f in features.items() if isinstance(f, hf.Image)), None)
    if image_col is not None:
        if opts.natural_column:
            raise SourceError(
                f"{where}: run-config key 'natural-column' applies to tables; this dataset holds images in column '{image_col}'"
            )
        images = _hf_images(ds, image_col, where, root, limits, hf)
        return "image", RawSplit(labels, images.x, images.image_info)
    for c, f in features.items():
        if not isinstance(f, (hf.Value, hf.ClassLabel)):
            raise SourceError(f"{where}: column '{c}' is of type {type(f).__name__}: only scalar columns can be features")
    size = int(ds.data.nbytes)
    if size > limits.max_array_bytes:
        raise SourceError(
            f"{where}: a table of {size} bytes in memory, more than this node's limit of {limits.max_array_bytes}: "
            "split the data over nodes, or raise node-config key 'max-array-bytes'"
        )
    columns = {c: list(ds[c]) for c in features}
    for c, f in features.items():
        if isinstance(f, hf.ClassLabel) and c != opts.label_column:
            columns[c] = [f.names[v] if v is not None and v >= 0 else None for v in columns[c]]
    columns[opts.label_column] = labels
    return "table", _table_split(columns, where, opts)


def _read_huggingface(root: Path, opts: SourceOptions, limits: ReaderLimits) -> tuple[str, str, RawSplit, RawSplit | None]:
    """A dataset saved with save_to_disk: a Dataset (training rows) or a DatasetDict's train/test splits."""
    hf = _require("datasets", root, "a Hugging Face dataset")
    try:
        saved = hf.load_from_disk(str(root))
    except Exception as exc:  # datasets raises many types for a damaged folder
        raise SourceError(f"{root}: not a readable Hugging Face dataset ({_one_line(exc)})") from None
    if isinstance(saved, hf.DatasetDict):
        if "train" not in saved:
            raise SourceError(
                f"{root}: a DatasetDict without a 'train' split (splits: {', '.join(saved)}): name the training split 'train'"
            )
        train_set, test_set = saved["train"], saved.get("test")
    else:
        train_set, test_set = saved, None
    kind, train = _hf_split(train_set, f"{root} (train)", opts, hf, root, limits)
    test = None
    if test_set is not None:
        test_kind, test = _hf_split(test_set, f"{root} (test)", opts, hf, root, limits)
        if test_kind != kind or (kind == "table" and set(test.x) != set(train.x)):
            raise SourceError(f"{root}: the test split has other columns than the train split: use the same features")
    return kind, "huggingface", train, test


# --- detection and the held-out test split ---------------------------------------------------


def _inside(path: Path, root: Path, limits: ReaderLimits, what: str) -> Path:
    """``path`` when it resolves inside the data folder ``root`` (or the node follows links out of it);
    else SourceError naming the link and its target, and the node setting that allows it."""
    target = path.resolve()
    if limits.follow_symlinks or target == root.resolve() or target.is_relative_to(root.resolve()):
        return path
    raise SourceError(
        f"{what}: {path} leads to {target}, outside the data folder {root}: copy the file into the folder, "
        "or set node-config key 'follow-symlinks=true' to read files outside it"
    )


def _check_links(root: Path, limits: ReaderLimits) -> None:
    """Every symbolic link under the data folder ``root`` must point inside it (links are not followed
    while looking), unless the node sets follow-symlinks: a link out could read any file the node can."""
    if limits.follow_symlinks or not root.is_dir():
        return
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = Path(folder) / name
            if path.is_symlink():
                _inside(path, root, limits, "a symbolic link in the data folder")


def _read_any(root: Path, opts: SourceOptions, limits: ReaderLimits) -> tuple[str, str, RawSplit, RawSplit | None]:
    """Pick the reader from what is at root."""
    if root.is_file():
        suffix = root.suffix.lower()
        if suffix in (".csv", ".parquet"):
            return _read_table(root, None, opts, limits)
        if suffix == ".npz":
            return _read_npz(root, opts, limits)
        raise SourceError(f"{root}: not a .csv, .parquet or .npz file: point run-config key 'dataset' at one, or at a data folder")
    if (root / "dataset_info.json").is_file() or (root / "dataset_dict.json").is_file():
        return _read_huggingface(root, opts, limits)
    tables = _table_files(root)
    if tables is not None:
        return _read_table(*tables, opts, limits)
    npzs = sorted(root.glob("*.npz"))
    if len(npzs) > 1:
        raise SourceError(f"{root}: holds {len(npzs)} .npz files: keep one, or point run-config key 'dataset' at one")
    if npzs:
        return _read_npz(npzs[0], opts, limits)
    if (root / "train").is_dir() or (root / "test").is_dir() or _has_class_folders(root):
        return _read_image_folder(root, opts, limits)
    raise SourceError(
        f"{root}: no data source found: expected image folders (train/<class>/*.png or <class>/*.png), "
        "train.csv or train.parquet, one .npz, or a Hugging Face save_to_disk folder"
    )


def _hold_out(labels: list[str], fraction: float, seed: int) -> np.ndarray:
    """Rows held out as the test split: a seeded `fraction` of every class, keeping one training row
    of each; without classes large enough, a seeded `fraction` of all rows."""
    rng = np.random.default_rng([seed, seeds.HOLDOUT])
    y = np.array(labels)
    chosen = []
    for name in sort_classes(labels):
        rows = np.flatnonzero(y == name)
        chosen.append(rng.permutation(rows)[: min(int(round(fraction * len(rows))), len(rows) - 1)])
    test = np.concatenate(chosen) if chosen else np.zeros(0, dtype=np.int64)
    if not len(test) and int(round(fraction * len(y))) > 0:
        test = rng.permutation(len(y))[: int(round(fraction * len(y)))]
    return np.sort(test)


def read_source(path: str | Path, opts: SourceOptions, limits: ReaderLimits = ReaderLimits()) -> RawSource:
    """Read what is at `path` raw (not yet encoded): an image folder (train/<class>/* and optionally
    test/<class>/*, or <class>/*), a .csv/.parquet file or a folder with train.csv/test.csv (or
    .parquet), an .npz with x_train, y_train [, x_test, y_test] (or a folder holding one), or a
    Hugging Face dataset saved with save_to_disk. A source without a test split gets a seeded
    `test_fraction` of its rows held out. SourceError (one line) naming the path on any problem. ``limits``
    are the node's (:class:`ReaderLimits`): pixels and decompressed bytes checked from headers before
    anything is allocated, and no symbolic link out of a data folder unless it allows them."""
    root = Path(path).expanduser()
    if not root.exists():
        raise SourceError(f"{root}: no such file or folder: check run-config key 'dataset' (or the node's data path)")
    _check_links(root, limits)
    kind, fmt, train, test = _read_any(root, opts, limits)
    held_out = test is None
    if test is None:
        rows = _hold_out(train.labels, opts.test_fraction, opts.seed)
        keep = np.setdiff1d(np.arange(len(train)), rows)
        train, test = train.take(keep), train.take(rows)
    return RawSource(str(root), kind, fmt, train, test, held_out)


# ---------------------------------------------------------------------------------------------
# Profiles: what a node declares about its data (no rows)


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


# ---------------------------------------------------------------------------------------------
# The schema every node encodes with


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


# ---------------------------------------------------------------------------------------------
# Encoding rows with a schema


def _decoded(image: Any, mode: str, size: int) -> np.ndarray:
    """A PIL image converted to L/RGB and resized (bilinear) to size x size, as uint8 (C, S, S)."""
    from PIL import Image

    image = image.convert(mode)
    if image.size != (size, size):
        image = image.resize((size, size), Image.Resampling.BILINEAR)
    pixels = np.asarray(image, dtype=np.uint8)
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def _pixels(item: Any, mode: str, size: int, name: str) -> np.ndarray:
    """One listed image's pixels; SourceError naming the file when it cannot be decoded."""
    from PIL import Image

    try:
        if isinstance(item, (Path, HFImage)):
            with item.file() if isinstance(item, HFImage) else open(item, "rb") as fh, Image.open(fh) as im:
                return _decoded(im, mode, size)
        return _decoded(item, mode, size)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise SourceError(f"{name}: cannot decode the image ({_one_line(exc)}): replace or delete the file") from None


def _array_channels(x: np.ndarray, channels: int) -> np.ndarray:
    """uint8 (n, C, H, W) with C made `channels`: gray repeated to RGB, or RGB to ITU-R 601 luma."""
    if x.shape[1] == channels:
        return x
    if channels == 3:
        return np.repeat(x, 3, axis=1)
    weights = np.array([0.299, 0.587, 0.114], dtype=np.float32).reshape(1, 3, 1, 1)
    return np.clip(np.rint((x.astype(np.float32) * weights).sum(1, keepdims=True)), 0, 255).astype(np.uint8)


def _array_resized(x: np.ndarray, size: int) -> np.ndarray:
    """uint8 (n, C, H, W) resized to size x size with torch (bilinear, antialiased), in chunks."""
    if x.shape[2:] == (size, size):
        return x
    import torch
    import torch.nn.functional as F

    out = []
    for i in range(0, len(x), 10_000):
        chunk = torch.from_numpy(np.ascontiguousarray(x[i : i + 10_000])).float()
        small = F.interpolate(chunk, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out.append(small.round_().clamp_(0, 255).to(torch.uint8).numpy())
    return np.concatenate(out) if out else np.zeros((0, x.shape[1], size, size), np.uint8)


def _encode_images(split: RawSplit, schema: DataSchema, where: str) -> np.ndarray:
    """A split's images as uint8 (n, C, S, S) of the schema's shape."""
    channels, size = schema.input_shape[0], schema.input_shape[1]
    if isinstance(split.x, np.ndarray):
        return _array_resized(_array_channels(split.x, channels), size)
    mode = "L" if channels == 1 else "RGB"
    out = np.empty((len(split), channels, size, size), dtype=np.uint8)
    for i, item in enumerate(split.x):
        out[i] = _pixels(item, mode, size, str(item) if isinstance(item, (Path, HFImage)) else f"{where} image row {i}")
    return out


def _encode_table(split: RawSplit, schema: DataSchema, where: str) -> np.ndarray:
    """A split's feature columns as float32 in the schema's order: numeric standardized with the
    federated mean/std (a missing or unparseable cell is 0, the mean), categorical one-hot."""
    missing = [c for c in schema.columns if c not in split.x]
    if missing:
        raise SourceError(f"{where}: lacks the run's columns {missing[:10]}: every node needs the same columns")
    out = np.zeros((len(split), schema.input_shape[0]), dtype=np.float32)
    for j, (col, mean, std) in enumerate(schema.numeric):
        if std == 0:  # a column the run leaves unused (too few nodes hold values for robust statistics): 0, as missing
            continue
        z = (_numbers(split.x[col], strict=False) - mean) / std
        out[:, j] = np.where(np.isnan(z), 0.0, z)
    j = len(schema.numeric)
    for col, levels in schema.categorical:
        index = {v: i for i, v in enumerate(levels)}
        for row, value in enumerate(split.x[col]):
            k = None if _is_missing(value) else index.get(_label_name(value))
            if k is not None:  # a level the schema lacks stays all zeros
                out[row, j + k] = 1.0
        j += len(levels)
    _require_finite(out, schema, where)
    return out


def _require_finite(x: np.ndarray, schema: DataSchema, where: str) -> None:
    """SourceError naming the first cell that encodes to ±inf or NaN (a value beyond float32 once scaled by the
    run's mean and std, e.g. 1e200 in held-out rows the profile never summed): nothing non-finite is trained on."""
    bad = np.argwhere(~np.isfinite(x))
    if not len(bad):
        return
    row, j = (int(v) for v in bad[0])
    col = schema.numeric[j][0] if j < len(schema.numeric) else "a categorical column"
    raise SourceError(
        f"{where}: row {row}, column '{col}' encodes to {x[row, j]} (a value too large for float32 once scaled by the run's "
        f"mean and std; {len(bad)} such cell(s)): fix or drop the value"
    )


def _encode_labels(labels: list[str], schema: DataSchema, where: str) -> np.ndarray:
    """Class names as int64 indices into schema.classes; SourceError naming labels outside it."""
    index = {c: i for i, c in enumerate(schema.classes)}
    unknown = sort_classes({name for name in labels if name not in index})
    if unknown:
        raise SourceError(
            f"{where}: labels {unknown[:10]} are not among the run's classes ({', '.join(schema.classes[:20])}): "
            "add them to run-config key 'classes' or drop those rows"
        )
    return np.array([index[name] for name in labels], dtype=np.int64)


def encode(raw: RawSource, schema: DataSchema, opts: SourceOptions, name: str) -> Dataset:
    """The rows as a core.data.Dataset laid out by `schema`: images uint8 (n, C, S, S), tables and
    vectors float32 standardized with the federated mean/std, labels int64 indices into
    schema.classes; the natural column becomes attrs_train/attrs_test."""
    if raw.kind != schema.kind:
        raise SourceError(f"{raw.path}: holds {raw.kind} data and the run's schema is for {schema.kind} data")
    encode_x = _encode_images if raw.kind == "image" else _encode_table
    xs = [encode_x(s, schema, f"{raw.path} ({part})") for s, part in ((raw.train, "train"), (raw.test, "test"))]
    ys = [_encode_labels(s.labels, schema, f"{raw.path} ({part})") for s, part in ((raw.train, "train"), (raw.test, "test"))]
    attrs_train, attrs_test = {}, {}
    if opts.natural_column and raw.train.attrs is not None:
        attrs_train = {opts.natural_column: np.array(raw.train.attrs, dtype=str)}
        attrs_test = {opts.natural_column: np.array(raw.test.attrs or [], dtype=str)}
    return Dataset(
        name,
        "classification",
        len(schema.classes),
        tuple(schema.input_shape),
        xs[0],
        ys[0],
        xs[1],
        ys[1],
        attrs_train,
        attrs_test,
        natural_column=opts.natural_column,
    )


def load_user_source(path: str, opts: SourceOptions, name: str) -> tuple[Dataset, DataSchema]:
    """read_source + merge([profile]) + encode: one machine holding the whole source (simulation)."""
    raw = read_source(path, opts)
    schema = merge([profile(raw, opts)], opts)
    return encode(raw, schema, opts, name), schema


# ---------------------------------------------------------------------------------------------
# Writers (the split command): each folder reads back with read_source to the same rows


def _names_array(names: Iterable[Any]) -> np.ndarray:
    return np.array([str(n) for n in names], dtype=str)


def write_npz(
    folder: str | Path, x_train: np.ndarray, y_train_names: Sequence[str], x_test: np.ndarray, y_test_names: Sequence[str]
) -> Path:
    """folder/data.npz with x_train, y_train, x_test, y_test (labels as class names); its path."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "data.npz"
    np.savez(
        path, x_train=np.asarray(x_train), y_train=_names_array(y_train_names), x_test=np.asarray(x_test), y_test=_names_array(y_test_names)
    )
    return path


def _class_folder(name: str) -> str:
    """A class name usable as one folder name, or SourceError."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        raise SourceError(f"class name {name!r} cannot be a folder name: write this source as npz or csv")
    return name


def write_image_folder(
    folder: str | Path, x_train_uint8_nchw: np.ndarray, y_train_names: Sequence[str], x_test: np.ndarray, y_test_names: Sequence[str]
) -> Path:
    """PNG files folder/train/<class>/NNNNNN.png and folder/test/<class>/...; the folder."""
    from PIL import Image

    folder = Path(folder)
    for split, x, names in (("train", x_train_uint8_nchw, y_train_names), ("test", x_test, y_test_names)):
        x = np.asarray(x)
        if x.dtype != np.uint8 or x.ndim != 4 or x.shape[1] not in (1, 3):
            raise SourceError(f"{folder}: images to write must be uint8 (n, 1 or 3, H, W), got {x.dtype} {x.shape}")
        (folder / split).mkdir(parents=True, exist_ok=True)
        for i, (image, name) in enumerate(zip(x, names)):
            target = folder / split / _class_folder(str(name))
            target.mkdir(exist_ok=True)
            pixels = image[0] if image.shape[0] == 1 else image.transpose(1, 2, 0)
            Image.fromarray(pixels).save(target / f"{i:06d}.png", compress_level=1)
    return folder


def _cell(value: Any) -> str:
    """A value as CSV text that reads back to the same number or string."""
    if value is None:
        return ""
    if isinstance(value, (float, np.floating)):
        return repr(float(value))
    if isinstance(value, (np.integer, np.bool_)):
        return str(value.item())
    return str(value)


def _columns_of(x: Any) -> dict[str, Sequence[Any]]:
    """Columns to write: a 2-D array becomes x0..x{d-1}, a mapping is taken as it is."""
    if isinstance(x, Mapping):
        return dict(x)
    x = np.asarray(x)
    if x.ndim != 2:
        raise SourceError(f"rows to write as CSV must be a 2-D array or a mapping of columns, got shape {x.shape}")
    return {f"x{j}": x[:, j] for j in range(x.shape[1])}


def write_csv(
    folder: str | Path, x_train: Any, y_train_names: Sequence[str], x_test: Any, y_test_names: Sequence[str], label_column: str = "label"
) -> Path:
    """folder/train.csv and folder/test.csv (features, then the label column of class names); the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for split, x, names in (("train", x_train, y_train_names), ("test", x_test, y_test_names)):
        columns = _columns_of(x)
        if label_column in columns:
            raise SourceError(f"{folder}: a feature column is named '{label_column}' like the label column: pass another label_column")
        with open(folder / f"{split}.csv", "w", newline="", encoding="utf-8") as fh:
            out = csv.writer(fh)
            out.writerow([*columns, label_column])
            for row, name in enumerate(names):
                out.writerow([*(_cell(v[row]) for v in columns.values()), str(name)])
    return folder


__all__ = [
    "DataSchema",
    "RawSource",
    "RawSplit",
    "SourceError",
    "SourceOptions",
    "encode",
    "fits",
    "is_path_source",
    "load_user_source",
    "merge",
    "options_from_config",
    "profile",
    "read_source",
    "sort_classes",
    "write_csv",
    "write_image_folder",
    "write_npz",
]
