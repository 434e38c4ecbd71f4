"""LG-FedAvg's global part named by layer patterns (lg-global-layers, issue 41 §1): how a spec resolves
(headway.core.layers.match_layers), the one-line refusals at config time, the paper's split on LeNet-5, an mlp
split on UCI Adult, and the averaging, SecAgg+ and median paths on a pattern split (fake grid)."""

from __future__ import annotations

import numpy as np
import pytest
from headway.client.secure_aggregation import answer
from headway.core import protocol as P
from headway.core.config import ConfigError, resolve, resolve_settings
from headway.core.data import SPECS
from headway.core.layers import layer_names, match_layers, select, top_layers
from headway.core.models import build_model
from headway.server.results import params_totals

from tests.fakes import FakeGrid, engine_for, make_strategy, reply
from tests.test_secure_aggregation import Clients

CONVS = {"body.convs.0.weight", "body.convs.0.bias", "body.convs.1.weight", "body.convs.1.bias"}


def test_a_whole_number_is_the_top_k_shorthand_and_patterns_match_with_or_without_the_first_component():
    model = build_model("lenet5", (3, 32, 32), 0, 10)
    assert match_layers(model, "2") == match_layers(model, 2) == top_layers(model, 2) == ["body.fcs.1", "head"]
    assert match_layers(model, "convs.*") == ["body.convs.0", "body.convs.1"]
    assert match_layers(model, "body.convs.*") == ["body.convs.0", "body.convs.1"]
    assert match_layers(model, " head , convs.1") == ["body.convs.1", "head"]  # input side first, whatever the order written
    assert match_layers(model, "fcs.?") == ["body.fcs.0", "body.fcs.1"]


def test_the_papers_split_on_lenet5_for_cifar_is_2872_parameters():
    model = build_model("lenet5", (3, 32, 32), 0, 10)
    part = select(model.state_dict(), match_layers(model, "convs.*"))
    assert set(part) == CONVS and sum(v.numel() for v in part.values()) == 2872


@pytest.mark.parametrize(
    "spec, match",
    [
        ("convz.*", "pattern 'convz.*' names no layer; the layers are body.convs.0, body.convs.1, body.fcs.0, body.fcs.1, head"),
        ("convs.*,fcs.*,head", "names every layer"),
        ("*", "names every layer"),
        ("convs.*,", "empty pattern"),
    ],
)
def test_bad_specs_are_refused_naming_the_pattern_and_the_layers(spec, match):
    with pytest.raises(ValueError, match=match.replace(".", r"\.").replace("*", r"\*")):
        match_layers(build_model("lenet5", (3, 32, 32), 0, 10), spec)


def test_the_strategy_refuses_a_bad_spec_at_config_time_in_one_line_naming_the_body():
    with pytest.raises(ConfigError) as err:
        make_strategy("lg-fedavg", body="mnist-cnn", **{"lg-global-layers": "convz.*"})
    text = str(err.value)
    assert "\n" not in text and "'convz.*'" in text and "body 'mnist-cnn'" in text and "body.convs.0" in text
    with pytest.raises(ConfigError, match="names every layer"):
        make_strategy("lg-fedavg", body="mnist-cnn", **{"lg-global-layers": "*"})
    with pytest.raises(ConfigError, match=r"'lg-global-layers' is '0'"):
        resolve({"algorithm": "lg-fedavg", "lg-global-layers": 0})


def test_bodies_whose_matched_layers_differ_are_refused_naming_both_bodies():
    """mnist-cnn's convolutions and lenet5's differ in shape (first conv 1→10 vs 1→6); an mlp has none to match."""
    with pytest.raises(ConfigError) as err:
        make_strategy("lg-fedavg", body="mnist-cnn", bodies="mnist-cnn,lenet5", **{"lg-global-layers": "convs.*"})
    text = str(err.value)
    assert "\n" not in text and "body 'lenet5'" in text and "body 'mnist-cnn'" in text and "must agree" in text
    with pytest.raises(ConfigError, match="pattern 'convs.*' names no layer.*body 'mlp'|body 'mlp'.*names no layer"):
        make_strategy("lg-fedavg", body="mnist-cnn", bodies="mnist-cnn,mlp", **{"feature-dim": 50, "lg-global-layers": "convs.*"})
    # a head pattern agrees across different bodies of equal feature width
    s = make_strategy("lg-fedavg", body="mnist-cnn", bodies="mnist-cnn,mlp", **{"feature-dim": 50, "lg-global-layers": "head"})
    assert set(s.initial_arrays()) == {"head.weight", "head.bias"}


def test_toml_integers_and_strings_give_the_same_split():
    for value in (2, "2"):
        assert resolve_settings({"algorithm": "lg-fedavg", "lg-global-layers": value}).lg_fedavg.global_layers == "2"
    a = make_strategy("lg-fedavg", **{"lg-global-layers": 2})
    b = make_strategy("lg-fedavg", **{"lg-global-layers": "body.fcs.0,head"})
    assert (
        set(a.shared(1, a.initial_arrays()))
        == set(b.shared(1, b.initial_arrays()))
        == {
            "body.fcs.0.weight",
            "body.fcs.0.bias",
            "head.weight",
            "head.bias",
        }
    )


def test_an_mlp_split_on_uci_adult_names_its_first_layer_global():
    """Another data set: UCI Adult's tabular rows through the mlp body, its first hidden layer global."""
    spec = SPECS["uci-adult"]
    model = build_model("mlp", spec.input_shape, 0, spec.num_classes)
    assert layer_names(model)[0] == "body.fcs.0"
    s = make_strategy("lg-fedavg", dataset="uci-adult", body="mlp", **{"lg-global-layers": "fcs.0"})
    assert set(s.initial_arrays()) == {"body.fcs.0.weight", "body.fcs.0.bias"}
    assert s.initial_arrays()["body.fcs.0.weight"].shape[1] == spec.input_shape[0]


