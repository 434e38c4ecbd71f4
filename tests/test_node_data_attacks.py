"""Crafted node data (issue 37 item 8): each test builds the file an attacker (or a careless export)
would leave in a node's data folder and reads it with the real readers. Real rows come from UCI Adult
and CIFAR-10 in the shared data folder; the bombs, links and corrupt rows are made in tmp_path."""

from __future__ import annotations

import csv
import io
import json
import struct
import tracemalloc
import zipfile
import zlib
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from headway.core.data import ADULT_COLUMNS, data_dir
from headway.core.sources import (
    DEFAULT_MAX_ARRAY_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    ReaderLimits,
    SourceError,
    SourceOptions,
    _hold_out,
    encode,
    limits_from_node_config,
    merge,
    options_from_config,
    profile,
    read_source,
)
from PIL import Image

from tests.conftest import needs_data

ADULT = SourceOptions(label_column="income", seed=0)


@lru_cache(maxsize=1)
def _cifar_images() -> tuple[np.ndarray, np.ndarray]:
    """The first 40 CIFAR-10 test images (uint8 HWC) and their labels."""
    with np.load(data_dir() / "cifar10" / "cifar10_test.npz") as data:
        return data["x"][:40].copy(), data["y"][:40].copy()


def _cifar_folder(root: Path, n: int = 12) -> Path:
    """A real image folder: n CIFAR-10 test images as PNG under root/train/<class>/."""
    x, y = _cifar_images()
    for i in range(n):
        folder = root / "train" / f"c{int(y[i])}"
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(x[i]).save(folder / f"{i:03d}.png")
    return root


def _adult_rows(n: int = 300) -> list[list[str]]:
    with open(data_dir() / "uci-adult" / "adult.data", newline="") as fh:
        rows = [[c.strip() for c in r] for r in csv.reader(fh, skipinitialspace=True) if len(r) == len(ADULT_COLUMNS)]
    return rows[:n]


