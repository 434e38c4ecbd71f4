"""A method key the run's algorithm does not read, set away from its default, is refused in one line naming the
key, the algorithm and what reads it, never silently ignored (the outside probe's finding in issue 42:
lg-global-layers on fedavg, fedpft-em-restarts on fedlog, ...). What each method reads is declared with it
(core/methods.py: its own keys, ``reads``, and FedPFT's extractor keys under inputs=features); the cross-check
below finds every ``settings.<method>`` read in its strategy's and procedure's source and holds the two equal.
A `headway run` config file is one setup several methods run with --set algorithm=...: the file's keys of the
method it no longer runs are left out, with a line saying so."""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import logging
import re
import sys
from collections.abc import Iterator

import headway.client.registry  # noqa: F401  (the procedures' modules, imported as a run imports them)
import headway.strategies.registry  # noqa: F401  (the strategies' modules)
import pytest
from headway.core.config import ConfigError, defaults, resolve
from headway.core.methods import ALGORITHMS, FEATURE_KEYS, METHODS, Method, class_path, key_owner, method_keys, reads
from headway.core.schema import key_name

from tests.conftest import ROOT

# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize(
    ("config", "key", "use"),
    [  # the outside probe's four
        ({"algorithm": "fedavg", "lg-global-layers": "2"}, "lg-global-layers", "set algorithm=lg-fedavg"),
        ({"algorithm": "fedlog", "fedpft-em-restarts": 5}, "fedpft-em-restarts", "set algorithm=fedpft"),
        ({"algorithm": "fedavg", "feddbe-kappa": 50.0}, "feddbe-kappa", "set algorithm=feddbe"),
        ({"algorithm": "fedlog", "fedprof-alpha": 25.0}, "fedprof-alpha", "set algorithm=fedprof"),
    ],
)
def test_a_key_of_another_method_is_refused_in_one_line(config, key, use):
    with pytest.raises(ConfigError) as err:
        resolve(config)
    text = str(err.value)
    owner = key_owner(key)
    assert owner is not None and "\n" not in text
    assert text.startswith(f"run-config key '{key}' is {config[key]!r}, but it is {owner.display}'s ({owner.key_prefix}-*)"), text
    assert f"algorithm={config['algorithm']} does not read it: remove it, or {use}" in text, text


def test_every_unread_key_is_named():
    with pytest.raises(ConfigError, match=r"'fedprox-mu' is 0.1.*; it would ignore lg-ensemble, fedpft-dp too$"):
        resolve({"algorithm": "fedavg", "fedprox-mu": 0.1, "lg-ensemble": "median", "fedpft-dp": "on"})


def test_keys_at_their_default_pass_on_every_algorithm():
    """pyproject.toml sends every key with its default (flwr run): only a value away from it says the user set it."""
    everything = defaults()
    for algorithm in ALGORITHMS:
        assert resolve({**everything, "algorithm": algorithm})["algorithm"] == algorithm
    assert resolve({"algorithm": "fedavg", "fedprox-mu": 0.01, "fedlog-alpha": 0})["fedlog-alpha"] == 0.0  # 0 is the default 0.0


def test_every_key_passes_on_its_own_method():
    """A non-default value of each method key is read by its owner (no method refuses its own keys)."""
    for name in method_keys():
        owner = key_owner(name)
        assert owner is not None and reads(owner, name) and not reads(METHODS["fedavg"], name), name


# the former special cases, kept: headway.core.methods.fedlog_c_key_rule and headway.core.config's lg-* check


@pytest.mark.parametrize("algorithm", ["fedavg", "fedpft"])
def test_fedlog_c_downlink_on_another_algorithm_is_refused(algorithm):
    with pytest.raises(ConfigError, match=f"'fedlog-c-downlink' is 'stats', but it is FedLog's .* algorithm={algorithm} does not read it"):
        resolve({"algorithm": algorithm, "fedlog-c-downlink": "stats"})


def test_fedlog_c_downlink_on_plain_fedlog_is_refused_in_one_line():
    """Within FedLog: only FedLog-C (fedlog-alpha or fedlog-beta > 0) sends Φ down (headway.core.methods._fedlog_rules)."""
    with pytest.raises(ConfigError, match="'fedlog-c-downlink' is 'stats', but plain FedLog .*leave it 'eta-and-stats'") as err:
        resolve({"algorithm": "fedlog", "fedlog-c-downlink": "stats"})
    assert "\n" not in str(err.value)


def test_fedlog_beta_on_another_algorithm_is_refused():
    with pytest.raises(ConfigError, match="'fedlog-beta' is 0.001, but it is FedLog's .*algorithm=fedprox does not read it"):
        resolve({"algorithm": "fedprox", "fedlog-beta": 0.001})


