"""Client state versions through the real ClientApp call path (build_client_app with a state
folder, Flower Messages and Contexts): an LG-FedAvg client whose run is resumed in round 2
restores its round-1 state and sends the very reply the killed run sent in round 2."""

from __future__ import annotations

import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.common.serde import recorddict_to_proto
from headway.client.app import build_client_app
from headway.client.env import client_env
from headway.client.state_store import STORE_RECORD, versions
from headway.core import protocol as P
from headway.core.config import resolve
from headway.core.layers import select, top_layers

NODE = {"partition-id": 0, "num-partitions": 2}


@pytest.fixture
def lg(data_dir, tmp_path, task_identity):
    """An LG-FedAvg ClientApp keeping its state under a simulation state folder, and the run's global head."""
    overrides = resolve(
        {
            "algorithm": "lg-fedavg",
            "dataset": "mnist",
            "num-clients": 2,
            "train-fraction": 0.01,
            "local-epochs": 1,
            "batch-size": 10,
            "data-dir": data_dir,
            "lg-warmup-rounds": 0,
        }
    )
    model = client_env(overrides, NODE).build_model()
    head = select(model.state_dict(), top_layers(model, int(overrides["lg-global-layers"])))
    return build_client_app(overrides, state_dir=tmp_path / "client-state"), head, tmp_path / "client-state"


def _message(kind: str, server_round: int, arrays: dict | None = None, fields: dict[str, str] | None = None) -> Message:
    content = RecordDict({P.CONFIG: ConfigRecord({P.ROUND: server_round, **(fields or {})})})
    if arrays is not None:
        content[P.ARRAYS] = ArrayRecord({k: Array(v.detach().cpu().numpy()) for k, v in arrays.items()})
    types = {"train": MessageType.TRAIN, "evaluate": MessageType.EVALUATE, "query": MessageType.QUERY}
    return Message(content=content, dst_node_id=101, message_type=types[kind], group_id=str(server_round))


def _context(run_id: int) -> Context:
    return Context(run_id=run_id, node_id=101, node_config=dict(NODE), state=RecordDict(), run_config={})


def _wire(reply: Message) -> bytes:
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    return recorddict_to_proto(reply.content).SerializeToString()


KEY = "5f0c1e2d3a4b5c6d7e8f90a1b2c3d4e5"  # the run's key, as its server draws it


def _register(app, server_round: int, context: Context, key: str = KEY) -> None:
    """The server's registration query naming the run's key (every run's first message to a node)."""
    assert not app(_message("query", server_round, None, {P.PHASE: P.PHASE_REGISTER, P.LINEAGE: key}), context).has_error()


def test_a_resumed_lg_fedavg_client_repeats_round_2_from_its_round_1_state(lg):
    app, head, root = lg
    first = _context(run_id=11)
    _register(app, 1, first)
    _wire(app(_message("train", 1, head, {P.PHASE: P.PHASE_TRAIN}), first))
    round_2 = _message("train", 2, head, {P.PHASE: P.PHASE_TRAIN})
    killed = _wire(app(round_2, first))
    scores = _wire(app(_message("evaluate", 2, head, {P.PHASE: P.PHASE_EVALUATE}), first))
    folder = root / f"run-{KEY}" / "partition-0"
    # the evaluation left the state as round 2's training did: no second copy of it
    assert [p.name for _, p in versions(folder)] == ["round-000001-train.state", "round-000002-train.state"]

    # the resumed run (another Flower run id) registers the node again in round 2, naming the first run
    resumed = _context(run_id=12)
    registration = app(_message("query", 2, None, {P.PHASE: P.PHASE_REGISTER, P.LINEAGE: KEY}), resumed)
    assert not registration.has_error() and resumed.state[STORE_RECORD]["restores"] == 1
    assert _wire(app(_message("train", 2, head, {P.PHASE: P.PHASE_TRAIN}), resumed)) == killed  # round 1's state, not round 2's
    assert _wire(app(_message("evaluate", 2, head, {P.PHASE: P.PHASE_EVALUATE}), resumed)) == scores
    assert not (root / "run-12").exists() and (root / "run-12.lineage").read_text() == KEY
    # its SuperNode restarts within the resumed run and is sent round 2's training first: the pointer names the lineage
    assert _wire(app(_message("train", 2, head, {P.PHASE: P.PHASE_TRAIN}), _context(run_id=12))) == killed

    # without the lineage key the new run starts from the seed: the reply differs
    assert _wire(app(_message("train", 2, head, {P.PHASE: P.PHASE_TRAIN}), _context(run_id=13))) != killed