def _write_csv(path: Path, rows: list[list[str]], header: tuple[str, ...] = ADULT_COLUMNS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(header)
        out.writerows(rows)
    return path


def _png_bomb(path: Path, side: int) -> Path:
    """A valid grayscale PNG of side x side zero pixels, its IDAT deflated as a stream (never held whole)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    deflate, row, idat = zlib.compressobj(9), bytes(side + 1), []  # filter byte 0 + a row of zeros
    for _ in range(side):
        idat.append(deflate.compress(row))
    idat.append(deflate.flush())
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", b"".join(idat)) + chunk(b"IEND", b""))
    return path


def _npz_bomb(path: Path, shape: tuple[int, ...]) -> Path:
    """An np.savez_compressed-style npz whose x_train (uint8 zeros of `shape`) is deflated as a stream, with y_train."""
    n = shape[0]
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("x_train.npy", "w", force_zip64=True) as fh:
            np.lib.format.write_array_header_1_0(fh, {"descr": "|u1", "fortran_order": False, "shape": shape})
            left, block = int(np.prod(shape)), bytes(16 << 20)
            while left:
                fh.write(block[: min(left, len(block))])
                left -= min(left, len(block))
        buf = io.BytesIO()
        np.save(buf, np.array([str(i % 2) for i in range(n)]))
        zf.writestr("y_train.npy", buf.getvalue())
    return path


def _hf_save(path: Path, images: list, labels: list[int]) -> Path:
    hf = pytest.importorskip("datasets")
    features = hf.Features({"image": hf.Image(), "label": hf.ClassLabel(names=[f"c{i}" for i in range(10)])})
    hf.Dataset.from_dict({"image": images, "label": labels}, features=features).save_to_disk(str(path))
    return path


# --- non-finite encodings ---------------------------------------------------------------------


@needs_data("uci-adult")
def test_1e200_in_held_out_csv_rows_is_refused_not_encoded_as_inf(tmp_path):
    """The value sits in a row the seeded hold-out puts in the test split, which no profile sums: before,
    it became inf in x_test; now encode refuses, naming the file, row and column."""
    rows = _adult_rows()
    held = _hold_out([r[-1] for r in rows], ADULT.test_fraction, ADULT.seed)
    rows[int(held[0])][0] = "1e200"  # age
    path = _write_csv(tmp_path / "adult.csv", rows)
    raw = read_source(path, ADULT)
    schema = merge([profile(raw, ADULT)], ADULT)  # the training rows' profile is clean
    with pytest.raises(SourceError) as err:
        encode(raw, schema, ADULT, "adult")
    text = str(err.value)
    assert "\n" not in text and str(path) in text and "(test)" in text and "column 'age'" in text and "inf" in text, text
    rows[int(held[0])][0] = "39"
    clean = encode(read_source(_write_csv(tmp_path / "ok.csv", rows), ADULT), schema, ADULT, "adult")
    assert np.isfinite(clean.x_test).all() and np.isfinite(clean.x_train).all()


@needs_data("uci-adult")
def test_1e200_in_training_rows_is_refused_by_the_node_naming_column_and_row(tmp_path):
    """The value sits in a training row: before, the node sent a description whose sum of squares was
    inf and the server left it out as 'node data profile 0 is malformed', naming neither file nor row.
    Now the node's own description refuses, naming the file, the split, the row and the column."""
    rows = _adult_rows()
    held = set(int(i) for i in _hold_out([r[-1] for r in rows], ADULT.test_fraction, ADULT.seed))
    target = next(i for i in range(len(rows)) if i not in held)
    rows[target][0] = "1e200"  # age
    path = _write_csv(tmp_path / "adult.csv", rows)
    raw = read_source(path, ADULT)
    row = [i for i, v in enumerate(raw.train.x["age"]) if v == "1e200"]
    with pytest.raises(SourceError) as err:
        profile(raw, ADULT)
    text = str(err.value)
    assert "\n" not in text and f"{path} (train): row {row[0]}, column 'age' holds 1e+200" in text and "inf" in text, text
    rows[target][0] = "1e15"  # large, and still a profile the server accepts
    prof = profile(read_source(_write_csv(tmp_path / "ok.csv", rows), ADULT), ADULT)
    assert np.isfinite(prof["columns"]["age"]["sumsq"]) and merge([prof], ADULT).numeric


# --- decompression bombs: one pixel and byte limit for every reader ----------------------------


@needs_data("cifar10")
def test_a_png_bomb_in_a_real_image_folder_is_refused_from_its_header(tmp_path):
    """A 9000² PNG of a few hundred kB beside real CIFAR-10 images: refused before any pixel is decoded,
    naming the file and the node setting; a node that raises max-image-pixels reads it (headers only)."""
    root = _cifar_folder(tmp_path / "data")
    bomb = _png_bomb(next((root / "train").iterdir()) / "bomb.png", 9000)
    assert bomb.stat().st_size < 1_000_000 and DEFAULT_MAX_IMAGE_PIXELS < 9000 * 9000
    with pytest.raises(SourceError) as err:
        read_source(root, SourceOptions())
    text = str(err.value)
    assert str(bomb) in text and "9000x9000 = 81000000 pixels" in text and "'max-image-pixels'" in text and "\n" not in text
    raw = read_source(root, SourceOptions(), ReaderLimits(max_image_pixels=9000 * 9000))
    assert (9000, 9000) in [size for _, size in raw.train.image_info + raw.test.image_info]


def test_an_npz_bomb_is_refused_from_its_member_headers_without_inflating(tmp_path):
    """An npz whose x_train declares 300 MB of zeros (under 1 MB on disk): refused from the .npy header
    (tracemalloc: the read allocates under 4 MB), naming the member and max-array-bytes."""
    shape = (300, 1000, 1000)
    bomb = _npz_bomb(tmp_path / "data.npz", shape)
    assert bomb.stat().st_size < 1_000_000 and np.prod(shape) > DEFAULT_MAX_ARRAY_BYTES
    tracemalloc.start()
    try:
        with pytest.raises(SourceError) as err:
            read_source(bomb, SourceOptions())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = str(err.value)
    assert "x_train has shape (300, 1000, 1000) of uint8, 300000000 bytes decompressed" in text and "'max-array-bytes'" in text
    assert peak < 4 * 2**20, peak
    small = _npz_bomb(tmp_path / "small.npz", (4, 3000, 3000))  # 36 MB: under the byte limit; 9 MP images, over a lowered pixel limit
    with pytest.raises(SourceError, match=r"small\.npz: x_train holds images of shape \(3000, 3000\), 9000000 pixels each"):
        read_source(small, SourceOptions(), ReaderLimits(max_image_pixels=1_000_000))


def test_csv_and_parquet_are_held_to_max_array_bytes(tmp_path):
    rows = [[str(i), f"v{i % 3}", str(i % 2)] for i in range(2000)]
    path = _write_csv(tmp_path / "t.csv", rows, ("x", "color", "label"))
    with pytest.raises(SourceError, match=r"t\.csv: a CSV file of \d+ bytes, more than this node's limit of 1000.*'max-array-bytes'"):
        read_source(path, SourceOptions(), ReaderLimits(max_array_bytes=1000))
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    pq.write_table(pa.table({"x": np.zeros(200_000), "label": ["a"] * 200_000}), str(tmp_path / "t.parquet"))
    assert (tmp_path / "t.parquet").stat().st_size < 100_000  # zeros compress: the footer says what they inflate to
    with pytest.raises(
        SourceError,
        match=r"t\.parquet: a Parquet file of 200000 rows x 2 columns, at least 3200000 bytes decoded, more than this node's limit",
    ):
        read_source(tmp_path / "t.parquet", SourceOptions(), ReaderLimits(max_array_bytes=1_000_000))


def _parquet_dictionary_bomb(path: Path, rows: list[list[str]], cell: int) -> Path:
    """Real Adult rows plus a column 'note' holding one string of ``cell`` bytes in every row, written
    dictionary-encoded: the file stores the string once, its footer declares about that much, and
    every row decodes to its own copy (the tester's 1,482-byte file: 150 rows x 2 MB = 300 MB)."""
    pq = pytest.importorskip("pyarrow.parquet")
    pa = pytest.importorskip("pyarrow")
    columns: dict[str, Any] = {name: [r[j] for r in rows] for j, name in enumerate(ADULT_COLUMNS)}
    columns["note"] = pa.array(["x" * cell] * len(rows)).dictionary_encode()
    pq.write_table(pa.table(columns), str(path), compression="zstd")
    return path


@needs_data("uci-adult")
def test_a_parquet_dictionary_bomb_is_refused_by_its_cell_before_it_is_expanded(tmp_path):
    """150 Adult rows each with the same dictionary-encoded 2 MB note: under 10 kB on disk and a footer
    under max-array-bytes, 300 MB decoded. Refused naming file, row 0 and column 'note' while the read
    allocates under 16 MB of Python objects (before: every row got its own 2 MB string, 468 MB peak)."""
    bomb = _parquet_dictionary_bomb(tmp_path / "train.parquet", _adult_rows(150), 2 * 2**20)
    assert bomb.stat().st_size < 10_000
    tracemalloc.start()
    try:
        with pytest.raises(SourceError) as err:
            read_source(bomb, ADULT)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = str(err.value)
    assert str(bomb) in text and "row 0, column 'note': a text cell of 2097152 bytes, more than 131072" in text, text
    assert peak < 16 * 2**20, peak


@needs_data("uci-adult")
def test_a_parquet_dictionary_bomb_of_short_cells_is_refused_by_its_decoded_size(tmp_path):
    """Cells under the cell limit (100 kB) in 2,000 real Adult rows: 200 MB decoded from a small file whose footer
    declares far less than the node's 50 MB limit; refused once the counted bytes pass it, before expansion.
    The same rows without the note read."""
    rows = _adult_rows(2000)
    bomb = _parquet_dictionary_bomb(tmp_path / "train.parquet", rows, 100_000)
    limits = ReaderLimits(max_array_bytes=50 * 2**20)
    tracemalloc.start()
    try:
        with pytest.raises(SourceError) as err:
            read_source(bomb, ADULT, limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    text = str(err.value)
    assert "train.parquet: decodes to more than" in text and f"limit of {50 * 2**20}" in text and "'max-array-bytes'" in text, text
    assert peak < 16 * 2**20, peak
    pq, pa = pytest.importorskip("pyarrow.parquet"), pytest.importorskip("pyarrow")
    pq.write_table(pa.table({n: [r[j] for r in rows] for j, n in enumerate(ADULT_COLUMNS)}), str(tmp_path / "ok.parquet"))
    raw = read_source(tmp_path / "ok.parquet", ADULT, limits)
    assert len(raw.train) + len(raw.test) == 2000 and raw.train.x["age"][0] == rows[0][0]


@needs_data("uci-adult")
def test_a_huggingface_table_cell_longer_than_a_csv_field_is_refused(tmp_path):
    """The CSV reader refuses a 300 kB field (Python's csv limit); a Hugging Face table with one such cell
    among real Adult rows is held to the same 131,072-character limit, naming the row and column."""
    hf = pytest.importorskip("datasets")
    rows = _adult_rows(50)
    columns: dict[str, Any] = {name: [r[j] for r in rows] for j, name in enumerate(ADULT_COLUMNS)}
    columns["note"] = ["ok"] * 50
    columns["note"][7] = "y" * 300_000
    hf.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "hf"))
    with pytest.raises(SourceError, match=r"column 'note' row 7: a text cell of 300000 characters, more than 131072"):
        read_source(tmp_path / "hf", ADULT)
    columns["note"][7] = "y" * 1000
    hf.Dataset.from_dict(columns).save_to_disk(str(tmp_path / "ok"))
    assert read_source(tmp_path / "ok", ADULT).train.x["note"]


