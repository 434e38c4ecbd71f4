"""Conformance of every method declaration (core/methods.py), parametrized from the declarations
themselves, never from a hand list: a new method is checked by adding it. Its strategy and client
procedure load from the names it declares; its keys follow its prefix and round-trip through the
typed settings (core/settings.py); its wire names collide with no other method's; and what its
strategy implements decides which capability refusals it gets; and the README's method table
names it."""

from __future__ import annotations

import dataclasses
import operator
import re
import typing

import headway.core.protocol as P
import pytest
from headway.core.config import ConfigError, resolve, resolve_settings
from headway.core.methods import METHODS, Method, class_path
from headway.core.schema import KEY, key_name
from headway.core.settings import SCHEMA, CommonSettings, Settings, attribute_path
from headway.strategies.capabilities import ROBUST_AGGREGATION, SECURE_SUM
from headway.strategies.registry import CAPABILITIES, STRATEGIES, check_capabilities, problems
from headway.strategies.registry import load as load_strategy

from tests.conftest import ROOT

DECLARED = list(METHODS.values())
WITH_KEYS = [m for m in DECLARED if m.settings is not None]
SHARED_PHASES = {value for name, value in vars(P).items() if name.startswith("PHASE_")} - {
    value for m in DECLARED for field, value in m.record_names().items() if field.startswith("phase_")
}


def ids(methods: list[Method]) -> list[str]:
    return [m.name for m in methods]


# ------------------------------------------------------------------ its classes


@pytest.mark.parametrize("method", DECLARED, ids=ids(DECLARED))
def test_a_method_loads_its_strategy_and_client_procedure(method):
    from headway.client.registry import PROCEDURES

    cls = STRATEGIES[method.name]
    assert f"{cls.__module__.removeprefix('headway.strategies.')}:{cls.__qualname__}" == method.strategy
    assert cls.name == method.name and problems(method, cls) == []
    procedure = PROCEDURES[method.name]
    assert f"{type(procedure).__module__.removeprefix('headway.client.procedures.')}:{type(procedure).__qualname__}" == method.procedure
    assert method.name in procedure.methods


def test_the_registries_hold_exactly_the_declared_methods_in_order():
    from headway.client.registry import PROCEDURES

    assert list(STRATEGIES) == list(METHODS) == list(PROCEDURES)


def test_a_declaration_naming_a_missing_class_is_refused_naming_the_method():
    broken = dataclasses.replace(METHODS["fedavg"], name="fedavg-typo", strategy="fedavg:FedAvgTypo")
    with pytest.raises(
        RuntimeError, match=r"method 'fedavg-typo' declares strategy headway\.strategies\.fedavg\.FedAvgTypo, which cannot be loaded"
    ):
        load_strategy(broken)
    with pytest.raises(RuntimeError, match=r"method 'fedavg' declares strategy headway\.strategies\.no_such_module\.X"):
        load_strategy(dataclasses.replace(METHODS["fedavg"], strategy="no_such_module:X"))
    with pytest.raises(ValueError, match="not 'module:Class'"):
        class_path("headway.strategies.fedavg.FedAvg")


def test_a_declaration_whose_procedure_does_not_claim_it_is_refused():
    from headway.client.registry import load as load_procedure

    with pytest.raises(
        RuntimeError, match="method 'fedlog' declares client procedure headway.client.procedures.fedavg.FedAvgClient, whose methods"
    ):
        load_procedure(dataclasses.replace(METHODS["fedlog"], procedure="fedavg:FedAvgClient"))


# ------------------------------------------------------------------ its keys, through the typed settings


@pytest.mark.parametrize("method", WITH_KEYS, ids=ids(WITH_KEYS))
def test_a_methods_keys_start_with_its_prefix_and_are_typed_as_their_defaults(method):
    hints = typing.get_type_hints(method.settings)
    assert method.keys, method.name
    for field in dataclasses.fields(method.settings):
        key = field.metadata[KEY]
        assert key_name(method.key_prefix, field.name).startswith(f"{method.key_prefix}-")
        assert hints[field.name] is type(key.default), f"{method.name}.{field.name}"
    assert dataclasses.is_dataclass(method.settings) and vars(method.settings)["__dataclass_params__"].frozen