def _lenet(**cfg):
    keys = {"dataset": "cifar10", "body": "lenet5", "lg-global-layers": "convs.*", "lg-new-test": False, "max-first-update-norm": 100.0}
    return make_strategy("lg-fedavg", **{**keys, **cfg})


def test_a_pattern_split_sends_and_averages_only_the_convolutions_by_count(task_identity):
    s = _lenet()

    def answer_with(pid, msg):
        sent = {k: v.numpy() for k, v in msg.content["arrays"].items()}
        return reply({k: np.full_like(v, (0.01, 0.04, 0.0)[pid]) for k, v in sent.items()}, (10, 20, 0)[pid] or None, pid)

    grid = FakeGrid(3, answer_with)
    step = s.train_round(1, s.initial_state(), engine_for(s, grid))
    trained = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert set(trained[0].content["arrays"]) == CONVS and set(step.arrays) == CONVS and step.clients == 2  # no count: refused
    for v in step.arrays.values():
        assert np.allclose(v.numpy(), 0.03)  # (10·0.01 + 20·0.04) / 30


def test_median_aggregates_a_pattern_split(task_identity):
    s = _lenet(aggregation="median")

    def answer_with(pid, msg):
        return reply({k: v.numpy() + np.float32((0.0, 0.001, 0.01)[pid]) for k, v in msg.content["arrays"].items()}, 10, pid)

    grid = FakeGrid(3, answer_with)
    step = s.train_round(2, s.initial_state(), engine_for(s, grid, server_round=2))
    sent = grid.sent[-1].content.array_records["arrays"]
    assert set(step.arrays) == set(sent) == CONVS and step.clients == 3
    for k, v in step.arrays.items():
        assert np.allclose(v.numpy(), sent[k].numpy() + 0.001, rtol=0, atol=1e-6), k


def test_secagg_plus_sums_a_pattern_split_to_the_weighted_mean(task_identity):
    clients = 4
    s = _lenet(**{"num-clients": clients, "secure-aggregation": "secagg+", "min-replies": 1})
    sent = {k: v.numpy() for k, v in s.shared(2, s.initial_arrays()).items()}
    assert set(sent) == CONVS
    counts = {p: 10 + 5 * p for p in range(clients)}
    deltas = {p: {k: np.full_like(v, 0.001 * (p + 1)) for k, v in sent.items()} for p in range(clients)}

    class Avg(Clients):
        def __call__(self, pid, msg):
            if msg.content.config_records[P.SECAGG][P.SECAGG_STAGE] != P.STAGE_COLLECT:
                return super().__call__(pid, msg)
            trained = {k: v + deltas[pid][k] for k, v in sent.items()}
            return answer(msg.content, msg.metadata.dst_node_id, pid, self.states[pid], lambda c: reply(trained, counts[pid], pid))

    engine = engine_for(s, FakeGrid(clients, Avg()))
    step = s.train_round(2, s.initial_state(), engine)
    assert step.clients == clients and not engine.meter.failures and set(step.arrays) == CONVS
    mean_delta = sum(counts[p] * 0.001 * (p + 1) for p in range(clients)) / sum(counts.values())
    for k, v in sent.items():
        np.testing.assert_allclose(step.arrays[k].numpy(), v + mean_delta, rtol=1e-5, atol=1e-6)


def test_parameters_communicated_count_the_array_elements_each_way(task_identity):
    """rounds.jsonl's params_down/params_up: 2,872 parameters to each of the 3 selected clients and back from
    the 2 whose replies were valid (a refused reply moves none); the summary adds the new test's upload."""
    s = _lenet()

    def answer_with(pid, msg):
        sent = {k: v.numpy() for k, v in msg.content["arrays"].items()}
        return reply(sent, None if pid == 2 else 10, pid)

    engine = engine_for(s, FakeGrid(3, answer_with))
    s.train_round(1, s.initial_state(), engine)
    assert engine.meter.params_record() == {"params_down": 3 * 2872, "params_up": 2 * 2872}
    rounds = [{"params_down": 3 * 2872, "params_up": 2 * 2872}, {"params_down": 1, "params_up": 2, "params_upload_up": 100}]
    assert params_totals(rounds) == {"params_communicated": 5 * 2872 + 3 + 100, "params_communicated_training": 5 * 2872 + 3}
    assert params_totals([{"params_up": 1}]) == {"params_communicated": None}  # results written before the count


@pytest.mark.system
def test_a_simulated_cifar10_run_with_the_papers_split_sends_the_convolutions_and_counts_them(tmp_path, data_dir):
    """The paper's split through Flower's simulation on CIFAR-10 (LeNet-5, 3 clients, 2 rounds): every training message
    carries the two convolutions (2,872 parameters) each way; the new test's upload counts every whole model once."""
    from tests.test_simulation import run

    cfg, summary, rounds = run(
        tmp_path,
        data_dir,
        **{"dataset": "cifar10", "body": "lenet5", "algorithm": "lg-fedavg", "lg-global-layers": "convs.*"},
        **{"num-clients": 3, "num-server-rounds": 2, "train-fraction": 0.02},
    )
    whole = sum(v.numel() for v in build_model("lenet5", (3, 32, 32), 0, 10).state_dict().values())
    for r in rounds:
        assert r["clients"] == 3 and r["failures"] == 0
        assert r["params_down"] == r["params_up"] == 3 * 2872 and r["params_eval_down"] == 3 * 2872
    assert rounds[-1]["params_upload_up"] == 3 * whole and rounds[-1]["new_test_models"] == 3
    assert summary["params_communicated"] == 2 * 2 * 3 * 2872 + 3 * whole