# --- Hugging Face image datasets: lazy, and a corrupt row named ------------------------------


@needs_data("cifar10")
def test_a_huggingface_image_dataset_is_decoded_lazily_like_a_folder(tmp_path, monkeypatch):
    """Reading decodes no image (headers only: before, every row was decoded at once); encode decodes each
    once, to the pixels saved."""
    x, y = _cifar_images()
    root = _hf_save(tmp_path / "hf", [Image.fromarray(im) for im in x[:20]], [int(v) for v in y[:20]])
    loads = []
    real_load = Image.Image.load

    def counted_load(im: Image.Image) -> object:
        loads.append(im.size)
        return real_load(im)

    monkeypatch.setattr(Image.Image, "load", counted_load)
    opts = SourceOptions(test_fraction=0.25)
    raw = read_source(root, opts)
    assert loads == [] and raw.format == "huggingface"
    ds = encode(raw, merge([profile(raw, opts)], opts), opts, "hf")
    assert loads  # the pixels are decoded here, one image at a time
    saved = {im.transpose(2, 0, 1).tobytes() for im in x[:20]}
    rows = np.concatenate([ds.x_train, ds.x_test])
    assert len(rows) == 20 and all(row.tobytes() in saved for row in rows)


@needs_data("cifar10")
def test_a_corrupt_image_in_a_huggingface_dataset_names_its_row(tmp_path):
    x, y = _cifar_images()
    images: list[Any] = [Image.fromarray(im) for im in x[:6]]
    images[4] = {"bytes": b"\x89PNG\r\n\x1a\n not really a png", "path": None}
    root = _hf_save(tmp_path / "hf", images, [int(v) for v in y[:6]])
    with pytest.raises(SourceError) as err:
        read_source(root, SourceOptions())
    text = str(err.value)
    assert f"{root} (train) row 4 (column 'image'): not a readable image" in text and "\n" not in text, text