def test_the_common_keys_are_typed_as_their_defaults():
    hints = typing.get_type_hints(CommonSettings)
    for field in dataclasses.fields(CommonSettings):
        assert hints[field.name] is type(field.metadata[KEY].default), field.name


def non_default(name: str) -> object:
    """A value other than ``name``'s default that its key alone accepts (a second choice, a flipped bool, a larger number)."""
    key = SCHEMA[name]
    if key.choices:
        return next(c for c in key.choices if c != key.default)
    if isinstance(key.default, bool):
        return not key.default
    if isinstance(key.default, (int, float)):
        for value in (key.default + 1, key.default / 2 if isinstance(key.default, float) else key.default, 0.5):
            if value != key.default and (key.check is None or key.check(value)):
                return type(key.default)(value)
        return key.default
    return "x"


@pytest.mark.parametrize("method", DECLARED, ids=ids(DECLARED))
def test_a_resolved_config_round_trips_through_the_settings(method):
    cfg = resolve({"algorithm": method.name})
    settings = Settings.from_config(cfg)
    assert settings.to_config() == cfg and list(settings.to_config()) == list(SCHEMA)
    for name in SCHEMA:  # every key sits where attribute_path says, with its value and type
        value = operator.attrgetter(attribute_path(name))(settings)
        assert value == cfg[name] and type(value) is type(cfg[name]), name
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.seed = 1  # type: ignore[misc]


@pytest.mark.parametrize("method", WITH_KEYS, ids=ids(WITH_KEYS))
def test_a_methods_own_values_land_on_its_attribute(method):
    changed = {name: non_default(name) for name in method.keys}
    settings = Settings.from_config({**resolve({}), **changed})
    own = getattr(settings, method.attr)
    assert isinstance(own, method.settings)
    for name, value in changed.items():
        assert operator.attrgetter(attribute_path(name))(settings) == value, name
        assert attribute_path(name).startswith(f"{method.attr}."), name


def test_the_attribute_mapping():
    assert attribute_path("fraction-train") == "fraction_train"
    assert attribute_path("lg-global-layers") == "lg_fedavg.global_layers"
    assert attribute_path("fedlog-dp-withholding") == "fedlog.dp_withholding"
    assert attribute_path("fedproto-lambda") == "fedproto.lambda_"  # a Python keyword gets PEP 8's trailing underscore
    with pytest.raises(KeyError, match="no run-config key"):
        attribute_path("num_clients")


def test_settings_has_one_attribute_per_method_with_keys():
    common = {f.name for f in dataclasses.fields(CommonSettings)}
    own = {f.name: f.type for f in dataclasses.fields(Settings) if f.name not in common}
    assert own == {m.attr: m.settings.__name__ for m in WITH_KEYS if m.settings is not None}


# ------------------------------------------------------------------ its wire names


def test_no_two_methods_share_a_wire_name():
    arrays: list[str] = []
    phases: list[str] = []
    for method in DECLARED:
        for field, value in method.record_names().items():
            (phases if field.startswith("phase_") else arrays).append(value)
    assert len(arrays) == len(set(arrays)), arrays
    assert len(phases) == len(set(phases)) and not set(phases) & SHARED_PHASES, phases
    assert not set(arrays) & {P.ARRAYS, P.CONFIG, P.METRICS, P.SCORES}


def test_the_old_protocol_names_alias_the_declarations():
    records = {m.name: m.record_names() for m in DECLARED}
    assert (records["fedlog"]["eta"], records["fedlog"]["stats"], records["fedlog"]["phase_stats"]) == (P.ETA, P.STATS, P.PHASE_STATS)
    assert (records["fedprof"]["profile"], "profile", records["lg-fedavg"]["phase_upload"]) == (P.PROFILE, P.PHASE_PROFILE, P.PHASE_UPLOAD)
    assert ("gmm-classes", "chain", records["fedproto"]["class_counts"]) == (P.GMM_CLASSES, P.PHASE_CHAIN, P.CLASS_COUNTS)


