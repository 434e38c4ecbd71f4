"""partition-sizes (core/partition.py): named partitions get exactly their training and test row counts, drawn
disjoint from the others' rows, the others split the rest by their scheme, and bad values are refused in one line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from headway.core.config import ConfigError, resolve_settings
from headway.core.data import Dataset
from headway.core.partition import make_partition, parse_partition_sizes
from headway.core.settings import Settings


def _images(n: int, n_test: int) -> Dataset:
    """A small synthetic classification set: ``n`` training and ``n_test`` test images over 4 classes."""
    rng = np.random.default_rng(0)
    x, xt = rng.random((n, 1, 8, 8), dtype=np.float32), rng.random((n_test, 1, 8, 8), dtype=np.float32)
    return Dataset("pngs", "classification", 4, (1, 8, 8), x, np.arange(n) % 4, xt, np.arange(n_test) % 4)


def _cfg(num_clients: int, **extra: object) -> Settings:
    cfg = resolve_settings({"dataset": "mnist", "algorithm": "fedavg", "num-clients": num_clients, "partition": "iid", **extra})
    return dataclasses.replace(cfg, train_fraction=1.0)


@pytest.mark.parametrize("scheme", ["iid", "shards", "dirichlet"])
def test_named_partition_gets_exact_counts_disjoint_from_the_others(scheme):
    ds = _images(2000, 400)
    part = make_partition(ds, _cfg(11, partition=scheme, **{"partition-sizes": "10:300/50,3:20/7"}))
    assert (len(part.train[10]), len(part.test[10])) == (300, 50)
    assert (len(part.train[3]), len(part.test[3])) == (20, 7)
    train, test = np.concatenate(part.train), np.concatenate(part.test)
    assert len(np.unique(train)) == len(train) == 2000  # every row dealt once: the others split the rest
    assert len(np.unique(test)) == len(test)  # test rows disjoint too
    others = [len(t) for k, t in enumerate(part.train) if k not in (3, 10)]
    if scheme == "iid":
        assert max(others) - min(others) <= 1 and sum(others) == 2000 - 320


def test_the_draw_is_seeded_and_leaves_runs_without_the_key_unchanged():
    ds = _images(1000, 200)
    a = make_partition(ds, _cfg(5, **{"partition-sizes": "4:100/20"}))
    b = make_partition(ds, _cfg(5, **{"partition-sizes": "4:100/20", "partition": "iid"}))
    assert np.array_equal(a.train[4], b.train[4])
    c = make_partition(ds, _cfg(5, seed=1, **{"partition-sizes": "4:100/20"}))
    assert not np.array_equal(a.train[4], c.train[4])
    plain = make_partition(ds, _cfg(5))
    again = make_partition(ds, dataclasses.replace(_cfg(5), partition_sizes=""))
    assert all(np.array_equal(x, y) for x, y in zip(plain.train, again.train))
    assert len(plain.train[4]) == 200


def test_a_pool_too_small_is_refused_in_one_line():
    ds = _images(500, 100)
    with pytest.raises(ValueError, match="asks for 600 training rows, but the pool holds 500"):
        make_partition(ds, _cfg(3, **{"partition-sizes": "2:600/10"}))
    with pytest.raises(ValueError, match="asks for 101 test rows, but the data set has 100"):
        make_partition(ds, _cfg(3, **{"partition-sizes": "2:10/101"}))


@pytest.mark.parametrize(
    ("value", "extra", "message"),
    [
        ("101:3000/500", {}, "partition id 101 is outside 0..100"),
        ("100:3000", {}, "is not partition-id:train/test"),
        ("100:0/5", {}, "would get no training rows"),
        ("100:3/5,100:4/5", {}, "names partition 100 twice"),
        ("100:30/5", {"partition": "natural"}, "does not combine with partition='natural'"),
    ],
)
def test_bad_values_are_refused_at_config_time(value, extra, message):
    with pytest.raises(ConfigError, match=message):
        resolve_settings({"num-clients": 101, "partition-sizes": value, **extra})


def test_parse():
    assert parse_partition_sizes(" 100:3000/500 , 7:1/0") == {100: (3000, 500), 7: (1, 0)}
    assert parse_partition_sizes("") == {}
