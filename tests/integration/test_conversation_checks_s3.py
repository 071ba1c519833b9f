"""The conversations checks read the shards and record their verdicts on S3 several at a time: what they find and
record is still what each shard holds (a damaged object still fails the read, a failed check still gates every
shard, in its object and in the index)."""

from __future__ import annotations

import orjson
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.conversations.shards import (
    ConversationsShardManifest,
    ShardBuffers,
    publish_shards,
    read_conversations,
    read_conversations_manifest,
    record_stage_verdict,
    scan_shards,
)
from dagster_project.resources.store import DatasetStore
from dagster_project.store.layout import CONVERSATIONS
from dagster_project.store.manifest import DamagedObject, write_stage_manifest
from dagster_project.store.verdicts import failed_gates, read_stage_records
from tests.support.ingest_helpers import questions_in_shards

SHARDS = 4


@pytest.fixture
def published(s3_bucket, tmp_path):
    """The conversations of `questions_in_shards`, published shard by shard on S3 as the stage publishes them."""
    local = questions_in_shards(tmp_path, count=12, num_shards=SHARDS)
    stage = read_conversations_manifest(local)
    store = DatasetStore(root=f"s3://{s3_bucket}/store", work_dir=str(tmp_path / "work"), s3=S3Resource()).open()
    buffers = ShardBuffers(tmp_path / "buffers", SHARDS)
    for shard in range(SHARDS):
        for conversation in read_conversations(local, shard):
            buffers.write(conversation, orjson.dumps(conversation))
    buffers.flush()
    manifests = publish_shards(store, buffers, policy=stage.policy, build_id=stage.build_id, tokenizer=stage.tokenizer)
    write_stage_manifest(store, stage)
    return store, stage, manifests


def test_a_failed_stage_check_gates_every_shard_in_its_object_and_in_the_index(published):
    store, stage, manifests = published
    scan = scan_shards(store, stage)
    assert (scan.rows, scan.missing_shards, scan.digest_mismatches) == (12, [], [])

    assert scan.manifests == manifests
    # As the check records it: on the shards its scan read.
    failed = {"unique_ids": "duplicate ids: ['c1']"}
    assert record_stage_verdict(store, stage, "unique_ids", failed, scan.manifests) == SHARDS
    records = read_stage_records(store, CONVERSATIONS, ConversationsShardManifest)
    for manifest in manifests:
        (verdict,) = records.verdicts[manifest.shard]
        assert not verdict.passed and verdict.judges(manifest)
        assert failed_gates(store, manifest) == {"unique_ids/unique_ids": "duplicate ids: ['c1']"}


def test_a_damaged_shard_fails_the_read_naming_its_object(published):
    store, stage, manifests = published
    (damaged,) = manifests[2].data_keys
    data = store.get_bytes(damaged)
    store.put_bytes(damaged, data.replace(b"Question", b"Qvestion", 1))  # same size, other bytes
    with pytest.raises(DamagedObject, match=damaged):
        scan_shards(store, stage)
