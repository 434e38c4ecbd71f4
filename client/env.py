"""What a client knows about itself: its config, partition, data tensors, body and device."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
import torch
from headway.core import seeds
from headway.core.config import LOCAL, body_for, fit_body, resolve_settings
from headway.core.data import Dataset, to_tensors
from headway.core.fairness import encode_protected, parse_protected
from headway.core.labels import check_label_column
from headway.core.models import Net, build_model, resolve_device
from headway.core.noise import corrupt, noise_assignment, parse_client_transform, transform
from headway.core.partition import make_partition
from headway.core.run_data import load_node_data, load_run_dataset
from headway.core.settings import Settings
from headway.core.sources import ReaderLimits, limits_from_node_config

log = logging.getLogger("headway")


@dataclass
class ClientEnv:
    """One client's view of the run: everything a procedure needs, nothing of Flower."""

    cfg: Settings
    partition_id: int
    body: str
    data: Dataset
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    device: torch.device
    # protected-columns: P of the training and test rows, (n, m) float 0/1, one column per protected column; None when
    # the run names none. Held here only: no reply, registration or log carries them.
    p_train: torch.Tensor | None = None
    p_test: torch.Tensor | None = None

    @property
    def outputs(self) -> int:
        """The head's width: one output per class of the data set, so every client's head lines up."""
        return self.data.num_classes

    @property
    def init_seed(self) -> int:
        """Seed of this client's initial model: the run seed for all clients, or with
        ``body-init=per-client`` one derived from the run seed and the partition id."""
        if self.cfg.body_init == "per-client":
            return _derived_seed(self.cfg.seed, self.partition_id, seeds.PER_CLIENT_INIT)
        return int(self.cfg.seed)

    def build_model(self, body: str | None = None) -> Net:
        """This client's initial model (see ``init_seed``)."""
        return build_model(
            body or self.body, self.data.input_shape, self.cfg.feature_dim, self.outputs, self.init_seed, self.cfg.body_dropout
        ).to(self.device)

    def lr(self, server_round: int) -> float:
        """The learning rate of ``server_round``: lr · lr-decay^(round − 1) (rounds from 1)."""
        return float(self.cfg.lr) * float(self.cfg.lr_decay) ** max(server_round - 1, 0)

    def seed_for(self, server_round: int, salt: int = seeds.BATCHES) -> int:
        """A seed for this client's randomness in one round (batches, crops, noise)."""
        return _derived_seed(self.cfg.seed, self.partition_id, server_round, salt)


def _derived_seed(*parts: object) -> int:
    """A 32-bit seed hashed from ``parts``: independent streams per client, round and use."""
    key = ":".join(map(str, parts)).encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little")


@lru_cache(maxsize=64)
def _env(cfg: Settings, partition_id: int, body_override: str) -> ClientEnv:
    """A simulated client: partition ``partition_id`` of the run's whole data set (``cfg`` is frozen: the cache's key)."""
    ds = load_run_dataset(cfg)
    part = make_partition(ds, cfg)
    if not 0 <= partition_id < part.num_clients:
        raise ValueError(f"partition-id {partition_id} is outside 0..{part.num_clients - 1} (num-clients={cfg.num_clients})")
    tr, te = part.train[partition_id], part.test[partition_id]
    env = _make_env(cfg, partition_id, body_override, ds, (ds.x_train[tr], ds.y_train[tr]), (ds.x_test[te], ds.y_test[te]))
    return with_protected(env, tr, te)


@lru_cache(maxsize=8)
def _local_env(cfg: Settings, data: str, schema_json: str, slot: int, body_override: str, limits: ReaderLimits) -> ClientEnv:
    """A node that owns its data: all of the source at ``data``, encoded with the run's
    agreed schema; ``slot`` is the client index the server gave it at registration; ``limits``
    are the node's own reader limits (its --node-config)."""
    ds = load_node_data(data, cfg, schema_json, limits)
    env = _make_env(cfg, slot, body_override, ds, (ds.x_train, ds.y_train), (ds.x_test, ds.y_test))
    return with_protected(env, np.arange(len(ds.y_train)), np.arange(len(ds.y_test)))


def with_protected(env: ClientEnv, train_rows: np.ndarray, test_rows: np.ndarray) -> ClientEnv:
    """``env`` with P of its rows (``protected-columns``, encoded by :func:`headway.core.fairness.encode_protected`
    against the loaded training rows); unchanged when the run names no protected column."""
    specs = parse_protected(env.cfg.protected_columns)
    if not specs:
        return env
    ds = env.data

    def targets(attrs: dict[str, np.ndarray], rows: np.ndarray) -> torch.Tensor:
        cols = [encode_protected(attrs[s.column][rows], s, ds.attrs_train[s.column]) for s in specs]
        return torch.from_numpy(np.stack(cols, axis=1).astype(np.float32))

    missing = [s.column for s in specs if s.column not in ds.attrs_train]
    if missing:
        raise ValueError(f"run-config key 'protected-columns' names {missing}, which data set {ds.name!r} does not hold as row attributes")
    p_test = targets(ds.attrs_test, test_rows)
    for column in constant_columns(p_test, [s.column for s in specs]):
        log.warning(
            "client %d: protected column %r is the same on all %d of its test rows, so its adversary AUC cannot be computed here "
            "(an AUC needs test rows with P = 1 and with P = 0): its adversary and post-hoc AUCs leave that column out (absent when it is the only one)",
            env.partition_id,
            column,
            len(p_test),
        )
    return replace(env, p_train=targets(ds.attrs_train, train_rows), p_test=p_test)


