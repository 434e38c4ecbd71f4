"""What a strategy is handed at construction: the server-held data (if any), separate
random streams for reproducible choices and for privacy, and reply bounds derived from
the data. Nothing here talks to clients."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from headway.core import seeds
from headway.core.config import LOCAL
from headway.core.data import Dataset, DatasetMissingError, to_tensors
from headway.core.partition import make_partition
from headway.core.run_data import load_run_dataset, load_server_data
from headway.core.settings import Settings

if TYPE_CHECKING:  # headway.core.sources is imported when a user source is read
    from headway.core.sources import DataSchema

log = logging.getLogger("headway")

DEFAULT_EXAMPLE_CAP = 1_000_000  # num-examples cap when the server has no data and max-client-examples = 0


def example_cap(max_client_examples: int) -> int:
    """The most examples one client may declare or report where the server holds no
    partition sizes: ``max-client-examples``, else :data:`DEFAULT_EXAMPLE_CAP`."""
    return int(max_client_examples) or DEFAULT_EXAMPLE_CAP


class ServerData:
    """The data the server itself holds: the test set and the partition sizes, computed
    the way every client computes its own partition (deterministic in the run seed).
    A deployment server may hold no data; then every accessor returns None."""

    def __init__(self, settings: Settings, schema: DataSchema | None = None):
        self.settings = settings
        self.schema = schema  # dataset=local: the nodes' agreed schema

    @property
    def local(self) -> bool:
        """Whether every node owns its data (dataset=local): the server holds at most ``server-data``."""
        return self.settings.dataset == LOCAL

    @cached_property
    def dataset(self) -> Dataset | None:
        """The data the server holds: the run's data set (a copy of what the clients split), or
        with dataset=local its own ``server-data``; None when it holds none."""
        if self.local:
            return load_server_data(self.settings, self.schema)
        try:
            return load_run_dataset(self.settings)
        except DatasetMissingError as exc:
            log.warning("the server holds no copy of the data (no global test score, reply counts capped by max-client-examples): %s", exc)
            return None

    @cached_property
    def partition_sizes(self) -> list[tuple[int, int]] | None:
        """(train, test) examples of every partition id, or None without data (or with
        dataset=local, where nothing is partitioned: nodes declare their own counts)."""
        if self.dataset is None or self.local:
            return None
        part = make_partition(self.dataset, self.settings)
        return [(len(tr), len(te)) for tr, te in zip(part.train, part.test)]

    def _inputs(self, ds: Dataset, x: np.ndarray, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ``ds`` as the run's models take them: tensors, or with ``inputs=features`` the
        frozen extractor's features of them (computed and cached as the clients' are)."""
        xt, yt = to_tensors(ds, x, y)
        if self.settings.inputs == "features":
            from headway.core.extractors import configured_features
            from headway.core.models import resolve_device

            xt = configured_features(self.settings, ds.name, xt, resolve_device("auto"))
        return xt, yt

    @cached_property
    def _test(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        ds = self.dataset
        return None if ds is None else self._inputs(ds, ds.x_test, ds.y_test)

    def test_tensors(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The whole test set as tensors (global evaluation, LG-FedAvg's new test), built once."""
        return self._test

    def validation_tensors(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The server's own validation rows (training rows no client holds; FedProf's D^V)
        as tensors, or None without data or without a holdout."""
        ds = self.dataset
        if ds is None:
            return None
        if self.local:  # server-data's training rows are the server's own
            return None if len(ds.y_train) == 0 else self._inputs(ds, ds.x_train, ds.y_train)
        rows = make_partition(ds, self.settings).validation
        return None if len(rows) == 0 else self._inputs(ds, ds.x_train[rows], ds.y_train[rows])

    def max_count(self, partition_id: int, split: str) -> int:
        """The largest ``num-examples`` partition ``partition_id`` can truly report for
        ``split`` (train or test): its size when known, else the configured cap."""
        sizes = self.partition_sizes
        if sizes is not None and 0 <= partition_id < len(sizes):
            return sizes[partition_id][0 if split == "train" else 1]
        return example_cap(self.settings.max_client_examples)


def private_rng() -> np.random.Generator:
    """A generator seeded from OS entropy: for DP noise and masks, never reproducible
    from the run config."""
    return np.random.default_rng()  # numpy seeds a fresh default_rng from the OS


@dataclass
class Services:
    """Handed to every strategy: data, the seeded sampling stream, the private stream."""

    settings: Settings
    schema: DataSchema | None = None  # dataset=local: the schema the nodes agreed on
    described: dict[int, dict[str, Any]] = field(default_factory=dict)  # dataset=local: node id -> the description discovery merged
    data: ServerData = field(init=False)
    sampling: np.random.Generator = field(init=False)
    private: np.random.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.data = ServerData(self.settings, self.schema)
        self.sampling = np.random.default_rng([int(self.settings.seed), seeds.SAMPLING])  # reproducible choices
        self.private = private_rng()
