"""End to end through Flower's simulation engine (Ray) on real MNIST slices."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from headway.core.config import resolve_settings
from headway.core.data import load_dataset
from headway.core.models import build_model
from headway.core.partition import make_partition
from headway.simulation import simulate
from headway.strategies.wire import WireMeter

pytestmark = pytest.mark.integration

BASE = {
    "dataset": "mnist",
    "num-clients": 4,
    "num-server-rounds": 3,
    "partition": "pathological",
    "train-fraction": 0.02,
    "local-epochs": 2,
    "batch-size": 10,
    "lr": 0.001,
    "seed": 0,
    "sample-timeout": 30.0,
}


def run(tmp_path, data_dir, **overrides):
    cfg = resolve_settings({**BASE, "data-dir": data_dir, **overrides})
    summary = simulate(cfg, tmp_path)
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    return cfg, summary, rounds


def train_sizes(cfg):
    part = make_partition(load_dataset(cfg.dataset, cfg.data_dir, cfg.seed), cfg)
    return [len(t) for t in part.train]


# Simulation draws a random uint64 run id and node ids (9 or 10 varint bytes each, written
# twice per message), so a message recomputed here may differ from the real one by a few bytes.
SLACK = 12  # bytes per message


def _sent(content: RecordDict, server_round: int) -> Message:
    """A server message as the engine builds it, under a run id like simulation's."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 2**63 + 12345, 1  # the SuperLink is node 1
    try:
        msg = Message(content=content, dst_node_id=2**63 + 6789, message_type=MessageType.TRAIN, group_id=str(server_round))
        msg.metadata.__dict__["_message_id"] = msg.object_id  # as Flower's grid sets it when pushing; replies point to it
        return msg
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


def down_bytes(arrays: dict, server_round: int = 1) -> int:
    """Wire bytes of a training message carrying ``arrays`` and the round number."""
    content = RecordDict(
        {"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}), "config": ConfigRecord({"server-round": server_round})}
    )
    return WireMeter().message(_sent(content, server_round))


def reply_bytes(arrays: dict, n: int, pid: int, loss: bool = True) -> int:
    """Wire bytes of a training reply: the arrays plus num-examples, partition-id (and a loss)."""
    metrics = MetricRecord({"num-examples": n, "partition-id": pid, **({"loss": 0.5} if loss else {})})
    content = RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}), "metrics": metrics})
    request = _sent(RecordDict({"config": ConfigRecord({"server-round": 1})}), 1)
    return WireMeter().message(Message(content=content, reply_to=request))


def near(measured: int, expected: int, messages: int) -> bool:
    """``measured`` is ``expected`` up to the id-length slack of ``messages`` messages."""
    return abs(measured - expected) <= SLACK * messages


def test_fedavg_learns_and_reports_the_bytes_it_sends(tmp_path, data_dir):
    cfg, summary, rounds = run(tmp_path, data_dir, algorithm="fedavg")
    assert [r["round"] for r in rounds] == [1, 2, 3]
    accs = [r["accuracy"] for r in rounds]
    assert accs[-1] > 0.35 and accs[-1] > accs[0] + 0.1  # chance is 0.1; FedAvg is slow on 2-class clients
    assert summary["final_accuracy"] == accs[-1] and summary["failures"] == 0
    assert all(r["global_accuracy"] > 0 for r in rounds)  # the global model is scored too
    # bytes: what the messages carry, recomputed here from the model and the partition
    state = {k: v.numpy() for k, v in build_model("mnist-cnn", (1, 28, 28), 0, 10).state_dict().items()}
    up = sum(reply_bytes(state, n, pid) for pid, n in enumerate(train_sizes(cfg)))
    for r in rounds:
        assert near(r["bytes_down"], 4 * down_bytes(state, r["round"]), 4), (r["bytes_down"], 4 * down_bytes(state, r["round"]))
        assert near(r["bytes_up"], up, 4), (r["bytes_up"], up)
        assert r["clients"] == 4
    assert summary["total_bytes"] == sum(r["bytes_down"] + r["bytes_up"] for r in rounds)
    # the values alone (what papers count): the model's float32 parameters, 4 clients each way, exactly
    model_bytes = sum(v.nbytes for v in state.values())
    assert all(r["values_bytes_down"] == r["values_bytes_up"] == 4 * model_bytes for r in rounds), [
        (r["values_bytes_down"], r["values_bytes_up"]) for r in rounds
    ]
    assert summary["total_values_bytes"] == 3 * 8 * model_bytes
    # 21 840 float32 parameters per client, plus each message's header and its tree of 64-hex object ids
    assert 4 * 21840 * 4 < rounds[0]["bytes_down"] < 4 * 21840 * 4 * 1.08
    for name in ("config.json", "summary.json", "accuracy_vs_round.png", "accuracy_vs_bytes.png"):
        assert (tmp_path / name).exists(), name


