import json
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_project.conversations.shards import ConversationsShardManifest, read_shard_conversations_manifest
from dagster_project.generation.shards import CompletionsShardManifest, read_completions_manifest, shard_coverage
from dagster_project.ops.coverage import damaged_shards, dataset_coverage
from dagster_project.records import COMPLETION_SCHEMA, empty_completion_row
from dagster_project.store import object_index
from dagster_project.store.dataclass_json import to_json
from dagster_project.store.layout import COMPLETIONS, CONVERSATIONS, shard_manifest_key
from dagster_project.store.manifest import ShardManifest, StoredObject, publish_shard, read_published_manifests
from dagster_project.store.storage import CorruptObject, LocalStore
from tests.support.ingest_helpers import run_stages


def publish_completions(store, tmp_path, shard: int, event_ids: list[str]) -> None:
    rows = [{**empty_completion_row(), "event_id": e, "status": "ok", "shard": shard} for e in event_ids]
    path = tmp_path / f"completions-{shard}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=COMPLETION_SCHEMA), path)
    publish_shard(store, CompletionsShardManifest(shard=shard, rows=len(rows)), [("completions.parquet", path)])


def test_coverage_by_id_finds_gaps_duplicates_and_strays_that_counts_would_hide(tmp_path):
    source = tmp_path / "prompts.jsonl"
    with open(source, "w") as handle:
        for i in range(12):
            messages = [{"role": "user", "content": f"Question number {i}?"}]
            if i % 4 == 0:  # multi-turn: two generated turns
                messages += [
                    {"role": "assistant", "content": "An answer."},
                    {"role": "user", "content": f"And then {i}?"},
                ]
            handle.write(json.dumps({"id": f"c{i}", "messages": messages}) + "\n")
    outcome = run_stages(tmp_path, [str(source)], num_shards=2)
    planned = {
        s: [c.event_id(t) for c in outcome.conversations if c.shard == s for t in range(c.num_turns)] for s in (0, 1)
    }
    assert sum(map(len, planned.values())) == 15

    publish_completions(outcome.store, tmp_path, 0, planned[0])
    complete_so_far = dataset_coverage(outcome.store, 2)
    assert complete_so_far.shards_published == 1 and complete_so_far.events_not_yet_published == len(planned[1])
    assert not complete_so_far.exactly_once

    # One event dropped and another recorded twice: the row count is right, the ids are not. Plus a stray.
    dropped, doubled = planned[1][0], planned[1][1]
    publish_completions(outcome.store, tmp_path, 1, planned[1][1:] + [doubled, "stranger#turn0"])
    coverage = dataset_coverage(outcome.store, 2)
    assert coverage.events_missing == 1 and coverage.missing_sample == [dropped]
    assert coverage.events_duplicated == 1 and coverage.duplicated_sample == [doubled]
    assert coverage.events_unexpected == 1 and coverage.unexpected_sample == ["stranger#turn0"]
    assert coverage.conversations_done == coverage.conversations - 1
    assert not coverage.exactly_once

    publish_completions(outcome.store, tmp_path, 1, planned[1])
    assert dataset_coverage(outcome.store, 2).exactly_once


def test_one_duplicated_event_alone_fails_the_shard_gate_and_the_dataset_coverage(tmp_path):
    """Every planned event has its record and one has a second: the count is one over, nothing is missing."""
    outcome = two_shard_store(tmp_path)
    planned = [c.event_id(0) for c in outcome.conversations if c.shard == 1]
    doubled = planned[0]
    publish_completions(outcome.store, tmp_path, 1, planned + [doubled])

    shard = shard_coverage(outcome.store, 1)
    assert (shard.missing, shard.unexpected, shard.duplicated) == ([], [], {doubled: 2})
    assert not shard.exact and shard.describe() == f"1 events have several records (e.g. {[doubled]})"

    coverage = dataset_coverage(outcome.store, 2)
    assert (coverage.events_missing, coverage.events_unexpected) == (0, 0)
    assert coverage.events_duplicated == 1 and coverage.duplicated_sample == [doubled]
    assert not coverage.exact_so_far and not coverage.exactly_once


def two_shard_store(tmp_path):
    source = tmp_path / "prompts.jsonl"
    with open(source, "w") as handle:
        for i in range(8):
            handle.write(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]}))
            handle.write("\n")
    outcome = run_stages(tmp_path, [str(source)], num_shards=2)
    for shard in (0, 1):
        publish_completions(
            outcome.store, tmp_path, shard, [c.event_id(0) for c in outcome.conversations if c.shard == shard]
        )
    assert dataset_coverage(outcome.store, 2).exactly_once
    return outcome


