"""Configs that used to pass pre-flight and then fail (issue 23, item 7): each is refused
by ``headway run`` with one ``error:`` line and exit 2 before the engine starts;
and a run in which no round ever aggregated is not reported as complete."""

from __future__ import annotations

import json

import flwr.simulation
import headway.simulation as simulation
import pytest
from flwr.app import Error, MessageType, MetricRecord, RecordDict
from headway.core import protocol as P
from headway.core.config import MAX_FEATURE_DIM, MAX_SEED, ConfigError, resolve

from tests.fakes import FakeGrid, reply

SMALL = ["dataset=mnist", "num-clients=3", "num-server-rounds=2", "train-fraction=0.02", "local-epochs=1", "partition=iid"]


@pytest.fixture
def no_engine(monkeypatch):
    def started(**kwargs):
        raise AssertionError("the simulation engine started")

    monkeypatch.setattr(flwr.simulation, "run_simulation", started)


@pytest.mark.parametrize(
    "sets, key",
    [
        (["seed=-1"], "'seed'"),
        (["seed=1e23"], "'seed'"),
        ([f"seed={MAX_SEED + 1}"], "'seed'"),
        (["feature-dim=1e8"], "'feature-dim'"),
        ([f"feature-dim={MAX_FEATURE_DIM + 1}"], "'feature-dim'"),
        (["algorithm=fedprof", "fedprof-layer=nope"], "'fedprof-layer'"),
        (["algorithm=fedprof", "fedprof-layer=body.fcs"], "'fedprof-layer'"),  # a container: it has no output of its own
        (
            ["algorithm=fedprof", "dataset=cifar10", "body=mnist-cnn"],
            "'body'",
        ),  # mnist-cnn cannot take 3x32x32 images: FedProf's profile would fail at round 0 (no body named: cifar-cnn fits)
        (["algorithm=fedprof", "fedprof-val-size=1e8"], "'fedprof-val-size'"),
        (["algorithm=fedprof", "fedprof-val-size=59999"], "'fedprof-val-size'"),  # leaves rows, but not one per client after train-fraction
        (["algorithm=fedavg", "server-holdout=60000"], "'server-holdout'"),
        (["algorithm=fedavg", "min-replies=10"], "'min-replies'"),
        (["algorithm=fedavg", "num-clients=10", "fraction-train=0.2", "min-replies=3"], "'min-replies'"),  # K = 2
        (["algorithm=fedpft", "min-replies=4"], "'min-replies'"),  # FedPFT asks every client: 3
    ],
)
def test_configs_that_would_fail_after_starting_are_refused_before(tmp_path, capsys, no_engine, data_dir, sets, key):
    args = ["--out", str(tmp_path / "out"), "--set", f"data-dir={data_dir}"]
    for s in SMALL + sets:
        args += ["--set", s]
    code = simulation.main(args)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: ") and key in lines[0], err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


def test_the_bounds_admit_what_runs():
    assert resolve({"seed": MAX_SEED})["seed"] == 2**32 - 1
    assert resolve({"feature-dim": MAX_FEATURE_DIM})["feature-dim"] == MAX_FEATURE_DIM
    assert resolve({"num-clients": 10, "fraction-train": 0.2, "min-replies": 2})["min-replies"] == 2
    assert resolve({"algorithm": "fedpft", "num-clients": 3, "fraction-train": 0.1, "min-replies": 3})["min-replies"] == 3
    with pytest.raises(ConfigError, match="min-replies"):
        resolve({"num-clients": 3, "min-replies": 4})


def test_a_seed_at_the_bound_seeds_everything():
    """2**32 - 1 is accepted by every generator a run seeds (the models' torch.manual_seed(seed)
    and (seed + 1), numpy's Generators from [seed, ...] lists as a client's derived seeds are,
    numpy's legacy seeding, torch Generators), and seeds it: the same draws twice, and not
    those of seed 0 (a bound that wrapped or was ignored would give seed 0's)."""
    import numpy as np
    import torch
    from headway.core import seeds
    from headway.core.models import build_model

    def weights(seed: int) -> np.ndarray:
        return torch.cat([p.detach().ravel() for p in build_model("mnist-cnn", (1, 28, 28), 0, 10, seed).parameters()]).numpy()

    draws = {
        "model": weights,
        "numpy Generator": lambda seed: np.random.default_rng([seed, seeds.SAMPLING]).random(8),
        "numpy legacy": lambda seed: np.random.RandomState(seed).random_sample(8),
        "torch Generator": lambda seed: torch.rand(8, generator=torch.Generator().manual_seed(seed)).numpy(),
    }
    for name, draw in draws.items():
        at_bound = draw(MAX_SEED)
        assert np.array_equal(at_bound, draw(MAX_SEED)), name
        assert not np.array_equal(at_bound, draw(0)), name


@pytest.mark.parametrize("min_replies, status", [(3, "failed"), (2, "complete")])
def test_a_run_in_which_no_round_aggregated_is_not_complete(tmp_path, task_identity, data_dir, min_replies, status):
    """Three clients, one of which always errs: with min-replies=3 no round reaches its
    quorum and the model never moves, so the run is failed with that reason, not complete."""
    from headway.server.app import run_server

    def answer(pid, msg):
        if msg.metadata.message_type == MessageType.EVALUATE:
            return RecordDict({P.METRICS: MetricRecord({P.NUM_EXAMPLES: 10, P.CORRECT: 5, P.PARTITION_ID: pid})})
        if pid == 2:
            return Error(code=1, reason="this client always fails")
        return reply({k: v.numpy() + 0.01 for k, v in msg.content[P.ARRAYS].items()}, 10, pid, loss=0.5)

    cfg = {
        "algorithm": "fedavg",
        "dataset": "mnist",
        "data-dir": data_dir,
        "num-clients": 3,
        "num-server-rounds": 2,
        "partition": "iid",
        "train-fraction": 0.02,
        "min-replies": min_replies,
        "sample-timeout": 0.0,
        "round-timeout": 5.0,
        "global-eval": False,
    }
    summary = run_server(FakeGrid(3, answer), cfg, tmp_path / "out")
    assert summary["status"] == status and summary["rounds"] == 2
    rounds = [json.loads(line) for line in (tmp_path / "out" / "rounds.jsonl").read_text().splitlines()]
    assert [r["aggregated"] for r in rounds] == [status == "complete"] * 2
    assert summary["aggregated_rounds"] == (2 if status == "complete" else 0)
    if status == "failed":
        assert "no round aggregated" in summary["reason"] and "min-replies=3" in summary["reason"]
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["status"] == status
