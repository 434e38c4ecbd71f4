"""Split a data set over clients, deterministically from a seed.

A client computes its own split from its partition id; the server computes the same
assignment for reporting. Test splits follow the training splits' class mix (each
client's test rows are drawn from the classes it trains on, as in FedLog §4.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from headway.core import seeds
from headway.core.data import Dataset
from headway.core.methods import METHODS
from headway.core.sampling import sample_size
from headway.core.settings import Settings

# a partitioner's answer: each client's training row indices, then its test row indices
Split = tuple[list[np.ndarray], list[np.ndarray]]


@dataclass(frozen=True)
class Partition:
    """Row indices of every client's training and test split."""

    train: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]
    validation: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # server-held training rows

    @property
    def num_clients(self) -> int:
        """How many clients the split serves: one training index array each."""
        return len(self.train)


def subsample(labels: np.ndarray, fraction: float, rng: np.random.Generator, stratify: bool) -> np.ndarray:
    """Indices of a ``fraction`` of the rows, stratified by class when ``stratify``."""
    n = len(labels)
    if fraction >= 1.0:
        return np.arange(n)
    if not stratify:
        return np.sort(rng.permutation(n)[: sample_size(n, fraction)])
    keep = []
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        keep.append(rng.permutation(rows)[: sample_size(len(rows), fraction)])
    return np.sort(np.concatenate(keep))


FEW_CLIENTS = 12  # up to this many clients a counts line lists every one; beyond it, min / median / max


def counts_line(counts: list[int] | tuple[int, ...], what: str = "training rows", who: str = "client") -> str:
    """One line saying how many rows each client got: every count when there are few clients, else
    the total and min / median / max (what a run and `headway split` print, so a cut is never silent)."""
    if not counts:
        return f"{what}: no {who}s"
    total, n = int(sum(counts)), len(counts)
    if n <= FEW_CLIENTS:
        return f"{what} per {who}: {', '.join(str(int(c)) for c in counts)} ({total} over {n} {who}s)"
    return f"{what} per {who}: {total} over {n} {who}s, min {int(min(counts))}, median {float(np.median(counts)):g}, max {int(max(counts))}"


def empty_note(counts: list[int] | tuple[int, ...], who: str = "client") -> str:
    """What to say when some clients get no training rows ('' when none is empty): how many, and the
    fix. Such a client is asked every round, trains on nothing and adds nothing to the aggregate."""
    empty = sum(1 for c in counts if int(c) == 0)
    if not empty:
        return ""
    filled = len(counts) - empty
    return (
        f"{empty} of {len(counts)} {who}s get no training rows ({int(sum(counts))} training rows in all): an empty {who} "
        f"trains on nothing and adds nothing to a round; lower num-clients (to at most {max(filled, 1)} here) or use more data"
    )


def check_filled(counts: list[int] | tuple[int, ...], who: str = "client") -> None:
    """ValueError when most clients (more than half) would get no training rows: such a run or split
    would be mostly empty clients, whatever it reports. A few empty ones are only warned of (:func:`empty_note`)."""
    if 2 * sum(1 for c in counts if int(c) == 0) > len(counts):
        raise ValueError(f"{empty_note(counts, who)}; refused, since most {who}s would be empty")


def iid(n: int, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Equal-size random shares."""
    return [np.sort(p) for p in np.array_split(rng.permutation(n), num_clients)]


def assign_classes(num_clients: int, num_classes: int, per_client: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Give each client ``per_client`` distinct classes, every class used as evenly as possible."""
    if per_client > num_classes:
        raise ValueError(f"classes-per-client={per_client} exceeds the data set's {num_classes} classes")
    use = np.zeros(num_classes, dtype=int)
    out = []
    for _ in range(num_clients):
        # least-used classes first, random among ties
        order = np.lexsort((rng.random(num_classes), use))
        chosen = np.sort(order[:per_client])
        use[chosen] += 1
        out.append(chosen)
    return out


def split_by_class(labels: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> list[np.ndarray]:
    """Deal each class's rows to the clients in proportion to ``weights[client, class]``
    (a client with weight 0 for a class gets none of it)."""
    num_clients = weights.shape[0]
    parts: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
    for c in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == c))
        w = weights[:, c]
        if w.sum() <= 0:
            continue
        cuts = np.rint(np.cumsum(w / w.sum()) * len(rows)).astype(int)[:-1]  # rint: a cumsum of 0.99999 must not leak a row
        for k, share in enumerate(np.split(rows, cuts)):
            if len(share):
                parts[k].append(share)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, dtype=np.int64) for p in parts]


