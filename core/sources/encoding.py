"""Encoding a node's raw rows with the run's schema into a :class:`headway.core.data.Dataset`, the same
way at every node: images resized to the schema's size and channels, tables scaled and one-hot
encoded in the schema's column order, labels as the schema's class indices."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from headway.core.data import Dataset
from headway.core.sources.common import SourceError, _is_missing, _label_name, _numbers, _one_line, sort_classes
from headway.core.sources.options import SourceOptions
from headway.core.sources.profiling import profile
from headway.core.sources.reading import HFImage, RawSource, RawSplit, read_source
from headway.core.sources.schema import DataSchema, merge


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
    """The rows as a headway.core.data.Dataset laid out by `schema`: images uint8 (n, C, S, S), tables and
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
    for col in opts.protected_columns:  # held by the node as P, never encoded as features
        attrs_train[col] = np.array(raw.train.protected.get(col, []), dtype=str)
        attrs_test[col] = np.array(raw.test.protected.get(col, []), dtype=str)
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
        protected=tuple(opts.protected_columns),
    )


def load_user_source(path: str, opts: SourceOptions, name: str) -> tuple[Dataset, DataSchema]:
    """read_source + merge([profile]) + encode: one machine holding the whole source (simulation)."""
    raw = read_source(path, opts)
    schema = merge([profile(raw, opts)], opts)
    return encode(raw, schema, opts, name), schema
