"""The snapshot `dflash status` keeps of what it read from a store, for when the store is too slow to answer."""

from __future__ import annotations

from dagster_project.ops.status_snapshot import StoreSnapshot, load_snapshot, save_snapshot
from tests.unit.ops.test_shard_states import GX, completions, exported, passed, readings, store_of, training

STORE = "s3://bucket/runs/r1"


def test_a_snapshot_reads_back_equal_its_shard_keyed_records_included(tmp_path):
    """Published manifests, verdicts and exports are keyed by shard number: JSON keys are strings, read back as ints."""
    c, t = completions(0), training(0)
    records = store_of({0: (c, [GX(c)], t, passed(t), exported(t)), 1: (completions(1), [], None, [], None)})
    snapshot = StoreSnapshot(STORE, readings(2, **records), first="materialize conversations first")
    assert save_snapshot(tmp_path, snapshot) is None
    assert load_snapshot(tmp_path, STORE) == snapshot
    assert load_snapshot(tmp_path, "s3://bucket/runs/other") is None  # a snapshot answers only for its own store


def test_a_snapshot_that_cannot_be_read_is_none_and_one_that_cannot_be_kept_is_a_note(tmp_path):
    snapshot = StoreSnapshot(STORE, readings(1, **store_of({})))
    assert save_snapshot(tmp_path, snapshot) is None
    (kept,) = (tmp_path / "status").glob("*.json")
    kept.write_bytes(b'{"store": "s3://bucket/runs/r1", "readings": ')  # cut short
    assert load_snapshot(tmp_path, STORE) is None
    blocked = tmp_path / "file"
    blocked.write_text("")  # the work directory is a file: nothing can be written under it
    note = save_snapshot(blocked, snapshot)
    assert note and note.startswith("status snapshot not kept: ") and str(blocked) in note
