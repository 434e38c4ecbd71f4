"""A user's own data: nodes that own their data agree on a schema (discovery), register
under indices the server gives, are refused when their data does not fit, and are held to
the counts they declared; and Flower simulations on a user's image folder and CSV table."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from flwr.app import ConfigRecord, Error, Message, MessageType, RecordDict
from headway.client.env import client_env, local_data
from headway.core import protocol as P
from headway.core.config import ConfigError, resolve, resolve_settings
from headway.core.extractors import input_spec
from headway.core.run_data import local_spec, node_profile
from headway.strategies.base import TrainRound
from headway.strategies.discovery import discover
from headway.strategies.engine import Engine, RoundFailed
from headway.strategies.registry import STRATEGIES
from headway.strategies.services import Services

from tests.fakes import GridStub, reply
from tests.test_results_doc import undocumented


def write_npz(folder, labels, per_class=6, test_per_class=2, seed=0):
    """A node's own data: 4x4 grayscale images of ``labels`` (class names), ``per_class`` each."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    y_train = np.array([c for c in labels for _ in range(per_class)])
    y_test = np.array([c for c in labels for _ in range(test_per_class)])
    np.savez(
        folder / "data.npz",
        x_train=rng.integers(0, 255, (len(y_train), 1, 4, 4), dtype=np.uint8),
        y_train=y_train,
        x_test=rng.integers(0, 255, (len(y_test), 1, 4, 4), dtype=np.uint8),
        y_test=y_test,
    )
    return str(folder)


class LocalGrid(GridStub):
    """Nodes 201, 202, … that own their data (``profiles[i]``: the JSON each declares, or an
    Error); they answer a describe or registration query with it and other messages with
    ``answer(node, message)``. A node may also claim a partition id of its own choosing."""

    def __init__(self, profiles, answer=None, claims=None):
        self.nodes = [201 + i for i in range(len(profiles))]
        self.profiles = dict(zip(self.nodes, profiles))
        self.answer = answer or (lambda node, msg: None)
        self.claims = claims or {}
        self.sent: list[Message] = []

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            if msg.metadata.message_type == MessageType.QUERY:
                prof = self.profiles[node]
                if isinstance(prof, Error):
                    out.append(Message(prof, reply_to=msg))
                    continue
                content = RecordDict({P.CONFIG: ConfigRecord({P.BODY: "mnist-cnn", P.DATA_PROFILE: prof})})
                if node in self.claims:
                    content["metrics"] = reply({}, None, self.claims[node])["metrics"]
                out.append(Message(content=content, reply_to=msg))
            else:
                answer = self.answer(node, msg)
                if answer is not None:
                    out.append(Message(content=answer, reply_to=msg) if not isinstance(answer, Error) else Message(answer, reply_to=msg))
        return out


def local_cfg(**keys):
    return resolve_settings(
        {"algorithm": "fedlog", "dataset": "local", "num-clients": 3, "sample-timeout": 0.0, "round-timeout": 5.0, "feature-dim": 8, **keys}
    )


def profile_json(path, cfg):
    return json.dumps(node_profile(path, cfg))


def test_discovery_fixes_the_sorted_union_of_class_names_and_leaves_out_an_unreadable_description(tmp_path, task_identity):
    cfg = local_cfg()
    a = profile_json(write_npz(tmp_path / "a", ["3", "10", "2"]), cfg)
    b = profile_json(write_npz(tmp_path / "b", ["2", "7"]), cfg)
    (tmp_path / "t.csv").write_text("x,label\n1.5,2\n2.5,3\n")
    table = profile_json(str(tmp_path / "t.csv"), cfg)  # a table among image nodes: it cannot join their schema
    grid = LocalGrid([a, b, "{not json", Error(code=P.ERROR_BAD_INPUT, reason="ValueError: no such folder /srv/x"), table])
    found = discover(grid, cfg)
    assert found.schema.classes == ("2", "3", "7", "10")  # numeric names sort as numbers
    assert found.schema.input_shape == (1, 4, 4) and found.nodes == 2
    assert len(found.left_out) == 3 and any("no such folder /srv/x" in r for r in found.left_out)
    assert any("does not agree with the others" in r and "kind" in r for r in found.left_out), found.left_out
    assert found.bytes_up > 0 and found.bytes_down > 0
    assert found.summary()["discovery"]["classes"] == ["2", "3", "7", "10"]
    with pytest.raises(RoundFailed, match="no node described its data"):
        discover(LocalGrid(["[]"]), cfg)


def strategy_on(cfg, schema):
    spec = input_spec(cfg, local_spec(schema))
    return STRATEGIES[cfg.algorithm](cfg, spec, Services(cfg, schema))


