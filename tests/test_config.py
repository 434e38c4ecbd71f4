"""The run-config schema, the method declarations' own rules and the files generated from them
(pyproject's ``[tool.flwr.app.config]``, docs/configuration.md); what every declaration must
hold (its classes, its keys through the typed settings, its capabilities) is in
tests/test_methods.py."""

import re
import shutil
import tomllib

import pytest
from headway.core.config import SCHEMA, ConfigError, body_for, check_bodies, defaults, max_replies, resolve, resolve_settings
from headway.core.methods import METHODS, method_keys, no_rules
from headway.core.partition import server_holdout

from headway import generate
from tests.conftest import ROOT


def test_defaults_resolve_to_the_schema():
    assert defaults() == {name: key.default for name, key in SCHEMA.items()}
    assert resolve({}) == {**defaults(), "train-fraction": 0.05}  # 0 resolves to the data set's own default: the built-in mnist's
    assert set(method_keys()) < set(SCHEMA) and "algorithm" in SCHEMA


@pytest.mark.parametrize(
    "dataset,given,used",
    [
        ("mnist", None, 0.05),  # a built-in: FedLog's Table 1 subset
        ("uci-adult", None, 0.05),
        ("./my-images", None, 1.0),  # the user's own data: every row
        ("data/people.csv", None, 1.0),
        ("local", None, 1.0),  # every node's own data
        ("./my-images", 0.3, 0.3),  # what the user sets is kept
        ("mnist", 1.0, 1.0),
        ("./my-images", 0, 1.0),  # 0 asks for the default explicitly
    ],
)
def test_train_fraction_default_uses_all_of_a_users_own_data(dataset, given, used):
    cfg = {"dataset": dataset} if given is None else {"dataset": dataset, "train-fraction": given}
    resolved = resolve(cfg)
    assert resolved["train-fraction"] == used
    assert resolve(resolved)["train-fraction"] == used  # a resolved config (config.json) resolves to itself


def test_train_fraction_refuses_values_outside_0_1():
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="'train-fraction'"):
            resolve({"train-fraction": bad})


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


def test_bodies_cycle_over_partition_ids_and_node_config_overrides():
    cfg = resolve_settings({"bodies": "cifar-cnn, cifar-cnn-small", "body": "cifar-cnn"})
    assert [body_for(cfg, i) for i in range(4)] == ["cifar-cnn", "cifar-cnn-small"] * 2
    assert body_for(cfg, 0, override="mlp") == "mlp"
    assert body_for(resolve_settings({}), 7) == "auto"  # until the inputs' shape is known: headway.core.config.fit_body


# --- the methods' own rules (core/methods.py): each applies when its method runs ---


@pytest.mark.parametrize(
    "sets,key",
    [
        ({"fedlog-dp": "local"}, "fedlog-clip"),
        ({"fedlog-dp": "central"}, "fedlog-clip"),
        ({"fedlog-dp": "local", "fedlog-clip": 1.0, "fedlog-uplink": "sparse"}, "fedlog-uplink"),
        ({"fedlog-dp": "central", "fedlog-clip": 1.0, "fedlog-uplink-dtype": "float16"}, "fedlog-uplink-dtype"),
        ({"fedlog-dp": "local", "fedlog-clip": 1.0, "fedlog-uplink-dtype": "float16"}, "fedlog-uplink-dtype"),
        ({"algorithm": "fedprof", "dataset": "local"}, "server-data"),
        ({"algorithm": "fedpft", "inputs": "features"}, "inputs"),
    ],
)
def test_a_method_refuses_what_it_cannot_run(sets, key):
    with pytest.raises(ConfigError, match=f"run-config key '{key}'"):
        resolve(sets)


@pytest.mark.parametrize(
    "sets",
    [
        {"fedlog-dp": "central", "fedlog-clip": 2.0, "fedlog-uplink": "sparse"},  # sparse is fine under central DP
        {"fedlog-dp": "local", "fedlog-clip": 2.0},
        {"fedlog-uplink-dtype": "float16", "fedlog-uplink": "sparse"},
        {"algorithm": "fedprof", "dataset": "local", "server-data": "held/by/server.csv"},
        {"algorithm": "fedavg", "inputs": "features", "body": "linear"},
        # a method's rules are its own: fedprox does not need fedprof's server data (fedlog's keys on fedavg are refused as
        # keys it does not read: tests/test_key_scope.py)
        {"algorithm": "fedprox", "dataset": "local"},
    ],
)
def test_a_method_accepts_what_it_can_run(sets):
    cfg = resolve(sets)
    assert all(cfg[k] == v for k, v in sets.items())


def test_only_the_methods_declaring_it_honour_client_sampling():
    honour = [m.name for m in METHODS.values() if m.client_sampling]
    assert honour and len(honour) < len(METHODS)  # both branches below are taken
    for name in METHODS:
        sets = {"algorithm": name, "client-sampling": "data-ratio"}
        if METHODS[name].client_sampling:
            assert resolve(sets)["client-sampling"] == "data-ratio"
        else:
            with pytest.raises(ConfigError, match=f"which only {' and '.join(honour)} implement"):
                resolve(sets)


def test_the_server_holdout_is_the_key_the_method_declares():
    assert server_holdout(resolve_settings({"algorithm": "fedprof", "fedprof-val-size": 300, "server-holdout": 7})) == 300
    assert server_holdout(resolve_settings({"algorithm": "fedavg", "server-holdout": 7})) == 7
    assert server_holdout(resolve_settings({"algorithm": "fedlog"})) == 0
    for method in METHODS.values():  # each method's own key, whichever it declares (fedprof-val-size only where it is read)
        keys = {"fedprof-val-size": 300, "server-holdout": 7} if method.name == "fedprof" else {"server-holdout": 7}
        cfg = resolve_settings({"algorithm": method.name, **keys})
        assert server_holdout(cfg) == cfg.value(method.holdout_key) == keys[method.holdout_key]


