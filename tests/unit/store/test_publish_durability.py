"""Publishing many shards makes them durable once per phase (files, then manifests), not once per object."""

from __future__ import annotations

import os

from dagster_project.store.layout import MANIFEST_NAME
from dagster_project.store.manifest import ShardManifest, publish_shards_together, read_shard_manifest, verify_shard
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
