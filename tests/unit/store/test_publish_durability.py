"""Publishing many shards makes them durable once per phase (files, then manifests), not once per object."""

from __future__ import annotations

import os

from dagster_project.store.layout import MANIFEST_NAME
from dagster_project.store.manifest import (
    ShardManifest,
    publish_shards_together,
    read_published_manifests,
    read_shard_manifest,
    verify_shard,
)
from dagster_project.store.storage import LocalStore

SHARDS = 8


class SyncRecordingStore(LocalStore):
    """A local store that notes, at each `sync`, which objects exist (the real sync still runs)."""

    def __init__(self, root):
        super().__init__(root)
        self.at_sync: list[set[str]] = []

    def sync(self) -> None:
        self.at_sync.append({info.key for info in self.list("stage/")})
        super().sync()


def _shards(tmp_path):
    shards = []
    for shard in range(SHARDS):
        path = tmp_path / f"data-{shard}.jsonl"
        path.write_bytes(b'{"id": "%d"}\n' % shard)
        shards.append((ShardManifest(stage="stage", shard=shard, rows=1), [("data.jsonl", path)]))
    return shards


def test_every_file_is_synced_before_any_manifest_is_written_and_every_manifest_before_the_index(tmp_path):
    store = SyncRecordingStore(tmp_path / "store")
    published = publish_shards_together(store, _shards(tmp_path))
    data_keys = {f"stage/shard={shard:05d}/data.jsonl" for shard in range(SHARDS)}
    manifest_keys = {f"stage/shard={shard:05d}/{MANIFEST_NAME}" for shard in range(SHARDS)}
    assert store.at_sync == [data_keys, data_keys | manifest_keys]
    for manifest in published:
        assert read_shard_manifest(store, "stage", manifest.shard, ShardManifest) == manifest
        assert verify_shard(store, manifest) == []


def test_no_published_object_is_fsynced_on_its_own(tmp_path, monkeypatch):
    store = LocalStore(tmp_path / "store")
    shards = _shards(tmp_path)
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: fsyncs.append(fd) or real_fsync(fd))
    publish_shards_together(store, shards)
    # Only the object index's block is written synced (once to forget the old manifests, once to record the new).
    assert len(fsyncs) <= 2 < 2 * SHARDS


class ReadDuringPut(LocalStore):
    """A local store whose object PUTs under `stage/` stall long enough for a reader to look (what a slow S3 PUT
    gives every reader): each records what a reader sees of shard 0 then, by its manifest and by the index."""

    def __init__(self, root):
        super().__init__(root)
        self.seen: list[tuple[ShardManifest | None, list[str], ShardManifest | None]] = []

    def put_file(self, key, path, *, synced=True):
        manifest = read_shard_manifest(self, "stage", 0, ShardManifest)
        indexed = read_published_manifests(self, "stage", ShardManifest).get(0)
        self.seen.append((manifest, verify_shard(self, manifest) if manifest else [], indexed))
        return super().put_file(key, path, synced=synced)


def test_a_republish_never_hides_the_published_shard_and_leaves_only_its_own_objects(tmp_path):
    store = ReadDuringPut(tmp_path / "store")
    first = publish_shards_together(store, _shards(tmp_path)[:1])[0]
    assert first.data_keys == ["stage/shard=00000/data.jsonl"]
    for publication in range(2):  # the replacement takes the other name each time, never the published one's
        store.seen.clear()
        replacement = tmp_path / "again.jsonl"
        replacement.write_bytes(b'{"id": "0", "again": %d}\n' % publication)
        published = read_shard_manifest(store, "stage", 0, ShardManifest)
        again = publish_shards_together(
            store, [(ShardManifest(stage="stage", shard=0, rows=1), [("data.jsonl", replacement)])]
        )[0]
        # While the new object was being written, the published shard was there whole, by its object and its index.
        assert store.seen == [(published, [], published)]
        assert again.data_keys != published.data_keys and verify_shard(store, again) == []
        assert read_shard_manifest(store, "stage", 0, ShardManifest) == again
        assert read_published_manifests(store, "stage", ShardManifest)[0] == again
        assert {info.key for info in store.list("stage/")} == {*again.data_keys, f"stage/shard=00000/{MANIFEST_NAME}"}
    assert again.data_keys == ["stage/shard=00000/data.jsonl"]
