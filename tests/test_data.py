from pathlib import Path

import numpy as np
import pytest
import torch
from headway.core.data import SPECS, DatasetMissingError, augment_batch, load_dataset, make_circle, spec_of, to_tensors


def test_mnist_from_the_idx_files(data_dir):
    ds = load_dataset("mnist", data_dir)
    assert ds.x_train.shape == (60000, 1, 28, 28) and ds.x_test.shape == (10000, 1, 28, 28)
    assert np.bincount(ds.y_train).tolist()[:3] == [5923, 6742, 5958]  # the published class counts
    x, _ = to_tensors(ds, ds.x_train[:2000], ds.y_train[:2000])
    assert abs(float(x.mean())) < 0.1 and abs(float(x.std()) - 1.0) < 0.1  # normalized


def test_mnist_from_torchvisions_uncompressed_raw_files(data_dir, tmp_path):
    """A torchvision data dir keeps MNIST/raw/*-ubyte uncompressed; those load like the .gz files."""
    import gzip

    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for f in Path(data_dir, "mnist").glob("*-ubyte.gz"):
        (raw / f.name.removesuffix(".gz")).write_bytes(gzip.decompress(f.read_bytes()))
    ds, ref = load_dataset("mnist", str(tmp_path)), load_dataset("mnist", data_dir)
    assert np.array_equal(ds.x_train, ref.x_train) and np.array_equal(ds.y_test, ref.y_test)


def test_cifar10_from_the_npz_pair(data_dir):
    ds = load_dataset("cifar10", data_dir)
    assert ds.x_train.shape == (50000, 3, 32, 32) and ds.augment
    assert np.bincount(ds.y_test).tolist() == [1000] * 10
    mean = ds.x_train[:5000].reshape(5000, 3, -1).mean(axis=(0, 2)) / 255
    assert np.allclose(mean, [0.4914, 0.4822, 0.4465], atol=0.02)


def test_uci_adult_keeps_protected_attributes(data_dir):
    ds = load_dataset("uci-adult", data_dir)
    assert len(ds.y_train) == 32561 and len(ds.y_test) == 16281
    assert set(ds.attrs_train) == {"race", "sex"} and set(np.unique(ds.attrs_test["sex"])) == {"Female", "Male"}
    assert 0.2 < ds.y_train.mean() < 0.3  # about 24 % earn >50K


def test_gas_turbine_is_a_regression_with_one_source_per_year(data_dir):
    ds = load_dataset("uci-gas-turbine", data_dir)
    assert ds.task == "regression" and len(ds.y_train) + len(ds.y_test) == 36733
    assert sorted(np.unique(ds.attrs_train["year"])) == ["2011", "2012", "2013", "2014", "2015"]
    assert ds.y_train.shape[1] == 2  # CO and NOx


def test_gas_turbine_holds_out_a_fifth_of_every_year_drawn_by_the_seed(data_dir):
    a, b = load_dataset("uci-gas-turbine", data_dir, seed=0), load_dataset("uci-gas-turbine", data_dir, seed=1)
    for year in np.unique(a.attrs_train["year"]):
        n_test = int((a.attrs_test["year"] == year).sum())
        n_all = n_test + int((a.attrs_train["year"] == year).sum())
        assert abs(n_test - 0.2 * n_all) <= 0.5, year
    assert len(a.y_test) == len(b.y_test) and not np.array_equal(a.y_test, b.y_test)  # another seed, other rows
    assert load_dataset("uci-gas-turbine", data_dir, seed=0) is a


def test_specs_match_the_loaded_data(data_dir):
    for name in ("mnist", "cifar10", "uci-adult", "uci-gas-turbine", "circle"):
        assert spec_of(load_dataset(name, data_dir)) == SPECS[name], name


def test_circle_labels_follow_the_radius():
    ds = make_circle(80, 200, seed=3)
    r = np.linalg.norm(np.concatenate([ds.x_train, ds.x_test]), axis=1)
    y = np.concatenate([ds.y_train, ds.y_test])
    assert np.array_equal(y == 1, r < 26 / 7) and np.abs(ds.x_train).max() <= 5


def test_missing_data_set_names_dataset_dirs_and_files(tmp_path: Path, monkeypatch):
    monkeypatch.setattr("torchvision.datasets.MNIST", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("offline")))
    with pytest.raises(DatasetMissingError) as err:
        load_dataset("mnist", str(tmp_path / "empty"))
    msg = str(err.value)
    assert "'mnist'" in msg and str(tmp_path / "empty") in msg and "train-images-idx3-ubyte.gz" in msg
    with pytest.raises(DatasetMissingError, match="adult.data"):
        load_dataset("uci-adult", str(tmp_path))


def test_augment_crops_and_flips_within_the_padding():
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).view(2, 3, 8, 8)
    out = augment_batch(x, torch.Generator().manual_seed(0), pad=2)
    assert out.shape == x.shape
    for i in range(2):
        padded = torch.nn.functional.pad(x[i], (2, 2, 2, 2))
        windows = [padded[:, a : a + 8, b : b + 8] for a in range(5) for b in range(5)]
        assert any(torch.equal(out[i], w) or torch.equal(out[i], w.flip(2)) for w in windows)