@pytest.mark.parametrize(
    "config",
    [
        {"fedlog-alpha": 0.01},
        {"fedlog-beta": 0.001, "fedlog-clip": 1.0},  # β alone is FedLog-C too: the server sends Φ
        {"fedlog-alpha": 0.01, "fedlog-beta": 0.0001},
    ],
)
def test_fedlog_c_takes_the_stats_downlink(config):
    assert resolve({"algorithm": "fedlog", "fedlog-c-downlink": "stats", **config})["fedlog-c-downlink"] == "stats"


@pytest.mark.parametrize(("algorithm", "key", "value"), [("fedavg", "lg-rounds", 5), ("local-only", "lg-warmup-goal", 0.9)])
def test_lg_fedavgs_run_length_keys_elsewhere_are_refused(algorithm, key, value):
    """Local-only reads LG-FedAvg's lg-ensemble (its new test), not the warm-up or the run length."""
    with pytest.raises(ConfigError, match=f"'{key}' is {value}, but it is LG-FedAvg's .*algorithm={algorithm} does not read it"):
        resolve({"algorithm": algorithm, key: value})


def test_local_only_reads_lg_ensemble_and_the_refusal_says_so():
    assert resolve({"algorithm": "local-only", "lg-ensemble": "median"})["lg-ensemble"] == "median"
    with pytest.raises(ConfigError, match="remove it, or set algorithm=lg-fedavg or local-only$"):
        resolve({"algorithm": "fedavg", "lg-ensemble": "median"})


def test_fedpfts_extractor_keys_are_read_by_every_method_with_features_as_inputs():
    cfg = {"algorithm": "fedavg", "body": "mlp", "fedpft-resolution": 96}
    assert resolve({**cfg, "inputs": "features"})["fedpft-resolution"] == 96
    with pytest.raises(ConfigError, match="with inputs=raw: remove it, or set inputs=features .*, or set algorithm=fedpft$"):
        resolve(cfg)
    with pytest.raises(ConfigError, match="'fedpft-components' is 3, but it is FedPFT's"):  # not an extractor key
        resolve({**cfg, "inputs": "features", "fedpft-components": 3})


# ------------------------------------------------------------------ the declarations, against the source

GROUPS = {m.attr: m for m in METHODS.values() if m.settings is not None}
READ = re.compile(r"\b(?:settings|cfg)\.(" + "|".join(GROUPS) + r")\b(?:\.(\w+))?")  # settings.fedlog.alpha, env.cfg.fedlog
NAME = re.compile(r"\b[A-Za-z_]\w*\b")
SCANNED = ("core", "strategies", "client")  # the packages whose code a run executes for its method
DECLARING = {
    "headway.core.settings",
    "headway.core.methods",
    "headway.core.config",
    "headway.core.schema",
}  # declare and validate every key: they run for every method


@functools.cache
def _definitions(module: str) -> dict[str, str]:
    """The source of each top-level function and class of ``module`` (parsed once)."""
    text = inspect.getsource(sys.modules[module])
    lines = text.splitlines()
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return {n.name: "\n".join(lines[n.lineno - 1 : n.end_lineno]) for n in ast.parse(text).body if isinstance(n, kinds)}


@functools.cache
def _own_code(obj: object) -> tuple[str, tuple[object, ...]]:
    """``obj``'s source (a function or class of ours) and the functions and classes of ours it names; empty for another's."""
    module = getattr(obj, "__module__", "") or ""
    if not module.startswith(tuple(f"headway.{package}." for package in SCANNED)) or module in DECLARING:
        return "", ()
    source = _definitions(module).get(getattr(obj, "__qualname__", ""), "")
    names = vars(sys.modules[module])
    return source, tuple(v for n in set(NAME.findall(source)) if inspect.isfunction(v := names.get(n)) or inspect.isclass(v))


def _code_run(*roots: object) -> Iterator[tuple[str, str]]:
    """(qualified name, source) of ``roots``, their base classes and every function and class of ours they reach by name."""
    seen: set[object] = set()
    todo = [base for root in roots for base in (root.__mro__ if isinstance(root, type) else (root,))]
    while todo:
        obj = todo.pop()
        if obj in seen:
            continue
        seen.add(obj)
        source, named = _own_code(obj)
        if source:
            yield f"{obj.__module__}.{obj.__qualname__}", source  # type: ignore[attr-defined]
        todo += named


def keys_read_in_source(*roots: object) -> dict[str, set[str]]:
    """Method key (or '<prefix>-*' where a whole settings group is taken) -> where the code ``roots`` run reads it."""
    found: dict[str, set[str]] = {}
    for where, source in _code_run(*roots):
        for attr, field in READ.findall(source):
            owner = GROUPS[attr]
            key = key_name(owner.key_prefix, field) if field else ""
            found.setdefault(key if key in owner.keys else f"{owner.key_prefix}-*", set()).add(where)  # a field, else the group
    return found


