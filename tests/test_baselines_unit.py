"""Unit tests of the layer-sharing and prototype methods on hand-made inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from headway.client.env import client_env
from headway.client.procedures.fedavg import FedProxClient
from headway.client.procedures.fedlog import FedLogClient
from headway.client.procedures.fedrep import FedRepClient
from headway.client.procedures.layer_sharing import PERSONAL, SharedLayersClient
from headway.core.config import ConfigError
from headway.core.data import SPECS
from headway.core.layers import layer_names, select, top_layers
from headway.core.models import build_model
from headway.core.prototypes import average_prototypes, class_prototypes, nearest_prototype, prototype_problem
from headway.core.training import ensemble_outputs

from tests.fakes import FakeGrid, engine_for, make_strategy, reply

MNIST = SPECS["mnist"]


def strategy(algorithm, **cfg):
    return make_strategy(algorithm, **cfg)


def test_layers_are_named_in_forward_order_and_selected_by_prefix():
    model = build_model("cifar-cnn", (3, 32, 32), 0, 10)
    assert layer_names(model) == ["body.convs.0", "body.convs.1", "body.fcs.0", "body.fcs.1", "head"]
    assert top_layers(model, 2) == ["body.fcs.1", "head"]
    state = model.state_dict()
    assert sorted(select(state, ["head"])) == ["head.bias", "head.weight"]
    assert "head.weight" not in select(state, ["head"], inside=False) and "body.convs.0.weight" in select(state, ["head"], inside=False)
    assert list(select({"body.fcs.10.weight": 1, "body.fcs.1.weight": 2}, ["body.fcs.1"])) == ["body.fcs.1.weight"]  # no prefix confusion
    with pytest.raises(ValueError, match="asked for the top 6 layers"):
        top_layers(model, 6)


@pytest.mark.parametrize(
    "algorithm, cfg, shared",
    [
        ("lg-fedavg", {"lg-global-layers": 1}, {"head.weight", "head.bias"}),
        ("lg-fedavg", {"lg-global-layers": 2}, {"head.weight", "head.bias", "body.fcs.0.weight", "body.fcs.0.bias"}),
        ("fedper", {}, {"body.convs.0.weight", "body.convs.0.bias", "body.convs.1.weight", "body.convs.1.bias"}),
        (
            "fedrep",
            {"fedrep-local-layers": 1},
            {
                "body.convs.0.weight",
                "body.convs.0.bias",
                "body.convs.1.weight",
                "body.convs.1.bias",
                "body.fcs.0.weight",
                "body.fcs.0.bias",
            },
        ),
    ],
)
def test_each_method_sends_its_shared_layers_and_averages_them_by_count(task_identity, algorithm, cfg, shared):
    s = strategy(
        algorithm, **cfg, **{"max-first-update-norm": 100.0}
    )  # constant arrays are far from the initial model: this test is about the average

    def answer(pid, msg):
        sent = {k: v.numpy() for k, v in msg.content["arrays"].items()}
        if pid == 0:
            return reply({k: np.full_like(v, 0.01) for k, v in sent.items()}, 10, pid)
        if pid == 1:
            return reply({k: np.full_like(v, 0.04) for k, v in sent.items()}, 20, pid)
        return reply({k: v for k, v in sent.items() if k != sorted(sent)[0]}, 30, pid)  # a layer missing: not averageable

    grid = FakeGrid(3, answer)
    engine = engine_for(s, grid)
    step = s.train_round(1, s.initial_state(), engine)
    trained = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(trained) == 3 and set(trained[0].content["arrays"]) == shared
    assert step.clients == 2 and len(engine.meter.failures) == 1 and "missing" in engine.meter.failures[0]
    for v in step.arrays.values():
        assert np.allclose(v.numpy(), 0.03)  # (10·0.01 + 20·0.04) / 30


def test_lg_fedavg_warm_up_shares_the_whole_model_then_only_the_head(task_identity):
    s = strategy("lg-fedavg", **{"lg-warmup-rounds": 2})
    full = s.initial_arrays()
    engine = engine_for(s, FakeGrid(3))
    for rnd, shared in ((2, set(full)), (3, {"head.weight", "head.bias"})):
        ctx, contents = s.configure_train(rnd, s.initial_state(full), engine)
        assert set(next(iter(contents.values()))["arrays"]) == shared and set(ctx.sent) == shared  # replies are checked against it


def test_lg_fedavg_logs_its_own_run_config_keys(caplog):
    """The strategy's start-of-run line names the method's declared keys (lg-*), not keys
    that start with the method's name (none do for lg-fedavg)."""
    s = strategy("lg-fedavg", **{"lg-global-layers": 2})
    with caplog.at_level("DEBUG", logger="headway"):  # DEBUG: `headway run --verbose` shows it
        s.summary()
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("strategy lg-fedavg"))
    assert "'lg-global-layers': '2'" in line and "'lg-warmup-rounds': 0" in line and "'lg-new-test': True" in line