def test_another_run_naming_a_runs_public_id_finds_none_of_its_state_and_leaves_it_whole(lg):
    """A run's server files its nodes' state under a random token it sends at registration; another run that names
    the first run's id (which anyone listing runs sees) as lineage gets a fresh client, and cannot overwrite that state."""
    app, head, root = lg
    token = KEY
    first = _context(run_id=41)
    assert not app(_message("query", 1, None, {P.PHASE: P.PHASE_REGISTER, P.LINEAGE: token}), first).has_error()
    _wire(app(_message("train", 1, head, {P.PHASE: P.PHASE_TRAIN}), first))
    _wire(app(_message("train", 2, head, {P.PHASE: P.PHASE_TRAIN}), first))
    scores = _wire(app(_message("evaluate", 2, head, {P.PHASE: P.PHASE_EVALUATE}), first))
    kept = [p.read_bytes() for _, p in versions(root / f"run-{token}" / "partition-0")]
    assert len(kept) == 2 and not (root / "run-41").exists()

    other = _context(run_id=77)
    refused = app(_message("query", 3, None, {P.PHASE: P.PHASE_REGISTER, P.LINEAGE: "41"}), other)
    assert refused.has_error() and "is not a run key" in str(refused.error.reason)  # a run id is never a key
    assert STORE_RECORD not in other.state  # nothing restored
    assert _wire(app(_message("evaluate", 3, head, {P.PHASE: P.PHASE_EVALUATE}), other)) != scores
    _wire(app(_message("train", 3, head, {P.PHASE: P.PHASE_TRAIN}), other))
    assert [p.read_bytes() for _, p in versions(root / f"run-{token}" / "partition-0")] == kept

    resumed = _context(run_id=78)  # the first run's own server, resumed: its token finds the state
    assert not app(_message("query", 3, None, {P.PHASE: P.PHASE_REGISTER, P.LINEAGE: token}), resumed).has_error()
    assert resumed.state[STORE_RECORD]["restores"] == 1
    assert _wire(app(_message("evaluate", 2, head, {P.PHASE: P.PHASE_EVALUATE}), _context(run_id=41))) == scores


def test_an_evaluate_of_a_resumed_round_uses_that_rounds_training(lg):
    app, head, _ = lg
    first = _context(run_id=21)
    _register(app, 1, first)
    _wire(app(_message("train", 1, head, {P.PHASE: P.PHASE_TRAIN}), first))
    scores = _wire(app(_message("evaluate", 1, head, {P.PHASE: P.PHASE_EVALUATE}), first))
    restarted = _context(run_id=21)  # a SuperNode restarted in the same run: same run id, empty state
    assert _wire(app(_message("evaluate", 1, head, {P.PHASE: P.PHASE_EVALUATE}), restarted)) == scores
    assert restarted.state[STORE_RECORD]["restores"] == 1


def test_a_bad_lineage_key_is_refused_with_one_line(lg):
    app, _, root = lg
    reply = app(_message("query", 2, None, {P.PHASE: P.PHASE_REGISTER, P.LINEAGE: "../../etc"}), _context(run_id=31))
    assert reply.has_error() and reply.error.code == P.ERROR_BAD_INPUT and "is not a run key" in str(reply.error.reason)
    assert not root.exists()


def test_a_restarted_node_with_its_own_data_picks_up_its_registration_and_body_and_repeats_its_reply(task_identity, tmp_path):
    """dataset=local through a real server run (two FedLog rounds on UCI Adult rows): a node restarted in
    the same run, sent round 2's training again, restores its registration (schema, client index) and
    body from the version before round 2, and answers byte for byte as it did."""
    import csv

    from headway.client.app import JOINED
    from headway.core.data import ADULT_COLUMNS

    from tests.conftest import data_root, missing_data
    from tests.test_node_merge_attacks import NodesGrid, adult_cfg, run

    src = data_root() / "uci-adult" / "adult.data"
    if not src.is_file():
        missing_data(f"UCI Adult not found at {src}")
    with open(src) as fh:
        rows = [r for r in csv.reader(fh, skipinitialspace=True) if len(r) == len(ADULT_COLUMNS)]
    folders = []
    for i in range(3):
        folder = tmp_path / f"node{i}"
        folder.mkdir()
        with open(folder / "train.csv", "w", newline="") as dst:
            csv.writer(dst).writerows([list(ADULT_COLUMNS), *rows[i * 300 : (i + 1) * 300]])
        folders.append(folder)
    cfg = adult_cfg(**{"num-server-rounds": 2})
    grid = NodesGrid(cfg, folders)
    for n, context in grid.contexts.items():  # a state folder per node, as each SuperNode has its own
        context.node_config["state-dir"] = str(tmp_path / f"state-{n}")
    summary, _ = run(tmp_path, cfg, grid, "run")
    assert summary["status"] == "complete", summary
    sent = [(i, m) for i, m in enumerate(grid.sent) if m.metadata.dst_node_id == 201 and m.metadata.message_type == MessageType.TRAIN]
    at, last_train = sent[-1]
    assert P.as_int(last_train.content[P.CONFIG][P.ROUND]) == 2
    restarted = Context(run_id=1, node_id=201, node_config=dict(grid.contexts[201].node_config), state=RecordDict(), run_config={})
    reply = grid.app(last_train, restarted)
    assert JOINED in restarted.state and restarted.state[STORE_RECORD]["restores"] == 1
    assert _wire(reply) == _wire(grid.replies[at])


def test_an_error_reply_never_carries_the_run_key(lg):
    """A state file's path names the run key, and the server records error reasons in rounds.jsonl: the key is cut out."""
    app, head, root = lg
    first = _context(run_id=51)
    _register(app, 1, first)
    (root / f"run-{KEY}" / "partition-0").mkdir(parents=True, exist_ok=True)
    (root / f"run-{KEY}" / "partition-0" / "round-000001-train.state").mkdir()  # a folder where the state file goes
    reply = app(_message("train", 1, head, {P.PHASE: P.PHASE_TRAIN}), first)
    assert reply.has_error() and "<run key>" in str(reply.error.reason) and KEY not in str(reply.error.reason)