def test_registration_gives_indices_refuses_data_that_does_not_fit_and_bounds_counts_by_the_declaration(tmp_path, task_identity):
    cfg = local_cfg(classes="2,3,7", **{"max-client-examples": 100})
    good = profile_json(write_npz(tmp_path / "a", ["3", "2"], per_class=6), cfg)
    other = profile_json(write_npz(tmp_path / "b", ["2", "cat"]), cfg)  # a class outside the run's list
    big = profile_json(write_npz(tmp_path / "c", ["7"], per_class=150), cfg)  # 150 + 2 examples > max-client-examples
    schema = discover(LocalGrid([good]), cfg).schema
    strategy = strategy_on(cfg, schema)
    grid = LocalGrid([good, other, big], claims={201: 2})  # node 201 claims partition 2: the server gives indices, not the node
    engine = Engine(grid, cfg, strategy.services, admit=strategy.body_problem)
    engine.begin_round(1)
    assert {n: c.partition_id for n, c in engine.registry.clients.items()} == {201: 0}
    refused = engine.registry.refused
    assert "classes not in the run's list: ['cat']" in refused[202]
    assert "declares 152 examples, more than max-client-examples=100" in refused[203]
    sent = [m for m in grid.sent if m.metadata.message_type == MessageType.QUERY]
    assert all(P.DATA_SCHEMA in m.content.config_records["config"] for m in sent)
    info = engine.registry.clients[201]
    assert info.declared == {"2": [6, 2], "3": [6, 2]} and info.declared_count("train") == 12
    # a FedLog reply whose class count exceeds what the node declared is refused
    stats = np.zeros((3, strategy.m), np.float32)
    stats[0, -1] = 40.0  # 40 examples of class "2": the node declared 12 training examples in all
    grid.answer = lambda node, msg: reply({P.STATS: stats}, 40, 0)
    got = engine.exchange(
        P.PHASE_TRAIN,
        {201: RecordDict({"config": ConfigRecord({"r": 1})})},
        MessageType.TRAIN,
        strategy.train_layout(TrainRound(1, engine, strategy.initial_state())),
    )
    assert got == [] and any("40" in f and "12" in f for f in engine.meter.failures), engine.meter.failures


def test_a_node_that_lost_its_schema_registers_again(tmp_path, task_identity):
    cfg = local_cfg()
    good = profile_json(write_npz(tmp_path / "a", ["0", "1"]), cfg)
    schema = discover(LocalGrid([good]), cfg).schema
    strategy = strategy_on(cfg, schema)
    grid = LocalGrid([good], answer=lambda node, msg: Error(code=P.ERROR_UNREGISTERED, reason="this node holds no schema"))
    engine = Engine(grid, cfg, strategy.services, admit=strategy.body_problem)
    engine.begin_round(1)
    assert 201 in engine.registry.clients
    engine.exchange(
        P.PHASE_TRAIN,
        {201: RecordDict({"config": ConfigRecord({"r": 1})})},
        MessageType.TRAIN,
        strategy.train_layout(TrainRound(1, engine, strategy.initial_state())),
    )
    assert 201 not in engine.registry.clients  # forgotten ...
    engine.begin_round(2)
    assert engine.registry.clients[201].partition_id == 0  # ... and registered afresh, with the schema sent again
    assert sum(P.DATA_SCHEMA in m.content.config_records["config"] for m in grid.sent if m.metadata.message_type == MessageType.QUERY) == 2


def test_a_node_reads_its_own_data_only_in_a_local_run(tmp_path, task_identity):
    folder = write_npz(tmp_path / "a", ["0", "1"])
    with pytest.raises(ValueError, match='--node-config "data=PATH"'):
        local_data(local_cfg(), {"partition-id": 0})
    with pytest.raises(ValueError, match="submit the run with dataset='local'"):
        local_data(resolve_settings({}), {"data": folder})
    cfg = local_cfg()
    schema = discover(LocalGrid([profile_json(folder, cfg)]), cfg).schema
    env = client_env(cfg.to_config(), {"data": folder}, (schema.to_json(), 2))
    assert env.partition_id == 2 and len(env.y_train) == 12 and len(env.y_test) == 4
    with pytest.raises(ValueError, match="has not registered"):
        client_env(cfg.to_config(), {"data": folder}, None)


def test_local_runs_are_refused_where_they_cannot_work():
    with pytest.raises(ConfigError, match="server-data"):
        resolve({"dataset": "local", "algorithm": "fedprof"})
    with pytest.raises(ConfigError, match="server-data"):
        resolve({"server-data": "/srv/eval"})  # only with dataset=local
    with pytest.raises(ConfigError, match="'dataset'"):
        resolve({"dataset": "mnistt"})


# ----- Flower simulation on a user's own sources -------------------------------------------------


