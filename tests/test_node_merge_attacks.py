"""Issue 37, items 4 and 5: lying nodes in a ``dataset=local`` run, on UCI Adult.

Every node here runs the real ClientApp (:func:`headway.client.app.build_client_app`) on a CSV of its
own, and the real ServerApp (:func:`headway.server.app.run_server`) drives the run through an
in-process grid (no Ray, no processes: a few seconds). A lying node is the real ClientApp with
its description and registration replies rewritten before they leave the node, as a SuperNode
running edited client code would send them. With one liar of three, the run must complete
with the two honest nodes, and they must encode and score exactly as in a run without the liar.

Item 5: a node refuses a server-chosen label column that is not categorical (numeric with
non-integer values, or more distinct values than its ``max-label-values``), and one whose
operator pinned another ``label-column`` in its node config: nothing of the column leaves it.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from headway.client.app import JOINED, build_client_app
from headway.core import protocol as P
from headway.core.config import resolve
from headway.core.data import ADULT_COLUMNS

from tests.conftest import data_root, missing_data
from tests.fakes import GridStub

ADULT = list(ADULT_COLUMNS)  # UCI Adult's columns, as core/data.py reads them
ROWS = 300  # per node: a few seconds of FedLog on an MLP


@pytest.fixture(scope="module")
def adult_nodes(tmp_path_factory) -> list[Path]:
    """Three node folders, each a train.csv of 300 other rows of UCI Adult (test-fraction holds out 20 %)."""
    src = data_root() / "uci-adult" / "adult.data"
    if not src.is_file():
        missing_data(f"UCI Adult not found at {src}")
    with open(src) as fh:
        rows = [r for r in csv.reader(fh, skipinitialspace=True) if len(r) == len(ADULT)]
    folders = []
    for i in range(3):
        folder = tmp_path_factory.mktemp(f"adult-node{i}")
        with open(folder / "train.csv", "w", newline="") as dst:
            w = csv.writer(dst)
            w.writerow(ADULT)
            w.writerows(rows[i * ROWS : (i + 1) * ROWS])
        folders.append(folder)
    return folders


Lie = Callable[[dict[str, Any]], dict[str, Any]]


class NodesGrid(GridStub):
    """Nodes 201, 202, ... each running the real ClientApp on its own folder (node config
    ``data``, plus ``node_config``); a node with a lie rewrites the profile of its
    description and registration replies with it (its own true profile in, the lie out)."""

    def __init__(self, cfg: dict[str, Any], folders: list[Path], lies: dict[int, Lie] | None = None, node_config: dict | None = None):
        self.app = build_client_app(cfg)
        self.nodes = [201 + i for i in range(len(folders))]
        self.contexts = {
            n: Context(run_id=1, node_id=n, node_config={"data": str(f), **(node_config or {})}, state=RecordDict(), run_config={})
            for n, f in zip(self.nodes, folders)
        }
        self.lies = {201 + i: lie for i, lie in (lies or {}).items()}
        self.sent: list[Message] = []
        self.replies: list[Message] = []

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        out = []
        for msg in messages:
            self.sent.append(msg)
            node = msg.metadata.dst_node_id
            reply = self.app(msg, self.contexts[node])
            lie = self.lies.get(node)
            if lie is not None and msg.metadata.message_type == MessageType.QUERY and not reply.has_error():
                fields = dict(reply.content.config_records[P.CONFIG])
                fields[P.DATA_PROFILE] = json.dumps(lie(json.loads(str(fields[P.DATA_PROFILE]))), sort_keys=True)
                reply = Message(content=RecordDict({P.CONFIG: ConfigRecord(fields)}), reply_to=msg)
            self.replies.append(reply)
            out.append(reply)
        return out

    def schema_of(self, index: int) -> str | None:
        """The schema JSON node ``201 + index`` registered with (None: it never joined)."""
        record = self.contexts[201 + index].state.config_records.get(JOINED)
        return None if record is None else str(record[P.DATA_SCHEMA])


def adult_cfg(**keys) -> dict[str, Any]:
    return resolve(
        {
            "algorithm": "fedlog",
            "dataset": "local",
            "label-column": "income",
            "num-clients": 3,
            "num-server-rounds": 1,
            "local-epochs": 1,
            "batch-size": 32,
            "body": "mlp",
            "feature-dim": 8,
            "sample-timeout": 0.0,
            "round-timeout": 60.0,
            **keys,
        }
    )


def run(tmp_path: Path, cfg: dict[str, Any], grid: NodesGrid, name: str) -> tuple[dict, list[dict]]:
    from headway.server.app import run_server

    out = tmp_path / name
    try:
        run_server(grid, cfg, out)
    except Exception as exc:  # a failed run still writes summary.json, which the test reads
        if not (out / "summary.json").exists():
            raise AssertionError(f"the run failed before writing summary.json: {type(exc).__name__}: {exc}") from exc
    summary = json.loads((out / "summary.json").read_text())
    rounds = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()] if (out / "rounds.jsonl").exists() else []
    return summary, rounds


def readable(reason: str) -> bool:
    return isinstance(reason, str) and 0 < len(reason) <= 1000 and "Traceback" not in reason and "\n" not in reason


def _numeric(profile: dict) -> dict[str, dict]:
    return {c: s for c, s in profile["columns"].items() if s["type"] == "numeric"}


def rows_at_the_means(profile: dict) -> dict:
    """10^15 rows whose numeric columns have the node's own means and spreads (its classes scaled alike)."""
    rows = sum(a for a, _ in profile["classes"].values())
    scale = 10**15 // rows
    for counts in profile["classes"].values():
        counts[0] *= scale
    for spec in profile["columns"].values():
        if spec["type"] == "numeric":
            spec["n"], spec["sum"], spec["sumsq"] = spec["n"] * scale, spec["sum"] * scale, spec["sumsq"] * scale
    return profile


