"""User data sources (core/sources/): every format read from files written here, class names
and tabular scaling agreed across nodes, the schema checks, and one-line errors."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from headway.core.sources import (
    DataSchema,
    SourceError,
    SourceOptions,
    encode,
    fits,
    is_path_source,
    load_user_source,
    merge,
    options_from_config,
    profile,
    read_source,
    write_csv,
    write_image_folder,
    write_npz,
)
from PIL import Image

OPTS = SourceOptions()


def _pixels(rng: np.random.Generator, rgb: bool, size: int = 6) -> np.ndarray:
    return rng.integers(0, 256, size=(size, size, 3) if rgb else (size, size), dtype=np.uint8)


def _image_folder(
    root: Path, counts: dict[str, int], rgb: bool, split: str = "train", seed: int = 0, size: int = 6
) -> dict[Path, np.ndarray]:
    """PNG files root/split/<class>/NN.png, classes created in the order given; {file: pixels}."""
    rng = np.random.default_rng(seed)
    written = {}
    for name, n in counts.items():
        folder = root / split / name if split else root / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            pixels = _pixels(rng, rgb, size)
            Image.fromarray(pixels).save(folder / f"{i:02d}.png")
            written[folder / f"{i:02d}.png"] = pixels
    return written


def _as_chw(pixels: np.ndarray) -> np.ndarray:
    return pixels[None] if pixels.ndim == 2 else pixels.transpose(2, 0, 1)


def _write_table(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(header)
        out.writerows(rows)
    return path


def _encode_alone(path: Path, opts: SourceOptions = OPTS):
    raw = read_source(path, opts)
    schema = merge([profile(raw, opts)], opts)
    return raw, schema, encode(raw, schema, opts, "t")


# --- image folders ---------------------------------------------------------------------------


@pytest.mark.parametrize("rgb", [False, True], ids=["grayscale", "rgb"])
def test_png_folders_read_and_encode_to_the_pixels_written(tmp_path, rgb):
    train = _image_folder(tmp_path, {"a": 15, "b": 12}, rgb)
    test = _image_folder(tmp_path, {"a": 3, "b": 4}, rgb, split="test", seed=1)
    raw, schema, ds = _encode_alone(tmp_path)
    prof = profile(raw, OPTS)
    assert (raw.kind, raw.format, raw.held_out) == ("image", "image-folder", False)
    assert prof["channels"] == (3 if rgb else 1) and prof["size"] == [6, 6]
    assert prof["classes"] == {"a": [15, 3], "b": [12, 4]}
    assert schema.input_shape == ((3 if rgb else 1), 6, 6) and schema.classes == ("a", "b")
    assert ds.x_train.dtype == np.uint8 and ds.x_train.shape == (27, schema.input_shape[0], 6, 6)
    for files, x, y in ((train, ds.x_train, ds.y_train), (test, ds.x_test, ds.y_test)):
        for i, (file, pixels) in enumerate(sorted(files.items())):  # class, then file name
            assert np.array_equal(x[i], _as_chw(pixels)), file
            assert schema.classes[y[i]] == file.parent.name
    json.dumps(prof)  # what a node sends: JSON, no rows


def test_gray_and_rgb_nodes_merge_to_rgb_and_gray_rows_are_replicated(tmp_path):
    gray = _image_folder(tmp_path / "g", {"a": 4, "b": 4}, rgb=False)
    _image_folder(tmp_path / "c", {"a": 4, "b": 4}, rgb=True)
    raws = [read_source(tmp_path / n, OPTS) for n in ("g", "c")]
    schema = merge([profile(r, OPTS) for r in raws], OPTS)
    assert schema.input_shape == (3, 6, 6)
    ds = encode(raws[0], schema, OPTS, "g")
    first = gray[sorted(gray)[0]]
    assert all(np.array_equal(ds.x_train[0][c], first) for c in range(3))


def test_images_of_other_sizes_are_resized_or_refused_naming_image_size(tmp_path):
    _image_folder(tmp_path / "small", {"a": 3, "b": 3}, rgb=False, size=6)
    _image_folder(tmp_path / "big", {"a": 3, "b": 3}, rgb=False, size=9)
    profs = [profile(read_source(tmp_path / n, OPTS), OPTS) for n in ("small", "big")]
    with pytest.raises(SourceError, match="image-size"):
        merge(profs, OPTS)
    opts = SourceOptions(image_size=8)
    schema = merge(profs, opts)
    ds = encode(read_source(tmp_path / "big", opts), schema, opts, "b")
    assert ds.x_train.shape[1:] == ds.x_test.shape[1:] == (1, 8, 8) and len(ds.y_train) + len(ds.y_test) == 6


# --- class names agree by name ---------------------------------------------------------------


def test_class_names_get_one_index_at_every_client(tmp_path):
    """Client A holds cat and dog, client B dog and elk (created in another order): locally dog
    would be index 1 at A and 0 at B; the merged classes give it one index at both."""
    _image_folder(tmp_path / "A", {"dog": 5, "cat": 4}, rgb=False)
    _image_folder(tmp_path / "B", {"elk": 3, "dog": 6}, rgb=True, seed=2)
    raws = [read_source(tmp_path / n, OPTS) for n in ("A", "B")]
    schema = merge([profile(r, OPTS) for r in raws], OPTS)
    assert schema.classes == ("cat", "dog", "elk")
    for raw in raws:
        ds = encode(raw, schema, OPTS, "c")
        assert [schema.classes[i] for i in ds.y_train] == raw.train.labels
        assert set(ds.y_train[np.array(raw.train.labels) == "dog"]) == {1}


def test_whole_number_class_names_sort_numerically():
    profs: list[dict[str, Any]] = [
        {
            "kind": "vector",
            "classes": {"10": [1, 0], "2": [1, 0]},
            "columns": {"x0": {"type": "numeric", "n": 2, "sum": 1.0, "sumsq": 1.0}},
        },
        {"kind": "vector", "classes": {"9": [1, 0], "2": [1, 0]}, "columns": {"x0": {"type": "numeric", "n": 2, "sum": 1.0, "sumsq": 1.0}}},
    ]
    assert merge(profs, OPTS).classes == ("2", "9", "10")
    profs[0]["classes"]["b"] = [1, 0]
    assert merge(profs, OPTS).classes == ("10", "2", "9", "b")


# --- tables ----------------------------------------------------------------------------------

ROWS: list[list[Any]] = [
    [23, "red", "yes"],
    [35, "blue", "no"],
    [41, "red", "no"],
    ["", "green", "yes"],
    [52.5, "blue", "yes"],
    [30, "red", "no"],
]


def test_csv_numeric_and_categorical_columns_encode_in_the_schemas_order(tmp_path):
    a = tmp_path / "a"
    a.mkdir()
    _write_table(a / "train.csv", ["age", "color", "label"], ROWS)
    _write_table(a / "test.csv", ["age", "color", "label"], [[23, "purple", "no"], ["?", "red", "yes"]])
    b = tmp_path / "b"  # the same rows, columns in another order
    b.mkdir()
    _write_table(b / "train.csv", ["label", "color", "age"], [r[::-1] for r in ROWS])
    _write_table(b / "test.csv", ["label", "color", "age"], [["no", "purple", 23], ["yes", "red", "?"]])
    raw_a, schema, ds_a = _encode_alone(a)
    raw_b, schema_b, ds_b = _encode_alone(b)
    assert schema == schema_b and raw_a.format == "csv"
    ages = np.array([23, 35, 41, 52.5, 30])
    mean, std = ages.mean(), ages.std() + 1e-8
    assert schema.numeric == (("age", pytest.approx(mean), pytest.approx(std)),)
    assert schema.categorical == (("color", ("blue", "green", "red")),) and schema.input_shape == (4,)
    assert schema.classes == ("no", "yes")
    assert np.array_equal(ds_a.x_train, ds_b.x_train) and np.array_equal(ds_a.x_test, ds_b.x_test)
    assert np.allclose(
        ds_a.x_train[:, 0], [(23 - mean) / std, (35 - mean) / std, (41 - mean) / std, 0, (52.5 - mean) / std, (30 - mean) / std], atol=1e-6
    )
    assert ds_a.x_train[:, 1:].tolist()[:2] == [[0, 0, 1], [1, 0, 0]]
    assert ds_a.x_test.tolist()[0][1:] == [0, 0, 0]  # an unseen level: all zeros
    assert ds_a.x_test[1, 0] == 0  # a missing number: the mean
    assert ds_a.y_train.tolist() == [1, 0, 0, 1, 1, 0] and ds_a.x_train.dtype == np.float32


def test_column_order_is_the_schemas_not_the_files(tmp_path):
    """Two sites whose CSVs order four columns differently encode alike: numeric columns sorted by
    name, then categorical ones, whatever order the files or the profiles list them in."""
    header = ["weight", "city", "label", "age", "color"]
    rows = [[70 + i, "c" + "xyz"[i % 3], "ab"[i % 2], 20 + 3 * i, "rgb"[i % 3 - 1]] for i in range(12)]
    path_a = _write_table(tmp_path / "a.csv", header, rows)
    order = [3, 4, 2, 1, 0]
    path_b = _write_table(tmp_path / "b.csv", [header[j] for j in order], [[r[j] for j in order] for r in rows])
    opts = SourceOptions(test_fraction=0.25)
    raw_a, raw_b = read_source(path_a, opts), read_source(path_b, opts)
    prof_a, prof_b = profile(raw_a, opts), profile(raw_b, opts)
    assert list(prof_a["columns"]) == list(prof_b["columns"]) == ["age", "city", "color", "weight"]
    prof_b["columns"] = dict(reversed(prof_b["columns"].items()))  # a node may send its columns in any order
    schema = merge([prof_b, prof_a], opts)
    assert [c for c, _, _ in schema.numeric] == ["age", "weight"] and [c for c, _ in schema.categorical] == ["city", "color"]
    assert schema == merge([prof_a], opts)
    ds_a, ds_b = encode(raw_a, schema, opts, "a"), encode(raw_b, schema, opts, "b")
    assert np.array_equal(ds_a.x_train, ds_b.x_train) and np.array_equal(ds_a.x_test, ds_b.x_test)


def test_merging_profiles_scales_with_the_pooled_training_rows(tmp_path):
    rng = np.random.default_rng(0)
    sites = [rng.normal(10, 3, size=(40, 2)), rng.normal(-5, 1, size=(25, 2))]
    raws = []
    for k, rows in enumerate(sites):
        path = _write_table(
            tmp_path / f"site{k}.csv",
            ["u", "v", "kind", "label"],
            [[repr(float(u)), repr(float(v)), f"k{k}{i % 2}", "a" if i % 3 else "b"] for i, (u, v) in enumerate(rows)],
        )
        raws.append(read_source(path, SourceOptions(test_fraction=0.25, seed=1)))
    schema = merge([profile(r, OPTS) for r in raws], OPTS)
    pooled = np.concatenate([np.column_stack([np.array(r.train.x[c], dtype=float) for c in ("u", "v")]) for r in raws])
    assert len(pooled) < 65  # training rows only: the held-out test rows are not in the moments
    for j, (name, mean, std) in enumerate(schema.numeric):
        assert name == "uv"[j]
        assert mean == pytest.approx(pooled[:, j].mean(), rel=1e-12, abs=1e-12)
        assert std == pytest.approx(pooled[:, j].std() + 1e-8, rel=1e-12)
    own = np.array(raws[1].train.x["u"], dtype=float)
    assert abs(own.mean() - schema.numeric[0][1]) > 1  # not the site's own scaling
    ds = encode(raws[1], schema, OPTS, "s1")
    assert np.allclose(ds.x_train[:, 0], (own - schema.numeric[0][1]) / schema.numeric[0][2], atol=1e-6)
    assert schema.categorical == (("kind", ("k00", "k01", "k10", "k11")),)


def test_parquet_reads_like_the_same_csv(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"age": [r[0] if r[0] != "" else None for r in ROWS], "color": [r[1] for r in ROWS], "label": [r[2] for r in ROWS]}),
        tmp_path / "t.parquet",
    )
    _write_table(tmp_path / "t.csv", ["age", "color", "label"], ROWS)
    opts = SourceOptions(test_fraction=0.34, seed=5)
    raw_p, schema_p, ds_p = _encode_alone(tmp_path / "t.parquet", opts)
    _, schema_c, ds_c = _encode_alone(tmp_path / "t.csv", opts)
    assert raw_p.format == "parquet" and raw_p.held_out
    assert schema_p == schema_c
    assert np.array_equal(ds_p.x_train, ds_c.x_train) and np.array_equal(ds_p.y_test, ds_c.y_test)


def test_natural_column_becomes_a_row_attribute_not_a_feature(tmp_path):
    path = _write_table(tmp_path / "t.csv", ["site", "age", "label"], [["s1", 1, "a"], ["s2", 2, "b"], ["s1", 3, "a"], ["s2", 4, "b"]])
    opts = SourceOptions(natural_column="site", test_fraction=0.5)
    ds, schema = load_user_source(str(path), opts, "t")
    assert schema.columns == {"age": "numeric"} and ds.natural_column == "site"
    assert sorted([*ds.attrs_train["site"], *ds.attrs_test["site"]]) == ["s1", "s1", "s2", "s2"]


# --- npz and Hugging Face --------------------------------------------------------------------


def test_npz_vectors_are_numeric_columns(tmp_path):
    rng = np.random.default_rng(0)
    x, xt = rng.normal(size=(30, 3)), rng.normal(size=(5, 3))
    np.savez(tmp_path / "v.npz", x_train=x, y_train=np.arange(30) % 3, x_test=xt, y_test=np.arange(5) % 3)
    raw, schema, ds = _encode_alone(tmp_path / "v.npz")
    assert raw.kind == "vector" and schema.classes == ("0", "1", "2")
    assert [c for c, _, _ in schema.numeric] == ["x0", "x1", "x2"]
    assert np.allclose(ds.x_test, (xt - x.mean(0)) / (x.std(0) + 1e-8), atol=1e-5)
    assert ds.y_test.tolist() == [0, 1, 2, 0, 1]


@pytest.mark.parametrize("shape", [(12, 5, 5), (12, 3, 5, 5)], ids=["n-h-w", "n-c-h-w"])
def test_npz_images_keep_their_pixels_and_resize_with_image_size(tmp_path, shape):
    x = np.random.default_rng(0).integers(0, 256, size=shape, dtype=np.uint8)
    (tmp_path / "one").mkdir()
    np.savez(tmp_path / "one" / "d.npz", x_train=x, y_train=np.array(["a", "b"] * 6))
    opts = SourceOptions(test_fraction=0.25)
    raw, schema, ds = _encode_alone(tmp_path / "one", opts)  # a folder with one .npz
    rows = np.concatenate([ds.x_train, ds.x_test])
    expect = x.reshape(12, -1, 5, 5)
    assert raw.kind == "image" and raw.held_out and schema.input_shape == (expect.shape[1], 5, 5)
    assert sorted(r.tobytes() for r in rows) == sorted(r.tobytes() for r in expect)
    small = SourceOptions(image_size=3, test_fraction=0.25)
    assert _encode_alone(tmp_path / "one", small)[2].x_train.shape[2:] == (3, 3)


def test_huggingface_image_dataset_with_class_labels(tmp_path):
    hf = pytest.importorskip("datasets")
    rng = np.random.default_rng(0)
    pixels = [_pixels(rng, rgb=True) for _ in range(10)]
    features = hf.Features({"image": hf.Image(), "label": hf.ClassLabel(names=["cat", "dog"])})
    hf.Dataset.from_dict(
        {"image": [Image.fromarray(p) for p in pixels], "label": [i % 2 for i in range(10)]}, features=features
    ).save_to_disk(str(tmp_path / "hf"))
    raw, schema, ds = _encode_alone(tmp_path / "hf", SourceOptions(test_fraction=0.2))
    assert (raw.kind, raw.format) == ("image", "huggingface") and schema.classes == ("cat", "dog")
    assert schema.input_shape == (3, 6, 6)
    by_bytes = {_as_chw(p).tobytes(): ("cat", "dog")[i % 2] for i, p in enumerate(pixels)}
    assert (len(ds.y_train), len(ds.y_test)) == (8, 2)
    for x, y in ((ds.x_train, ds.y_train), (ds.x_test, ds.y_test)):
        assert len(x) == len(y) and all(by_bytes[row.tobytes()] == schema.classes[label] for row, label in zip(x, y))
    assert len(ds.y_test) == 2


def test_huggingface_table_dataset_dict_uses_its_train_and_test_splits(tmp_path):
    hf = pytest.importorskip("datasets")

    def split(rows):
        return hf.Dataset.from_dict({"age": [r[0] or None for r in rows], "color": [r[1] for r in rows], "label": [r[2] for r in rows]})

    hf.DatasetDict({"train": split(ROWS[:4]), "test": split(ROWS[4:])}).save_to_disk(str(tmp_path / "hf"))
    raw, schema, ds = _encode_alone(tmp_path / "hf")
    assert (raw.kind, raw.format, raw.held_out) == ("table", "huggingface", False)
    assert schema.columns == {"age": "numeric", "color": "categorical"} and len(ds.y_test) == 2


def test_missing_optional_packages_say_how_to_install(tmp_path, monkeypatch):
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    monkeypatch.setitem(sys.modules, "datasets", None)
    for path in (tmp_path / "t.parquet", tmp_path / "hf"):
        with pytest.raises(SourceError, match=r"pip install -e '\.\[data\]'") as err:
            read_source(path, OPTS)
        assert str(path) in str(err.value)


# --- the schema's checks ---------------------------------------------------------------------


def test_fits_refuses_classes_outside_the_list_and_other_columns(tmp_path):
    _image_folder(tmp_path / "A", {"cat": 3, "dog": 3}, rgb=False)
    _image_folder(tmp_path / "B", {"cat": 3, "elk": 3}, rgb=False)
    opts = SourceOptions(classes=("cat", "dog"))
    prof_a, prof_b = (profile(read_source(tmp_path / n, opts), opts) for n in ("A", "B"))
    schema = merge([prof_a], opts)
    assert fits(prof_a, schema) is None
    assert "classes not in the run's list" in str(fits(prof_b, schema)) and "'elk'" in str(fits(prof_b, schema))
    t1 = _write_table(tmp_path / "t1.csv", ["age", "color", "label"], ROWS)
    t2 = _write_table(tmp_path / "t2.csv", ["age", "size", "label"], [[1, "s", "yes"], [2, "m", "no"]])
    table = merge([profile(read_source(t1, OPTS), OPTS)], OPTS)
    reason = str(fits(profile(read_source(t2, OPTS), OPTS), table))
    assert "missing ['color']" in reason and "extra ['size']" in reason
    assert "kind" in str(fits(prof_a, table))
    t3 = _write_table(tmp_path / "t3.csv", ["age", "color", "label"], [[1, 5, "yes"], [2, 6, "no"]])
    assert "column 'color' is numeric here and categorical" in str(fits(profile(read_source(t3, OPTS), OPTS), table))


def test_labels_outside_a_given_class_list_are_refused_by_encode(tmp_path):
    _image_folder(tmp_path, {"cat": 3, "elk": 3}, rgb=False)
    opts = SourceOptions(classes=("cat", "dog"))
    raw = read_source(tmp_path, opts)
    with pytest.raises(SourceError, match=r"\['elk'\] are not among the run's classes"):
        encode(raw, merge([profile(raw, opts)], opts), opts, "x")


def test_merge_refuses_nodes_that_disagree(tmp_path):
    t1 = _write_table(tmp_path / "t1.csv", ["age", "color", "label"], ROWS)
    t2 = _write_table(tmp_path / "t2.csv", ["age", "color", "label"], [[1, 5, "yes"], [2, 6, "no"]])
    t3 = _write_table(tmp_path / "t3.csv", ["age", "label"], [[1, "yes"], [2, "no"]])
    p1, p2, p3 = (profile(read_source(t, OPTS), OPTS) for t in (t1, t2, t3))
    with pytest.raises(SourceError, match="column 'color' is numeric at some nodes and categorical"):
        merge([p1, p2], OPTS)
    with pytest.raises(SourceError, match="column 'color' is missing in node data"):
        merge([p1, p3], OPTS)
    with pytest.raises(SourceError, match="disagree on the kind"):
        merge([p1, {"kind": "image", "classes": {"a": [1, 0]}, "channels": 1, "size": [4, 4]}], OPTS)


GOOD_TABLE = {
    "kind": "table",
    "format": "csv",
    "classes": {"a": [3, 1]},
    "columns": {"u": {"type": "numeric", "n": 3, "sum": 3.0, "sumsq": 5.0}, "c": {"type": "categorical", "levels": ["x"]}},
}
GOOD_IMAGE = {"kind": "image", "format": "image-folder", "classes": {"a": [3, 1]}, "channels": 1, "size": [4, 4]}


@pytest.mark.parametrize(
    "bad",
    [
        "not a dict",
        {**GOOD_TABLE, "kind": "audio"},
        {**GOOD_TABLE, "classes": ["a"]},
        {**GOOD_TABLE, "classes": {"a": [-1, 0]}},
        {**GOOD_TABLE, "classes": {"a": [True, 0]}},
        {**GOOD_TABLE, "classes": {"a": [1.5, 0]}},
        {**GOOD_TABLE, "classes": {"a": [1]}},
        {**GOOD_TABLE, "classes": {"a" * 5000: [1, 0]}},
        {**GOOD_TABLE, "columns": {"u": {"type": "numeric", "n": -3, "sum": 3.0, "sumsq": 5.0}}},
        {**GOOD_TABLE, "columns": {"u": {"type": "numeric", "n": 3, "sum": float("inf"), "sumsq": 5.0}}},
        {**GOOD_TABLE, "columns": {"u": {"type": "numeric", "n": 3, "sum": float("nan"), "sumsq": 5.0}}},
        {**GOOD_TABLE, "columns": {"u": {"type": "numeric", "n": 3, "sum": 3.0, "sumsq": "5"}}},
        {**GOOD_TABLE, "columns": {"u": {"type": "numeric", "n": 3, "sum": 3.0, "sumsq": -5.0}}},
        {**GOOD_TABLE, "columns": {"c": {"type": "categorical", "levels": "x"}}},
        {**GOOD_TABLE, "columns": {"c": {"type": "categorical", "levels": [1]}}},
        {**GOOD_TABLE, "columns": {"c": {"type": "date"}}},
        {**GOOD_TABLE, "columns": {}},
        {**GOOD_TABLE, "columns": None},
        {**GOOD_IMAGE, "channels": 2},
        {**GOOD_IMAGE, "channels": True},
        {**GOOD_IMAGE, "size": [0, 4]},
        {**GOOD_IMAGE, "size": "4x4"},
    ],
)
def test_merge_refuses_malformed_profiles_from_untrusted_nodes(bad):
    good = GOOD_IMAGE if isinstance(bad, dict) and bad.get("kind") == "image" else GOOD_TABLE
    merge([good], OPTS)  # the unmutated profile is fine
    with pytest.raises(SourceError, match="node data profile 1 is malformed") as err:
        merge([good, bad], OPTS)
    assert "\n" not in str(err.value)
    assert str(fits(bad, merge([good], OPTS))).startswith("malformed profile")


def test_schema_round_trips_through_json(tmp_path):
    _, schema, _ = _encode_alone(_write_table(tmp_path / "t.csv", ["age", "color", "label"], ROWS))
    assert DataSchema.from_json(schema.to_json()) == schema
    with pytest.raises(SourceError, match="malformed"):
        DataSchema.from_json('{"kind": "table"}')


# --- errors and the held-out test split ------------------------------------------------------


def test_a_corrupt_image_is_named_in_one_line(tmp_path):
    _image_folder(tmp_path, {"a": 3, "b": 3}, rgb=False)
    (tmp_path / "train" / "b" / "broken.png").write_bytes(b"this is not a png")
    with pytest.raises(SourceError, match=r"broken\.png: not a readable image") as err:
        read_source(tmp_path, OPTS)
    assert "\n" not in str(err.value)
    good = (tmp_path / "train" / "a" / "00.png").read_bytes()
    (tmp_path / "train" / "b" / "broken.png").write_bytes(good[: len(good) // 2])  # the header reads, the pixels do not
    raw = read_source(tmp_path, OPTS)
    with pytest.raises(SourceError, match=r"broken\.png: cannot decode the image") as err:
        encode(raw, merge([profile(raw, OPTS)], OPTS), OPTS, "x")
    assert "\n" not in str(err.value)


def test_a_missing_label_column_is_named_with_the_columns_found(tmp_path):
    path = _write_table(tmp_path / "t.csv", ["age", "color", "class"], ROWS)
    with pytest.raises(SourceError) as err:
        read_source(path, OPTS)
    text = str(err.value)
    assert "t.csv" in text and "no label column 'label'" in text and "columns found: age, color, class" in text
    assert "label-column" in text and "\n" not in text
    assert set(read_source(path, SourceOptions(label_column="class")).train.labels) == {"yes", "no"}


def _npz_without_x_train(folder: Path) -> Path:
    np.savez(folder / "x.npz", x=np.zeros(3))
    return folder / "x.npz"


@pytest.mark.parametrize(
    "setup, match",
    [
        (lambda p: p / "nothing-here", "no such file or folder"),
        (lambda p: (p / "d").mkdir() or p / "d", "no data source found"),
        (_npz_without_x_train, "npz without x_train"),
        (lambda p: _write_table(p / "r.csv", ["a", "label"], [[1, "x"], [1, 2, 3]]), r"r\.csv line 3: 3 fields"),
    ],
)
def test_other_bad_sources_give_one_line_naming_the_path(tmp_path, setup, match):
    path = setup(tmp_path)
    with pytest.raises(SourceError, match=match) as err:
        read_source(path, OPTS)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_a_source_without_test_split_holds_out_a_seeded_fraction(tmp_path):
    rows = [[i, "a" if i % 4 else "b"] for i in range(80)]
    path = _write_table(tmp_path / "t.csv", ["id", "label"], rows)
    ids = lambda raw: (sorted(raw.train.x["id"], key=int), sorted(raw.test.x["id"], key=int))  # noqa: E731
    first = read_source(path, SourceOptions(test_fraction=0.25, seed=3))
    train, test = ids(first)
    assert first.held_out and len(test) == 20 and not set(train) & set(test) and len(train) + len(test) == 80
    assert sum(1 for r in first.test.labels if r == "b") == 5  # stratified: a quarter of each class
    assert ids(read_source(path, SourceOptions(test_fraction=0.25, seed=3))) == (train, test)  # same seed, same rows
    assert ids(read_source(path, SourceOptions(test_fraction=0.25, seed=4)))[1] != test
    ds, _ = load_user_source(str(path), SourceOptions(test_fraction=0.25, seed=3), "t")
    assert len(ds.y_test) == 20


# --- options, paths, writers -----------------------------------------------------------------


def test_options_from_a_run_config():
    opts = options_from_config(
        {
            "label-column": "y",
            "image-size": "32",
            "channels": 1,
            "test-fraction": 0.1,
            "seed": 7,
            "natural-column": "site",
            "classes": "cat, dog",
        }
    )
    assert opts == SourceOptions("y", 32, 1, 0.1, 7, "site", ("cat", "dog"))
    assert options_from_config({}) == SourceOptions()
    for bad, key in (({"channels": 2}, "channels"), ({"image-size": "x"}, "image-size"), ({"classes": "a,a"}, "classes")):
        with pytest.raises(SourceError, match=key):
            options_from_config(bad)


def test_path_sources_are_told_from_built_in_names():
    assert all(is_path_source(n) for n in ("./data", "~/x", "site/a", "t.csv", "d.parquet", "a.npz", "C:\\d"))
    assert not any(is_path_source(n) for n in ("mnist", "uci-adult", "local"))


def test_writers_read_back_to_the_same_rows(tmp_path):
    rng = np.random.default_rng(0)
    img, img_t = rng.integers(0, 256, (6, 3, 4, 4), dtype=np.uint8), rng.integers(0, 256, (2, 3, 4, 4), dtype=np.uint8)
    names, names_t = ["b", "a", "b", "a", "a", "b"], ["a", "b"]
    vec, vec_t = rng.normal(size=(6, 2)).astype(np.float32), rng.normal(size=(2, 2)).astype(np.float32)
    npz = read_source(write_npz(tmp_path / "n", img, names, img_t, names_t), OPTS)
    assert np.array_equal(npz.train.x, img) and npz.train.labels == names and npz.test.labels == names_t
    png = read_source(write_image_folder(tmp_path / "i", img, names, img_t, names_t), OPTS)
    _, schema, ds = _encode_alone(tmp_path / "i")
    order = np.argsort(names, kind="stable")  # read back class by class
    assert np.array_equal(ds.x_train, img[order]) and png.train.labels == sorted(names)
    table = read_source(write_csv(tmp_path / "c", vec, names, vec_t, names_t), OPTS)
    assert np.array_equal(np.column_stack([np.array(table.train.x[c], dtype=np.float64) for c in ("x0", "x1")]).astype(np.float32), vec)
    assert table.test.labels == names_t


# --- what pandas' to_csv adds: an index column (issue 38, tester's odd.csv) -------------------


def _sorted_by_class(path: Path, index_header: str, shuffle: bool = False) -> Path:
    """A table sorted by class (as load_wine's frame is), written the way pandas' to_csv writes it by default:
    the frame's index first, under ``index_header``; features that say nothing of the class; a constant column."""
    rng = np.random.default_rng(0)
    order = rng.permutation(30) if shuffle else np.arange(30)
    rows = [[int(i), f"{rng.normal():.4f}", f"{rng.normal():.4f}", "1", f"c{i // 10}"] for i in order]
    return _write_table(path, [index_header, "f1", "f2", "const", "label"], rows)


@pytest.mark.parametrize("header", ["", "Unnamed: 0"], ids=["to_csv", "read_csv-then-to_csv"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_a_pandas_index_column_is_left_out_with_one_notice(tmp_path, caplog, header, shuffle):
    """The row numbers of a file sorted by class give the class away (the tester's wine: accuracy 1.0 in round 1):
    never a feature, and the user is told which column was left out and how to save without it."""
    path = _sorted_by_class(tmp_path / "t.csv", header, shuffle)
    with caplog.at_level("INFO", logger="headway"):
        raw, schema, ds = _encode_alone(path)
    assert sorted(raw.train.x) == ["const", "f1", "f2"] and [c for c, _, _ in schema.numeric] == ["const", "f1", "f2"]
    assert ds.x_train.shape[1] == 3
    notices = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert len(notices) == 1 and f"column {header!r} left out" in notices[0], notices
    assert "row numbers (0..29)" in notices[0] and "to_csv(index=False)" in notices[0]
    constant = [r.getMessage() for r in caplog.records if "one value in every training row" in r.getMessage()]
    assert len(constant) == 1 and "'const'" in constant[0] and "'f1'" not in constant[0]


def test_only_unnamed_row_numbers_are_taken_for_an_index(tmp_path, caplog):
    """A column the user named stays a feature whatever it holds ('id' 0..n-1 included: the user chose it), and
    so does one pandas named 'Unnamed: 2' over real values; a header-less column of data is left out, said so."""
    rows = [[i, f"{0.5 * i}", i % 3, f"{i % 4}.5", f"c{i % 2}"] for i in range(12)]
    path = _write_table(tmp_path / "t.csv", ["id", "Unnamed: 1", "", "Unnamed: 3", "label"], rows)
    with caplog.at_level("INFO", logger="headway"):
        raw = read_source(path, OPTS)
    assert sorted(raw.train.x) == ["Unnamed: 1", "Unnamed: 3", "id"]
    assert [r.getMessage().split(": ", 1)[1] for r in caplog.records if "left out" in r.getMessage()] == [
        "column '' left out of the features: a column needs a header to be a feature"
    ]


def test_split_of_a_pandas_csv_writes_node_files_without_its_index(tmp_path, capsys):
    """`headway split` of a to_csv file: the notice on stderr, and no node's CSV carries the index column."""
    from headway.cli import main

    path = _sorted_by_class(tmp_path / "t.csv", "")
    argv = ["split", str(path), "--format", "csv", "--partition", "iid", "--num-clients", "2", "--out", str(tmp_path / "nodes")]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert err.count("left out of the features") == 1 and "row numbers (0..29)" in err
    for k in range(2):
        with open(tmp_path / "nodes" / f"node-{k}" / "train.csv", newline="") as fh:
            assert next(csv.reader(fh)) == ["f1", "f2", "const", "label"]
