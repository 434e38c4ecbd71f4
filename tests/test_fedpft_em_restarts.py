"""fedpft-em-restarts: the number of EM starts each FedPFT class mixture is fitted from reaches
every fit FedPFT makes (a real client's train call), changes the fit where one start lands
worse, defaults to headway.core.gmm.RESTARTS and refuses a value below 1 in one line."""

from __future__ import annotations

import headway.core.fedpft
import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict
from headway.core import protocol as P
from headway.core.config import ConfigError, resolve, resolve_settings
from headway.core.fedpft import fit_class_mixtures
from headway.core.gmm import RESTARTS


def test_the_key_defaults_to_the_em_default():
    assert resolve_settings({"algorithm": "fedpft"}).fedpft.em_restarts == RESTARTS


@pytest.mark.parametrize("value", [0, -2, 11, 1_000_000_000])
def test_starts_outside_one_to_ten_are_refused_in_one_line(value):
    # each start holds another copy of a class's points: a billion starts exhausted a client's memory (outside probe)
    with pytest.raises(ConfigError, match=r"'fedpft-em-restarts' is -?\d+; it must be in 1\.\.10") as err:
        resolve({"algorithm": "fedpft", "fedpft-em-restarts": value})
    assert "\n" not in str(err.value)


def _classes(seed: int) -> tuple[torch.Tensor, np.ndarray]:
    """Three classes of 200-300 points in 16 dimensions, each of ten overlapping Gaussian
    clusters: a 6-component fit of a class ends in different optima from different starts."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    for label, n in enumerate((300, 200, 250)):
        means, std = rng.normal(0.0, 1.0, (10, 16)), rng.uniform(0.3, 0.8, (10, 16))
        which = rng.integers(0, 10, n)
        xs.append(means[which] + rng.normal(size=(n, 16)) * std[which])
        ys.append(np.full(n, label))
    return torch.tensor(np.concatenate(xs), dtype=torch.float32), np.concatenate(ys)


def test_more_starts_give_a_likelier_fit_where_one_start_lands_worse():
    x, y = _classes(11)
    ll = {r: fit_class_mixtures(x, y, 6, "diag", 2, 1e-6, 1e-3, 100, "kmeans", 0, restarts=r)[1] for r in (1, 3)}
    # (the three starts are drawn together, so none of them need be the single start: only the seeded case is checked)
    assert np.all(ll[3] >= ll[1]) and ll[3].sum() > ll[1].sum() + 0.5, ll


def test_a_client_fits_its_mixtures_with_the_configured_starts(data_dir, monkeypatch):
    """The value a real FedPFT client's train call hands to fit_gmm is the run config's."""
    from headway.client.env import client_env
    from headway.client.procedures.fedpft import FedPFTClient

    seen: list[int] = []
    real = headway.core.fedpft.fit_gmm

    def spy(*args, **kwargs):
        seen.append(kwargs["restarts"])
        return real(*args, **kwargs)

    monkeypatch.setattr(headway.core.fedpft, "fit_gmm", spy)
    base = {
        "algorithm": "fedpft",
        "num-server-rounds": 1,
        "fedpft-extractor": "identity",
        "fedpft-components": 2,
        "num-clients": 20,
        "train-fraction": 0.02,
        "data-dir": data_dir,
        "partition": "iid",
    }
    msg = RecordDict({P.CONFIG: ConfigRecord({P.ROUND: 1, P.PHASE: P.PHASE_TRAIN})})
    for overrides, expected in (({"fedpft-em-restarts": 2}, 2), ({}, RESTARTS)):
        seen.clear()
        env = client_env(resolve({**base, **overrides}), {"partition-id": 0})
        FedPFTClient().train(env, msg, RecordDict())
        assert seen == [expected]