def test_layer_sharing_runs_fedavg_init(monkeypatch):
    """LayerSharing is a FedAvg: its construction goes through FedAvg's (the one-body rule,
    relaxed only where mixed_bodies says so)."""
    from headway.strategies.fedavg import FedAvg

    seen, original = [], FedAvg.__init__

    def spy(self, *args):
        seen.append(type(self).__name__)
        original(self, *args)

    monkeypatch.setattr(FedAvg, "__init__", spy)
    for algorithm in ("lg-fedavg", "fedper", "fedrep"):
        strategy(algorithm)
    assert seen == ["LGFedAvg", "FedPer", "FedRep"]


def test_mixed_bodies_allowed_only_where_shared_layers_agree():
    strategy("lg-fedavg", bodies="mnist-cnn,mlp", **{"feature-dim": 50})  # heads 51→10 agree
    with pytest.raises(ConfigError, match="shared layers"):
        strategy("lg-fedavg", bodies="mnist-cnn,mlp", **{"feature-dim": 50, "lg-global-layers": 2})
    with pytest.raises(ConfigError, match="same body"):
        strategy("fedper", bodies="mnist-cnn,mlp", **{"feature-dim": 50})
    with pytest.raises(ConfigError, match="nothing to share"):
        strategy("fedper", **{"fedper-local-layers": 4})


def test_prototypes_average_per_class_weighted_by_counts():
    p1 = np.array([[1.0, 1.0], [0.0, 0.0], [0.0, 0.0]])
    p2 = np.array([[3.0, 5.0], [2.0, -2.0], [0.0, 0.0]])
    protos, counts = average_prototypes([p1, p2], [np.array([1.0, 0.0, 0.0]), np.array([3.0, 2.0, 0.0])])
    assert np.allclose(protos[0], [2.5, 4.0])  # (1·[1,1] + 3·[3,5]) / 4
    assert np.allclose(protos[1], [2.0, -2.0])  # only client 2 holds class 1: client 1's zeros do not dilute it
    assert np.allclose(protos[2], 0.0) and counts.tolist() == [4.0, 2.0, 0.0]


def test_client_prototypes_are_class_means_and_checked():
    feats = np.array([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
    protos, counts = class_prototypes(feats, np.array([0, 0, 2]), 3)
    assert np.allclose(protos, [[2.0, 1.0], [0.0, 0.0], [5.0, 5.0]]) and counts.tolist() == [2, 0, 1]
    assert prototype_problem(protos, counts, 3, (3, 2)) is None
    assert "add up" in (prototype_problem(protos, counts, 4, (3, 2)) or "")
    assert "shape" in (prototype_problem(protos[:, :1], counts, 3, (3, 2)) or "")
    assert "NaN" in (prototype_problem(np.full((3, 2), np.nan), counts, 3, (3, 2)) or "")
    assert "non-negative" in (prototype_problem(protos, np.array([3.0, -1.0, 1.0]), 3, (3, 2)) or "")
    assert "no examples" in (prototype_problem(np.ones((3, 2)), counts, 3, (3, 2)) or "")


def test_nearest_prototype_skips_classes_without_a_prototype():
    protos = np.array([[0.0, 0.0], [10.0, 10.0], [1.0, 1.0]])
    feats = np.array([[0.9, 0.9], [9.0, 9.0]])
    assert nearest_prototype(feats, protos, np.array([True, True, True])).tolist() == [2, 1]
    assert nearest_prototype(feats, protos, np.array([True, True, False])).tolist() == [0, 1]


def test_ensemble_is_the_mean_of_the_models_logits():
    torch.manual_seed(0)
    models = [torch.nn.Linear(4, 3) for _ in range(3)]
    x = torch.randn(7, 4)
    with torch.no_grad():
        expected = sum(m(x) for m in models) / 3
    assert torch.allclose(ensemble_outputs(models, x, batch_size=2), expected, atol=1e-6)


def test_one_model_with_extreme_logits_decides_the_logit_ensemble_but_not_the_probability_or_median_ones():
    """The new test's rules (lg-ensemble) against an upload whose head bias is 1e6 on class 2: the paper's mean of
    logits answers 2 everywhere; the mean softmax (the liar adds at most 1/K to a class) and the median follow the two
    confident honest models."""
    torch.manual_seed(0)
    honest = torch.nn.Linear(4, 3)
    liar = torch.nn.Linear(4, 3)
    with torch.no_grad():
        honest.weight *= 20  # confident: its top class holds most of the probability
        liar.bias[2] = 1e6
    x = torch.randn(50, 4)
    with torch.no_grad():
        truth = honest(x).argmax(1)
    models = [honest, honest, liar]
    assert (ensemble_outputs(models, x, "logits").argmax(1) == 2).all()
    assert torch.equal(ensemble_outputs(models, x, "median").argmax(1), truth)
    probabilities = ensemble_outputs(models, x, "probabilities").exp()
    with torch.no_grad():
        assert (probabilities - torch.softmax(honest(x), 1)).abs().max() <= 1 / 3 + 1e-6  # one of K = 3 moves a class by 1/3 at most
    assert (probabilities.argmax(1) == truth).float().mean() > 0.9  # it wins only where the honest models are unsure
    with pytest.raises(ValueError, match="unknown ensemble rule"):
        ensemble_outputs(models, x, "vote")


def _env(data_dir, algorithm, pid=0, **cfg):
    run = {"algorithm": algorithm, "num-clients": 3, "train-fraction": 0.02, "batch-size": 10, "data-dir": data_dir, **cfg}
    return client_env(run, {"partition-id": pid})


@pytest.mark.parametrize("init", ["shared", "per-client"])
def test_body_init_gives_clients_one_or_their_own_initial_weights(data_dir, init):
    def weights(pid, seed=0):
        env = _env(data_dir, "fedlog", pid, **{"body-init": init, "seed": seed})
        return list(env.build_model().state_dict().values()), list(FedLogClient()._features(env, RecordDict()).body.state_dict().values())

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a, b))

    (net0, body0), (net1, body1) = weights(0), weights(1)
    assert same(net0, net1) == same(body0, body1) == (init == "shared")
    assert same(weights(1)[1], body1)  # reproducible from the run seed
    assert not same(weights(1, seed=1)[1], body1)


