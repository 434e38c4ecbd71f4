"""FedLog-C's repulsion term β (AAAI Eq. 15): Σ_{y'≠y} ‖φ − Φ̄_{y'}‖² over the classes the
server has seen, subtracted; refused where it leaves the loss without a minimum; wired into
the client's objective; and the server sends Φ when β alone asks for it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from headway.client.env import client_env
from headway.client.procedures.fedlog import feature_map, fedlog_c_loss, fedlog_c_repulsion, train_body
from headway.core.config import ConfigError, resolve_settings
from headway.core.extractors import input_spec
from headway.strategies.fedlog import FedLog, FedLogState

from tests.fakes import make_strategy


def test_repulsion_sums_the_other_seen_classes_per_example():
    g = torch.Generator().manual_seed(0)
    phi, means = torch.randn(6, 4, generator=g), torch.randn(5, 4, generator=g)
    y = torch.tensor([0, 1, 2, 2, 4, 3])
    known = torch.tensor([True, True, False, True, True])  # class 2: no client has it
    want = sum(float(((phi[i] - means[c]) ** 2).sum()) for i in range(6) for c in range(5) if c != int(y[i]) and bool(known[c])) / 6
    assert float(fedlog_c_repulsion(phi, y, means, known)) == pytest.approx(want, rel=1e-6)


@pytest.mark.parametrize("beta, bounded", [(0.001, True), (0.002, False)])
def test_the_loss_has_a_minimum_only_while_alpha_outweighs_beta(beta, bounded):
    """α‖φ − Φ̄_y‖² − β Σ_{y'≠y}‖φ − Φ̄_{y'}‖² along φ = t·d: its t² coefficient is α − β·(classes − 1)."""
    g = torch.Generator().manual_seed(1)
    means, d = torch.randn(10, 8, generator=g), torch.randn(1, 8, generator=g)
    y, known = torch.tensor([3]), torch.ones(10, dtype=torch.bool)

    def loss(t: float) -> float:
        return float(0.01 * fedlog_c_loss(t * d, y, means, known) - beta * fedlog_c_repulsion(t * d, y, means, known))

    far = [loss(t) for t in (1e2, 1e3, 1e4)]
    assert (far[0] < far[1] < far[2]) if bounded else (far[0] > far[1] > far[2] and far[2] < -1e4)


def test_an_unbounded_beta_is_refused_unless_the_features_are_clipped():
    def check(**cfg) -> None:
        settings = resolve_settings({"algorithm": "fedlog", **cfg})
        FedLog.check_config(settings, input_spec(settings))

    with pytest.raises(ConfigError, match="fedlog-beta"):
        check(**{"fedlog-alpha": 0.01, "fedlog-beta": 0.01})
    check(**{"fedlog-alpha": 0.01, "fedlog-beta": 0.001})  # 0.009 < 0.01
    check(**{"fedlog-alpha": 0.01, "fedlog-beta": 0.01, "fedlog-clip": 5.0})  # bounded features
    check()  # β = 0: today's FedLog


def test_beta_alone_makes_the_server_send_the_statistics():
    phi = np.zeros((10, 51))
    phi[:, 0] = 4.0
    for cfg, sent in (({"fedlog-beta": 0.001, "fedlog-clip": 5.0}, {"eta", "stats-sum"}), ({}, {"eta"})):
        s = make_strategy("fedlog", **cfg)
        assert set(s.head_record(FedLogState(np.zeros((10, 51)), phi))) == sent


def test_beta_enters_the_clients_objective(data_dir):
    """The same body, head, Φ and seed: β > 0 trains another body than β = 0."""
    rng = np.random.default_rng(0)
    eta = rng.normal(0, 0.1, size=(10, 51))
    phi_sum = np.abs(rng.normal(0, 1, size=(10, 51))) * 20
    phi_sum[:, 0] = 20.0

    def trained(beta: float) -> dict[str, torch.Tensor]:
        cfg = {
            "algorithm": "fedlog",
            "data-dir": data_dir,
            "train-fraction": 0.01,
            "local-epochs": 1,
            "fedlog-alpha": 0.01,
            "fedlog-beta": beta,
        }
        env = client_env(cfg, {"partition-id": 0, "num-partitions": 50})
        fmap = feature_map(env, None)
        train_body(env, fmap, eta, phi_sum, 1)
        return {k: v.detach().clone() for k, v in fmap.body.state_dict().items()}

    plain, pushed = trained(0.0), trained(0.001)
    assert any(not torch.equal(plain[k], pushed[k]) for k in plain)
