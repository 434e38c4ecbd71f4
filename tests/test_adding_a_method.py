"""What a developer adding a method (docs/methods.md, "Adding a method") is told when something is
off, from an outside tester who added FedAvgM: a strategy subclassing FedAvg with its own
``aggregate_train`` hides the hooks it inherits, and the refusal says so and how to keep them; a
subclass's own method state survives FedAvg's data-ratio bookkeeping; a declared class that cannot
load is named in the run's reason; every method has its section in docs/methods.md; step 2 names
both lines core/settings.py needs; a layer-sharing body refusal says what the server averages."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from headway.core.config import ConfigError, resolve_settings
from headway.core.methods import METHODS
from headway.strategies import registry
from headway.strategies.base import Step, TrainRound
from headway.strategies.capabilities import capabilities_of
from headway.strategies.fedavg import FedAvg, FedAvgState, ModelAveraging
from headway.strategies.replies import Reply
from headway.strategies.state import ServerState

from tests.conftest import ROOT
from tests.fakes import FakeGrid, engine_for, make_strategy, reply


class FedAvgM(FedAvg):
    """The tester's shape: FedAvg's average, then a step of its own (here none)."""

    name = "no-such-method-x"

    def aggregate_train(self, ctx: TrainRound[FedAvgState], replies: list[Reply]) -> Step[FedAvgState]:
        return super().aggregate_train(ctx, replies)


class FedAvgMRestated(FedAvgM):
    """As the refusal advises: the hidden hook restated."""

    def update_weights(self, ctx: TrainRound[FedAvgState], replies: list[Reply]) -> list[float]:
        return super().update_weights(ctx, replies)


FEDAVGM = replace(METHODS["fedavg"], name="no-such-method-x")


def test_an_own_aggregate_train_is_told_which_inherited_hooks_it_hides_and_how_to_keep_them():
    (problem,) = registry.problems(FEDAVGM, FedAvgM)
    assert problem.startswith(
        "'no-such-method-x': its strategy FedAvgM defines its own aggregate_train, which hides the update_weights it inherits"
    ), problem
    assert "restate update_weights in FedAvgM" in problem and "otherwise declare server_combines" in problem
    assert registry.problems(FEDAVGM, FedAvgMRestated) == []


def test_a_strategy_without_the_hook_at_all_keeps_the_plain_advice():
    class Combines(ModelAveraging[FedAvgState]):  # never had update_weights: nothing is hidden
        name = "no-such-method-x"

        def aggregate_train(self, ctx: TrainRound[FedAvgState], replies: list[Reply]) -> Step[FedAvgState]:
            raise NotImplementedError

    (problem,) = registry.problems(FEDAVGM, Combines)
    assert (
        problem
        == "'no-such-method-x': its strategy "
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


# ----------------------------------------------------------------- errors a new developer hits


def _broken_package(tmp_path, monkeypatch, package) -> None:
    """A module ``broken`` in ``package`` that fails as it runs, as a half-written method's module does."""
    (tmp_path / "broken.py").write_text("undefined_name_in_a_new_method\n")
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])


@pytest.mark.parametrize("side", ["strategy", "client procedure"])
@pytest.mark.parametrize("module", ["no_such_module_x", "broken"])
def test_a_declared_class_that_cannot_load_is_named_in_the_runs_reason(tmp_path, monkeypatch, side, module):
    """The run's reason is the root of the exception's cause chain (simulation/runner.py): it must be the registry's
    message naming the method and the declared path, not a bare ModuleNotFoundError or NameError."""
    import headway.client.procedures
    import headway.strategies as strategies
    from headway.client import registry as client_registry
    from headway.simulation.runner import _reason

    package, load = (strategies, registry.load) if side == "strategy" else (headway.client.procedures, client_registry.load)
    _broken_package(tmp_path, monkeypatch, package)
    declared = f"{module}:FedAvgM"
    unknown = replace(METHODS["fedavg"], name="no-such-method-x")
    method = replace(unknown, strategy=declared) if side == "strategy" else replace(unknown, procedure=declared)
    with pytest.raises(RuntimeError) as failed:
        load(method)
    reason = _reason(failed.value)
    where = f"{package.__name__}.{module}.FedAvgM"
    assert reason.startswith(f"RuntimeError: method 'no-such-method-x' declares {side} {where}, which cannot be loaded: "), reason
    assert ("ModuleNotFoundError" if module == "no_such_module_x" else "NameError") in reason, reason


def test_every_declared_method_has_its_section_in_docs_methods():
    """A method's section names it as a heading ('## Name (`name`') or a bullet ('- **Name** (`name`')."""
    text = (ROOT / "docs" / "methods.md").read_text()
    missing = [name for name in METHODS if not re.search(rf"^(## .*|- \*\*.*\*\* )\(`{re.escape(name)}`[,)]", text, re.M)]
    assert missing == [], f"docs/methods.md has no section for {missing}"


def test_adding_a_method_says_the_settings_class_is_imported_in_core_settings():
    """Step 2 of 'Adding a method' names both lines a method with keys needs in core/settings.py, as the file requires."""
    import headway.core.settings

    source = (ROOT / "core" / "settings.py").read_text()
    for method in METHODS.values():
        if method.settings is not None:
            assert getattr(headway.core.settings, method.settings.__name__) is method.settings and method.settings.__name__ in source
    doc = (ROOT / "docs" / "methods.md").read_text()
    step = doc[doc.index("## Adding a method") :].split("\n2. ", 1)[1].split("\n3. ", 1)[0]
    assert "from headway.core.methods import" in step and "attribute in `Settings`" in step, step


@pytest.mark.parametrize(
    ("algorithm", "shared", "local"),
    [
        ("fedbabu", "body.convs.0, body.convs.1, body.fcs.0", "head"),
        ("fedrep", "body.convs.0, body.convs.1, body.fcs.0", "head"),
        ("fedper", "body.convs.0, body.convs.1", "body.fcs.0, head"),
    ],
)
def test_a_layer_sharing_body_refusal_says_what_the_server_averages(algorithm, shared, local):
    s = make_strategy(algorithm)
    assert s.body_problem("mnist-cnn") is None
    assert s.body_problem("lenet5") == (
        f"registration names body 'lenet5', but {algorithm} averages layers {shared} of body 'mnist-cnn' and keeps {local} "
        "on each client: every client must run it"
    )


def test_a_method_with_keys_but_no_settings_attribute_is_named_with_the_line_to_add(monkeypatch):
    """Step 2 of docs/methods.md left out: the import-time check names the method's attribute and the line that adds it."""
    from headway.core import settings as settings_module

    @dataclass(frozen=True)
    class NoSuchMethodXSettings:
        """A new method's keys."""

        momentum: float = 0.9

    declared = replace(METHODS["fedavg"], name="no-such-method-x", settings=NoSuchMethodXSettings)
    monkeypatch.setitem(settings_module.METHODS, "no-such-method-x", declared)
    with pytest.raises(RuntimeError) as failed:
        settings_module._check_method_attributes()
    attr = declared.attr
    assert f"add '{attr}: NoSuchMethodXSettings = field(default_factory=NoSuchMethodXSettings)'" in str(failed.value)
    assert "fedbabu" not in str(failed.value)  # only what is wrong, not every method's attribute
