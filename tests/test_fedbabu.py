"""FedBABU: the head stays at its seeded initialization, the server averages the body alone,
fine-tuning changes a client's score and nothing it sends, hostile replies are refused, and a
short real MNIST run learns."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from headway.client.env import ClientEnv, client_env
from headway.client.faults import MODEL_MODES, damage_reply
from headway.client.procedures.fedbabu import INITIAL, FedBABUClient, part_names
from headway.core.config import ConfigError
from headway.core.layers import select
from headway.core.models import build_model
from headway.core.settings import Settings

from tests.fakes import FakeGrid, engine_for, make_strategy, reply
from tests.test_hostile_replies import EXPECTED_REASON, honest

HEAD = {"head.weight", "head.bias"}


@lru_cache(maxsize=4)
def _loaded(data_dir: str, pid: int) -> ClientEnv:
    run = {"algorithm": "fedbabu", "num-clients": 3, "train-fraction": 0.02, "batch-size": 10, "local-epochs": 1, "data-dir": data_dir}
    return client_env(run, {"partition-id": pid})


def _env(data_dir, pid=0, **cfg) -> ClientEnv:
    """Client ``pid`` of a small MNIST run with ``cfg`` over its keys (the data loaded once)."""
    env = _loaded(data_dir, pid)
    return replace(env, cfg=Settings.from_config({**env.cfg.to_config(), **cfg}))


def _content(body: dict[str, torch.Tensor], server_round: int = 1) -> RecordDict:
    return RecordDict({"arrays": ArrayRecord(body), "config": ConfigRecord({"server-round": server_round})})


def _initial_body(env) -> dict[str, torch.Tensor]:
    """What the server sends in round 1: the run-seeded model without its head."""
    state = build_model(env.body, env.data.input_shape, env.cfg.feature_dim, env.outputs, env.cfg.seed).state_dict()
    return {k: v for k, v in state.items() if k not in HEAD}


@pytest.mark.parametrize("init", ["shared", "per-client"])
def test_the_head_stays_byte_equal_to_its_initialization_across_rounds_on_every_client(data_dir, init):
    """Two rounds on two clients: each trains on the run seed's head (whatever body-init says), the head
    never moves, the body does, and only the body goes back."""
    proc = FedBABUClient()
    seeded = build_model("mnist-cnn", (1, 28, 28), 50, 10, 0).head.state_dict()
    for pid in (0, 1):
        env = _env(data_dir, pid, **{"body-init": init})
        body = _initial_body(env)
        for rnd in (1, 2):
            model, shared = proc.model(env, _content(body, rnd), RecordDict())
            proc.fit(env, model, shared, rnd)
            assert all(torch.equal(v, seeded[k]) for k, v in model.head.state_dict().items())
            sent = proc.train(env, _content(body, rnd), state := RecordDict())
            new = sent.array_records["arrays"].to_torch_state_dict()
            assert set(new) == set(body) and not HEAD & set(new) and not state.array_records
            assert any(not torch.equal(new[k], body[k]) for k in body)  # the body learned
            body = new


def test_the_server_sends_only_the_body_and_averages_it_by_count(task_identity):
    s = make_strategy("fedbabu", **{"max-first-update-norm": 100.0})  # constant replies are far from the initial body

    def answer(pid, msg):
        sent = {k: v.numpy() for k, v in msg.content["arrays"].items()}
        return reply({k: np.full_like(v, (0.01, 0.04)[pid]) for k, v in sent.items()}, (10, 20)[pid], pid)

    grid = FakeGrid(2, answer)
    step = s.train_round(1, s.initial_state(), engine_for(s, grid))
    trained = [m for m in grid.sent if m.metadata.message_type == "train"]
    body = set(s.initial_arrays()) - HEAD
    assert len(trained) == 2 and all(set(m.content["arrays"]) == body for m in trained)
    assert step.clients == 2 and set(step.arrays) == body
    assert all(np.allclose(v.numpy(), 0.03) for v in step.arrays.values())  # (10·0.01 + 20·0.04) / 30


def test_fine_tuning_changes_the_score_but_not_what_is_sent_up(data_dir):
    proc = FedBABUClient()
    scores: dict[int, dict[str, float]] = {}  # fine-tuning epochs -> the evaluation reply's numbers
    for epochs in (0, 3):
        env = _env(data_dir, **{"fedbabu-finetune-epochs": epochs, "lr": 0.01})
        content, state = _content(_initial_body(env)), RecordDict()
        metrics = proc.evaluate(env, content, state).metric_records["metrics"]
        scores[epochs] = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
        after = proc.train(env, content, state).array_records["arrays"].to_torch_state_dict()
        alone = proc.train(env, content, RecordDict()).array_records["arrays"].to_torch_state_dict()
        assert not state.array_records and all(torch.equal(after[k], alone[k]) for k in alone)  # nothing of evaluation is kept
    n = scores[0]["num-examples"]
    assert scores[0]["correct"] == scores[0][INITIAL] == scores[3][INITIAL]  # 0 epochs: the global model's score
    assert scores[3]["correct"] > scores[3][INITIAL] and scores[3]["correct"] > 0.5 * n  # personalized on 2 classes


@pytest.mark.parametrize("part", ["full", "head", "body"])
def test_fine_tuning_trains_the_part_it_is_told(data_dir, part):
    env = _env(data_dir, **{"fedbabu-finetune-part": part, "fedbabu-finetune-epochs": 1})
    proc = FedBABUClient()
    model, _ = proc.model(env, _content(_initial_body(env)), RecordDict())
    before = {k: v.clone() for k, v in model.named_parameters()}
    proc.fine_tune(env, model, 1)
    changed = {k for k, v in model.named_parameters() if not torch.equal(v, before[k])}
    assert changed == set(part_names(model, part)) and changed
    assert (changed & HEAD == HEAD) == (part != "body") and (changed - HEAD != set()) == (part != "head")


@pytest.mark.parametrize("mode", ["nan", "wrong-shape", "extra-array", *MODEL_MODES])
def test_a_hostile_body_is_refused_and_the_round_goes_on(task_identity, data_dir, mode):
    s = make_strategy("fedbabu", **{"data-dir": data_dir})

    def answer(pid, msg):
        content = honest("fedbabu", pid, msg)
        return damage_reply(content, mode, "train") if pid == 2 else content

    rnd = 2 if mode in MODEL_MODES else 1  # a sign flip is refused from round 2 (round 1's bound admits long honest moves)
    engine = engine_for(s, FakeGrid(3, answer), server_round=rnd)
    step = s.train_round(rnd, s.initial_state(), engine)
    assert step.clients == 2 and len(engine.meter.failures) == 1, engine.meter.failures
    assert EXPECTED_REASON[mode] in engine.meter.failures[0]
    assert all(np.all(np.isfinite(v.numpy())) for v in step.arrays.values())


def test_a_score_before_fine_tuning_above_the_test_count_is_refused(task_identity):
    s = make_strategy("fedbabu")
    scores = {0: 5, 1: 11}  # partition 1 claims 11 correct of 10

    def answer(pid, msg):
        met = {"num-examples": 10, "partition-id": pid, "correct": 5, INITIAL: scores[pid]}
        return RecordDict({"metrics": MetricRecord(met)})

    engine = engine_for(s, FakeGrid(2, answer))
    out = s.evaluate_round(1, s.initial_state(), engine)
    assert out["eval_clients"] == 1 and out["accuracy_initial"] == 0.5
    assert "correct-initial" in engine.meter.failures[0]


def test_bodies_must_agree_and_a_model_without_a_body_is_refused():
    with pytest.raises(ConfigError, match="same body"):
        make_strategy("fedbabu", bodies="mnist-cnn,mlp", **{"feature-dim": 50})
    with pytest.raises(ConfigError, match="no body layer"):
        make_strategy("fedbabu", body="linear")  # the linear body is the head alone


@pytest.mark.integration
def test_a_short_mnist_run_learns_and_sends_only_the_body(tmp_path, data_dir):
    from tests.test_simulation import down_bytes, near, run

    cfg, summary, rounds = run(tmp_path, data_dir, algorithm="fedbabu", **{"num-clients": 3, "num-server-rounds": 3})
    assert summary["status"] == "complete" and all(r["clients"] == 3 and r["failures"] == 0 for r in rounds)
    body = select({k: v.numpy() for k, v in build_model("mnist-cnn", (1, 28, 28), 0, 10).state_dict().items()}, ["head"], inside=False)
    assert all(near(r["bytes_down"], 3 * down_bytes(body, r["round"]), 3) for r in rounds)  # the head never travels
    assert rounds[-1]["accuracy"] > 0.8  # fine-tuned on 2-class clients; a 10-class guess scores 0.1
    assert rounds[-1]["accuracy_initial"] > 0.2  # the global body on the fixed head learned too


def test_with_dataset_local_nodes_train_the_body_and_a_count_beyond_a_declaration_is_refused(task_identity):
    """dataset=local: three nodes declare their data, register and get the body alone; one then claims
    10,000 examples where it declared 10: refused, and the body is the honest average."""
    from tests.test_local_attacks import Script, ScriptedGrid, _model_reply, discover, image_profile, local_cfg, registered, text

    cfg = local_cfg(algorithm="fedbabu", classes="0,1", **{"fraction-train": 1.0})
    prof = text(image_profile({"0": [5, 1], "1": [5, 1]}))
    pids: dict[int, int] = {}

    def honest(node, msg):
        return _model_reply(msg, pids[node], 0.98, 10)

    def liar(node, msg):
        return _model_reply(msg, pids[node], 0.9, 10_000)

    grid = ScriptedGrid([Script(prof, answer=honest), Script(prof, answer=liar), Script(prof, answer=honest)])
    strategy, engine = registered(cfg, discover(grid, cfg).schema, grid)
    pids.update({n: c.partition_id for n, c in engine.registry.clients.items()})
    start = strategy.initial_arrays()
    step = strategy.train_round(1, strategy.initial_state(start), engine)
    assert step.clients == 2 and any("above the 10 this client can hold" in f for f in engine.meter.failures), engine.meter.failures
    assert step.arrays is not None and set(step.arrays) == set(start) - HEAD
    for name, arr in step.arrays.items():
        np.testing.assert_allclose(arr.numpy(), start[name].numpy() * 0.98, rtol=1e-5, atol=1e-7)
