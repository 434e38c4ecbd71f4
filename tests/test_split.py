"""`headway split` (headway/split.py): node folders that read back, through headway.core.sources, to
exactly the rows and labels of the in-memory partition."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from headway.core.data import load_dataset
from headway.core.partition import make_partition
from headway.core.sources import SourceOptions, encode, merge, profile, read_source

from headway.split import run_config, split

ROOT = Path(__file__).resolve().parents[1]
OPTS = SourceOptions()  # image_size 0: the nodes' own 28x28


@pytest.fixture
def mnist_cfg(data_dir):
    return run_config("mnist", {"partition": "dirichlet", "num-clients": 3, "train-fraction": 0.01, "seed": 0, "data-dir": data_dir})


def _read_nodes(folders: list[Path]):
    """Every node folder read and encoded with the schema merged from all the nodes' profiles."""
    raws = [read_source(f, OPTS) for f in folders]
    schema = merge([profile(r, OPTS) for r in raws], OPTS)
    return [encode(r, schema, OPTS, f.name) for r, f in zip(raws, folders)], schema


def test_split_npz_reads_back_to_the_in_memory_partition(tmp_path, mnist_cfg):
    folders = split("mnist", mnist_cfg, tmp_path / "nodes", "npz")
    assert [f.name for f in folders] == ["node-0", "node-1", "node-2"]
    ds = load_dataset("mnist", mnist_cfg.data_dir, mnist_cfg.seed)
    part = make_partition(ds, mnist_cfg)
    nodes, schema = _read_nodes(folders)
    assert schema.input_shape == (1, 28, 28)
    classes = np.array(schema.classes)
    for k, node in enumerate(nodes):
        assert node.x_train.dtype == np.uint8
        assert np.array_equal(node.x_train, ds.x_train[part.train[k]]) and np.array_equal(node.x_test, ds.x_test[part.test[k]])
        assert classes[node.y_train].tolist() == [str(c) for c in ds.y_train[part.train[k]]]
        assert classes[node.y_test].tolist() == [str(c) for c in ds.y_test[part.test[k]]]


@pytest.mark.slow
def test_split_images_writes_png_class_folders_with_the_same_rows(tmp_path, mnist_cfg):
    folders = split("mnist", mnist_cfg, tmp_path / "nodes", "images")
    ds = load_dataset("mnist", mnist_cfg.data_dir, mnist_cfg.seed)
    part = make_partition(ds, mnist_cfg)
    nodes, schema = _read_nodes(folders)
    assert (folders[0] / "train").is_dir() and any((folders[0] / "test").glob("*/*.png"))
    rows = lambda x, y, names: sorted(zip((names[i] for i in y), (r.tobytes() for r in x)))  # noqa: E731
    as_str = np.array([str(c) for c in range(10)])
    for k, node in enumerate(nodes):  # read back class by class: the same rows, in another order
        assert rows(node.x_train, node.y_train, schema.classes) == rows(ds.x_train[part.train[k]], ds.y_train[part.train[k]], as_str)
        assert rows(node.x_test, node.y_test, schema.classes) == rows(ds.x_test[part.test[k]], ds.y_test[part.test[k]], as_str)


@pytest.mark.slow
def test_split_through_the_command_line(tmp_path, data_dir):
    out = tmp_path / "nodes"
    cmd = [
        sys.executable,
        "-m",
        "headway",
        "split",
        "mnist",
        "--partition",
        "dirichlet",
        "--num-clients",
        "3",
        "--out",
        str(out),
        "--train-fraction",
        "0.01",
        "--set",
        f"data-dir={data_dir}",
        "--set",
        "seed=1",
    ]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wrote 3 node folders" in done.stdout
    assert all((out / f"node-{k}" / "data.npz").is_file() for k in range(3)) and not (out / "node-3").exists()


