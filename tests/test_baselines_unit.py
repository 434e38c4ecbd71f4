"""Unit tests of the layer-sharing and prototype methods on hand-made inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from client.env import client_env
from client.procedures.fedavg import FedProxClient
from client.procedures.fedlog import FedLogClient
from client.procedures.fedrep import FedRepClient
from client.procedures.layer_sharing import PERSONAL, SharedLayersClient
from core.config import ConfigError, resolve
from core.data import SPECS
from core.layers import layer_names, select, top_layers
from core.models import build_model
from core.prototypes import average_prototypes, class_prototypes, nearest_prototype, prototype_problem
from core.training import ensemble_logits
from strategies.registry import STRATEGIES

MNIST = SPECS["mnist"]


class NodesGrid:
    """A grid with three connected nodes that answers with prepared contents."""

    def __init__(self, answer=None):
        self.answer = answer or (lambda i, msg: None)

    def get_node_ids(self):
        return [101, 102, 103]

    def send_and_receive(self, messages, timeout):
        out = []
        for i, msg in enumerate(messages):
            content = self.answer(i, msg)
            if content is not None:
                out.append(Message(content=content, reply_to=msg))
        return out


def strategy(algorithm, **cfg):
    s = STRATEGIES[algorithm](resolve({"algorithm": algorithm, "num-clients": 3, "sample-timeout": 0.0, **cfg}))
    s.check(MNIST)
    return s


def reply_content(arrays: dict[str, np.ndarray], n: int) -> RecordDict:
    return RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}), "metrics": MetricRecord({"num-examples": n, "loss": 0.1})})


def test_layers_are_named_in_forward_order_and_selected_by_prefix():
    model = build_model("cifar-cnn", (3, 32, 32), 0, 10)
    assert layer_names(model) == ["body.convs.0", "body.convs.1", "body.fcs.0", "body.fcs.1", "head"]
    assert top_layers(model, 2) == ["body.fcs.1", "head"]
    state = model.state_dict()
    assert sorted(select(state, ["head"])) == ["head.bias", "head.weight"]
    assert "head.weight" not in select(state, ["head"], inside=False) and "body.convs.0.weight" in select(state, ["head"], inside=False)
    assert list(select({"body.fcs.10.weight": 1, "body.fcs.1.weight": 2}, ["body.fcs.1"])) == ["body.fcs.1.weight"]  # no prefix confusion
    with pytest.raises(ValueError):
        top_layers(model, 6)


@pytest.mark.parametrize(
    "algorithm, cfg, shared",
    [
        ("lg-fedavg", {"lg-global-layers": 1}, {"head.weight", "head.bias"}),
        ("lg-fedavg", {"lg-global-layers": 2}, {"head.weight", "head.bias", "body.fcs.0.weight", "body.fcs.0.bias"}),
        ("fedper", {}, {"body.convs.0.weight", "body.convs.0.bias", "body.convs.1.weight", "body.convs.1.bias"}),
        ("fedrep", {"fedrep-local-layers": 1}, {"body.convs.0.weight", "body.convs.0.bias", "body.convs.1.weight", "body.convs.1.bias", "body.fcs.0.weight", "body.fcs.0.bias"}),
    ],
)
def test_each_method_sends_its_shared_layers_and_averages_them_by_count(task_identity, algorithm, cfg, shared):
    s = strategy(algorithm, **cfg)
    msgs = list(s.configure_train(1, s.initial_arrays(MNIST), ConfigRecord(), NodesGrid()))
    assert len(msgs) == 3
    sent = {k: v.numpy() for k, v in msgs[0].content["arrays"].items()}
    assert set(sent) == shared
    a = {k: np.ones_like(v) for k, v in sent.items()}
    b = {k: np.full_like(v, 4.0) for k, v in sent.items()}
    bad = {k: v for k, v in sent.items() if k != sorted(sent)[0]}  # a layer missing: not averageable
    replies = [Message(content=reply_content(x, n), reply_to=m) for x, n, m in ((a, 10, msgs[0]), (b, 20, msgs[1]), (bad, 30, msgs[2]))]
    new, metrics = s.aggregate_train(1, replies)
    assert metrics["clients"] == 2 and s.meter.failures == 1 and "names differ" in s.meter.failure_reasons[0]
    for k, v in new.items():
        assert np.allclose(v.numpy(), 3.0)  # (10·1 + 20·4) / 30


def test_lg_fedavg_warm_up_shares_the_whole_model_then_only_the_head(task_identity):
    s = strategy("lg-fedavg", **{"lg-warmup-rounds": 2})
    full = s.initial_arrays(MNIST)
    assert set(list(s.configure_train(2, full, ConfigRecord(), NodesGrid()))[0].content["arrays"]) == set(full)
    assert set(list(s.configure_train(3, full, ConfigRecord(), NodesGrid()))[0].content["arrays"]) == {"head.weight", "head.bias"}


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
    assert "add up" in prototype_problem(protos, counts, 4, (3, 2))
    assert "shape" in prototype_problem(protos[:, :1], counts, 3, (3, 2))
    assert "NaN" in prototype_problem(np.full((3, 2), np.nan), counts, 3, (3, 2))
    assert "non-negative" in prototype_problem(protos, np.array([3.0, -1.0, 1.0]), 3, (3, 2))
    assert "no examples" in prototype_problem(np.ones((3, 2)), counts, 3, (3, 2))


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
    assert torch.allclose(ensemble_logits(models, x, batch_size=2), expected, atol=1e-6)


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
    after = state[PERSONAL].to_torch_state_dict()
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
    from core.data import load_dataset, to_tensors
    from core.training import score

    s = strategy("lg-fedavg", **{"data-dir": data_dir})
    models = [build_model("mnist-cnn", (1, 28, 28), 0, 10, seed) for seed in (1, 2)]

    def answer(i, msg):
        assert msg.content["config"]["phase"] == "upload-model"
        if i < 2:
            state = ArrayRecord(models[i].state_dict())
        else:  # a client sends a model that does not fit its architecture
            state = ArrayRecord({"head.weight": torch.zeros(2, 2)})
        return RecordDict({"arrays": state, "config": ConfigRecord({"body": "mnist-cnn"}), "metrics": MetricRecord({"num-examples": 1})})

    out = s.final_evaluation(ArrayRecord(), NodesGrid(answer), 10.0)
    ds = load_dataset("mnist", data_dir, 0)
    x, y = to_tensors(ds, ds.x_test, ds.y_test)
    expected = score("classification", ensemble_logits([m.eval() for m in models], x), y)["accuracy"]
    assert out["new_test_models"] == 2 and out["new_test_accuracy"] == pytest.approx(expected)
    assert s.meter.failures == 1 and "does not match" in s.meter.failure_reasons[0]
    assert s.meter.phase_bytes("upload")[1] > 2 * 21840 * 4  # two whole models came up


def test_fedproto_server_averages_valid_prototypes_only(task_identity):
    s = strategy("fedproto")
    msgs = list(s.configure_train(1, ArrayRecord(), ConfigRecord(), NodesGrid()))
    assert len(msgs[0].content["arrays"]) == 0  # nothing to send before the first aggregation
    p1, c1 = np.zeros((10, 50), np.float32), np.zeros(10, np.float32)
    p1[0], c1[0] = 1.0, 4
    p2, c2 = np.zeros((10, 50), np.float32), np.zeros(10, np.float32)
    p2[0], p2[1], c2[0], c2[1] = 3.0, 7.0, 4, 2
    nan = p2.copy()
    nan[1, 0] = np.nan
    replies = [
        Message(content=reply_content({"prototypes": p, "class-counts": c}, int(c.sum())), reply_to=m)
        for (p, c), m in zip(((p1, c1), (p2, c2), (nan, c2)), msgs)
    ]
    new, metrics = s.aggregate_train(1, replies)
    assert metrics["clients"] == 2 and s.meter.failures == 1
    protos = new["prototypes"].numpy()
    assert np.allclose(protos[0], 2.0) and np.allclose(protos[1], 7.0) and np.allclose(protos[2:], 0.0)
    assert new["class-counts"].numpy().tolist()[:3] == [8.0, 2.0, 0.0]
    assert set(list(s.configure_train(2, ArrayRecord(), ConfigRecord(), NodesGrid()))[0].content["arrays"]) == {"prototypes", "class-counts"}