@needs_data("cifar10")
def test_a_huggingface_png_bomb_is_refused_by_row(tmp_path):
    x, y = _cifar_images()
    bomb = _png_bomb(tmp_path / "bomb.png", 9000).read_bytes()
    images = [Image.fromarray(im) for im in x[:4]] + [{"bytes": bomb, "path": None}]
    root = _hf_save(tmp_path / "hf", images, [int(v) for v in y[:5]])
    with pytest.raises(SourceError, match=r"\(train\) row 4 \(column 'image'\): an image of 9000x9000 = 81000000 pixels"):
        read_source(root, SourceOptions())


# --- class names: missing-value spellings and control characters ----------------------------


@pytest.mark.parametrize("label", ["NA", "?", "nan", "null", "None", "N/A", ""])
def test_missing_value_spellings_are_no_class(tmp_path, label):
    rows = [[str(i), "red", "cat" if i % 2 else "dog"] for i in range(10)]
    rows[7][2] = label
    path = _write_csv(tmp_path / "t.csv", rows, ("x", "color", "label"))
    with pytest.raises(SourceError, match=r"t\.csv: row 7 has no label.*give every row a class or drop it"):
        read_source(path, SourceOptions())


@needs_data("uci-adult")
def test_adults_question_marks_are_a_missing_category_not_a_level(tmp_path):
    rows = _adult_rows()
    assert any(r[1] == "?" for r in rows)  # workclass has '?' cells in the real file
    raw = read_source(_write_csv(tmp_path / "adult.csv", rows), ADULT)
    assert "?" not in profile(raw, ADULT)["columns"]["workclass"]["levels"]


