"""The in-process FedPFT studies of benchmarks/fedpft.py (dp-study, fig7): what each DP variant releases."""

from __future__ import annotations

import numpy as np
import torch
from headway.core.fedpft import normalize

from benchmarks.fedpft import _as_sent, dp_mixtures


def _data() -> tuple[torch.Tensor, np.ndarray]:
    gen = torch.Generator().manual_seed(0)
    f = normalize(torch.rand(300, 16, generator=gen, dtype=torch.float64) + 0.5)
    return f, np.repeat([0, 1, 2], [200, 60, 40])


def test_dp_study_variants_noise_only_what_they_name_and_drop_small_classes():
    f, y = _data()
    exact = {m.label: m for m in dp_mixtures(f, y, 1.0, "none", 2, np.random.default_rng(1))}
    c0 = f[torch.as_tensor(y == 0)]
    assert np.allclose(exact[0].means[0], c0.mean(0).numpy()) and np.isclose(
        exact[0].covariances[0], ((c0 - c0.mean(0)) ** 2).mean().item()
    )
    for noise, mean_noised, var_noised in (("mean", True, False), ("variance", False, True), ("both", True, True)):
        out = {m.label: m for m in dp_mixtures(f, y, 1.0, noise, 50, np.random.default_rng(1))}
        assert sorted(out) == [0, 1]  # the class of 40 examples is not sent at min_n = 50
        for c in out:
            assert (not np.allclose(out[c].means, exact[c].means)) == mean_noised
            assert (not np.allclose(out[c].covariances, exact[c].covariances)) == var_noised


def test_study_mixtures_are_rounded_as_the_wire_carries_them():
    f, y = _data()
    sent = _as_sent(dp_mixtures(f, y, 1.0, "none", 2, np.random.default_rng(1)))
    assert all(np.array_equal(m.means, m.means.astype(np.float16).astype(np.float64)) for m in sent)
