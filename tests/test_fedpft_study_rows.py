"""benchmarks/fedpft.py's study_features: which training rows a study of n rows gets, and how they reach the feature cache."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import benchmarks.fedpft as bench


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Fake 50,000-row CIFAR-10 whose inputs are their row numbers; records each feature call's row count."""
    seen: list[int] = []
    ds = SimpleNamespace(
        name="cifar10", x_train=np.arange(50000), y_train=np.arange(50000) % 10, x_test=-np.arange(1, 101), y_test=np.zeros(100)
    )
    monkeypatch.setattr(bench, "load_dataset", lambda *a: ds)
    monkeypatch.setattr(bench, "to_tensors", lambda ds, x, y: (torch.as_tensor(x), torch.as_tensor(y)))

    def features(cfg: Any, name: str, x: torch.Tensor) -> torch.Tensor:
        seen.append(len(x))
        return x.double()[:, None]

    monkeypatch.setattr(bench, "features", features)
    return seen


def test_larger_studies_keep_the_smaller_ones_rows_and_cache_entries(calls: list[int]) -> None:
    cfg = bench.config(0, [])
    seed, size = bench.STUDY_SAMPLE
    sample = np.sort(np.random.default_rng(seed).permutation(50000)[:size])
    f3, y3, ft, _ = bench.study_features(cfg, 3000)
    assert calls == [3000, 100] and len(ft) == 100  # the default study: one entry, as before the chunks
    assert np.array_equal(f3[:, 0].numpy(), sample[:3000]) and np.array_equal(y3.numpy(), sample[:3000] % 10)
    calls.clear()
    f12, y12, _, _ = bench.study_features(cfg, size)
    assert calls == [3000, 7000, 2000, 100]  # the 3,000- and 10,000-row studies' entries are reused
    assert np.array_equal(f12[:, 0].numpy(), sample) and np.array_equal(y12.numpy(), sample % 10)


@pytest.mark.parametrize("rows", [0, 12001])
def test_rows_outside_the_study_sample_are_refused_in_one_line(calls: list[int], rows: int) -> None:
    with pytest.raises(SystemExit, match="give 1 to 12000"):
        bench.study_features(bench.config(0, []), rows)
    assert calls == []