def _shared_content(env, model):
    names = set(select(model.state_dict(), top_layers(model, 1), inside=False))  # FedRep shares all but the head
    arrays = ArrayRecord({k: v for k, v in model.state_dict().items() if k in names})
    return RecordDict({"arrays": arrays, "config": ConfigRecord({"server-round": 1})})


@pytest.mark.parametrize("head_epochs, body_epochs, moved", [(2, 0, "head"), (0, 2, "body")])
def test_fedrep_trains_head_and_body_in_separate_phases(data_dir, head_epochs, body_epochs, moved):
    env = _env(data_dir, "fedrep", **{"fedrep-head-epochs": head_epochs, "local-epochs": body_epochs})
    proc = FedRepClient()
    content, state = _shared_content(env, env.build_model()), RecordDict()
    before = {k: v.clone() for k, v in proc.model(env, content, state)[0].state_dict().items()}
    proc.train(env, content, state)
    after = state.array_records[PERSONAL].to_torch_state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    head = {"head.weight", "head.bias"}
    assert changed == (head if moved == "head" else set(before) - head)


def test_fedprox_term_keeps_the_model_near_the_global_one(data_dir):
    drift = {}
    for mu in (0.0, 10.0):
        env = _env(data_dir, "fedprox", **{"fedprox-mu": mu, "local-epochs": 2, "lr": 0.01})
        model = env.build_model()
        start = [p.detach().clone() for p in model.parameters()]
        FedProxClient().fit(env, model, [], 1)
        drift[mu] = sum(float(((p.detach() - s) ** 2).sum()) for p, s in zip(model.parameters(), start))
    assert drift[10.0] < 0.5 * drift[0.0]


def test_client_keeps_its_local_layers_and_takes_the_received_ones(data_dir):
    env = _env(data_dir, "lg-fedavg")
    proc = SharedLayersClient()
    model = env.build_model()
    head = {k: torch.full_like(v, 0.5) for k, v in model.state_dict().items() if k.startswith("head.")}
    body = {k: torch.full_like(v, 0.25) for k, v in model.state_dict().items() if not k.startswith("head.")}
    state = RecordDict({PERSONAL: ArrayRecord({**body, **{k: torch.zeros_like(v) for k, v in head.items()}})})
    merged, shared = proc.model(env, RecordDict({"arrays": ArrayRecord(head)}), state)
    sd = merged.state_dict()
    assert sorted(shared) == ["head.bias", "head.weight"]
    assert all(torch.all(sd[k] == 0.5) for k in head) and all(torch.all(sd[k] == 0.25) for k in body)
    with pytest.raises(ValueError, match="does not have"):
        proc.model(env, RecordDict({"arrays": ArrayRecord({"head.weight": torch.zeros(3, 3)})}), state)