def test_a_damaged_completions_shard_is_named_and_its_events_count_as_missing(tmp_path):
    outcome = two_shard_store(tmp_path)
    store = outcome.store
    truncated = read_completions_manifest(store, 0).data_keys[0]
    original_0 = (store.root / truncated).read_bytes()
    (store.root / truncated).write_bytes(original_0[:-100])
    overwritten = read_completions_manifest(store, 1).data_keys[0]
    original = (store.root / overwritten).read_bytes()
    (store.root / overwritten).write_bytes(original[:-1] + bytes([original[-1] ^ 1]))  # same size, other bytes

    coverage = dataset_coverage(store, 2)
    assert coverage.shards_damaged == [0, 1] and coverage.shards_published == 0
    assert coverage.events_missing == coverage.events_planned == len(outcome.conversations)
    assert not coverage.exactly_once
    # Each damaged shard names its objects: what `dflash status` and the page show.
    assert [(damage.shard, damage.problems) for damage in coverage.damaged] == [
        (0, [f"{truncated}: {len(original_0) - 100} bytes in the store, manifest says {len(original_0)}"]),
        (1, [f"{overwritten}: checksum differs from the manifest"]),
    ]


def test_an_unreadable_conversations_shard_is_named(tmp_path):
    store = two_shard_store(tmp_path).store
    key = read_shard_conversations_manifest(store, 1).data_keys[0]
    (store.root / key).write_bytes(b'{"id": "c1", "messages": [')
    with pytest.raises(CorruptObject, match=f"{store.url(key)} is damaged: 26 bytes in the store, manifest says"):
        dataset_coverage(store, 2)


def test_damaged_shards_checks_each_local_file_s_checksum_small_and_large(tmp_path):
    """Small files are hashed in the calling thread and large ones in threads: both ways catch other bytes of the
    same size, and only in the shards that have them."""
    store = LocalStore(tmp_path / "store")
    sizes = {0: 20_000, 1: 20_000, 2: 3 << 20, 3: 3 << 20}  # two under and two over the threads' threshold
    published = {}
    for shard, size in sizes.items():
        path = tmp_path / f"data-{shard}.bin"
        path.write_bytes(bytes(range(256)) * (size // 256))
        published[shard] = publish_shard(store, ShardManifest(stage=COMPLETIONS, shard=shard, rows=1), [("d", path)])
    for shard in (1, 3):
        key = published[shard].data_keys[0]
        data = bytearray((store.root / key).read_bytes())
        data[len(data) // 2] ^= 1
        (store.root / key).write_bytes(bytes(data))
    listed = {info.key: info for info in store.list(f"{COMPLETIONS}/")}

    damaged = damaged_shards(store, published, listed)

    assert sorted(damaged) == [1, 3]
    assert all("checksum differs" in problem for problems in damaged.values() for problem in problems)


def test_coverage_reads_the_conversations_the_manifests_name_when_the_index_disagrees(tmp_path):
    """DuckDB starts on the shards the index names; a stale index (a shard forgotten, a copy naming an object
    that is gone) must not change the answer, and the check leaves the index repaired."""
    store = two_shard_store(tmp_path).store
    manifests = {shard: read_shard_conversations_manifest(store, shard) for shard in (0, 1)}

    object_index.forget(store, [shard_manifest_key(CONVERSATIONS, 1)])
    coverage = dataset_coverage(store, 2)
    assert coverage.exactly_once and coverage.events_planned == 8
    assert read_published_manifests(store, CONVERSATIONS, ConversationsShardManifest) == manifests

    gone = StoredObject(key=f"{CONVERSATIONS}/shard=00000/gone.jsonl", size=1)
    object_index.record(store, shard_manifest_key(CONVERSATIONS, 0), to_json(replace(manifests[0], objects=(gone,))))
    coverage = dataset_coverage(store, 2)
    assert coverage.exactly_once and coverage.events_planned == 8
    assert read_published_manifests(store, CONVERSATIONS, ConversationsShardManifest) == manifests

    object_index.forget(store, [shard_manifest_key(COMPLETIONS, 1)])
    coverage = dataset_coverage(store, 2)
    assert coverage.exactly_once and coverage.events_recorded == 8
    assert sorted(read_published_manifests(store, COMPLETIONS, CompletionsShardManifest)) == [0, 1]


def test_mid_run_the_events_of_shards_not_yet_published_are_to_come_not_missing(tmp_path):
    """Half way through a run nothing is lost: what the unpublished shard plans is "not yet published", and only
    a gap in a published shard is "missing"."""
    source = tmp_path / "prompts.jsonl"
    source.write_text(
        "".join(
            json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Q {i}?"}]}) + "\n" for i in range(10)
        )
    )
    outcome = run_stages(tmp_path, [str(source)], num_shards=2)
    planned = {s: [c.event_id(0) for c in outcome.conversations if c.shard == s] for s in (0, 1)}
    publish_completions(outcome.store, tmp_path, 0, planned[0][1:])  # one event of shard 0 lost

    mid_run = dataset_coverage(outcome.store, 2)
    assert (mid_run.events_missing, mid_run.conversations_missing) == (1, 1)
    assert mid_run.missing_sample == [planned[0][0]]
    assert (mid_run.events_not_yet_published, mid_run.conversations_not_yet_published) == (len(planned[1]),) * 2
    assert not mid_run.exactly_once