def _classes(method: Method) -> tuple[type, type]:
    """Its strategy and client procedure classes, as the registries load them."""
    loaded = []
    for package, path in (("headway.strategies", method.strategy), ("headway.client.procedures", method.procedure)):
        module, name = class_path(path)
        loaded.append(getattr(importlib.import_module(f"{package}.{module}"), name))
    return loaded[0], loaded[1]


def _declared(method: Method, key: str) -> bool:
    """Whether ``method``'s declaration says it reads ``key`` (a whole group: every key of it)."""
    if key.endswith("-*"):
        group = [k for k in method_keys() if k.startswith(key[:-1])]
        return all(reads(method, k) for k in group)
    return reads(method, key)


@pytest.mark.parametrize("name", list(METHODS))
def test_what_each_method_reads_is_declared(name):
    """Every settings.<method>.<field> its strategy and procedure (and what they call of ours) read is its own key or in
    its ``reads``; and each ``reads`` entry is read there: the rule refuses exactly what the run would ignore."""
    method = METHODS[name]
    found = keys_read_in_source(*_classes(method))
    undeclared = {key: sorted(where) for key, where in found.items() if not _declared(method, key)}
    assert not undeclared, f"{name} reads {undeclared}: declare them in its Method(reads=...) in core/methods.py"
    for entry in method.reads:
        assert any(key == entry or (entry.endswith("-*") and key.startswith(entry[:-1])) for key in found), (
            f"{name} declares reads={entry!r}, but its strategy and procedure never read it"
        )
    if key_owner(method.holdout_key) is not None:  # a method key: read through Settings.value, not as an attribute
        assert reads(method, method.holdout_key)


def test_the_extractor_keys_are_what_features_as_inputs_reads():
    """inputs=features runs FedPFT's extractor for any method (core/extractors.py): FEATURE_KEYS are the keys it reads."""
    from headway.core.extractors import configured_features, input_spec

    assert set(keys_read_in_source(configured_features, input_spec)) == set(FEATURE_KEYS)


# ------------------------------------------------------------------ config files of `headway run`, and the benchmarks


def _load(tmp_path, text: str, *sets: str):
    from headway.simulation.runner import load_config

    path = tmp_path / "setup.toml"
    path.write_text(f"[run-config]\n{text}\n")
    return load_config(str(path), list(sets))


def test_a_files_keys_for_the_method_it_no_longer_runs_are_left_out_with_a_line(tmp_path, caplog):
    text = 'algorithm = "fedprof"\nfedprof-alpha = 25.0\nfedprof-val-size = 8000\nfedprof-layer = "body"\nnum-clients = 60'
    with caplog.at_level(logging.INFO, logger="headway"):
        cfg = _load(tmp_path, text, "algorithm=fedavg")
    assert cfg.algorithm == "fedavg" and cfg.fedprof.alpha == 10.0 and cfg.fedprof.val_size == 1000 and cfg.num_clients == 60
    (line,) = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert line.endswith("fedprof-alpha=25.0, fedprof-val-size=8000 left out (FedProf's keys, which --set algorithm=fedavg does not read)")


def test_a_files_keys_for_another_method_than_its_own_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="'fedprof-alpha' is 25.0, but it is FedProf's .*algorithm=fedlog does not read it"):
        _load(tmp_path, "fedprof-alpha = 25.0")  # no algorithm: the default, fedlog, runs
    with pytest.raises(ConfigError, match="'fedprox-mu' is 0.1, but .*algorithm=fedprof does not read it"):
        _load(tmp_path, 'algorithm = "fedprof"\nfedprox-mu = 0.1', "algorithm=fedprof")  # the file's own algorithm


def test_a_key_given_with_set_is_refused_whatever_the_file_says(tmp_path):
    with pytest.raises(ConfigError, match="'lg-global-layers' is '2', but .*algorithm=fedavg does not read it"):
        _load(tmp_path, 'algorithm = "lg-fedavg"', "algorithm=fedavg", "lg-global-layers=2")


def test_every_benchmark_config_runs_as_printed_and_with_every_algorithm():
    from headway.simulation.runner import load_config

    for path in sorted((ROOT / "benchmarks" / "configs").glob("*.toml")):
        for sets in ([], *([f"algorithm={a}"] for a in ALGORITHMS)):
            load_config(str(path), sets)


def test_a_benchmarks_own_set_is_left_out_of_the_runs_that_do_not_read_it(capsys):
    """benchmarks/README.md's Table 3 command gives --set lg-new-test=False to its FedAvg and FedProx arms too."""
    from benchmarks.lg_table3 import CONFIG
    from benchmarks.runner import read_by_run

    sets = ["eval-every=50", "lg-new-test=False"]
    assert read_by_run(CONFIG, {"algorithm": "lg-fedavg"}, sets) == sets
    assert read_by_run(CONFIG, {"algorithm": "fedavg"}, sets) == ["eval-every=50"]
    assert "--set lg-new-test=False left out of this fedavg run" in capsys.readouterr().out
