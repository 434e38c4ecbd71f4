import tomllib

import pytest

from core.config import SCHEMA, ConfigError, body_for, defaults, resolve
from tests.conftest import ROOT


def test_defaults_resolve_and_match_pyproject():
    cfg = resolve({})
    assert cfg == defaults()
    app_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert set(app_cfg) == set(SCHEMA), "pyproject's [tool.flwr.app.config] must list every run-config key"
    for key, value in app_cfg.items():
        assert resolve({key: value})[key] == SCHEMA[key].default, key


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="num_clients"):
        resolve({"num_clients": 3})


@pytest.mark.parametrize(
    "key,value,needle",
    [
        ("partition", "random", "allowed values: iid, pathological, shards, dirichlet, natural"),
        ("optimizer", "rmsprop", "allowed values: adam, sgd"),
        ("fraction-train", 1.5, "in (0, 1]"),
        ("num-clients", 0, "> 0"),
        ("lr", "fast", "must be a number"),
        ("body", "vgg", "unknown body 'vgg'"),
    ],
)
def test_bad_values_name_key_and_allowed(key, value, needle):
    with pytest.raises(ConfigError) as err:
        resolve({key: value})
    assert f"'{key}'" in str(err.value)
    assert needle in str(err.value)


def test_numbers_are_coerced_to_the_keys_type():
    cfg = resolve({"lr": 1, "num-clients": 4.0, "global-eval": "false"})
    assert cfg["lr"] == 1.0 and isinstance(cfg["lr"], float)
    assert cfg["num-clients"] == 4 and isinstance(cfg["num-clients"], int)
    assert cfg["global-eval"] is False


def test_dp_needs_a_clip_bound():
    with pytest.raises(ConfigError, match="fedlog-clip"):
        resolve({"fedlog-dp": "local"})
    assert resolve({"fedlog-dp": "central", "fedlog-clip": 2.0})["fedlog-clip"] == 2.0


def test_bodies_cycle_over_partition_ids_and_node_config_overrides():
    cfg = resolve({"bodies": "cifar-cnn, cifar-cnn-small", "body": "cifar-cnn"})
    assert [body_for(cfg, i) for i in range(4)] == ["cifar-cnn", "cifar-cnn-small"] * 2
    assert body_for(cfg, 0, override="mlp") == "mlp"
    assert body_for(resolve({}), 7) == "mnist-cnn"


def test_readme_documents_every_key():
    readme = (ROOT / "README.md").read_text()
    missing = [k for k in SCHEMA if f"`{k}`" not in readme]
    assert not missing, f"README lacks {missing}"


def test_every_algorithm_has_a_strategy_and_a_client_procedure():
    from client.registry import PROCEDURES
    from core.config import ALGORITHMS
    from strategies.registry import STRATEGIES

    assert set(STRATEGIES) == set(ALGORITHMS) == set(PROCEDURES)
