"""Reading a user source raw: image folders, CSV and Parquet tables, npz arrays and Hugging Face
datasets, rows as read and labels as class names, not yet encoded. Sizes are checked from
headers against the node's :class:`~headway.core.sources.options.ReaderLimits` before anything is
decoded; a source without a test split gets a seeded share of its rows held out."""

from __future__ import annotations

import csv
import importlib
import io
import logging
import math
import os
import re
import zipfile
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from headway.core import seeds
from headway.core.console import HEADWAY_LOGGER
from headway.core.sources.common import CONTROL, SourceError, _control_problem, _is_missing, _label_name, _numbers, _one_line, sort_classes
from headway.core.sources.options import DEFAULT_LIMITS, ReaderLimits, SourceOptions

log = logging.getLogger(HEADWAY_LOGGER)

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")
MAX_CELL_BYTES = 131_072  # of one text cell in a table (Python's csv field limit, applied to Parquet and HF tables too)
PARQUET_BATCH_ROWS = 4_096  # rows of a Parquet file decoded at a time (text kept dictionary-encoded until counted)
INSTALL_HINT = "pip install -e '.[data]'"
# a header pandas gives a frame's index: to_csv writes "" (read back as "Unnamed: 0"), to_parquet "__index_level_0__"
INDEX_HEADER = re.compile(r"|Unnamed: \d+|__index_level_\d+__")


@dataclass
class RawSplit:
    """One split's rows as read: class names, and inputs in the form their kind reads them in."""

    labels: list[str]
    # image: a list of files (Path) or PIL images, or a uint8 array (n, C, H, W);
    # table and vector: {column: values}, values a list (cells as read) or a 1-D numeric array
    x: Any
    image_info: list[tuple[str, tuple[int, int]]] = field(default_factory=list)  # (PIL mode, (h, w)) of each listed image
    attrs: list[str] | None = None  # the natural column's value of each row
    protected: dict[str, list[str]] = field(default_factory=dict)  # protected-columns: each one's value of each row (never a feature)

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
            pick(self.labels),
            x,
            pick(self.image_info) if self.image_info else [],
            pick(self.attrs) if self.attrs is not None else None,
            {c: pick(v) for c, v in self.protected.items()},
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


def _require(module: str, path: Path, what: str) -> Any:
    """Import an optional package on first use, or SourceError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise SourceError(f"{path}: reading {what} needs the '{module.split('.')[0]}' package: {INSTALL_HINT}") from None


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
    if opts.natural_column or opts.protected_columns:
        raise SourceError(
            f"{root}: run-config key 'natural-column' or 'protected-columns' is set, but an image folder has no columns: leave them empty"
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
    if missing := [c for c in opts.protected_columns if c not in columns]:
        raise SourceError(f"{where}: no column {missing} for run-config key 'protected-columns' (columns found: {found})")
    if opts.label_column in opts.protected_columns:
        raise SourceError(
            f"{where}: run-config key 'protected-columns' names the label column '{opts.label_column}': protect other columns"
        )
    labels = _labels_of(columns[opts.label_column], where)
    attrs = [_label_name(v) for v in columns[opts.natural_column]] if opts.natural_column else None
    protected = {c: [_label_name(v) for v in columns[c]] for c in opts.protected_columns}
    named = (opts.label_column, *((opts.natural_column,) if opts.natural_column else ()), *opts.protected_columns)
    index = _index_columns(columns, named, where)
    x = {c: v for c, v in columns.items() if c not in (*named, *index)}
    if not x:
        raise SourceError(f"{where}: no feature columns besides '{opts.label_column}' (columns found: {found})")
    for col, values in ((c, v) for c, v in columns.items() if c != opts.label_column):
        problem = _control_problem(str(col), "column name") or _text_problem(values, f"column '{col}'")
        if problem:
            raise SourceError(f"{where}: {problem}")
    return RawSplit(labels, x, attrs=attrs, protected=protected)


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
    if opts.natural_column or opts.protected_columns:
        raise SourceError(
            f"{file}: run-config key 'natural-column' or 'protected-columns' is set, but an npz has no named columns: leave them empty"
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
        if opts.natural_column or opts.protected_columns:
            raise SourceError(
                f"{where}: run-config keys 'natural-column' and 'protected-columns' apply to tables; this dataset holds images in column '{image_col}'"
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


def read_source(path: str | Path, opts: SourceOptions, limits: ReaderLimits = DEFAULT_LIMITS) -> RawSource:
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
