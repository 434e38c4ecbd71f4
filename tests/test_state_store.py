"""A client's local state on the node's disk: exact round trip, restored only into an
empty state, restores counted, nothing kept without a state-dir."""

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from client.state_store import STORE_RECORD, load_state, restore_state, save_state, state_path


def test_state_round_trips_exactly_and_restores_only_an_empty_state(tmp_path):
    assert state_path({"partition-id": 0}, 7, 0) is None  # no state-dir: nothing on disk
    path = state_path({"state-dir": str(tmp_path)}, 7, 3)
    assert path is not None and path == tmp_path / "run-7" / "partition-3.state"
    body = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    state = RecordDict({"body": ArrayRecord({"w": Array(body)}), "meta": ConfigRecord({"round": 4}), "m": MetricRecord({"loss": 0.5})})
    save_state(state, path)
    assert not list(path.parent.glob("*.tmp"))  # written atomically, no leftovers
    fresh = RecordDict()
    assert restore_state(fresh, path)
    np.testing.assert_array_equal(fresh.array_records["body"]["w"].numpy(), body)
    assert fresh["meta"]["round"] == 4 and fresh[STORE_RECORD]["restores"] == 1
    save_state(fresh, path)
    again = RecordDict()
    assert restore_state(again, path) and again[STORE_RECORD]["restores"] == 2
    assert not restore_state(again, path)  # a live state is never overwritten from disk
    assert not restore_state(RecordDict(), tmp_path / "missing.state")
    save_state(RecordDict(), tmp_path / "empty.state")
    assert not restore_state(RecordDict(), tmp_path / "empty.state")  # nothing saved is no restore
    assert set(load_state(path)) == {"body", "meta", "m", STORE_RECORD}


def test_an_unreadable_state_file_is_set_aside_and_the_client_starts_from_the_seed(tmp_path):
    path = tmp_path / "run-1" / "partition-0.state"
    save_state(RecordDict({"m": MetricRecord({"x": 1.0})}), path)
    path.write_bytes(path.read_bytes()[:7])  # truncated
    state = RecordDict()
    assert not restore_state(state, path) and len(state) == 0
    assert not path.exists() and (path.parent / "partition-0.state.corrupt").exists()
