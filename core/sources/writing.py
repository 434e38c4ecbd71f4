"""Writing rows as a source (``headway split``): npz arrays, image folders or CSV, each of which
reads back with :func:`headway.core.sources.reading.read_source` to the same rows."""

from __future__ import annotations

import csv
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from headway.core.sources.common import SourceError


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
