"""benchmarks/fedprof_untuned.py: the runs it makes, the 28×28 digits it writes as a user's
own data set, and the divergence AUC its table reports."""

from __future__ import annotations

import numpy as np

import benchmarks.fedprof_untuned as bench


def test_auc_counts_noisy_clients_that_diverge_more_than_clean_ones():
    noise = {1: "irrelevant", 2: "salt-pepper"}
    assert bench.divergence_auc({"0": 0.1, "1": 0.5, "2": 0.9, "3": 0.2}, noise) == 1.0
    assert bench.divergence_auc({"0": 0.6, "1": 0.5, "2": 0.9, "3": 0.2}, noise) == 0.75
    assert bench.divergence_auc({"0": 0.5, "1": 0.5}, noise) == 0.5  # a tie counts half
    assert bench.divergence_auc({"0": 0.1}, noise) is None  # no noisy client scored


def test_digits_are_upsampled_to_28_by_28_uint8_and_keep_their_shape():
    images = np.zeros((2, 8, 8))
    images[0, :, :4] = 16  # left half lit
    out = bench.upsample(images, 28)
    assert out.shape == (2, 28, 28) and out.dtype == np.uint8
    assert out[0, :, :12].min() == 255 and out[0, :, 16:].max() == 0 and out[1].max() == 0


def test_every_mode_and_layer_runs_fedprof_against_fedavg_with_the_same_aggregation(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(bench, "simulate", lambda config, out, overrides, sets: calls.append((out.relative_to(tmp_path), overrides)))
    monkeypatch.setattr(bench, "results_root", lambda name, tag: tmp_path)
    bench.main(["--datasets", "mnist", "--modes", "full", "partial", "--layers", "body", "body.fcs.0", "--seeds", "3"])
    runs = {str(path): o for path, o in calls}
    assert len(runs) == 8
    assert runs["mnist/partial@body.fcs.0/fedavg-s3"] == {
        "dataset": "mnist",
        "fedprof-aggregation": "partial",
        "fedprof-layer": "body.fcs.0",
        "seed": 3,
        "fedprof-alpha": 0.0,
    }
    assert "fedprof-alpha" not in runs["mnist/full/fedprof-s3"] and runs["mnist/full/fedprof-s3"]["fedprof-aggregation"] == "full"


def test_clean_share_is_the_chance_a_draw_by_score_picks_a_clean_client():
    from benchmarks.fedprof_layers import clean_share

    noise = {1: "irrelevant"}
    assert clean_share({"0": 0.0, "1": 0.0}, noise, 10.0) == 0.5
    assert abs(clean_share({"0": 0.0, "1": np.log(3) / 10}, noise, 10.0) - 0.75) < 1e-12  # λ = 1 and 1/3


def test_pre_activation_is_the_bodys_last_linear_operator_before_its_relu():
    import torch
    from headway.core.models import build_model
    from headway.core.profiles import model_profile, resolve_layer

    cnn, lenet, linear = (build_model(b, (1, 28, 28), 0, 10) for b in ("mnist-cnn", "lenet5", "linear"))
    assert (resolve_layer(cnn, "pre-activation"), resolve_layer(lenet, "pre-activation")) == ("body.fcs.0", "body.fcs.1")
    assert resolve_layer(linear, "pre-activation") == "body" and resolve_layer(cnn, "body") == "body"
    x = torch.randn(64, 1, 28, 28)
    pre, post = model_profile(cnn, "pre-activation", x), model_profile(cnn, "body", x)
    assert pre.shape == post.shape == (50, 2) and pre[:, 0].min() < 0 <= post[:, 0].min()


def test_fedprof_defaults_to_partial_aggregation_on_the_post_relu_features():
    """Issue 42: full aggregation trailed partial for FedProf and uniform selection alike (benchmarks/README.md)."""
    from headway.core.config import resolve_settings

    cfg = resolve_settings({"algorithm": "fedprof"})
    assert (cfg.fedprof.aggregation, cfg.fedprof.layer) == ("partial", "body")