def test_fedlog_with_two_body_architectures(tmp_path, data_dir):
    cfg, summary, rounds = run(tmp_path, data_dir, algorithm="fedlog", bodies="mnist-cnn,mlp", **{"feature-dim": 50})
    accs = [r["accuracy"] for r in rounds]
    assert min(accs) > 0.8  # chance 0.1; each client tests on its own two classes
    assert summary["m"] == 51 and summary["failures"] == 0
    # each client registered the body it ran: `bodies` is cycled over partition ids
    assert summary["participants"] == {"0": "mnist-cnn", "1": "mlp", "2": "mnist-cnn", "3": "mlp"}
    assert all(r["solve_seconds"] < 1.0 for r in rounds)
    stats = {"stats": np.zeros((10, 51), np.float32)}
    per_client = [reply_bytes(stats, n, pid) for pid, n in enumerate(train_sizes(cfg))]
    assert all(10 * 51 * 4 + 1000 < b < 10 * 51 * 4 + 2000 for b in per_client)  # classes × m values; header, tree, ids, counts
    for r in rounds[1:]:
        assert near(r["bytes_up"], sum(per_client), 4), (r["bytes_up"], sum(per_client))
    # round 1 also carries the statistics round of fedlog-init=stats (replies without a loss)
    stats_round = sum(reply_bytes(stats, n, pid, loss=False) for pid, n in enumerate(train_sizes(cfg)))
    assert rounds[0]["stats_bytes_up"] == rounds[0]["bytes_up"] - rounds[1]["bytes_up"]
    assert near(rounds[0]["stats_bytes_up"], stats_round, 4), (rounds[0]["stats_bytes_up"], stats_round)
    assert summary["total_bytes"] < 150_000  # FedAvg moves over 1 MB a round here
    # values alone: η (10 × 51 float32) to each of 4 clients, T (10 × 51) back; round 1 twice (statistics round)
    assert [r["values_bytes_down"] for r in rounds] == [8 * 10 * 51 * 4] + [4 * 10 * 51 * 4] * (len(rounds) - 1)
    assert [r["values_bytes_up"] for r in rounds] == [8 * 10 * 51 * 4] + [4 * 10 * 51 * 4] * (len(rounds) - 1)


@pytest.mark.parametrize("mode", ["nan", "wrong-shape"])
def test_fedlog_drops_bad_replies_and_goes_on(tmp_path, data_dir, mode):
    cfg, summary, rounds = run(tmp_path, data_dir, algorithm="fedlog", **{"fault-clients": "1", "fault-mode": mode, "num-server-rounds": 2})
    assert [r["failures"] for r in rounds] == [2, 1]  # round 1 includes the statistics round
    assert all(r["clients"] == 3 for r in rounds)
    assert all(r["accuracy"] is not None and math.isfinite(r["accuracy"]) and r["accuracy"] > 0.5 for r in rounds)
    reasons = " ".join(rounds[-1]["failure_reasons"])
    assert ("NaN" in reasons) if mode == "nan" else ("shape" in reasons)


def test_fedavg_survives_a_client_that_raises(tmp_path, data_dir):
    cfg, summary, rounds = run(
        tmp_path, data_dir, algorithm="fedavg", **{"fault-clients": "3", "fault-mode": "error", "num-server-rounds": 2}
    )
    assert [r["failures"] for r in rounds] == [1, 1] and all(r["clients"] == 3 for r in rounds)
    assert rounds[-1]["accuracy"] > 0.3


