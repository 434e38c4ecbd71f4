"""What a developer adding a method (docs/methods.md, "Adding a method") is told when something is
off, from an outside tester who added FedAvgM: a strategy subclassing FedAvg with its own
``aggregate_train`` hides the hooks it inherits, and the refusal says so and how to keep them; a
subclass's own method state survives FedAvg's data-ratio bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np
import pytest

from core.config import ConfigError, resolve_settings
from core.methods import METHODS
from strategies import registry
from strategies.base import Step, TrainRound
from strategies.capabilities import capabilities_of
from strategies.fedavg import FedAvg, FedAvgState, ModelAveraging
from strategies.replies import Reply
from strategies.state import ServerState
from tests.fakes import FakeGrid, engine_for, make_strategy, reply


class FedAvgM(FedAvg):
    """The tester's shape: FedAvg's average, then a step of its own (here none)."""

    name = "fedavgm"

    def aggregate_train(self, ctx: TrainRound[FedAvgState], replies: list[Reply]) -> Step[FedAvgState]:
        return super().aggregate_train(ctx, replies)


class FedAvgMRestated(FedAvgM):
    """As the refusal advises: the hidden hook restated."""

    def update_weights(self, ctx: TrainRound[FedAvgState], replies: list[Reply]) -> list[float]:
        return super().update_weights(ctx, replies)


FEDAVGM = replace(METHODS["fedavg"], name="fedavgm")


def test_an_own_aggregate_train_is_told_which_inherited_hooks_it_hides_and_how_to_keep_them():
    (problem,) = registry.problems(FEDAVGM, FedAvgM)
    assert problem.startswith(
        "'fedavgm': its strategy FedAvgM defines its own aggregate_train, which hides the update_weights it inherits"
    ), problem
    assert "restate update_weights in FedAvgM" in problem and "otherwise declare server_combines" in problem
    assert registry.problems(FEDAVGM, FedAvgMRestated) == []


def test_a_strategy_without_the_hook_at_all_keeps_the_plain_advice():
    class Combines(ModelAveraging[FedAvgState]):  # never had update_weights: nothing is hidden
        name = "fedavgm"

        def aggregate_train(self, ctx: TrainRound[FedAvgState], replies: list[Reply]) -> Step[FedAvgState]:
            raise NotImplementedError

    (problem,) = registry.problems(FEDAVGM, Combines)
    assert (
        problem
        == "'fedavgm': its strategy "
        + Combines.__qualname__
        + " implements no robust aggregation step: declare server_combines (what its server does instead)"
    )


def test_secure_aggregation_refusal_names_the_hidden_sum_hooks(monkeypatch):
    monkeypatch.setitem(registry.STRATEGIES, "fedavg", FedAvgM)
    monkeypatch.setitem(registry.CAPABILITIES, "fedavg", capabilities_of(FedAvgM))
    with pytest.raises(ConfigError) as refused:
        registry.check_capabilities(resolve_settings({"algorithm": "fedavg", "secure-aggregation": "secagg+"}))
    assert "its strategy FedAvgM defines its own aggregate_train, which hides the sum_spec, aggregate_sum it inherits" in str(
        refused.value
    ), refused.value


@dataclass(frozen=True)
class MomentumState(FedAvgState):
    """A subclass's state: FedAvg's counts and a field of its own."""

    velocity: dict[str, float] = field(default_factory=dict)


def test_data_ratio_bookkeeping_keeps_a_subclass_state_and_its_fields(task_identity):
    s = make_strategy("fedavg", **{"client-sampling": "data-ratio", "fraction-train": 1.0})

    def answer(pid, msg):
        return reply({k: v.numpy() * 0.99 for k, v in msg.content["arrays"].items()}, 10 + pid, pid)

    engine = engine_for(s, FakeGrid(3, answer))
    start = ServerState(s.initial_arrays(), MomentumState({7: 5}, {"w": 1.5}))
    step = s.train_round(1, start, engine)
    assert isinstance(step.method, MomentumState) and step.method.velocity == {"w": 1.5}, step.method
    heard = {r: 10 + r for r in range(3) if r in step.method.counts}
    assert heard and step.method.counts == {7: 5, **heard}
    assert np.isfinite(next(iter(step.arrays.values())).numpy()).all()
