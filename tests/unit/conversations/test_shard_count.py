"""The shard count is a property of the conversations: rebuilding them with another count while shards made from
them are published is refused, unless the operator supersedes those shards (then withdrawn); and a store whose
completions and conversations disagree is reported by `dflash status --by-id`, not a crash."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_project import cli
from dagster_project.conversations.shards import read_conversations, read_conversations_manifest
from dagster_project.conversations.stage import ShardCountChanged, build_conversations
from dagster_project.generation.shards import CompletionsShardManifest, read_completions_manifest
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops.coverage import dataset_coverage, read_coverage
from dagster_project.records import COMPLETION_SCHEMA, empty_completion_row
from dagster_project.store.layout import COMPLETIONS, CONVERSATIONS, TRAINING_SET, shard_manifest_key
from dagster_project.store.manifest import ShardManifest, publish_shard, published_shards
from dagster_project.tokenizer import load_tokenizer, tokenizer_identity
from tests.support.ingest_helpers import run_stages

EXPORT_KEY = "exports/specforge/shard=00003.jsonl"


def write_prompts(path, count: int = 16) -> str:
    with open(path, "w") as handle:
        for i in range(count):
            handle.write(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]}))
            handle.write("\n")
    return str(path)


def publish_completions(store, tmp_path, shard: int, event_ids: list[str], made_from: str = "") -> None:
    """A completions shard of these events, made from the conversations whose ids digest is `made_from`."""
    rows = [{**empty_completion_row(), "event_id": e, "status": "ok", "shard": shard} for e in event_ids]
    path = tmp_path / f"completions-{shard}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=COMPLETION_SCHEMA), path)
    manifest = CompletionsShardManifest(shard=shard, rows=len(rows), conversations_ids_digest=made_from)
    publish_shard(store, manifest, [("completions.parquet", path)])


def rebuild(store, tmp_path, num_shards: int, **options):
    return build_conversations(
        store,
        load_tokenizer=load_tokenizer,
        tokenizer=tokenizer_identity(load_tokenizer()),
        settings=GenerationSettings(),
        num_shards=num_shards,
        work_dir=tmp_path / "rebuild",
        **options,
    )


@pytest.fixture
def built(tmp_path):
    """Conversations in 4 shards; completions of every shard, a training shard and an export made from them."""
    outcome = run_stages(tmp_path, [write_prompts(tmp_path / "prompts.jsonl")], num_shards=4)
    store = outcome.store
    for shard in range(4):
        events = [c.event_id(t) for c in read_conversations(store, shard) for t in range(c.num_turns)]
        publish_completions(store, tmp_path, shard, events)
    rows = tmp_path / "rows.parquet"
    rows.write_bytes(b"rows")
    publish_shard(store, ShardManifest(stage=TRAINING_SET, shard=3, rows=1), [("rows.parquet", rows)])
    store.put_bytes(EXPORT_KEY, b"{}\n")
    return store


def test_another_shard_count_is_refused_while_completions_exist(built, tmp_path):
    with pytest.raises(ShardCountChanged) as refused:
        rebuild(built, tmp_path, 2)
    message = str(refused.value)
    assert "have 4 shards, and 4 completions shards, 1 training_set shards and 1 exports were made" in message
    assert "DFLASH_NUM_SHARDS=4" in message and "DFLASH_STORE" in message and "supersede_shards: true" in message
    # Nothing changed: the conversations, and every shard made from them, are as they were.
    assert read_conversations_manifest(built).num_shards == 4
    assert published_shards(built, COMPLETIONS) == [0, 1, 2, 3] and built.exists(EXPORT_KEY)

    assert rebuild(built, tmp_path, 4).num_shards == 4  # the same count is a plain rebuild


def test_superseding_withdraws_every_shard_made_from_the_old_conversations(built, tmp_path):
    manifest = rebuild(built, tmp_path, 2, supersede_shards=True)
    assert manifest.num_shards == 2 and manifest.superseded == {COMPLETIONS: 4, TRAINING_SET: 1, "exports": 1}
    assert published_shards(built, COMPLETIONS) == [] and published_shards(built, TRAINING_SET) == []
    assert not built.exists(EXPORT_KEY)
    assert published_shards(built, CONVERSATIONS) == [0, 1]
    assert read_completions_manifest(built, 0) is None  # downstream sees the shards as unpublished


def test_status_by_id_reports_completions_that_disagree_with_the_conversations(tmp_path, monkeypatch, capsys):
    store = run_stages(tmp_path, [write_prompts(tmp_path / "prompts.jsonl")], num_shards=2).store
    events = [c.event_id(0) for c in read_conversations(store, 0)]
    publish_completions(store, tmp_path, 0, events, made_from="the digest of other conversations")
    publish_completions(store, tmp_path, 3, ["c99#turn0"])  # a shard of an earlier build with 4 shards
    store.delete(shard_manifest_key(CONVERSATIONS, 1))  # a rebuild that stopped half-way

    coverage = dataset_coverage(store, 2)
    assert coverage.conversations_shards_missing == [1]
    assert coverage.completions_from_other_conversations == [0]
    assert coverage.completions_beyond_shard_count == [3]
    assert not coverage.exactly_once

    monkeypatch.setenv("DFLASH_STORE", store.uri)
    monkeypatch.setenv("DFLASH_WORK_DIR", str(tmp_path / "work"))
    assert cli.main(["status", "--by-id"]) == 0
    shown = capsys.readouterr().out
    assert "ALERT: conversations shards not published: [1]" in shown
    assert "ALERT: completions shards made from other conversations than those published now: [0]" in shown
    assert "ALERT: completions shards beyond the conversations' 2 shards: [3]" in shown
    assert read_coverage(store).completions_beyond_shard_count == [3]