@pytest.fixture(scope="module")
def digit_folder(tmp_path_factory, request, data_dir):
    """600 MNIST training and 200 test digits written as PNG files, in class folders named by word
    (skipped, saying why, without MNIST)."""
    from headway.core.data import load_dataset
    from PIL import Image

    ds = load_dataset("mnist", data_dir)
    root = tmp_path_factory.mktemp("digits")
    words = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    for split, x, y, n in (("train", ds.x_train, ds.y_train, 600), ("test", ds.x_test, ds.y_test, 200)):
        for i in range(n):
            (root / split / words[y[i]]).mkdir(parents=True, exist_ok=True)
            Image.fromarray(x[i, 0]).save(root / split / words[y[i]] / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def adult_csv(tmp_path_factory):
    """2,000 rows of UCI Adult as one CSV with its text columns (workclass, sex, ...) and a
    label column; no test split, so test-fraction is held out (skipped, saying why, without it)."""
    from tests.conftest import data_root

    root = data_root()
    where = (root / "uci-adult" / "adult.data", root / "adult" / "adult.data", root / "adult.data")
    src = next((p for p in where if p.is_file()), None)
    if src is None:
        pytest.skip(f"UCI Adult (adult.data) not found in {root}: set HEADWAY_DATA_DIR")
    out = tmp_path_factory.mktemp("adult") / "adult.csv"
    names = [
        "age",
        "workclass",
        "fnlwgt",
        "education",
        "education-num",
        "marital-status",
        "occupation",
        "relationship",
        "race",
        "sex",
        "capital-gain",
        "capital-loss",
        "hours-per-week",
        "native-country",
        "income",
    ]
    with open(src) as fh, open(out, "w", newline="") as dst:
        w = csv.writer(dst)
        w.writerow(names)
        rows = [r for r in csv.reader(fh, skipinitialspace=True) if len(r) == len(names)]
        w.writerows(rows[:2000])
    return out


def simulate_on(tmp_path, source, **keys):
    from headway.simulation.runner import load_config, preflight, simulate

    sets = [
        f"{k}={v}"
        for k, v in {
            "dataset": str(source),
            "num-clients": 3,
            "num-server-rounds": 2,
            "local-epochs": 1,  # train-fraction left at its default: all of a user's rows (issue 38)
            "sample-timeout": 30.0,
            **keys,
        }.items()
    ]
    cfg = load_config(None, sets)
    preflight(cfg, tmp_path)
    summary = simulate(cfg, tmp_path)
    rounds = [json.loads(line) for line in (tmp_path / "rounds.jsonl").read_text().splitlines()]
    return summary, rounds


@pytest.mark.integration
@pytest.mark.parametrize("algorithm", ["fedlog", pytest.param("fedavg", marks=pytest.mark.system)])  # the other pairing: make test-system
def test_simulation_on_a_users_image_folder(tmp_path, digit_folder, algorithm):
    summary, rounds = simulate_on(tmp_path, digit_folder, algorithm=algorithm, partition="iid", **{"feature-dim": 50})
    assert summary["status"] == "complete" and summary["rounds"] == 2 and summary["failures"] == 0
    assert rounds[-1]["test_examples"] == 200  # the folder's own test split, spread over the clients
    assert_every_training_row_used(tmp_path, summary, rounds, 600)
    assert rounds[-1]["accuracy"] > 0.3, rounds[-1]  # 10 classes: chance is 0.1


@pytest.mark.integration
@pytest.mark.parametrize("algorithm", ["fedavg", pytest.param("fedlog", marks=pytest.mark.system)])
def test_simulation_on_a_users_csv_table(tmp_path, adult_csv, algorithm):
    summary, rounds = simulate_on(tmp_path, adult_csv, algorithm=algorithm, body="mlp", partition="iid", **{"label-column": "income"})
    assert summary["status"] == "complete" and summary["rounds"] == 2 and summary["failures"] == 0
    assert rounds[-1]["test_examples"] == 400  # test-fraction 0.2 of 2,000 rows, held out locally
    assert rounds[-1]["accuracy"] > 0.76, rounds[-1]  # above always guessing "<=50K" (about 0.76 of Adult)
    assert_every_training_row_used(tmp_path, summary, rounds, 1600)


def assert_every_training_row_used(folder, summary, rounds, rows: int) -> None:
    """A user source is not cut to a built-in's 5 %: config.json says train-fraction 1, summary.json's per-client
    counts add up to every training row, and each round's train_examples is its selected clients' rows."""
    assert json.loads((folder / "config.json").read_text())["train-fraction"] == 1.0
    counts = summary["train_examples"]
    assert sorted(counts) == ["0", "1", "2"] and sum(counts.values()) == rows and min(counts.values()) > 0
    for r in rounds:
        assert r["train_examples"] == sum(counts[str(p)] for p in r["selected"]), r
    assert undocumented(folder) == {"rounds.jsonl": [], "summary.json": []}  # docs/results.md names every field written


def test_a_node_imports_only_the_body_it_runs():
    """A site's own body module need not be installed at the other sites: a client reads the run
    config without importing the import-path bodies it does not run (the server imports them all)."""
    from headway.client.env import node_cfg

    run = {"body": "mnist-cnn", "bodies": "mnist-cnn,site_b_private.bodies:net"}
    with pytest.raises(ConfigError, match="site_b_private"):
        resolve(run)
    assert node_cfg(run, {"data": "/srv/a"}).bodies == run["bodies"]
    with pytest.raises(ConfigError, match="unknown body 'vgg'"):
        node_cfg({"body": "vgg"}, {})  # a name that is no body at all is still refused