def test_a_round_of_fedpft_asks_every_client():
    assert max_replies(resolve_settings({"algorithm": "fedpft", "num-clients": 20, "fraction-train": 0.1})) == 20
    assert max_replies(resolve_settings({"algorithm": "fedavg", "num-clients": 20, "fraction-train": 0.1})) == 2
    with pytest.raises(ConfigError, match="asks every client = 20"):
        resolve({"algorithm": "fedpft", "num-clients": 20, "min-replies": 21})
    with pytest.raises(ConfigError, match=r"asks K = .* = 2 client"):
        resolve({"algorithm": "fedavg", "num-clients": 20, "fraction-train": 0.1, "min-replies": 3})


def test_only_a_method_that_builds_the_body_checks_it():
    shape = (1, 2, 2)  # far too small for mnist-cnn's convolutions and pooling
    with pytest.raises(ConfigError, match="run-config key 'body'"):
        check_bodies(resolve_settings({"algorithm": "fedlog"}), shape)
    check_bodies(resolve_settings({"algorithm": "fedpft"}), shape)  # FedPFT builds its extractor, never `body`


# --- the files generated from the schema and the declarations (headway generate) ---


def test_generated_files_are_current():
    stale = generate.stale(generate.expected(ROOT))
    assert not stale, f"{[str(p.relative_to(ROOT)) for p in stale]} are stale: run `headway generate` (python -m headway.generate)"


def test_the_pyproject_block_holds_every_key_with_its_default_and_type():
    block = tomllib.loads(generate.config_block())["tool"]["flwr"]["app"]["config"]
    assert list(block) == [*generate.general_keys(), *method_keys()]
    for name, key in SCHEMA.items():
        assert block[name] == key.default and type(block[name]) is type(key.default), name
        assert resolve({name: block[name]})[name] == resolve({})[name]  # what Flower hands the apps resolves as the default does
    app_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert app_cfg == block


def rows(text: str) -> dict[str, list[tuple[str, str, str, str]]]:
    """Key -> every table row of the reference naming it, with the section it is in."""
    out: dict[str, list[tuple[str, str, str, str]]] = {}
    section = ""
    for line in text.splitlines():
        if line.startswith("#"):
            section = line.lstrip("# ").strip()
        found = re.fullmatch(r"\| `([^`]+)` \| `(.*?)` \| (.*?) \| (.*) \|", line)
        if found:
            out.setdefault(found[1], []).append((section, found[2], found[3], found[4]))
    return out


def test_the_reference_documents_every_key_once_in_its_section():
    documented = rows(generate.doc_text())
    assert set(documented) == set(SCHEMA)
    owner = {name: method.name for method in METHODS.values() for name in method.keys}
    for name, key in SCHEMA.items():
        [(section, default, allowed, help_text)] = documented[name]
        assert section == owner.get(name, "General keys"), name
        assert default == generate.toml_value(key.default), name
        assert all(f"`{choice}`" in allowed for choice in key.choices or ()), name
        assert key.rule.replace("|", "\\|") in allowed, name
        assert help_text.startswith(" ".join(key.help.split())[:40].replace("|", "\\|")), name
    for method in METHODS.values():
        section = generate.doc_text().split(f"\n### {method.name}\n\n")[1].split("\n### ")[0]
        assert section.startswith(f"{method.summary[0].upper()}{method.summary[1:]}."), method.name
        assert ("Checked at start: " in section) == (method.validate is not no_rules), method.name
    assert {m.validate is no_rules for m in METHODS.values()} == {True, False}  # the page has sections of both kinds


def test_check_mode_names_a_hand_edited_file_and_a_run_repairs_it(tmp_path, capsys):
    for name in (generate.PYPROJECT, generate.DOC, generate.METHODS_DOC):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    root = ["--root", str(tmp_path)]
    assert generate.main(root) == 0  # current, whatever the checkout's copies hold (test_generated_files_are_current checks those)
    assert generate.main(["--check", *root]) == 0
    pyproject = tmp_path / generate.PYPROJECT
    pyproject.write_text(pyproject.read_text().replace("\nnum-clients = 50\n", "\nnum-clients = 51\n"))
    (tmp_path / generate.DOC).write_text((tmp_path / generate.DOC).read_text() + "hand-written line\n")
    methods_doc = tmp_path / generate.METHODS_DOC
    methods_doc.write_text(methods_doc.read_text().replace("| `fedpft` | ", "| `fedpft` | hand-edited |", 1))
    capsys.readouterr()
    assert generate.main(["--check", *root]) == 1
    assert "stale: pyproject.toml, docs/configuration.md, docs/methods.md" in capsys.readouterr().err
    assert generate.main(root) == 0
    assert generate.main(["--check", *root]) == 0
    assert tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"]["num-clients"] == 50
    assert pyproject.read_text().split(generate.BEGIN)[0] == (ROOT / generate.PYPROJECT).read_text().split(generate.BEGIN)[0]
    assert methods_doc.read_text() == (ROOT / generate.METHODS_DOC).read_text()  # the table rewritten, the prose around it kept


def test_a_pyproject_without_the_generated_block_is_refused(tmp_path, capsys):
    (tmp_path / generate.PYPROJECT).write_text('[tool.flwr.app.config]\nalgorithm = "fedlog"\n')
    assert generate.main(["--root", str(tmp_path)]) == 2
    assert "one generated block" in capsys.readouterr().err