# ------------------------------------------------------------------ its capabilities, read from its strategy


@pytest.mark.parametrize("method", DECLARED, ids=ids(DECLARED))
def test_secure_aggregation_is_refused_exactly_where_the_strategy_cannot_sum(method):
    if method.name == "local-only":  # nothing to sum: its own rule refuses it first, saying so
        with pytest.raises(ConfigError, match="local-only sends no arrays to sum"):
            resolve_settings({"algorithm": method.name, "secure-aggregation": "secagg+"})
        return
    needs: dict[str, dict[str, object]] = {"fedlog": {"fedlog-clip": 2.0}, "lg-fedavg": {"lg-new-test": False}}  # their rules under secagg
    cfg = resolve_settings({"algorithm": method.name, "secure-aggregation": "secagg+", **needs.get(method.name, {})})
    if SECURE_SUM in CAPABILITIES[method.name]:
        check_capabilities(cfg)
        return
    able = ", ".join(n for n in METHODS if SECURE_SUM in CAPABILITIES[n])
    with pytest.raises(ConfigError) as refused:
        check_capabilities(cfg)
    assert str(refused.value) == (
        f"run-config key 'secure-aggregation' is 'secagg+', which only {able} implement: {method.name}'s server needs what each "
        "client sends, not only their sum"
    )


@pytest.mark.parametrize("method", DECLARED, ids=ids(DECLARED))
def test_a_robust_rule_is_refused_exactly_where_the_strategy_does_not_average_updates(method):
    cfg = resolve_settings({"algorithm": method.name, "aggregation": "median"})
    if ROBUST_AGGREGATION in CAPABILITIES[method.name]:
        assert not method.server_combines
        check_capabilities(cfg)
        return
    able = ", ".join(n for n in METHODS if ROBUST_AGGREGATION in CAPABILITIES[n])
    with pytest.raises(ConfigError) as refused:
        check_capabilities(cfg)
    assert str(refused.value) == (
        f"run-config key 'aggregation' is 'median', which only {able} implement (it replaces their average of the round's "
        f"model updates); {method.name} {method.server_combines}: leave it 'mean'"
    )


def test_both_kinds_of_method_are_declared():
    """The parametrized refusal tests above take both branches."""
    for capability in (SECURE_SUM, ROBUST_AGGREGATION):
        assert {capability in CAPABILITIES[name] for name in METHODS} == {True, False}, capability


def test_a_strategy_that_disagrees_with_its_declaration_is_named():
    fedavg, fedlog = METHODS["fedavg"], METHODS["fedlog"]
    combines = dataclasses.replace(fedavg, server_combines="adds statistics")
    assert problems(combines, STRATEGIES["fedavg"]) == [
        "'fedavg': its strategy FedAvg implements a robust aggregation step, but the declaration says its server adds statistics"
    ]
    silent = dataclasses.replace(fedlog, server_combines="")
    assert "implements no robust aggregation step" in problems(silent, STRATEGIES["fedlog"])[0]
    assert "has name 'fedavg'" in problems(dataclasses.replace(fedavg, name="other"), STRATEGIES["fedavg"])[0]


# ------------------------------------------------------------------ its row in the README


def readme_methods() -> list[str]:
    """The ``algorithm=`` names of the README's method table, in row order."""
    names = []
    for line in (ROOT / "README.md").read_text().splitlines():
        cells = line.split("|")
        if len(cells) > 3 and "`" in cells[2] and not line.startswith("|---"):
            names += [n for n in re.findall(r"`([^`]+)`", cells[2]) if n != "algorithm="]  # the header names the key
    return names


def test_the_readme_table_names_every_declared_method_once():
    names = readme_methods()
    assert sorted(names) == sorted(METHODS), f"README's method table names {names}; declared: {list(METHODS)}"
