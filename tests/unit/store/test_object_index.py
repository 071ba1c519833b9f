"""The store's index of shard manifests and heartbeats: what status reads in a few requests instead of one per
shard, kept right by its writers, and made to agree with the objects by the coverage check."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from dagster_project.generation.heartbeat import read_heartbeats, write_heartbeat
from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.ops.status import collect_status
from dagster_project.store import object_index
from dagster_project.store.dataclass_json import to_json
from dagster_project.store.layout import COMPLETIONS, shard_manifest_key
from dagster_project.store.manifest import (
    ShardManifest,
    publish_shard,
    read_manifests_from_objects,
    read_published_manifests,
    withdraw_shards,
)
from dagster_project.store.storage import LocalStore
from tests.support.heartbeats import heartbeat


def publish(store: LocalStore, tmp_path: Path, shard: int, rows: int = 1) -> CompletionsShardManifest:
    data = tmp_path / f"data-{shard}.parquet"
    data.write_bytes(b"rows" * rows)
    return publish_shard(store, CompletionsShardManifest(shard=shard, rows=rows), [("part-0.parquet", data)])


class CountingStore(LocalStore):
    """A local store that counts the requests made of it (each would be a round trip on S3)."""

    requests = 0

    def get_versioned(self, key):
        self.requests += 1
        return super().get_versioned(key)

    def get_bytes(self, key):
        self.requests += 1
        return super().get_bytes(key)

    def list(self, prefix=""):
        self.requests += 1
        return super().list(prefix)

    def head(self, key):
        self.requests += 1
        return super().head(key)


def test_published_manifests_come_from_the_index_and_follow_publish_and_withdraw(tmp_path):
    store = LocalStore(tmp_path / "store")
    published = {shard: publish(store, tmp_path, shard) for shard in (0, 1, 300)}  # 300: another index block
    assert read_published_manifests(store, COMPLETIONS, CompletionsShardManifest) == published

    again = publish(store, tmp_path, 1, rows=5)
    assert read_published_manifests(store, COMPLETIONS, CompletionsShardManifest)[1] == again

    withdraw_shards(store, COMPLETIONS)
    assert read_published_manifests(store, COMPLETIONS, CompletionsShardManifest) == {}


def test_a_store_without_an_index_is_read_object_by_object(tmp_path):
    store = LocalStore(tmp_path / "store")
    published = {shard: publish(store, tmp_path, shard) for shard in range(3)}
    for info in list(store.list(object_index.INDEX_PREFIX + "/")):
        store.delete(info.key)  # as written before the index existed
    assert read_published_manifests(store, COMPLETIONS, CompletionsShardManifest) == published


def test_status_requests_grow_with_index_blocks_not_with_shards(tmp_path):
    def requests_for(shards: int) -> int:
        store = CountingStore(tmp_path / f"store-{shards}")
        for shard in range(shards):
            data = to_json(replace(CompletionsShardManifest(shard=shard, rows=1), published_at=1.0))
            store.put_bytes(shard_manifest_key(COMPLETIONS, shard), data)
            object_index.record(store, shard_manifest_key(COMPLETIONS, shard), data)
            write_heartbeat(store, heartbeat(shard, state="published", done=10), first=False)
        store.requests = 0
        status = collect_status(store, [])
        assert status.coverage.events_in_published_shards == 0  # no conversations: shards beyond the count
        return store.requests

    # One more GET per index block (of the completions' records, manifests and verdicts read at once, and of
    # heartbeats): 2 × 3 more blocks, not 2 × 396 more objects.
    extra_blocks = 400 // object_index.BLOCK_SHARDS
    assert requests_for(400) == requests_for(4) + 2 * extra_blocks


def test_concurrent_writers_of_one_index_block_lose_no_entry(tmp_path):
    store = LocalStore(tmp_path / "store")
    keys = [shard_manifest_key(COMPLETIONS, shard) for shard in range(64)]
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(
            pool.map(
                lambda key: object_index.record(store, key, to_json(ShardManifest(stage="x", shard=0, rows=1))), keys
            )
        )
    found = object_index.read_records(store, f"{COMPLETIONS}/shard=", ShardManifest, lambda key: True)
    assert sorted(found) == sorted(keys)


def test_publishers_working_side_by_side_take_shards_of_different_blocks():
    shards = range(3 * object_index.BLOCK_SHARDS + 5)
    order = object_index.spread_over_blocks(shards)
    blocks = [object_index.block_key(shard_manifest_key(COMPLETIONS, shard)) for shard in order]
    assert sorted(order) == list(shards)
    assert all(len(set(blocks[start : start + 3])) == 3 for start in range(len(blocks) - 2))  # 3 full blocks


def test_a_running_heartbeat_is_read_from_its_object_and_a_finished_one_from_the_index(tmp_path):
    store = CountingStore(tmp_path / "store")
    write_heartbeat(store, heartbeat(7, state="running", done=1), first=True)
    write_heartbeat(store, heartbeat(7, state="running", done=4), first=False)  # not indexed: readers fetch the object
    assert [b.done_events for b in read_heartbeats(store)] == [4]

    write_heartbeat(store, heartbeat(7, state="published", done=10), first=False)
    store.requests = 0
    assert [(b.state, b.done_events) for b in read_heartbeats(store)] == [("published", 10)]
    assert store.requests == 2  # list the index blocks, read the one: not the heartbeat itself

    write_heartbeat(store, heartbeat(7, state="running", done=2), first=True)  # the shard runs again
    assert [(b.state, b.done_events) for b in read_heartbeats(store)] == [("running", 2)]


def test_the_coverage_checks_reading_of_the_manifests_repairs_an_index_that_drifted(tmp_path):
    store = LocalStore(tmp_path / "store")
    publish(store, tmp_path, 0)
    publish(store, tmp_path, 1)
    lost = shard_manifest_key(COMPLETIONS, 1)
    store.delete(lost)  # removed behind the index's back
    stale = ShardManifest(stage=COMPLETIONS, shard=2, rows=9)
    store.put_bytes(shard_manifest_key(COMPLETIONS, 2), to_json(stale))  # written without recording it
    assert sorted(read_published_manifests(store, COMPLETIONS, ShardManifest)) == [0, 1]

    manifests, listed = read_manifests_from_objects(store, COMPLETIONS, ShardManifest)
    assert sorted(manifests) == [0, 2] and lost not in listed
    assert sorted(read_published_manifests(store, COMPLETIONS, ShardManifest)) == [0, 2]


def test_reconciling_keeps_a_shard_published_after_the_coverage_check_listed_the_store(tmp_path):
    store = LocalStore(tmp_path / "store")
    manifest = publish(store, tmp_path, 4)  # published while the check was reading: not in what it read
    assert object_index.reconcile(store, COMPLETIONS, {}) == 1
    assert read_published_manifests(store, COMPLETIONS, CompletionsShardManifest) == {4: manifest}