def pathological(
    y_train: np.ndarray, y_test: np.ndarray, num_clients: int, num_classes: int, per_client: int, rng: np.random.Generator
) -> Split:
    """Each client gets ``per_client`` distinct classes, every class used as evenly as possible, and an equal share of
    the rows of each class it holds with the other holders; its test rows follow the same class mix."""
    classes = assign_classes(num_clients, num_classes, per_client, rng)
    weights = np.zeros((num_clients, num_classes))
    for k, cs in enumerate(classes):
        weights[k, cs] = 1.0
    return split_by_class(y_train, weights, rng), split_by_class(y_test, weights, rng)


def shards(y_train: np.ndarray, y_test: np.ndarray, num_clients: int, num_classes: int, per_client: int, rng: np.random.Generator) -> Split:
    """The split of the FedAvg and FedLog authors' code: training rows sorted by label (in a
    random order within a class), cut into num_clients·per_client equal shards, and
    ``per_client`` shards dealt at random to each client, so a client may hold one class
    twice (and then fewer classes). Unlike ``pathological``, which gives every client exactly
    ``per_client`` distinct classes and every class to equally many clients. Test rows
    follow each client's class mix."""
    order = rng.permutation(len(y_train))
    order = order[np.argsort(y_train[order], kind="stable")]
    pieces = np.array_split(order, num_clients * per_client)
    deal = rng.permutation(num_clients * per_client).reshape(num_clients, per_client)
    train = [np.sort(np.concatenate([pieces[s] for s in deal[k]])) for k in range(num_clients)]
    counts = np.stack([np.bincount(y_train[t], minlength=num_classes) for t in train]).astype(float)
    return train, split_by_class(y_test, counts, rng)


def dirichlet(y_train: np.ndarray, y_test: np.ndarray, num_clients: int, num_classes: int, alpha: float, rng: np.random.Generator) -> Split:
    """Per class, shares over clients drawn from Dir(alpha); test rows follow each client's class mix."""
    weights = rng.dirichlet(np.full(num_clients, alpha), size=num_classes).T  # clients x classes
    train = split_by_class(y_train, weights, rng)
    counts = np.stack([np.bincount(y_train[t], minlength=num_classes) for t in train]).astype(float)
    return train, split_by_class(y_test, counts, rng)


def dominant(
    y_train: np.ndarray,
    y_test: np.ndarray,
    num_clients: int,
    num_classes: int,
    fraction: float,
    sizes: np.ndarray | None,
    rng: np.random.Generator,
) -> Split:
    """FedProf §5: each client has one dominant class holding ``fraction`` of its data, the
    rest spread evenly over the other classes. Dominant classes are dealt round-robin in a
    random order, so every class dominates equally many clients and the class supply
    balances; ``sizes`` (None: equal) scale each client's share. Test rows follow each
    client's class mix."""
    owner = rng.permutation(np.arange(num_clients) % num_classes)
    weights = np.full((num_clients, num_classes), (1.0 - fraction) / max(num_classes - 1, 1))
    weights[np.arange(num_clients), owner] = fraction
    if sizes is not None:
        weights *= sizes[:, None]
    train = split_by_class(y_train, weights, rng)
    counts = np.stack([np.bincount(y_train[t], minlength=num_classes) for t in train]).astype(float)
    return train, split_by_class(y_test, counts, rng)


def client_sizes(num_clients: int, mean: float, std: float, available: int, seed: int) -> np.ndarray | None:
    """Local data sizes drawn from N(mean, std²), at least one row each, from their own
    stream of ``seed`` (None when ``mean`` is 0: equal shares). Sizes that ask for more rows
    than ``available`` are scaled down in proportion."""
    if mean <= 0:
        return None
    sizes = np.maximum(1, np.rint(np.random.default_rng([seed, seeds.CLIENT_SIZES]).normal(mean, std, num_clients))).astype(np.int64)
    if sizes.sum() > available:
        if num_clients > available:
            raise ValueError(
                f"client-size-mean: {num_clients} clients need at least one row each, and only {available} training rows are left"
            )
        sizes = np.maximum(1, np.floor(sizes * (available / sizes.sum()))).astype(np.int64)
        while sizes.sum() > available:  # the floor of at least 1 can still overshoot by a few rows
            sizes[np.argmax(sizes)] -= 1
    return sizes


