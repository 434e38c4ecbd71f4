"""Data sets as plain arrays: loading from a data directory (or a download), and the
preprocessing the papers use.

Every loader returns a :class:`Dataset` of numpy arrays; images stay uint8 until a
client turns its own slice into normalized tensors (:func:`to_tensors`), so the
whole training set is never copied as floats.
"""

from __future__ import annotations

import csv
import gzip
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # torch is imported where tensors are made: loading the arrays does not need it
    import torch

MNIST_FILES = (
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
)
NORMALIZATION = {
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar10-gray": ((0.4808,), (0.2318,)),  # of the converted training images (load_cifar10_gray)
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
USER_IMAGE_NORMALIZATION = (0.5, 0.25)  # per channel, of pixels in [0, 1]: the user's images, whose statistics no one holds


def image_normalization(name: str, channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (mean, std) images of data set ``name`` are normalized with: a built-in's
    published figures, else a fixed one for the user's images (the same at every node)."""
    if name in NORMALIZATION:
        return NORMALIZATION[name]
    mean, std = USER_IMAGE_NORMALIZATION
    return (mean,) * channels, (std,) * channels


GAS_TURBINE_FEATURES = ("AT", "AP", "AH", "AFDP", "GTEP", "TIT", "TAT", "TEY", "CDP")
GAS_TURBINE_TARGETS = ("CO", "NOX")
ADULT_COLUMNS = (
    "age",
    "workclass",
    "fnlwgt",
    "education",
    "education-num",
    "marital-status",
    "occupation",
    "relationship",
    "race",
    "sex",
    "capital-gain",
    "capital-loss",
    "hours-per-week",
    "native-country",
    "income",
)
ADULT_NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")
ADULT_PROTECTED = ("race", "sex")
# levels of each categorical column in adult.data's training rows (the one-hot width; tests/test_fairness.py checks them)
ADULT_LEVELS = {
    "workclass": 9,
    "education": 16,
    "marital-status": 7,
    "occupation": 15,
    "relationship": 6,
    "race": 5,
    "sex": 2,
    "native-country": 42,
}


class DatasetMissingError(FileNotFoundError):
    """A data set is not on disk and could not be downloaded."""

    def __init__(self, dataset: str, searched: list[Path], expected: tuple[str, ...], why: str = ""):
        dirs = ", ".join(dict.fromkeys(str(p) for p in searched))  # each once: "mnist" and its "mnist".replace("-", "_") are one folder
        msg = (
            f"data set '{dataset}' not found: searched {dirs} for {', '.join(expected)}"
            + (f" ({why})" if why else "")
            + ". Put the files there, point run-config 'data-dir' or HEADWAY_DATA_DIR "
            "at a directory holding them, or run once with network access to download them."
        )
        super().__init__(msg)


@dataclass(eq=False)  # hashed by identity: partitions are cached per loaded data set
class Dataset:
    """A train/test pair of arrays with what models and partitions need to know."""

    name: str
    task: str  # "classification" | "regression"
    num_classes: int  # classes, or regression outputs
    input_shape: tuple[int, ...]
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    # named per-row attributes (natural sources, protected attributes), train and test
    attrs_train: dict[str, np.ndarray] = field(default_factory=dict)
    attrs_test: dict[str, np.ndarray] = field(default_factory=dict)
    natural_column: str = ""
    augment: bool = False  # random crop + flip for training images
    protected: tuple[str, ...] = ()  # attrs that are protected columns (protected-columns): never features, never sent

    @property
    def is_image(self) -> bool:
        """Whether rows are (C, H, W) images rather than a table, which decides their normalization and the export formats."""
        return len(self.input_shape) == 3


def data_dir(configured: str = "") -> Path:
    """The data directory: run-config 'data-dir', else $HEADWAY_DATA_DIR, else a user cache."""
    if configured:
        return Path(configured).expanduser()
    env = os.environ.get("HEADWAY_DATA_DIR", "")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "headway" / "data"


def _find(root: Path, subdirs: tuple[str, ...], files: tuple[str, ...]) -> Path | None:
    for sub in subdirs:
        cand = root / sub if sub else root
        if all((cand / f).exists() for f in files):
            return cand
    return None


def _find_idx(root: Path, subdirs: tuple[str, ...]) -> list[Path] | None:
    """The four MNIST-format files in the first folder that holds them all, each either
    gzipped (as published) or uncompressed (``raw/*-ubyte``, as torchvision keeps them)."""
    for sub in subdirs:
        cand = root / sub if sub else root
        paths = [next((p for p in (cand / f, cand / f.removesuffix(".gz")) if p.is_file()), None) for f in MNIST_FILES]
        found = [p for p in paths if p is not None]
        if len(found) == len(paths):
            return found
    return None


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims).copy()  # writable, for torch


def _load_idx_set(name: str, root: Path, tv_name: str, tv_cls: str) -> Dataset:
    subdirs = (name, name.replace("-", "_"), f"{tv_name}/raw", "")
    found = _find_idx(root, subdirs)
    if found is None:
        _download(tv_cls, root, name, [root / s for s in subdirs], MNIST_FILES)
        found = _find_idx(root, subdirs)
        if found is None:
            raise DatasetMissingError(name, [root / s for s in subdirs], MNIST_FILES, "the download did not leave the IDX files")
    xtr, ytr, xte, yte = (_read_idx(f) for f in found)
    return Dataset(name, "classification", 10, (1, 28, 28), xtr[:, None], ytr.astype(np.int64), xte[:, None], yte.astype(np.int64))


def _download(tv_cls: str, root: Path, name: str, searched: list[Path], expected: tuple[str, ...]) -> None:
    """Fetch a torchvision data set into ``root``; a missing data set fails with one message."""
    try:
        import torchvision.datasets as tvd

        root.mkdir(parents=True, exist_ok=True)
        getattr(tvd, tv_cls)(str(root), train=True, download=True)
        getattr(tvd, tv_cls)(str(root), train=False, download=True)
    except Exception as exc:  # no network, no space, bad checksum: all mean "missing"
        raise DatasetMissingError(name, searched, expected, f"download failed: {type(exc).__name__}") from None


def load_mnist(root: Path) -> Dataset:
    """MNIST from the data folder's IDX files (60,000 training and 10,000 test images, 1×28×28)."""
    return _load_idx_set("mnist", root, "MNIST", "MNIST")


def load_fashion_mnist(root: Path) -> Dataset:
    """Fashion-MNIST from the data folder's IDX files (the same layout as MNIST)."""
    return _load_idx_set("fashion-mnist", root, "FashionMNIST", "FashionMNIST")


def _cifar(name: str, root: Path, classes: int) -> Dataset:
    npz = ("cifar10_train.npz", "cifar10_test.npz") if classes == 10 else ("cifar100_train.npz", "cifar100_test.npz")
    found = _find(root, (name, ""), npz)
    if found is not None:
        tr, te = (np.load(found / f) for f in npz)
        xtr, ytr, xte, yte = tr["x"], tr["y"], te["x"], te["y"]
    else:
        tv_cls, folder = ("CIFAR10", "cifar-10-batches-py") if classes == 10 else ("CIFAR100", "cifar-100-python")
        import importlib

        if not (root / folder).exists():
            _download(tv_cls, root, name, [root / name, root, root / folder], npz + (folder + "/",))
        tvd = importlib.import_module("torchvision.datasets")
        tr_set = getattr(tvd, tv_cls)(str(root), train=True, download=False)
        te_set = getattr(tvd, tv_cls)(str(root), train=False, download=False)
        xtr, ytr = tr_set.data, np.asarray(tr_set.targets)
        xte, yte = te_set.data, np.asarray(te_set.targets)
    to_chw = lambda x: np.ascontiguousarray(x.transpose(0, 3, 1, 2))  # noqa: E731
    return Dataset(
        name, "classification", classes, (3, 32, 32), to_chw(xtr), ytr.astype(np.int64), to_chw(xte), yte.astype(np.int64), augment=True
    )


def load_cifar10(root: Path) -> Dataset:
    """CIFAR-10 from the data folder (3×32×32, 10 classes)."""
    return _cifar("cifar10", root, 10)


def to_gray28(x: np.ndarray) -> np.ndarray:
    """(n, 3, 32, 32) uint8 RGB -> (n, 1, 28, 28) uint8: ITU-R BT.601 luma
    (0.299 R + 0.587 G + 0.114 B), then an antialiased bilinear resize to 28×28."""
    import torch
    import torch.nn.functional as F

    out = []
    weights = torch.tensor([0.299, 0.587, 0.114]).view(1, 3, 1, 1)
    for i in range(0, len(x), 10_000):
        luma = (torch.from_numpy(np.ascontiguousarray(x[i : i + 10_000])).float() * weights).sum(1, keepdim=True)
        small = F.interpolate(luma, size=(28, 28), mode="bilinear", antialias=True, align_corners=False)
        out.append(small.round_().clamp_(0, 255).to(torch.uint8).numpy())
    return np.concatenate(out) if out else np.zeros((0, 1, 28, 28), np.uint8)


def load_cifar10_gray(root: Path) -> Dataset:
    """CIFAR-10 as a 28×28 grayscale data set (MNIST's shape, not MNIST's content): the
    published split, every image through :func:`to_gray28`; no augmentation."""
    rgb = load_cifar10(root)
    return Dataset(
        "cifar10-gray", "classification", 10, (1, 28, 28), to_gray28(rgb.x_train), rgb.y_train, to_gray28(rgb.x_test), rgb.y_test
    )


def load_cifar100(root: Path) -> Dataset:
    """CIFAR-100 from the data folder (3×32×32, 100 fine classes)."""
    return _cifar("cifar100", root, 100)


def _read_adult(path: Path) -> list[list[str]]:
    rows = []
    with open(path, newline="") as fh:
        for row in csv.reader(fh, skipinitialspace=True):
            if len(row) != len(ADULT_COLUMNS):
                continue  # blank lines and the test file's "|1x3 Cross validator" line
            rows.append([c.strip() for c in row])
    return rows


def load_uci_adult(root: Path, protected: tuple[str, ...] = ()) -> Dataset:
    """UCI Adult (adult.data, adult.test): income above 50K from census columns, encoded as numbers; the
    ``protected`` categorical columns are left out of the features (kept only as row attributes)."""
    _check_protectable("uci-adult", protected)
    files = ("adult.data", "adult.test")
    found = _find(root, ("uci-adult", "adult", ""), files)
    if found is None:
        raise DatasetMissingError("uci-adult", [root / "uci-adult", root / "adult", root], files)
    train, test = _read_adult(found / files[0]), _read_adult(found / files[1])
    cols = {c: i for i, c in enumerate(ADULT_COLUMNS)}
    categorical = [c for c in ADULT_COLUMNS if c not in ADULT_NUMERIC and c != "income" and c not in protected]
    levels = {c: sorted({r[cols[c]] for r in train}) for c in categorical}

    def encode(rows: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
        num = np.array([[float(r[cols[c]]) for c in ADULT_NUMERIC] for r in rows], dtype=np.float32)
        parts = [num]
        for c in categorical:
            index = {v: i for i, v in enumerate(levels[c])}
            onehot = np.zeros((len(rows), len(levels[c])), dtype=np.float32)
            for i, r in enumerate(rows):
                j = index.get(r[cols[c]])
                if j is not None:  # a level unseen in training stays all-zero
                    onehot[i, j] = 1.0
            parts.append(onehot)
        y = np.array([1 if r[cols["income"]].rstrip(".") == ">50K" else 0 for r in rows], dtype=np.int64)
        return np.concatenate(parts, axis=1), y

    xtr, ytr = encode(train)
    xte, yte = encode(test)
    mean, std = xtr[:, : len(ADULT_NUMERIC)].mean(0), xtr[:, : len(ADULT_NUMERIC)].std(0) + 1e-8
    for x in (xtr, xte):
        x[:, : len(ADULT_NUMERIC)] = (x[:, : len(ADULT_NUMERIC)] - mean) / std
    kept = tuple(dict.fromkeys((*ADULT_PROTECTED, *protected)))
    attrs = lambda rows: {c: np.array([r[cols[c]] for r in rows]) for c in kept}  # noqa: E731
    return Dataset(
        "uci-adult",
        "classification",
        2,
        (xtr.shape[1],),
        xtr,
        ytr,
        xte,
        yte,
        attrs(train),
        attrs(test),
        natural_column=NATURAL_COLUMNS["uci-adult"],
        protected=tuple(protected),
    )


def load_uci_gas_turbine(root: Path, test_share: float = 0.2, seed: int = 0) -> Dataset:
    """UCI Gas Turbine CO and NOx emissions (one CSV a year, 2011–2015): regression, standardized; ``test_share`` of each year's rows, drawn with ``seed``, held out for testing."""
    years = tuple(f"gt_{y}.csv" for y in range(2011, 2016))
    found = _find(root, ("uci-gas-turbine", "gas-turbine", ""), years)
    if found is None:
        raise DatasetMissingError("uci-gas-turbine", [root / "uci-gas-turbine", root], years)
    xs, ys, srcs = [], [], []
    for f in years:
        with open(found / f, newline="") as fh:
            reader = csv.reader(fh)
            header = [h.strip() for h in next(reader)]
            data = np.array([[float(v) for v in row] for row in reader if row], dtype=np.float32)
        idx = {h: i for i, h in enumerate(header)}
        xs.append(data[:, [idx[c] for c in GAS_TURBINE_FEATURES]])
        ys.append(data[:, [idx[c] for c in GAS_TURBINE_TARGETS]])
        srcs.append(np.full(len(data), f[3:7]))
    x, y, src = np.concatenate(xs), np.concatenate(ys), np.concatenate(srcs)
    rng = np.random.default_rng(seed)
    test = np.zeros(len(x), dtype=bool)
    for year in np.unique(src):  # exactly test_share of every year's rows, drawn by the run seed
        rows = np.flatnonzero(src == year)
        test[rng.choice(rows, size=int(round(test_share * len(rows))), replace=False)] = True
    mean, std = x[~test].mean(0), x[~test].std(0) + 1e-8
    ymean, ystd = y[~test].mean(0), y[~test].std(0) + 1e-8
    x, y = (x - mean) / std, (y - ymean) / ystd
    return Dataset(
        "uci-gas-turbine",
        "regression",
        len(GAS_TURBINE_TARGETS),
        (x.shape[1],),
        x[~test],
        y[~test],
        x[test],
        y[test],
        {"year": src[~test]},
        {"year": src[test]},
        natural_column=NATURAL_COLUMNS["uci-gas-turbine"],
    )


def make_circle(n_train: int = 80, n_test: int = 1000, seed: int = 0) -> Dataset:
    """FedLog §4.1: points uniform in [-5, 5]^2, class 1 inside the circle of radius 26/7."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-5, 5, size=(n_train + n_test, 2)).astype(np.float32)
    y = (np.linalg.norm(x, axis=1) < 26 / 7).astype(np.int64)
    return Dataset("circle", "classification", 2, (2,), x[:n_train], y[:n_train], x[n_train:], y[n_train:])


LOADERS: dict[str, Callable[..., Dataset]] = {
    "mnist": load_mnist,
    "fashion-mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
    "cifar10-gray": load_cifar10_gray,
    "cifar100": load_cifar100,
    "uci-adult": load_uci_adult,
    "uci-gas-turbine": load_uci_gas_turbine,
}


# Loaders whose train/test split depends on the run seed (the others use the published split).
SEEDED_SPLIT = ("uci-gas-turbine",)


# Built-in tables that can name protected columns (protected-columns), and the loader argument that drops them.
PROTECTABLE = ("uci-adult",)

# The column that splits a built-in table under partition=natural when natural-column is empty.
NATURAL_COLUMNS = {"uci-adult": "race", "uci-gas-turbine": "year"}


@lru_cache(maxsize=4)
def _cached(name: str, root: str, seed: int, protected: tuple[str, ...] = ()) -> Dataset:
    if name == "circle":
        return make_circle(seed=seed)
    if protected:
        return LOADERS[name](Path(root), protected=protected)
    if name in SEEDED_SPLIT:
        return LOADERS[name](Path(root), seed=seed)
    return LOADERS[name](Path(root))


def load_dataset(name: str, configured_dir: str = "", seed: int = 0, protected: tuple[str, ...] = ()) -> Dataset:
    """Load a data set by name (cached per process: simulation workers reuse it); ``protected``: columns left out of the features."""
    if name != "circle" and name not in LOADERS:
        raise ValueError(f"unknown data set {name!r}; allowed: circle, {', '.join(LOADERS)}")
    _check_protectable(name, protected)
    seeded = name == "circle" or name in SEEDED_SPLIT
    return _cached(name, str(data_dir(configured_dir)), seed if seeded else 0, tuple(protected))  # one copy of a published split


def _check_protectable(name: str, protected: tuple[str, ...]) -> None:
    """ValueError in one line when built-in ``name`` cannot name ``protected`` columns."""
    if protected and name not in PROTECTABLE:
        raise ValueError(
            f"run-config key 'protected-columns' is set, but built-in {name!r} has no categorical columns to protect: "
            f"use {', '.join(PROTECTABLE)} or a table of your own (dataset = a CSV or Parquet path)"
        )
    if bad := [c for c in protected if c not in ADULT_LEVELS]:
        raise ValueError(
            f"run-config key 'protected-columns' names {bad}, which uci-adult has no categorical column for; allowed: {', '.join(ADULT_LEVELS)}"
        )


def builtin_spec(name: str, protected: tuple[str, ...] = ()) -> DatasetSpec:
    """A built-in's spec; with ``protected`` (uci-adult) the one-hot blocks of those columns left out (levels of adult.data's training rows)."""
    spec = SPECS[name]
    if not protected:
        return spec
    _check_protectable(name, protected)
    return DatasetSpec(spec.task, spec.num_classes, (spec.input_shape[0] - sum(ADULT_LEVELS[c] for c in protected),))


def to_tensors(ds: Dataset, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn raw rows into float tensors, normalized as the papers do."""
    import torch

    xt = torch.from_numpy(np.ascontiguousarray(x))
    if ds.is_image:
        mean, std = image_normalization(ds.name, ds.input_shape[0])
        xt = xt.float().div_(255.0)
        xt = (xt - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
    else:
        xt = xt.float()
    yt = torch.from_numpy(np.ascontiguousarray(y))
    return xt, (yt.long() if ds.task == "classification" else yt.float())


def augment_batch(x: torch.Tensor, generator: torch.Generator | None = None, pad: int = 4) -> torch.Tensor:
    """Random crop (zero padding ``pad``) and horizontal flip of a batch of images."""
    import torch
    import torch.nn.functional as F

    n, c, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    # pick rows, then columns: two gathers keep the crop vectorized over the batch
    rows = (dy.view(n, 1, 1, 1) + torch.arange(h).view(1, 1, h, 1)).expand(n, c, h, w + 2 * pad)
    out = torch.gather(padded, 2, rows)
    cols = (dx.view(n, 1, 1, 1) + torch.arange(w).view(1, 1, 1, w)).expand(n, c, h, w)
    out = torch.gather(out, 3, cols)
    flip = torch.rand(n, generator=generator) < 0.5
    out[flip] = out[flip].flip(3)
    return out


@dataclass(frozen=True)
class DatasetSpec:
    """What a server needs to build models without holding the data."""

    task: str
    num_classes: int
    input_shape: tuple[int, ...]


SPECS: dict[str, DatasetSpec] = {
    "mnist": DatasetSpec("classification", 10, (1, 28, 28)),
    "fashion-mnist": DatasetSpec("classification", 10, (1, 28, 28)),
    "cifar10": DatasetSpec("classification", 10, (3, 32, 32)),
    "cifar10-gray": DatasetSpec("classification", 10, (1, 28, 28)),
    "cifar100": DatasetSpec("classification", 100, (3, 32, 32)),
    "uci-adult": DatasetSpec("classification", 2, (108,)),
    "uci-gas-turbine": DatasetSpec("regression", 2, (9,)),
    "circle": DatasetSpec("classification", 2, (2,)),
}


def spec_of(ds: Dataset) -> DatasetSpec:
    """What a server needs of ``ds`` to build models: its task, class count and input shape."""
    return DatasetSpec(ds.task, ds.num_classes, tuple(ds.input_shape))