def test_model_averaging_carries_a_batchnorm_body_through_rounds(tmp_path, data_dir):
    """ShuffleNet V2 (FedProf's CIFAR-10 model): 338 arrays, BatchNorm's 0-d counters among
    them. Every reply is accepted in every round: the cap allows the arrays' framing and 0-d
    arrays stay 0-d both ways (a (1,) counter from the client or from the server's average
    was refused as the wrong shape)."""
    cfg, summary, rounds = run(
        tmp_path,
        data_dir,
        algorithm="fedprof",
        dataset="cifar10",
        body="shufflenet-v2",
        partition="iid",
        **{
            "num-clients": 2,
            "num-server-rounds": 2,
            "train-fraction": 0.004,
            "local-epochs": 1,
            "batch-size": 32,
            "fraction-train": 1.0,
            "fedprof-val-size": 200,
            "eval-every": 0,
            "global-eval": False,
        },
    )
    assert summary["status"] == "complete"
    assert [(r["clients"], r["failures"]) for r in rounds] == [(2, 0), (2, 0)], [r.get("failure_reasons") for r in rounds]


def test_fedprof_scores_irrelevant_clients_down_and_counts_profile_bytes(tmp_path, data_dir):
    """Half the clients hold structured noise instead of digits: their profiles diverge from
    the baseline and they are (almost) never selected; the profiling round is metered."""
    from headway.core.noise import noise_assignment

    cfg, summary, rounds = run(
        tmp_path,
        data_dir,
        algorithm="fedprof",
        partition="iid",
        **{
            "num-clients": 6,
            "num-server-rounds": 3,
            "fraction-train": 0.5,
            "local-epochs": 1,
            "train-fraction": 0.05,
            "client-noise": "irrelevant:0.5",
            "fedprof-alpha": 10.0,
        },
    )
    noisy = set(noise_assignment("irrelevant:0.5", 6, 0))
    div = {int(k): v for k, v in summary["fedprof_last_divergence"].items()}
    assert min(div[k] for k in noisy) > 3 * max(div[k] for k in set(range(6)) - noisy)
    picks = {int(k): v for k, v in summary["fedprof_selections"].items()}
    assert sum(picks.get(k, 0) for k in noisy) <= 1 < sum(picks.get(k, 0) for k in set(range(6)) - noisy)
    assert len(rounds) == 3 and all(r["failures"] == 0 and r["clients"] == 3 for r in rounds)
    profile = {"profile": np.zeros((50, 2), np.float32)}
    expected = sum(reply_bytes(profile, n, pid, loss=False) for pid, n in enumerate(train_sizes(cfg)))
    assert near(rounds[0]["profile_bytes_up"], expected, 6), (rounds[0]["profile_bytes_up"], expected)
    assert rounds[0]["bytes_up"] > rounds[0]["profile_bytes_up"] > 0  # the method's own cost
    assert rounds[-1]["global_accuracy"] > 0.6
    # who trained, by kind, from rounds.jsonl's `selected`: the same picks the strategy counted
    assert sum(len(r["selected"]) for r in rounds) == sum(picks.values()) == 9
    by_kind = summary["participation_by_noise"]
    assert by_kind["clean"] == sum(picks.get(k, 0) for k in set(range(6)) - noisy) / 3 > by_kind["irrelevant"]
    assert set(rounds[0]["fedprof_scores"]) == {str(k) for k in range(6)}
    # the benchmark report reads this run as it reads its own (sizes, cost model, records)
    from benchmarks.fedprof_report import run_figures

    figs = run_figures("mnist", tmp_path, (0.5,))
    assert figs["rounds"] == 3 and figs["participation_by_noise"] == by_kind
    assert figs["simulated_minutes_total"] > 0 and len(figs["scores"]) == 3
    assert figs["to"]["0.5"]["round"] == next(r["round"] for r in rounds if r["global_accuracy"] >= 0.5)