def natural(src_train: np.ndarray, src_test: np.ndarray, num_clients: int) -> Split:
    """One client per source value of the ``natural-column`` (e.g. a writer): the split the data already has, refused unless num-clients matches the sources."""
    sources = np.unique(src_train)
    if len(sources) != num_clients:
        raise ValueError(
            f"partition 'natural' has {len(sources)} sources ({', '.join(map(str, sources[:10]))}"
            f"{'…' if len(sources) > 10 else ''}); set num-clients={len(sources)}"
        )
    return [np.flatnonzero(src_train == s) for s in sources], [np.flatnonzero(src_test == s) for s in sources]


FIXED_SIZES = 0x66697865  # the stream of partition-sizes' draw (apart from the scheme's, so other runs split as before)
SIZES_KEY = "partition-sizes"


def parse_partition_sizes(text: str) -> dict[int, tuple[int, int]]:
    """``"100:3000/500"`` -> {100: (3000, 500)}: partition id -> (training rows, test rows); ValueError naming the
    key for anything else (a partition named twice, no training rows, a negative count)."""
    out: dict[int, tuple[int, int]] = {}
    for item in (t.strip() for t in str(text).split(",")):
        if not item:
            continue
        pid, _, counts = (t.strip() for t in item.partition(":"))
        train, _, test = (t.strip() for t in counts.partition("/"))
        if not (pid.isdigit() and train.isdigit() and test.isdigit()):
            raise ValueError(f"run-config key '{SIZES_KEY}': {item!r} is not partition-id:train/test (e.g. '100:3000/500')")
        if int(pid) in out:
            raise ValueError(f"run-config key '{SIZES_KEY}' names partition {int(pid)} twice")
        if int(train) == 0:
            raise ValueError(f"run-config key '{SIZES_KEY}': partition {int(pid)} would get no training rows; give it at least 1")
        out[int(pid)] = (int(train), int(test))
    return out


def sizes_problem(text: str, num_clients: int, scheme: str) -> str | None:
    """Why ``partition-sizes`` cannot run with this num-clients and partition scheme (one line), or None."""
    sizes = parse_partition_sizes(text)
    if not sizes:
        return None
    outside = sorted(p for p in sizes if p >= num_clients)
    if outside:
        return f"run-config key '{SIZES_KEY}': partition id {outside[0]} is outside 0..{num_clients - 1} (num-clients={num_clients})"
    if len(sizes) == num_clients:
        return f"run-config key '{SIZES_KEY}' names every partition: leave at least one to split the rest by partition={scheme!r}"
    if scheme == "natural":
        return f"run-config key '{SIZES_KEY}' does not combine with partition='natural' (one client per source): use another partition"
    return None


def take_fixed(
    pool: np.ndarray, test_pool: np.ndarray, sizes: dict[int, tuple[int, int]], others: int, rng: np.random.Generator
) -> tuple[dict[int, tuple[np.ndarray, np.ndarray]], np.ndarray, np.ndarray]:
    """Draw each named partition's training rows from ``pool`` and test rows from ``test_pool`` at random, without
    overlap; returns them and what is left of both pools for the ``others`` clients. ValueError when a pool is too small."""
    need_train, need_test = sum(t for t, _ in sizes.values()), sum(e for _, e in sizes.values())
    if need_train + others > len(pool):
        raise ValueError(
            f"run-config key '{SIZES_KEY}' asks for {need_train} training rows, but the pool holds {len(pool)} and the other "
            f"{others} clients need at least one each: ask for fewer rows"
        )
    if need_test > len(test_pool):
        raise ValueError(
            f"run-config key '{SIZES_KEY}' asks for {need_test} test rows, but the data set has {len(test_pool)}: ask for fewer"
        )
    train_order, test_order = rng.permutation(pool), rng.permutation(test_pool)
    fixed: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    i = j = 0
    for pid in sorted(sizes):
        t, e = sizes[pid]
        fixed[pid] = (np.sort(train_order[i : i + t]), np.sort(test_order[j : j + e]))
        i, j = i + t, j + e
    return fixed, np.sort(train_order[i:]), np.sort(test_order[j:])


def interleave(fixed: dict[int, tuple[np.ndarray, np.ndarray]], train: list[np.ndarray], test: list[np.ndarray]) -> Split:
    """Every partition id's rows in order: the named ones from ``fixed``, the others from the scheme's lists in turn."""
    out_train, out_test = [], []
    rest = iter(zip(train, test))
    for pid in range(len(fixed) + len(train)):
        t, e = fixed[pid] if pid in fixed else next(rest)
        out_train.append(t)
        out_test.append(e)
    return out_train, out_test


def server_holdout(cfg: Settings) -> int:
    """Training rows the server keeps for itself before partitioning, as the run's method
    declares (core/methods.py): FedProf's validation set D^V (``fedprof-val-size``), the others
    ``server-holdout`` (0 by default), which lets a method run on exactly the client data a
    FedProf run of the same seed has."""
    return METHODS[cfg.algorithm].holdout(cfg)