def huge_values(profile: dict) -> dict:
    """999,000 rows (under the 10^6 example cap) whose numeric values are all 1e14."""
    total = 999_000
    names = list(profile["classes"])
    for i, c in enumerate(names):
        profile["classes"][c] = [total // len(names) + (total % len(names) if i == 0 else 0), 0]
    for spec in _numeric(profile).values():
        spec["n"], spec["sum"], spec["sumsq"] = total, total * 1e14, total * 1e28
    return profile


def invented_classes(profile: dict) -> dict:
    """Its own classes and 9,998 invented ones (one row each)."""
    profile["classes"].update({f"invented-{i:04d}": [1, 0] for i in range(9_998)})
    return profile


LIES = {"1e15 rows at the means": rows_at_the_means, "999,000 rows of 1e14": huge_values, "9,998 invented classes": invented_classes}


@pytest.fixture(scope="module")
def module_identity():
    """The identity messages built outside a Flower run need (as tests.conftest's task_identity), for module fixtures."""
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


@pytest.fixture(scope="module")
def honest_run(adult_nodes, tmp_path_factory, module_identity):
    """The two honest nodes alone (num-clients=3, the third never connects): the reference."""
    cfg = adult_cfg()
    grid = NodesGrid(cfg, adult_nodes[:2])
    summary, rounds = run(tmp_path_factory.mktemp("honest"), cfg, grid, "honest")
    assert summary["status"] == "complete" and rounds[-1]["clients"] == 2, summary
    return summary, rounds, grid


@pytest.mark.parametrize("lie", list(LIES.values()), ids=list(LIES))
def test_one_lying_node_of_three_neither_stops_nor_shapes_the_run(task_identity, tmp_path, adult_nodes, honest_run, lie):
    ref_summary, ref_rounds, ref_grid = honest_run
    cfg = adult_cfg()
    grid = NodesGrid(cfg, adult_nodes, lies={2: lie})  # the liar is node 203: the honest nodes get indices 0 and 1 as in the reference
    summary, rounds = run(tmp_path, cfg, grid, "attacked")
    assert summary["status"] == "complete", summary.get("reason")
    # the honest two took part, the liar was refused, with a reason that names what it claimed
    assert rounds[-1]["clients"] == 2 and sorted(summary["participants"]) == ["0", "1"], (rounds, summary["participants"])
    print(summary["refused_nodes"], summary["discovery"]["left_out"])
    assert len(summary["refused_nodes"]) == 1 and readable(summary["refused_nodes"][0]), summary["refused_nodes"]
    # the honest nodes encode exactly as without the liar: same schema, same classes, same scores
    assert grid.schema_of(0) == ref_grid.schema_of(0) and grid.schema_of(1) == ref_grid.schema_of(1)
    assert summary["discovery"]["classes"] == ["<=50K", ">50K"] and summary["discovery"]["nodes"] == 2, summary["discovery"]
    assert len(summary["discovery"]["left_out"]) == 1 and summary["discovery"]["left_out"][0].startswith("node 203:"), summary["discovery"]
    assert [r["accuracy"] for r in rounds] == [r["accuracy"] for r in ref_rounds]
    assert rounds[-1]["bytes_up"] == ref_rounds[-1]["bytes_up"]  # replies of the same size: 2 classes, not 10,000


def test_two_honest_nodes_with_their_own_spread_keep_a_scaling_between_them(task_identity):
    """The median rules on honest descriptions: a node's own moments alone give its own
    mean and std (as before); two nodes give the midpoint, and a scale with their spread."""
    from headway.core.node_merge import robust_moments

    assert robust_moments([(5.0, 4.0)]) == (5.0, 2.0)
    centre, scale = robust_moments([(0.0, 1.0), (2.0, 1.0)])
    assert centre == 1.0 and scale == pytest.approx(2**0.5)  # 1 + (1)^2 about the midpoint
    centre, scale = robust_moments([(0.0, 1.0), (2.0, 1.0), (1e14, 0.0)])  # one liar of three: between the honest
    assert centre == 2.0 and scale == pytest.approx(5**0.5)


def test_names_enter_by_support_or_within_one_nodes_cap_of_lone_names():
    from headway.core.node_merge import MAX_NEW_NAMES, supported

    assert supported([["a", "b"], ["a", "b"], ["a", "b", *map(str, range(9998))]]) == {"a", "b"}
    assert supported([["a", "b", "x"], ["a", "c"], ["b", "c"]]) == {"a", "b", "c", "x"}  # x: one honest site's own class
    many = [f"n{i}" for i in range(MAX_NEW_NAMES + 1)]
    assert supported([["a", "b"], ["a", "b"], ["a", "b", *many[:-1]]]) == {"a", "b", *many[:-1]}  # at the cap: admitted
    assert supported([["a", "b"], ["a", "b"], ["a", "b", *many]]) == {"a", "b"}  # one past it: none of its lone names
    assert supported([["a"], ["a", *(f"n{i}" for i in range(MAX_NEW_NAMES))]]) == {"a", *(f"n{i}" for i in range(MAX_NEW_NAMES))}
    assert supported([["a"], ["a", *(f"n{i}" for i in range(MAX_NEW_NAMES + 1))]]) == {"a"}


# ----- item 5: a server-chosen label column --------------------------------------------------------
@pytest.mark.parametrize("column", ["fnlwgt", "age", "hours-per-week"])
def test_a_numeric_label_column_is_refused_by_the_node_and_nothing_is_sent(task_identity, tmp_path, adult_nodes, column):
    """The server names a numeric column of Adult as the label: every node answers the
    description with an error naming the column and the rule; no reply carries a profile,
    and discovery fails with that reason."""
    from headway.core.settings import Settings
    from headway.strategies.discovery import discover
    from headway.strategies.engine import RoundFailed

    cfg = adult_cfg(**{"label-column": column})
    grid = NodesGrid(cfg, adult_nodes)
    with pytest.raises(RoundFailed, match=f"this node refuses the run's label column: label column '{column}'"):
        discover(grid, Settings.from_config(cfg))
    assert all(r.has_error() for r in grid.replies) and len(grid.replies) == 3
    assert not any(r.has_content() and P.DATA_PROFILE in r.content.config_records.get(P.CONFIG, {}) for r in grid.replies)
    reason = str(grid.replies[0].error.reason)
    summary, rounds = run(tmp_path, cfg, NodesGrid(cfg, adult_nodes), "refused")  # the whole run: failed, and summary.json says why
    assert summary["status"] == "failed" and f"label column '{column}'" in summary["reason"] and rounds == [], summary
    assert len(summary["discovery"]["left_out"]) == 3 and summary["discovery"]["nodes"] == 0, summary["discovery"]
    assert readable(reason) and ("more than max-numeric-label-values=20" in reason or "more than max-label-values=100" in reason), reason


def test_a_server_that_skips_the_description_still_gets_no_statistics_of_a_refused_column(task_identity, adult_nodes):
    """A server that registers a node directly, with a schema whose classes are every age,
    gets an error on registration and on training: the node checks the column on every message."""
    from headway.core.sources import DataSchema

    cfg = adult_cfg(**{"label-column": "age"})
    grid = NodesGrid(cfg, adult_nodes[:1])
    ages = tuple(str(a) for a in range(10, 100))
    schema = DataSchema(
        "table",
        ages,
        (6,),
        tuple((c, 0.0, 1.0) for c in ["capital-gain", "capital-loss", "education-num", "fnlwgt", "hours-per-week", "income"]),
    )
    register = RecordDict(
        {P.CONFIG: ConfigRecord({P.ROUND: 1, P.PHASE: P.PHASE_REGISTER, P.DATA_SCHEMA: schema.to_json(), P.CLIENT_INDEX: 0})}
    )
    reply = grid.send_and_receive([Message(content=register, dst_node_id=201, message_type=MessageType.QUERY)])[0]
    assert reply.has_error() and "label column 'age'" in str(reply.error.reason)
    train = RecordDict({P.CONFIG: ConfigRecord({P.ROUND: 1})})
    reply = grid.send_and_receive([Message(content=train, dst_node_id=201, message_type=MessageType.TRAIN)])[0]
    assert reply.has_error() and "label column 'age'" in str(reply.error.reason)


def test_a_node_that_pins_its_label_column_refuses_another(task_identity, adult_nodes):
    cfg = adult_cfg(**{"label-column": "sex"})  # categorical, 2 values: the rule alone would let it pass
    grid = NodesGrid(cfg, adult_nodes[:1], node_config={"label-column": "income"})
    content = RecordDict({P.CONFIG: ConfigRecord({P.ROUND: 0, P.PHASE: P.PHASE_DESCRIBE})})
    reply = grid.send_and_receive([Message(content=content, dst_node_id=201, message_type=MessageType.QUERY)])[0]
    assert reply.has_error() and readable(str(reply.error.reason))
    assert "pins label-column='income' in its node config and the run asks for 'sex'" in str(reply.error.reason)
    honest = NodesGrid(adult_cfg(), adult_nodes[:1], node_config={"label-column": "income"})  # the pinned column: described
    reply = honest.send_and_receive([Message(content=content, dst_node_id=201, message_type=MessageType.QUERY)])[0]
    assert not reply.has_error() and set(json.loads(str(reply.content.config_records[P.CONFIG][P.DATA_PROFILE]))["classes"]) == {
        "<=50K",
        ">50K",
    }


def _adult_folder(root: Path, rows: list[list[str]]) -> Path:
    root.mkdir(parents=True)
    with open(root / "train.csv", "w", newline="") as dst:
        w = csv.writer(dst)
        w.writerow(ADULT)
        w.writerows(rows)
    return root


def _describe(cfg: dict[str, Any], folder: Path) -> Message:
    """The real ClientApp's answer to a server asking ``folder``'s node to describe its data."""
    content = RecordDict({P.CONFIG: ConfigRecord({P.ROUND: 0, P.PHASE: P.PHASE_DESCRIBE})})
    return NodesGrid(cfg, [folder]).send_and_receive([Message(content=content, dst_node_id=201, message_type=MessageType.QUERY)])[0]


def test_numbers_written_as_people_write_them_are_no_label_column(task_identity, tmp_path):
    """The tester's bypasses, as a server asking for the column: 'age' of 400 real Adult rows with one
    top-coded '90+' (59 distinct ages: before, accepted as text); 'fnlwgt' written '120,000' (rounded to
    ten thousands: fewer distinct than half the rows, the numbers-like rule); 'fnlwgt' with commas at a node
    of 80 rows (79 distinct: before, 64 classes sent). Each node answers with an error, no description;
    its real class columns still describe."""
    src = data_root() / "uci-adult" / "adult.data"
    if not src.is_file():
        missing_data(f"UCI Adult not found at {src}")
    with open(src) as fh:
        rows = [r for r in csv.reader(fh, skipinitialspace=True) if len(r) == len(ADULT)][:400]
    top = [list(r) for r in rows]
    top[0][0] = "90+"
    thousands = [[f"{round(int(c), -4):,}" if j == 2 else c for j, c in enumerate(r)] for r in rows]
    commas = [[f"{int(c):,}" if j == 2 else c for j, c in enumerate(r)] for r in rows[:80]]
    assert len({r[2] for r in thousands}) < 200 and len({r[0] for r in top}) > 20
    cases = [
        ("age", top, "holds 60 distinct numbers"),
        ("fnlwgt", thousands, "distinct numbers (of"),
        ("fnlwgt", commas, "distinct values in 80 rows (more than half the rows"),
    ]
    for i, (column, data, why) in enumerate(cases):
        reply = _describe(adult_cfg(**{"label-column": column}), _adult_folder(tmp_path / f"n{i}", data))
        assert reply.has_error() and not reply.has_content(), column
        reason = str(reply.error.reason)
        assert readable(reason) and f"this node refuses the run's label column: label column '{column}'" in reason and why in reason, reason
    for column in ("income", "education", "race"):  # classes, even in the same altered files
        reply = _describe(adult_cfg(**{"label-column": column}), tmp_path / "n0")
        assert not reply.has_error(), str(reply.error.reason) if reply.has_error() else column


def test_the_label_rule_itself():
    from headway.core.labels import label_problem

    assert label_problem(["<=50K", ">50K"], "income", 100, 20) is None
    assert label_problem([str(d) for d in range(10)], "label", 100, 20) is None  # digits: whole, few
    assert "not whole" in str(label_problem(["1", "2.5"], "x", 100, 20))
    assert "more than max-numeric-label-values=20" in str(label_problem([str(a) for a in range(17, 60)], "age", 100, 20))
    assert "more than max-label-values=100" in str(label_problem([f"id{i}" for i in range(101)], "id", 100, 20))
    assert label_problem([str(a) for a in range(17, 60)], "age", 100, 50) is None  # an operator who means it
    assert "distinct numbers" in str(label_problem([f"${a},000" for a in range(100, 130)] * 3, "pay", 100, 20))  # currency, separators
    assert "not whole" in str(label_problem(["10%", "12.5%"] * 10, "rate", 100, 20))
    assert label_problem(["a", "b", "c"], "tiny", 100, 20) is None  # few classes at a tiny node: not an identifier
    assert "more than half the rows" in str(label_problem([f"user{i}" for i in range(30)], "user", 100, 20))


def test_the_launcher_pins_the_label_column_in_the_node_config(capsys, tmp_path):
    """`headway supernode --data PATH --label-column income` hands Flower a node config holding the pin."""
    from flwr.common.config import parse_config_args

    from headway.deploy import main

    main(["supernode", "--superlink", "srv:9092", "--data", str(tmp_path), "--label-column", "income", "--insecure", "--dry-run"])
    line = capsys.readouterr().out
    config = line.split("--node-config ", 1)[1].split(" --isolation", 1)[0]
    assert parse_config_args([config]) == {"data": str(tmp_path.absolute()), "label-column": "income"}


def test_the_launcher_hands_the_nodes_own_limits_to_flower(capsys, tmp_path):
    """`headway supernode` passes the node's reader and label limits into its node config, where
    core/sources.py and core/labels.py read them (the run config cannot raise them); a bad value exits 2."""
    from flwr.common.config import parse_config_args
    from headway.core.labels import node_limit
    from headway.core.sources import limits_from_node_config

    from headway.deploy import main

    argv = ["supernode", "--superlink", "srv:9092", "--data", str(tmp_path), "--insecure", "--dry-run"]
    main([*argv, "--max-image-pixels", "1000", "--max-array-bytes", "2048", "--follow-symlinks", "--max-label-values", "7"])
    line = capsys.readouterr().out
    config = parse_config_args([line.split("--node-config ", 1)[1].split(" --isolation", 1)[0]])
    limits = limits_from_node_config(config)
    assert (limits.max_image_pixels, limits.max_array_bytes, limits.follow_symlinks) == (1000, 2048, True)
    assert node_limit(config, "max-label-values", 100) == 7 and "max-numeric-label-values" not in config
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--max-array-bytes", "0"])
    assert exc.value.code == 2


def _profiles(folders: list[Path]) -> list[dict]:
    """The real descriptions the nodes' readers make of their folders (what the ClientApp sends)."""
    from headway.core.sources import options_from_config, profile, read_source

    opts = options_from_config({"label-column": "income"})
    return [profile(read_source(f, opts), opts) for f in folders]


def _merge(profiles: list[dict]) -> tuple[Any, dict[int, str]]:
    from headway.core.node_merge import merge_robustly
    from headway.core.sources import options_from_config

    return merge_robustly(dict(enumerate(profiles)), options_from_config({"label-column": "income"}), 1_000_000)


def _constant(profile: dict, column: str) -> dict:
    spec = profile["columns"][column]
    spec["sum"], spec["sumsq"] = 0.0, 0.0  # every value 0, as capital-loss is at many real Adult sites
    return profile


def test_nodes_constant_in_a_column_do_not_leave_out_an_honest_node_whose_values_vary(adult_nodes):
    """Two sites whose capital-loss is all 0 (true of most small Adult samples) and one whose isn't: the
    median second moment is 0, and the scale must come from the site that varies, not leave it out (the
    outside probe's finding; a liar copying a constant site's description did the same)."""
    a, b, c = _profiles(adult_nodes)
    liar = _constant(copy_of(a), "capital-loss")  # a liar that copies a constant site's description
    schema, out = _merge([_constant(a, "capital-loss"), b, liar])
    assert out == {} and schema is not None, out
    spec = b["columns"]["capital-loss"]
    second = spec["sumsq"] / spec["n"]  # about the centre 0, the median of the means
    assert dict((n, s) for n, _, s in schema.numeric)["capital-loss"] == pytest.approx(second**0.5, rel=1e-6)
    schema, out = _merge([a, b, _constant(c, "capital-loss")])
    assert out == {}, out  # three honest sites, two of them constant: nobody is left out


def copy_of(profile: dict) -> dict:
    return json.loads(json.dumps(profile))


def test_a_column_too_few_nodes_hold_is_unused_so_a_liar_cannot_set_it(adult_nodes):
    """One honest site has hours-per-week all missing; the liar's hours are 1e14. A median of the two
    that hold values would be the liar's to set (the honest site's hours encoded to one constant):
    the column is unused instead, and the lying description shapes nothing an honest one would not."""
    from headway.core.sources import encode, options_from_config, read_source

    a, b, c = _profiles(adult_nodes)
    a["columns"]["hours-per-week"].update(n=0, sum=0.0, sumsq=0.0)
    liar = copy_of(c)
    hours = liar["columns"]["hours-per-week"]
    hours["sum"], hours["sumsq"] = 1e14 * hours["n"], 1e28 * hours["n"]
    lied, out = _merge([a, b, liar])
    honest, _ = _merge([a, b, c])
    assert lied == honest and dict((n, s) for n, _, s in lied.numeric)["hours-per-week"] == 0.0, out
    opts = options_from_config({"label-column": "income"})
    x = encode(read_source(adult_nodes[1], opts), lied, opts, "node-1").x_train
    assert not x[:, [n for n, _, _ in lied.numeric].index("hours-per-week")].any()  # unused: 0 for every row
    assert x[:, [n for n, _, _ in lied.numeric].index("age")].std() > 0.5  # the other columns as ever


def test_a_nodes_lone_levels_are_capped_over_all_its_columns(adult_nodes):
    """A liar adding 64 invented values (the per-node cap) to every categorical column widened the input
    from 91 to 532: the cap holds over all of a node's columns together, so none of them enter."""
    from headway.core.node_merge import MAX_NEW_NAMES

    a, b, c = _profiles(adult_nodes)
    honest, _ = _merge([a, b, c])
    for spec in c["columns"].values():
        if spec["type"] == "categorical":
            spec["levels"] = sorted([*spec["levels"], *(f"made-up-{i}" for i in range(MAX_NEW_NAMES))])
    lied, _ = _merge([a, b, c])
    levels = {col: set(values) for col, values in lied.categorical}
    assert not any(v.startswith("made-up-") for values in levels.values() for v in values)
    assert all(levels[col] <= set(values) for col, values in honest.categorical)  # over its budget: none of its lone values
    assert lied.input_shape[0] <= honest.input_shape[0] < 91


def test_a_malformed_description_is_left_out_under_its_own_node_id(task_identity, tmp_path, adult_nodes):
    """A node whose description sums overflow (1e200, inf) is left out by the server with a reason that names
    that node and what is wrong, not "node data profile 0", a position in the server's merge."""

    def overflowing(profile: dict) -> dict:
        profile["columns"]["fnlwgt"].update(sum=1e200, sumsq=float("inf"))
        return profile

    cfg = adult_cfg()
    summary, rounds = run(tmp_path, cfg, NodesGrid(cfg, adult_nodes, lies={2: overflowing}), "malformed")
    assert summary["status"] == "complete" and rounds[-1]["clients"] == 2, summary.get("reason")
    (reason,) = summary["discovery"]["left_out"]
    assert reason.startswith("node 203:") and "malformed" in reason and "fnlwgt" in reason and "profile 0" not in reason, reason