@pytest.mark.parametrize("bad", ["cat\x00", "\x1b[31mcat\x1b[0m", "two\nlines", "tab\there", "rtl\u202egnp.exe"])
def test_control_characters_in_class_names_and_levels_are_refused(tmp_path, bad):
    rows = [[str(i), "red", "cat" if i % 2 else "dog"] for i in range(10)]
    rows[3][2] = bad
    with pytest.raises(SourceError, match=r"row 3: label .* holds the control character"):
        read_source(_write_csv(tmp_path / "label.csv", rows, ("x", "color", "label")), SourceOptions())
    rows[3][2], rows[5][1] = "cat", bad
    with pytest.raises(SourceError, match=r"column 'color' row 5: value .* holds the control character") as err:
        read_source(_write_csv(tmp_path / "level.csv", rows, ("x", "color", "label")), SourceOptions())
    assert "\n" not in str(err.value) and "\x1b" not in str(err.value) and "\x00" not in str(err.value)


def test_a_lying_profile_with_a_control_character_class_is_refused_by_merge(tmp_path):
    rows = [[str(i), "red", "cat" if i % 2 else "dog"] for i in range(10)]
    prof = profile(read_source(_write_csv(tmp_path / "t.csv", rows, ("x", "color", "label")), SourceOptions()), SourceOptions())
    prof = json.loads(json.dumps(prof))
    prof["classes"]["\x1b[2J\x1b[Hpwned"] = [1, 0]
    with pytest.raises(SourceError, match="node data profile 0 is malformed: class .* holds the control character"):
        merge([prof], SourceOptions())


def test_class_folders_with_control_characters_are_refused(tmp_path):
    (tmp_path / "train" / "ca\x1bt").mkdir(parents=True)
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "train" / "ca\x1bt" / "a.png")
    with pytest.raises(SourceError, match="class folder name 'ca\\\\x1bt' holds the control character"):
        read_source(tmp_path, SourceOptions())


# --- symbolic links out of the data folder ----------------------------------------------------