def make_partition(ds: Dataset, cfg: Settings) -> Partition:
    """The partition a run config asks for (cached: every client of a process shares it)."""
    return _make_partition(
        ds,
        cfg.partition,
        cfg.num_clients,
        cfg.classes_per_client,
        cfg.dirichlet_alpha,
        cfg.train_fraction,
        cfg.seed,
        cfg.natural_column,
        server_holdout(cfg),
        cfg.dominant_class_fraction,
        cfg.client_size_mean,
        cfg.client_size_std,
        cfg.partition_sizes,
    )


@lru_cache(maxsize=8)
def _make_partition(
    ds: Dataset,
    scheme: str,
    num_clients: int,
    per_client: int,
    alpha: float,
    fraction: float,
    seed: int,
    column: str,
    holdout: int = 0,
    dominant_fraction: float = 0.6,
    size_mean: float = 0.0,
    size_std: float = 0.0,
    fixed_sizes: str = "",
) -> Partition:
    rng = np.random.default_rng(seed)
    classification = ds.task == "classification"
    if scheme in ("pathological", "shards", "dirichlet") and not classification:
        raise ValueError(f"partition '{scheme}' needs class labels; data set '{ds.name}' is a regression task: use iid or natural")
    validation = np.zeros(0, dtype=np.int64)
    pool = np.arange(len(ds.y_train))
    if holdout > 0:  # drawn first, from its own stream, and never dealt to a client
        if holdout >= len(pool):
            raise ValueError(f"a server holdout of {holdout} rows leaves no training rows for clients ({len(pool)} in {ds.name})")
        validation = np.sort(np.random.default_rng([seed, seeds.SERVER_HOLDOUT]).choice(len(pool), size=holdout, replace=False))
        pool = np.setdiff1d(pool, validation)
    named = parse_partition_sizes(fixed_sizes)
    test_pool = np.arange(len(ds.y_test))
    fixed: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    if named:  # drawn from their own stream before the scheme splits what is left over the other clients
        problem = sizes_problem(fixed_sizes, num_clients, scheme)
        if problem:
            raise ValueError(problem)
        others = num_clients - len(named)
        fixed, pool, test_pool = take_fixed(pool, test_pool, named, others, np.random.default_rng([seed, FIXED_SIZES]))
        num_clients = others
    labels = ds.y_train[pool] if classification else np.zeros(len(pool))
    keep = pool[subsample(labels, fraction, rng, classification)]
    sizes = client_sizes(num_clients, size_mean, size_std, len(keep), seed)
    if scheme == "dominant" and sizes is not None and sizes.sum() < len(keep):  # the drawn sizes take only part of the rows
        keep = keep[subsample(ds.y_train[keep], sizes.sum() / len(keep), rng, True)]
    y_train, y_test = ds.y_train[keep], ds.y_test[test_pool]
    if scheme == "iid" and sizes is not None:  # exactly the drawn sizes; rows beyond their sum stay unused
        train = [np.sort(p) for p in np.split(rng.permutation(len(keep)), np.cumsum(sizes))[:num_clients]]
        test = iid(len(y_test), num_clients, rng)
    elif scheme == "iid":
        train, test = iid(len(keep), num_clients, rng), iid(len(y_test), num_clients, rng)
    elif scheme == "dominant":
        train, test = dominant(y_train, y_test, num_clients, ds.num_classes, dominant_fraction, sizes, rng)
    elif scheme == "pathological":
        train, test = pathological(y_train, y_test, num_clients, ds.num_classes, per_client, rng)
    elif scheme == "shards":
        train, test = shards(y_train, y_test, num_clients, ds.num_classes, per_client, rng)
    elif scheme == "dirichlet":
        train, test = dirichlet(y_train, y_test, num_clients, ds.num_classes, alpha, rng)
    elif scheme == "natural":
        col = column or ds.natural_column
        if not col or col not in ds.attrs_train:
            raise ValueError(
                f"partition 'natural' needs a source column; data set '{ds.name}' has "
                f"{sorted(ds.attrs_train) or 'none'}: set natural-column"
            )
        train, test = natural(ds.attrs_train[col][keep], ds.attrs_test[col], num_clients)
    else:
        raise ValueError(f"unknown partition {scheme!r}")
    train, test = [keep[t] for t in train], [test_pool[t] for t in test]  # row ids of the data set
    if fixed:
        train, test = interleave(fixed, train, test)
    check_filled([len(t) for t in train])
    return Partition(tuple(train), tuple(test), validation)