def test_lg_new_test_scores_the_ensemble_of_uploaded_models_and_rejects_bad_uploads(task_identity, data_dir):
    from headway.core.data import load_dataset, to_tensors
    from headway.core.training import task_metrics

    s = strategy("lg-fedavg", **{"data-dir": data_dir})
    models = [build_model("mnist-cnn", (1, 28, 28), 0, 10, seed) for seed in (1, 2)]

    def answer(pid, msg):
        assert msg.content["config"]["phase"] == "upload-model"
        if pid < 2:
            state = {k: v.numpy() for k, v in models[pid].state_dict().items()}
        else:  # a client sends a model that does not fit its architecture
            state = {"head.weight": np.zeros((2, 2), np.float32)}
        return reply(state, None, pid)

    engine = engine_for(s, FakeGrid(3, answer))
    out = s.final_evaluation(s.initial_state(ArrayRecord()), engine)
    ds = load_dataset("mnist", data_dir, 0)
    x, y = to_tensors(ds, ds.x_test, ds.y_test)
    expected = task_metrics("classification", ensemble_outputs([m.eval() for m in models], x), y)["accuracy"]
    assert out["new_test_models"] == 2 and out["new_test_accuracy"] == pytest.approx(expected)
    assert len(engine.meter.failures) == 1 and "array names differ" in engine.meter.failures[0]
    assert engine.meter.phase("upload-model")[1] > 2 * 21840 * 4  # two whole models came up


def test_fedproto_server_averages_valid_prototypes_only(task_identity):
    s = strategy("fedproto")
    p1, c1 = np.zeros((10, 50), np.float32), np.zeros(10, np.float32)
    p1[0], c1[0] = 1.0, 4
    p2, c2 = np.zeros((10, 50), np.float32), np.zeros(10, np.float32)
    p2[0], p2[1], c2[0], c2[1] = 3.0, 7.0, 4, 2
    nan = p2.copy()
    nan[1, 0] = np.nan
    payloads = [(p1, c1), (p2, c2), (nan, c2)]
    grid = FakeGrid(
        3, lambda pid, msg: reply({"prototypes": payloads[pid][0], "class-counts": payloads[pid][1]}, int(payloads[pid][1].sum()), pid)
    )
    engine = engine_for(s, grid)
    step = s.train_round(1, s.initial_state(), engine)
    assert len(grid.sent[-1].content["arrays"]) == 0  # nothing to send before the first aggregation
    assert step.clients == 2 and len(engine.meter.failures) == 1 and "NaN" in engine.meter.failures[0]
    protos = step.arrays["prototypes"].numpy()
    assert np.allclose(protos[0], 2.0) and np.allclose(protos[1], 7.0) and np.allclose(protos[2:], 0.0)
    assert step.arrays["class-counts"].numpy().tolist()[:3] == [8.0, 2.0, 0.0]
    after = s.initial_state().advance(step)
    assert set(next(iter(s.configure_train(2, after, engine)[1].values()))["arrays"]) == {"prototypes", "class-counts"}


def test_fedproto_pulls_the_features_before_feature_dropout_towards_the_prototypes(data_dir, monkeypatch):
    """The authors' FedProto takes its prototypes from the features before the dropout that
    feeds the classifier; on dropped-out features λ‖f − c_y‖² adds a hidden (p/(1-p))·‖f‖²
    penalty. With p = 0.95 the dropped-out features are nearly all zero."""
    import headway.client.procedures.fedproto as fp
    from flwr.app import Array

    seen = []
    real = fp.prototype_loss

    def recorded(f, *a):
        seen.append(f.detach().clone())
        return real(f, *a)

    monkeypatch.setattr(fp, "prototype_loss", recorded)
    env = client_env(
        {"algorithm": "fedproto", "data-dir": data_dir, "train-fraction": 0.01, "local-epochs": 1, "body-dropout": 0.95},
        {"partition-id": 0, "num-partitions": 50},
    )
    content = RecordDict(
        {
            "arrays": ArrayRecord(
                {"prototypes": Array(np.full((10, 50), 0.5, np.float32)), "class-counts": Array(np.full(10, 100.0, np.float32))}
            ),
            "config": ConfigRecord({"server-round": 2, "phase": "train"}),
        }
    )
    fp.FedProtoClient().train(env, content, RecordDict())
    nonzero = float(np.mean([(f != 0).float().mean() for f in seen]))
    assert seen and nonzero > 0.2, nonzero  # dropped-out features would be ~5 % × the ReLU's share
