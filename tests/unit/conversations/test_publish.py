"""Publishing the shards of a local store from the drafting processes gives what publishing them from threads gives."""

from __future__ import annotations

import dataclasses

import orjson

from dagster_project.conversations import drafts
from dagster_project.conversations.shards import ShardBuffers, publish_shards, read_conversations
from dagster_project.records import Conversation
from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import TokenizerIdentity

SHARDS = 300  # three object-index blocks


def _publish(root, pool):
    buffers = ShardBuffers(root / "buffers", SHARDS, max_buffered_bytes=2000)  # several flushes
    for index in range(120):
        conversation = Conversation(f"c{index}", [{"role": "user", "content": "hi"}], [0], shard=index * 7 % SHARDS)
        buffers.write(conversation, orjson.dumps(conversation))
    buffers.flush()
    store = LocalStore(root / "store")
    manifests = publish_shards(
        store, buffers, policy="all_turns", build_id="b", tokenizer=TokenizerIdentity(), pool=pool
    )
    assert not list((root / "buffers").iterdir()), "the shard files and the ids files are given up"
    return store, [dataclasses.replace(m, published_at=0.0) for m in manifests]


def test_shards_published_in_worker_processes_equal_shards_published_in_threads(tmp_path) -> None:
    with drafts.worker_pool(tmp_path, parallel=True) as pool:
        in_workers, by_workers = _publish(tmp_path / "workers", pool)
    in_threads, by_threads = _publish(tmp_path / "threads", None)
    assert by_workers == by_threads and len(by_workers) == SHARDS
    assert sum(m.rows for m in by_workers) == 120
    for shard in (0, 7, 14, 299):
        assert list(read_conversations(in_workers, shard)) == list(read_conversations(in_threads, shard))
