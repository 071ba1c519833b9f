import dataclasses
import hashlib
import os
import tempfile
from pathlib import Path

import orjson
import pytest

from dagster_project.conversations.shards import ConversationsManifest, PolicyCounts, SourceTotals
from dagster_project.store.dataclass_json import from_json, to_json
from dagster_project.store.manifest import (
    ShardManifest,
    StoredObject,
    ids_digest,
    publish_shard,
    read_shard_manifest,
    verify_shard,
)
from dagster_project.store.storage import LocalStore, StoreError, open_store
from dagster_project.store.transfer import local_copy, put_file_moving


# The same tests run on S3 (the moto server) in tests/integration/test_store_s3.py.
@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "store")


def test_round_trip_list_and_delete(store, tmp_path):
    info = store.put_bytes("a/b/one.txt", b"hello")
    assert (info.size, info.sha256) == (5, "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824")
    source = tmp_path / "two.bin"
    source.write_bytes(b"x" * 3000)
    assert store.put_file("a/two.bin", source).size == 3000
    assert store.get_bytes("a/b/one.txt") == b"hello"
    assert [o.key for o in store.list("a/")] == ["a/b/one.txt", "a/two.bin"]
    assert store.exists("a/two.bin") and not store.exists("a/missing")
    assert store.head("a/missing") is None
    with local_copy(store, "a/two.bin") as path:
        assert path.read_bytes() == b"x" * 3000
    store.delete("a/two.bin")
    assert not store.exists("a/two.bin")
    with pytest.raises(StoreError):
        store.get_bytes("a/two.bin")


def test_publishing_replaces_a_shard_and_verifies_it(store, tmp_path):
    old = tmp_path / "old.parquet"
    old.write_bytes(b"old data")
    publish_shard(store, ShardManifest(stage="completions", shard=3, rows=1), [("part-0.parquet", old)])
    new = tmp_path / "new.parquet"
    new.write_bytes(b"new data!")
    manifest = publish_shard(store, ShardManifest(stage="completions", shard=3, rows=2), [("part-1.parquet", new)])
    assert read_shard_manifest(store, "completions", 3, ShardManifest) == manifest
    # objects of the earlier publication that the new manifest does not list are gone
    assert sorted(o.key for o in store.list("completions/shard=00003/")) == [
        "completions/shard=00003/_manifest.json",
        "completions/shard=00003/part-1.parquet",
    ]
    assert verify_shard(store, manifest) == []
    store.put_bytes("completions/shard=00003/part-1.parquet", b"tampered")
    assert verify_shard(store, manifest) == [
        "completions/shard=00003/part-1.parquet: 8 bytes in the store, manifest says 9"
    ]


def test_unsupported_uris_are_refused():
    with pytest.raises(ValueError, match="unsupported"):
        open_store("gs://bucket/x")
    with pytest.raises(ValueError, match="no S3 client"):
        open_store("s3://bucket/x")


def test_verification_reports_an_object_of_the_right_size_with_other_bytes(store, tmp_path):
    data = tmp_path / "part-0.parquet"
    data.write_bytes(b"the bytes that were published")
    manifest = publish_shard(store, ShardManifest(stage="completions", shard=1, rows=1), [("part-0.parquet", data)])
    store.put_bytes("completions/shard=00001/part-0.parquet", b"the bytes that were overwritten"[:29])
    assert store.head("completions/shard=00001/part-0.parquet").size == manifest.objects[0].size
    assert verify_shard(store, manifest) == [
        "completions/shard=00001/part-0.parquet: checksum differs from the manifest"
    ]


def test_a_store_root_that_is_a_file_fails_the_step_naming_the_setting(tmp_path):
    """What every asset's step does first (`store.open()`): a Dagster failure naming DFLASH_STORE, not a
    NotADirectoryError from deep in the stage."""
    import dagster as dg
    from dagster_aws.s3 import S3Resource

    from dagster_project.resources import DatasetStore

    root = tmp_path / "store"
    root.write_text("a file where the store should be")
    resource = DatasetStore(root=str(root), work_dir=str(tmp_path / "work"), s3=S3Resource())
    with pytest.raises(dg.Failure, match=r"root \(DFLASH_STORE\): the store root .* is not a directory"):
        resource.open()


def test_a_file_given_up_is_moved_into_a_local_store_or_copied_from_another_file_system(store, tmp_path):
    moved = tmp_path / "moved.jsonl"
    moved.write_bytes(b"line\n" * 100)
    inode = moved.stat().st_ino
    info = put_file_moving(store, "conversations/shard=00001/conversations.jsonl", moved, synced=False)
    target = store.root / "conversations/shard=00001/conversations.jsonl"
    assert not moved.exists() and target.stat().st_ino == inode  # renamed, not copied
    assert (info.size, info.sha256) == (500, hashlib.sha256(b"line\n" * 100).hexdigest())
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    with tempfile.TemporaryDirectory(dir="/dev/shm") as other:  # tmpfs: another file system than tmp_path's
        copied = Path(other) / "copied.jsonl"
        copied.write_bytes(b"other\n")
        info = put_file_moving(store, "conversations/shard=00002/conversations.jsonl", copied)
        assert not copied.exists() and store.get_bytes(info.key) == b"other\n"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_records_are_written_as_the_json_of_asdict_and_read_back_equal():
    """A record is written by orjson from the dataclass itself: the same JSON as `asdict`, nested ones included."""
    manifest = ConversationsManifest(
        num_shards=2,
        policy="all_turns",
        build_id="b",
        input_rows=3,
        rows=2,
        normalized=2,
        quarantined=1,
        quarantine_rate=1 / 3,
        quarantined_by_reason={"duplicate": 1},
        by_source={"chat": SourceTotals(3, 2, 1, {"duplicate": 1})},
        history="generated",
        multi_turn=1,
        turns=3,
        by_policy={"all_turns": PolicyCounts(2, 1, 3)},
        ids_digest="d",
        quarantine_rate_max=0.1,
        max_prompt_tokens=16384,
        quarantine_object=StoredObject("conversations/quarantine.jsonl.zst", 10, "s", None),
        superseded={"completions": 2},
    )
    written = to_json(manifest)
    assert written == orjson.dumps(dataclasses.asdict(manifest), option=orjson.OPT_INDENT_2)
    assert from_json(ConversationsManifest, written) == manifest


def test_the_ids_digest_is_that_of_the_sorted_ids_each_on_its_line():
    """Manifests of earlier builds hold it: the same ids must keep giving the same digest, in any order."""
    assert ids_digest(["b", "a\nz", "é"]) == hashlib.sha256("a\nz\nb\né\n".encode()).hexdigest()
    assert ids_digest([]) == hashlib.sha256(b"").hexdigest()
    assert ids_digest(["x", "y"]) == ids_digest(iter(["y", "x"]))
