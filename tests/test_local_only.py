"""The local-only method (LG-FedAvg's "local only" arm, issue 41): the server sends config and no
arrays, averages nothing and counts the clients whose replies came valid; the client trains its whole
model and keeps it; after the last round every model goes up once for the new test (ensemble)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from headway.client.env import client_env
from headway.client.procedures.layer_sharing import PERSONAL
from headway.client.procedures.local_only import LocalOnlyClient
from headway.core import protocol as P
from headway.core.config import ConfigError, resolve_settings
from headway.strategies.registry import check_capabilities

from tests.fakes import FakeGrid, engine_for, make_strategy, reply


def test_training_sends_no_arrays_and_the_round_counts_its_valid_replies(task_identity):
    s = make_strategy("local-only")
    assert len(s.initial_arrays()) == 0

    def answer(pid, msg):
        assert len(msg.content.array_records[P.ARRAYS]) == 0  # config only
        if pid == 2:
            return reply({"head.weight": np.zeros((10, 50), np.float32)}, 10, pid)  # an array nobody asked for: refused
        return reply({}, 10 + pid, pid, loss=0.5 + pid)

    engine = engine_for(s, FakeGrid(3, answer))
    step = s.train_round(1, s.initial_state(), engine)
    assert step.clients == 2 and len(step.arrays) == 0 and step.metrics["loss"] == pytest.approx(1.0)
    assert len(engine.meter.failures) == 1 and "head.weight" in engine.meter.failures[0]


def test_any_known_bodies_may_mix_and_sums_or_robust_rules_are_refused():
    s = make_strategy("local-only", bodies="mnist-cnn,lenet5,mlp", **{"feature-dim": 50})
    assert s.body_problem("lenet5") is None and s.body_problem("mlp") is None
    with pytest.raises(ConfigError, match="local-only sends no arrays to sum: leave it 'off'"):
        resolve_settings({"algorithm": "local-only", "secure-aggregation": "secagg+"})
    with pytest.raises(ConfigError, match="local-only averages nothing: every model stays on its client: leave it 'mean'"):
        check_capabilities(resolve_settings({"algorithm": "local-only", "aggregation": "median"}))


def _train_message(rnd: int) -> RecordDict:
    return RecordDict({P.ARRAYS: ArrayRecord(), P.CONFIG: ConfigRecord({P.ROUND: rnd, P.PHASE: P.PHASE_TRAIN})})


def test_the_client_trains_its_whole_model_keeps_it_and_sends_no_layer(data_dir):
    env = client_env(
        {"algorithm": "local-only", "num-clients": 3, "train-fraction": 0.01, "local-epochs": 1, "batch-size": 10, "data-dir": data_dir},
        {"partition-id": 0},
    )
    client, state = LocalOnlyClient(), RecordDict()
    start = {k: v.clone() for k, v in env.build_model().state_dict().items()}
    out = client.train(env, _train_message(1), state)
    assert len(out.array_records[P.ARRAYS]) == 0 and float(out.metric_records[P.METRICS][P.NUM_EXAMPLES]) > 0  # type: ignore[arg-type]
    kept = state.array_records[PERSONAL].to_torch_state_dict()
    assert all(not torch.equal(kept[k], start[k]) for k in start if k.endswith("weight"))  # every layer trained, body and head
    again = client.train(env, _train_message(2), state)  # the next round starts from the kept model
    assert len(again.array_records[P.ARRAYS]) == 0
    assert any(not torch.equal(state.array_records[PERSONAL].to_torch_state_dict()[k], kept[k]) for k in kept)
    upload = RecordDict({P.ARRAYS: ArrayRecord(), P.CONFIG: ConfigRecord({P.ROUND: 2, P.PHASE: P.PHASE_UPLOAD})})
    whole = client.evaluate(env, upload, state).array_records[P.ARRAYS].to_torch_state_dict()
    assert set(whole) == set(start) and all(
        torch.equal(whole[k], v) for k, v in state.array_records[PERSONAL].to_torch_state_dict().items()
    )


@pytest.mark.system
def test_a_simulated_run_scores_local_and_new_test_with_mixed_bodies_and_moves_no_parameters(tmp_path, data_dir):
    from tests.test_simulation import run

    cfg, summary, rounds = run(
        tmp_path,
        data_dir,
        algorithm="local-only",
        **{"num-clients": 3, "num-server-rounds": 2, "bodies": "mnist-cnn,lenet5,mnist-cnn", "feature-dim": 50},
    )
    assert all(r["clients"] == 3 and r["failures"] == 0 for r in rounds)
    assert rounds[-1]["accuracy"] > 0.8  # each client's own model on its own 2-class test split
    assert rounds[-1]["new_test_models"] == 3 and 0.15 < rounds[-1]["new_test_accuracy"] <= 0.65
    assert all(r["params_down"] == 0 and r["params_up"] == 0 for r in rounds)
    assert summary["params_communicated"] == rounds[-1]["params_upload_up"] > 0  # only the new test's one upload
