"""Split a data set into one folder per node (demo data for a deployment): the partition a run
config asks for, written to disk as node-0/, node-1/, ... with each node's training and test rows
and labels as class names, in a format headway.core.sources reads back (npz, PNG folders or CSV).

    headway split mnist --partition dirichlet --num-clients 3 --out nodes/
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from headway.core.config import resolve_settings
from headway.core.data import Dataset, load_dataset
from headway.core.partition import Partition, counts_line, empty_note, make_partition
from headway.core.run_data import source_options
from headway.core.settings import Settings
from headway.core.sources import (
    RawSource,
    RawSplit,
    encode,
    is_path_source,
    merge,
    profile,
    read_source,
    write_csv,
    write_image_folder,
    write_npz,
)

FORMATS = ("npz", "images", "csv")


def run_config(source: str, settings: Mapping[str, Any]) -> Settings:
    """The settings of a split: `settings` (run-config keys, as --set gives them) with dataset=source,
    resolved (the keys that say how a user source is read are run-config keys like the others)."""
    # a user path too: train-fraction's default (0) then means all of its rows, not a built-in's 5 %
    return resolve_settings({**dict(settings), "dataset": source})


def _load(source: str, cfg: Settings) -> tuple[Dataset, list[str], RawSource | None]:
    """The data set to split, its class names in index order, and the raw source of a user path."""
    if is_path_source(source):
        opts = source_options(cfg)
        raw = read_source(source, opts)
        schema = merge([profile(raw, opts)], opts)
        return encode(raw, schema, opts, Path(source).name), list(schema.classes), raw
    ds = load_dataset(source, cfg.data_dir, cfg.seed)
    if ds.task != "classification":
        raise ValueError(f"split writes class labels, and data set '{source}' is a {ds.task} task: split a classification data set")
    return ds, [str(c) for c in range(ds.num_classes)], None


def _check_format(ds: Dataset, fmt: str, source: str) -> None:
    """Refuse a format that cannot hold this kind of data."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    if fmt == "images" and not ds.is_image:
        raise ValueError(f"--format images needs images, and '{source}' is a table: use npz or csv")
    if fmt == "csv" and ds.is_image:
        raise ValueError(f"--format csv is for tables, and '{source}' holds images: use npz or images")


def _check_free(out: Path, num_clients: int, overwrite: bool = False) -> None:
    """Refuse to write into node folders that already hold files (old rows would mix with new ones);
    with ``overwrite`` those node-k folders are emptied first (a node-k that is a file or a link is always refused)."""
    for k in range(num_clients):
        folder = out / f"node-{k}"
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise FileExistsError(f"{folder} is not a folder (a file or a link): remove it or pick another --out")
        if folder.exists() and any(folder.iterdir()):
            if not overwrite:
                raise FileExistsError(f"{folder} already holds files: pass --overwrite to replace them, remove it, or pick another --out")
            shutil.rmtree(folder)


def _write_node(
    folder: Path, fmt: str, ds: Dataset, raw: RawSource | None, train: np.ndarray, test: np.ndarray, names: np.ndarray, label_column: str
) -> None:
    """One node's rows in `fmt`; a user table as CSV keeps its own columns, cells and label column."""
    y_train, y_test = names[ds.y_train[train]], names[ds.y_test[test]]
    if fmt == "npz":
        write_npz(folder, ds.x_train[train], y_train, ds.x_test[test], y_test)
    elif fmt == "images":
        write_image_folder(folder, ds.x_train[train], y_train, ds.x_test[test], y_test)
    elif raw is not None:
        write_csv(folder, _raw_columns(raw.train.take(train), ds), y_train, _raw_columns(raw.test.take(test), ds), y_test, label_column)
    else:
        write_csv(folder, ds.x_train[train], y_train, ds.x_test[test], y_test)


def _raw_columns(split: RawSplit, ds: Dataset) -> dict[str, Any]:
    """A user table's feature columns and its natural column, as read."""
    columns = dict(split.x)
    if ds.natural_column and split.attrs is not None:
        columns[ds.natural_column] = split.attrs
    return columns


def split(source: str, cfg: Settings, out: str | Path, fmt: str = "npz", overwrite: bool = False) -> list[Path]:
    """Write out/node-k/ for every client k of `cfg`'s partition of `source` (a built-in name or a
    user path): its training rows part.train[k] and test rows part.test[k], labels as class names
    (built-ins: str(index)). The node folders, in partition order."""
    return split_nodes(source, cfg, out, fmt, overwrite)[0]


def split_nodes(
    source: str, cfg: Settings, out: str | Path, fmt: str = "npz", overwrite: bool = False
) -> tuple[list[Path], Partition, int]:
    """:func:`split`, also returning the partition written and the source's training rows (for the command's report)."""
    ds, classes, raw = _load(source, cfg)
    _check_format(ds, fmt, source)
    part = make_partition(ds, cfg)
    out = Path(out)
    _check_free(out, part.num_clients, overwrite)
    names = np.array(classes, dtype=str)
    label_column = cfg.label_column.strip() if raw is not None else "label"
    folders = []
    for k, (train, test) in enumerate(zip(part.train, part.test)):
        folder = out / f"node-{k}"
        _write_node(folder, fmt, ds, raw, train, test, names, label_column)
        folders.append(folder)
    return folders, part, len(ds.y_train)


def report(part: Partition, cfg: Settings, available: int | None = None) -> str:
    """What `headway split` says each node got: training rows per node (every one, or min / median / max),
    test rows, and the train-fraction used."""
    used = sum(len(t) for t in part.train)
    of = f" of {available}" if available is not None else ""
    return (
        f"{counts_line([len(t) for t in part.train], who='node')}; train-fraction={cfg.train_fraction:g} ({used}{of} training rows); "
        f"{counts_line([len(t) for t in part.test], 'test rows', 'node')}"
        + (f"\nwarning: {empty}" if (empty := empty_note([len(t) for t in part.train], "node")) else "")  # headway.core.partition
    )
