"""A client's local state on the node's disk: exact round trip, versions by message position
(restored strictly before the message answered), pruning, a corrupt version falling back to
the one before, the lineage key redirecting the store, secrets never written."""

import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from headway.client.secure_aggregation import SESSION
from headway.client.state_store import (
    LINEAGE_RECORD,
    STORE_RECORD,
    is_fresh,
    lineage_key,
    load_state,
    position,
    restore_state,
    save_state,
    save_version,
    state_folder,
    state_root,
    version_path,
    versions,
)
from headway.core import protocol as P

KEY = "0123456789abcdef0123456789abcdef"  # a run key as a server draws it


def _tagged(tag: str) -> RecordDict:
    return RecordDict({"meta": ConfigRecord({"tag": tag})})


def _restored_tag(folder, before) -> str | None:
    state = RecordDict()
    return str(state["meta"]["tag"]) if restore_state(state, folder, before) else None


def test_state_round_trips_exactly_and_restores_only_a_fresh_state(tmp_path):
    assert state_root({"partition-id": 0}) is None  # no state-dir: nothing on disk
    assert state_root({"partition-id": 0}, tmp_path / "sim") == tmp_path / "sim"  # simulation: the runner's folder
    assert state_root({"state-dir": str(tmp_path)}, tmp_path / "sim") == tmp_path  # a node's own state-dir wins
    folder = tmp_path / f"run-{KEY}" / "partition-3"
    assert state_folder(tmp_path, KEY, 3) == folder and state_folder(None, KEY, 3) is None and state_folder(tmp_path, None, 3) is None
    body = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    state = RecordDict({"body": ArrayRecord({"w": Array(body)}), "meta": ConfigRecord({"round": 4}), "m": MetricRecord({"loss": 0.5})})
    path = save_version(state, folder, position(4, "train"))
    assert path == folder / "round-000004-train.state"
    assert not list(folder.glob("*.tmp"))  # written atomically, no leftovers
    fresh = RecordDict()
    assert restore_state(fresh, folder, position(4, "evaluate"))
    np.testing.assert_array_equal(fresh.array_records["body"]["w"].numpy(), body)
    assert fresh["meta"]["round"] == 4 and fresh[STORE_RECORD]["restores"] == 1
    save_version(fresh, folder, position(4, "evaluate"))
    again = RecordDict()
    assert restore_state(again, folder, position(5, "train")) and again[STORE_RECORD]["restores"] == 2
    assert not restore_state(again, folder, position(5, "train"))  # a live state is never overwritten from disk
    assert not restore_state(RecordDict(), tmp_path / "missing", position(5, "train"))
    save_version(RecordDict(), tmp_path / "empty", position(1, "train"))
    assert not restore_state(RecordDict(), tmp_path / "empty", position(2, "train"))  # nothing saved is no restore
    assert set(load_state(folder / "round-000004-evaluate.state")) == {"body", "meta", "m", STORE_RECORD}


def test_an_unchanged_state_is_not_written_again_and_a_changed_one_replaces_its_position(tmp_path):
    folder = tmp_path / "run-1" / "partition-0"
    save_version(_tagged("1-train"), folder, position(1, "train"))
    save_version(_tagged("1-train"), folder, position(1, "evaluate"))  # an evaluation that changed nothing
    assert [p.name for _, p in versions(folder)] == ["round-000001-train.state"]
    assert _restored_tag(folder, position(2, "train")) == "1-train"
    save_version(_tagged("2-stage-a"), folder, position(2, "train"))
    save_version(_tagged("1-train"), folder, position(2, "train"))  # a later stage of round 2 went back to round 1's state
    assert _restored_tag(folder, position(2, "evaluate")) == "1-train"  # never the stale "2-stage-a"
    save_version(_tagged("2-train"), folder, position(2, "train"))
    assert _restored_tag(folder, position(3, "train")) == "2-train"


def test_a_message_restores_the_newest_version_strictly_before_its_position(tmp_path):
    folder = tmp_path / "run-1" / "partition-0"
    for r in (1, 2):
        for kind in ("train", "evaluate"):
            save_version(_tagged(f"{r}-{kind}"), folder, position(r, kind))
    assert position(2, "query") < position(2, "train") < position(2, "evaluate") < position(3, "query")
    assert _restored_tag(folder, position(3, "train")) == "2-evaluate"
    assert _restored_tag(folder, position(2, "evaluate")) == "2-train"  # an evaluate of round r restores the train of r
    assert _restored_tag(folder, position(2, "train")) == "1-evaluate"  # never what round 2 itself wrote
    assert _restored_tag(folder, position(2, "query")) == "1-evaluate"  # a resumed server's registration in round 2
    assert _restored_tag(folder, position(1, "train")) is None  # nothing before round 1's training: the seed


