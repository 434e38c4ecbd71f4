import numpy as np
import pytest
from headway.core.config import resolve_settings
from headway.core.data import load_dataset
from headway.core.partition import _make_partition, make_partition

from tests.conftest import needs_data


def _cfg(**kw):
    base = {"num-clients": 50, "partition": "pathological", "classes-per-client": 2, "train-fraction": 0.05, "seed": 0}
    base.update(kw)
    return resolve_settings(base)


def fresh_partition(ds, cfg):
    """``make_partition`` computed anew: its cache is cleared first, so two calls are two
    computations to compare, not one cached object compared with itself."""
    _make_partition.cache_clear()
    return make_partition(ds, cfg)


def same_splits(a, b) -> bool:
    """Every client's training and test rows, and the server's holdout, are the same."""
    return all(np.array_equal(x, y) for x, y in zip(a.train + a.test + (a.validation,), b.train + b.test + (b.validation,), strict=True))


def test_pathological_gives_each_client_its_classes_in_train_and_test(data_dir):
    ds = load_dataset("mnist", data_dir)
    part = make_partition(ds, _cfg())
    assert part.num_clients == 50
    used = np.zeros(10, dtype=int)
    for tr, te in zip(part.train, part.test):
        classes = set(np.unique(ds.y_train[tr]))
        assert len(classes) == 2
        assert set(np.unique(ds.y_test[te])) == classes  # test drawn from the same classes
        used[list(classes)] += 1
    assert used.tolist() == [10] * 10  # every class held by the same number of clients
    all_train = np.concatenate(part.train)
    assert len(all_train) == len(np.unique(all_train))  # disjoint
    assert abs(len(all_train) - 3000) <= 10  # 5 % of 60 000
    all_test = np.concatenate(part.test)
    assert len(all_test) == len(np.unique(all_test)) == 10000  # the whole test set, split


def test_partition_is_deterministic_in_the_seed(data_dir):
    """Two computations from one seed agree (num-server-rounds, which no split reads and the
    cache key leaves out, changes nothing); another seed gives another split."""
    ds = load_dataset("mnist", data_dir)
    a, b = fresh_partition(ds, _cfg(seed=1)), fresh_partition(ds, _cfg(seed=1, **{"num-server-rounds": 7}))
    c = fresh_partition(ds, _cfg(seed=2))
    assert a is not b
    assert same_splits(a, b), "one seed, two different partitions"
    assert not all(np.array_equal(x, y) for x, y in zip(a.train, c.train))
    assert make_partition(ds, _cfg(seed=2, **{"num-server-rounds": 7})) is c  # the clients of a process share one
    held = [fresh_partition(ds, _cfg(seed=1, algorithm="fedprof", **{"fedprof-val-size": 500})) for _ in range(2)]
    assert len(held[0].validation) == 500
    assert same_splits(*held), "one seed, two different FedProf holdouts or partitions"


def test_dirichlet_skew_responds_to_alpha(data_dir):
    ds = load_dataset("mnist", data_dir)

    def mean_top_share(alpha):
        part = make_partition(ds, _cfg(partition="dirichlet", **{"dirichlet-alpha": alpha, "num-clients": 20, "train-fraction": 0.2}))
        shares = [np.bincount(ds.y_train[t], minlength=10).max() / max(len(t), 1) for t in part.train if len(t)]
        return float(np.mean(shares))

    skewed, even = mean_top_share(0.1), mean_top_share(100.0)
    assert skewed > 0.6 and even < 0.2 and skewed > even


def test_iid_sizes_are_equal_and_disjoint(data_dir):
    ds = load_dataset("mnist", data_dir)
    part = make_partition(ds, _cfg(partition="iid", **{"num-clients": 7, "train-fraction": 1.0}))
    sizes = [len(t) for t in part.train]
    assert max(sizes) - min(sizes) <= 1 and sum(sizes) == 60000


@needs_data("uci-gas-turbine")
def test_natural_partition_is_one_client_per_year(data_dir):
    ds = load_dataset("uci-gas-turbine", data_dir)
    part = make_partition(ds, _cfg(partition="natural", **{"num-clients": 5, "train-fraction": 1.0}))
    years = [set(ds.attrs_train["year"][t]) for t in part.train]
    assert [y.pop() for y in years] == ["2011", "2012", "2013", "2014", "2015"]
    with pytest.raises(ValueError, match="num-clients=5"):
        make_partition(ds, _cfg(partition="natural", **{"num-clients": 4, "train-fraction": 1.0}))


@needs_data("uci-gas-turbine")
def test_regression_cannot_be_split_by_class(data_dir):
    ds = load_dataset("uci-gas-turbine", data_dir)
    with pytest.raises(ValueError, match="regression"):
        make_partition(ds, _cfg(partition="pathological"))


def test_shards_deal_equal_sorted_shards_so_a_client_may_hold_one_class_twice(data_dir):
    ds = load_dataset("mnist", data_dir)
    part = make_partition(ds, _cfg(partition="shards"))
    sizes = [len(t) for t in part.train]
    assert max(sizes) - min(sizes) <= 2  # 100 shards of 3000 rows, two each
    all_train = np.concatenate(part.train)
    assert len(all_train) == len(np.unique(all_train)) and abs(len(all_train) - 3000) <= 10
    classes = [set(np.unique(ds.y_train[t])) for t in part.train]
    assert all(1 <= len(c) <= 4 for c in classes)  # a shard may straddle two classes
    assert sum(len(c) == 1 for c in classes) >= 1  # seed 0: some client got one class twice
    for tr, te in zip(part.train, part.test):
        assert set(np.unique(ds.y_test[te])) <= set(np.unique(ds.y_train[tr]))  # test follows the client's classes
    assert len(np.unique(np.concatenate(part.test))) == sum(len(t) for t in part.test)  # disjoint
    again = fresh_partition(ds, _cfg(partition="shards", **{"num-server-rounds": 3}))
    other = fresh_partition(ds, _cfg(partition="shards", seed=1))
    assert again is not part
    assert same_splits(part, again), "one seed, two different shard deals"
    assert not all(np.array_equal(x, y) for x, y in zip(part.train, other.train))


def test_counts_line_lists_few_clients_and_summarises_many():
    from headway.core.partition import counts_line

    assert counts_line([8, 4, 4]) == "training rows per client: 8, 4, 4 (16 over 3 clients)"
    many = counts_line(list(range(1, 101)), who="node")
    assert many == "training rows per node: 5050 over 100 nodes, min 1, median 50.5, max 100"
    assert counts_line([]) == "training rows: no clients"