def constant_columns(p: torch.Tensor, names: list[str]) -> list[str]:
    """The protected columns whose P does not vary over the rows of ``p`` (no AUC can be computed on them)."""
    return [name for j, name in enumerate(names) if len(p) == 0 or bool((p[:, j] == p[0, j]).all())]


def _make_env(
    cfg: Settings,
    partition_id: int,
    body_override: str,
    ds: Dataset,
    train: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
) -> ClientEnv:
    """Tensors, body and device of client ``partition_id`` from its raw train and test rows."""
    x_raw = train[0]
    kind = noise_assignment(cfg.client_noise, cfg.num_clients, cfg.seed).get(partition_id)
    if kind is not None:  # a low-quality client: its training data only, deterministically from the seed
        x_raw = corrupt(x_raw, kind, np.random.default_rng([int(cfg.seed), partition_id, seeds.NOISE]))
    x_test = test[0]
    if (turn := parse_client_transform(cfg.client_transform).get(partition_id)) is not None:  # another domain: train and test alike
        x_raw, x_test = transform(x_raw, turn), transform(x_test, turn)
    xtr, ytr = to_tensors(ds, x_raw, train[1])
    xte, yte = to_tensors(ds, x_test, test[1])
    device = resolve_device(cfg.device)
    if cfg.inputs == "features":  # the frozen extractor's features stand in for the inputs (noise applied before)
        from headway.core.extractors import configured_features

        xtr, xte = configured_features(cfg, ds.name, xtr, device), configured_features(cfg, ds.name, xte, device)
        ds = replace(ds, input_shape=(xtr.shape[1],), augment=False)  # a view: same arrays, models see vectors
    cfg = fit_body(cfg, ds.input_shape)  # body=auto: the body that fits the inputs (the server picks the same from the same shape)
    body = body_for(cfg, partition_id, body_override or None)
    return ClientEnv(cfg, partition_id, body, ds, xtr, ytr, xte, yte, device)


def node_cfg(run_config: Mapping[str, Any], node_config: Mapping[str, Any]) -> Settings:
    """The settings of the run as this node reads them: a SuperNode's ``data-dir`` overrides the run's. A
    node imports only the body it runs: the others the run names need not be installed here."""
    overrides = {k: node_config[k] for k in ("data-dir",) if k in node_config}
    return resolve_settings({**dict(run_config), **overrides}, import_bodies=False)


def local_data(cfg: Settings, node_config: Mapping[str, Any]) -> str | None:
    """The path of this node's own data with ``dataset=local`` (node config ``data``), None
    in a run that partitions one data set; ValueError when the two do not match, or when the
    node refuses the run's label column (:func:`headway.core.labels.check_label_column`: before
    any description, registration or reply, so nothing of a refused column leaves the node)."""
    data = str(node_config.get("data", "") or "")
    if cfg.dataset == LOCAL and not data:
        raise ValueError(
            "the run has dataset='local', so every node reads its own data, but this node's config has no 'data': "
            'start the SuperNode with --node-config "data=PATH" (the launcher: --data PATH)'
        )
    if data and cfg.dataset != LOCAL:
        raise ValueError(
            f"this node was started with its own data (data={data!r}), but the run partitions dataset={cfg.dataset!r} "
            "by partition id: submit the run with dataset='local', or start the node with --partition-id instead"
        )
    if data:
        check_label_column(data, cfg, node_config)
    return data or None


def client_env(run_config: Mapping[str, Any], node_config: Mapping[str, Any], joined: tuple[str, int] | None = None) -> ClientEnv:
    """Build (or reuse, within one process) the environment of the client on this node.

    In simulation ``node_config`` holds ``partition-id``; in deployment a SuperNode's
    ``--node-config`` gives either ``partition-id`` (a demo: its share of one data set) or
    ``data`` (the node's own data; ``joined`` is then the schema JSON and client index the
    server sent at registration), and may give ``body`` and ``data-dir``.
    """
    cfg = node_cfg(run_config, node_config)
    body = str(node_config.get("body", ""))
    data = local_data(cfg, node_config)
    if data is not None:
        if joined is None:
            raise ValueError(
                "this node has not registered with the server in this run (no schema received): it is asked again when it reconnects"
            )
        schema_json, slot = joined
        return _local_env(cfg, data, schema_json, int(slot), body, limits_from_node_config(node_config))
    if "partition-id" not in node_config:
        raise ValueError(
            "node config has no 'partition-id': start the SuperNode with --node-config \"partition-id=N num-partitions=M\", "
            "or with its own data: --node-config \"data=PATH\" and dataset='local'"
        )
    pid = int(node_config["partition-id"])
    return _env(cfg, pid, body)