def test_a_symlink_out_of_the_data_folder_is_refused_unless_the_node_allows_it(tmp_path):
    """A train.csv that links to a passwd-like file outside the folder would have the node read (and
    profile, and send the levels of) any file it can: refused naming the link, its target and the setting."""
    secret = tmp_path / "etc" / "passwd"
    _write_csv(secret, [[f"user{i}", "x", str(i % 2)] for i in range(10)], ("name", "shell", "label"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.csv").symlink_to(secret)
    with pytest.raises(SourceError) as err:
        read_source(data, SourceOptions())
    text = str(err.value)
    assert f"{data / 'train.csv'} leads to {secret}, outside the data folder {data}" in text and "follow-symlinks=true" in text
    assert read_source(data, SourceOptions(), ReaderLimits(follow_symlinks=True)).format == "csv"
    (data / "train.csv").unlink()
    _write_csv(data / "real" / "train.csv", [[f"r{i}", "x", str(i % 2)] for i in range(10)], ("name", "shell", "label"))
    (data / "train.csv").symlink_to(data / "real" / "train.csv")  # a link inside the folder is fine
    assert read_source(data, SourceOptions()).format == "csv"


def test_a_symlinked_class_folder_out_of_the_data_folder_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(outside / "a.png")
    (tmp_path / "data" / "train" / "dog").mkdir(parents=True)
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(tmp_path / "data" / "train" / "dog" / "b.png")
    (tmp_path / "data" / "train" / "cat").symlink_to(outside)
    with pytest.raises(SourceError, match=r"train/cat leads to .*outside, outside the data folder"):
        read_source(tmp_path / "data", SourceOptions())


def test_a_huggingface_row_that_points_at_a_file_outside_is_refused(tmp_path):
    """save_to_disk embeds image bytes, but a crafted Arrow file may hold a path-only row pointing anywhere."""
    hf = pytest.importorskip("datasets")
    pa = pytest.importorskip("pyarrow")
    secret = tmp_path / "secret.png"
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(secret)
    features = hf.Features({"image": hf.Image(), "label": hf.Value("string")})
    hf.Dataset.from_dict({"image": [Image.open(secret)] * 2, "label": ["a", "b"]}, features=features).save_to_disk(str(tmp_path / "hf"))
    arrow = next((tmp_path / "hf").glob("*.arrow"))
    table = pa.ipc.open_stream(arrow.read_bytes()).read_all()
    field = table.schema.field("image")
    crafted = table.set_column(
        table.schema.get_field_index("image"), field, pa.array([{"bytes": None, "path": str(secret)}] * 2, field.type)
    )
    with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, crafted.schema) as out:
        out.write_table(crafted)
    with pytest.raises(SourceError, match=r"row 0 \(column 'image'\): .*secret\.png leads to .*secret\.png, outside the data folder"):
        read_source(tmp_path / "hf", SourceOptions())
    assert read_source(tmp_path / "hf", SourceOptions(), ReaderLimits(follow_symlinks=True)).train.image_info[0][1] == (4, 4)


# --- the node's settings -----------------------------------------------------------------------


def test_reader_limits_come_from_the_nodes_config():
    assert limits_from_node_config({}) == ReaderLimits()
    got = limits_from_node_config({"max-image-pixels": "100", "max-array-bytes": 5000, "follow-symlinks": "true"})
    assert got == ReaderLimits(100, 5000, True)
    for bad, key in (({"max-image-pixels": 0}, "max-image-pixels"), ({"max-array-bytes": "lots"}, "max-array-bytes")):
        with pytest.raises(SourceError, match=f"node-config key '{key}' must be a whole number > 0"):
            limits_from_node_config(bad)
    with pytest.raises(SourceError, match="node-config key 'follow-symlinks' must be true or false"):
        limits_from_node_config({"follow-symlinks": "yes please"})
    with pytest.raises(SourceError, match=r"run-config key 'image-size' is 60000; it must be in \[0, 1024\]"):
        options_from_config({"image-size": 60000})


@needs_data("cifar10")
def test_a_nodes_description_reads_within_its_node_config(tmp_path):
    """The plumbing a SuperNode uses: its --node-config limits reach the reader that builds its description."""
    from headway.client.app import description
    from headway.core.config import resolve_settings

    root = _cifar_folder(tmp_path / "data")
    cfg = resolve_settings({"dataset": "local"})
    assert description(cfg, str(root), "mnist-cnn", {})
    with pytest.raises(SourceError, match=r"32x32 = 1024 pixels, more than this node's limit of 1000"):
        description(cfg, str(root), "mnist-cnn", {"max-image-pixels": 1000})