def test_split_command_refuses_to_write_over_node_folders(tmp_path, data_dir, capsys):
    from headway.cli import main

    argv = [
        "split",
        "mnist",
        "--partition",
        "iid",
        "--num-clients",
        "2",
        "--out",
        str(tmp_path),
        "--train-fraction",
        "0.01",
        "--set",
        f"data-dir={data_dir}",
    ]
    (tmp_path / "node-1").mkdir()
    (tmp_path / "node-1" / "old.png").write_bytes(b"")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "node-1 already holds files" in err and err.count("\n") == 1
    assert main([*argv[:-2], "--set", "data-dir"]) == 2 and "not KEY=VALUE" in capsys.readouterr().err


def test_split_refuses_formats_that_cannot_hold_the_data(tmp_path, mnist_cfg):
    with pytest.raises(ValueError, match="--format csv is for tables"):
        split("mnist", mnist_cfg, tmp_path / "n", "csv")


def test_split_of_a_user_table_keeps_its_columns_as_csv(tmp_path):
    source = tmp_path / "people.csv"
    with open(source, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["color", "age", "y"])
        out.writerows([["red" if i % 3 else "blue", i, "a" if i % 2 else "b"] for i in range(40)])
    cfg = run_config(str(source), {"partition": "iid", "num-clients": 2, "train-fraction": 1.0, "label-column": "y", "test-fraction": 0.25})
    folders = split(str(source), cfg, tmp_path / "nodes", "csv")
    opts = SourceOptions(label_column="y")
    raws = [read_source(f, opts) for f in folders]
    assert len(raws) == 2 and all(set(r.train.x) == {"color", "age"} and not r.held_out for r in raws)
    ages = sorted(int(a) for r in raws for a in r.train.x["age"])
    whole = read_source(source, SourceOptions(label_column="y", test_fraction=0.25))
    assert ages == sorted(int(a) for a in whole.train.x["age"])  # every training row once
    assert all(
        y == ("a" if int(a) % 2 else "b") for r in raws for a, y in zip(r.train.x["age"], r.train.labels)
    )  # labels stay with their rows


def _image_folder(root: Path, per_class: int = 15) -> Path:
    """A user's PNG class folders (no test split of their own): 3 classes of 8x8 grey images."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for c in ("cat", "dog", "owl"):
        (root / c).mkdir(parents=True)
        for i in range(per_class):
            Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def test_split_of_a_user_folder_keeps_every_row_and_says_what_each_node_got(tmp_path, capsys):
    from headway.cli import main

    source = _image_folder(tmp_path / "pics")  # 45 images: 36 training rows, 9 held out for test (test-fraction 0.2)
    out = str(tmp_path / "nodes") + "/"  # a trailing slash, as a user types it
    assert main(["split", str(source), "--partition", "iid", "--num-clients", "3", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "training rows per node: 12, 12, 12 (36 over 3 nodes); train-fraction=1 (36 of 36 training rows)" in printed
    assert "test rows per node: 3, 3, 3 (9 over 3 nodes)" in printed and "//" not in printed
    nodes = [read_source(tmp_path / "nodes" / f"node-{k}", OPTS) for k in range(3)]
    assert [len(n.train.labels) for n in nodes] == [12, 12, 12]  # on disk too: not the built-ins' 5 %
    # asked for, a share is still taken, and said
    argv = ["split", str(source), "--partition", "iid", "--num-clients", "3", "--out", out, "--train-fraction", "0.5"]
    assert main(argv) == 2 and "pass --overwrite" in capsys.readouterr().err
    assert main([*argv, "--overwrite"]) == 0
    assert "train-fraction=0.5 (18 of 36 training rows)" in capsys.readouterr().out
    assert sum(len(read_source(tmp_path / "nodes" / f"node-{k}", OPTS).train.labels) for k in range(3)) == 18  # old rows gone


def test_split_overwrite_never_follows_a_linked_node_folder(tmp_path):
    source = _image_folder(tmp_path / "pics", per_class=5)
    elsewhere = tmp_path / "precious"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    (tmp_path / "nodes").mkdir()
    (tmp_path / "nodes" / "node-0").symlink_to(elsewhere)
    cfg = run_config(str(source), {"partition": "iid", "num-clients": 2})
    with pytest.raises(FileExistsError, match="not a folder"):
        split(str(source), cfg, tmp_path / "nodes", "npz", overwrite=True)
    assert (elsewhere / "keep.txt").read_text() == "mine"