def test_versions_are_pruned_replaced_at_one_position_and_a_rewrite_drops_the_abandoned_future(tmp_path):
    folder = tmp_path / "f"
    for r in range(1, 6):
        save_version(_tagged(f"{r}"), folder, position(r, "train"))
    assert [at for at, _ in versions(folder)] == [position(r, "train") for r in (2, 3, 4, 5)]  # the newest four
    save_version(_tagged("5-again"), folder, position(5, "train"))  # a later stage of the same round replaces it
    assert len(versions(folder)) == 4 and _restored_tag(folder, position(5, "evaluate")) == "5-again"
    # a resumed run answering round 4 again: what the killed run wrote after it is another timeline
    save_version(_tagged("4-resumed"), folder, position(4, "train"))
    assert [at for at, _ in versions(folder)] == [position(r, "train") for r in (2, 3, 4)]
    assert _restored_tag(folder, position(9, "train")) == "4-resumed"
    # a killed round that wrote all three of its positions still leaves the round before it to resume from
    for kind in ("query", "train", "evaluate"):
        save_version(_tagged(f"5-{kind}"), folder, position(5, kind))
    assert _restored_tag(folder, position(5, "query")) == "4-resumed"
    save_version(_tagged("x"), tmp_path / "one", position(1, "train"), keep=1)
    save_version(_tagged("y"), tmp_path / "one", position(2, "train"), keep=1)
    assert [p.name for _, p in versions(tmp_path / "one")] == ["round-000002-train.state"]


def test_a_corrupt_newest_version_is_set_aside_and_the_one_before_is_restored(tmp_path, caplog):
    folder = tmp_path / "run-1" / "partition-0"
    save_version(_tagged("1"), folder, position(1, "train"))
    newest = save_version(_tagged("2"), folder, position(2, "train"))
    newest.write_bytes(newest.read_bytes()[:7])  # truncated
    with caplog.at_level(logging.ERROR, logger="headway"):
        assert _restored_tag(folder, position(3, "train")) == "1"
    assert [r.levelno for r in caplog.records if "unreadable" in r.getMessage()] == [logging.ERROR]  # one line
    assert not newest.exists() and newest.with_name(newest.name + ".corrupt").exists()
    assert [at for at, _ in versions(folder)] == [position(1, "train")]  # the set-aside file is no version
    version_path(folder, position(1, "train")).write_bytes(b"\xff" * 9)
    assert _restored_tag(folder, position(3, "train")) is None  # none readable: the seed


def test_the_run_key_files_the_store_and_a_pointer_finds_it_after_a_restart(tmp_path):
    state = RecordDict()
    assert lineage_key(state, tmp_path, 42) is None and len(state) == 0  # before the registration: nothing on disk, never the run id
    assert lineage_key(state, tmp_path, 43, KEY) == KEY  # the server's registration names the run's key
    assert state[LINEAGE_RECORD][P.LINEAGE] == KEY and is_fresh(state)  # kept, and the state still takes a restore
    assert lineage_key(state, tmp_path, 43) == KEY  # later messages of the run
    assert (tmp_path / "run-43.lineage").read_text() == KEY
    assert lineage_key(RecordDict(), tmp_path, 43) == KEY  # a node restarted within the run
    assert lineage_key(RecordDict(), None, 43) is None
    save_version(_tagged("first run"), tmp_path / f"run-{KEY}" / "partition-0", position(3, "evaluate"))
    assert restore_state(state, tmp_path / f"run-{lineage_key(state, tmp_path, 43)}" / "partition-0", position(4, "query"))
    assert state["meta"]["tag"] == "first run" and state[LINEAGE_RECORD][P.LINEAGE] == KEY
    # a run id anyone can list, a name that would collide with a pointer file, anything but 32 lowercase hex digits
    for bad in ("42", "43.lineage", KEY.upper(), "x" * 32, KEY + "0", "../x", "", "a/b", 7):
        with pytest.raises(ValueError, match="is not a run key"):
            lineage_key(RecordDict(), tmp_path, 43, bad)


def test_a_secure_aggregation_session_is_never_written(tmp_path):
    state = RecordDict({SESSION: ConfigRecord({"secret": b"\x01" * 32}), "meta": ConfigRecord({"tag": "kept"})})
    path = save_version(state, tmp_path / "f", position(1, "train"))
    assert set(load_state(path)) == {"meta"} and SESSION in state  # the live state keeps it, the disk never
    save_state(state, tmp_path / "plain.state")
    assert SESSION not in load_state(tmp_path / "plain.state")
