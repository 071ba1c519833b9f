"""The raw_prompts and conversations assets and their checks, materialized on the demo data."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.conversations import conversations
from dagster_project.assets.raw_prompts import raw_prompts
from dagster_project.checks.conversations import (
    conversations_gx_suite,
    conversations_multi_turn_counts,
    conversations_quarantine_rate,
    conversations_turn_markers,
    conversations_unique_ids,
)
from dagster_project.conversations.shards import read_conversations, read_shard_conversations_manifest
from dagster_project.ingest.quarantine import REASONS
from dagster_project.resources import DatasetStore, GenerationConfig, TokenizerResource
from dagster_project.settings import DEMO_DATA_DIR
from dagster_project.store import layout
from dagster_project.store.manifest import ShardManifest, publish_shard, published_shards
from dagster_project.store.storage import LocalStore
from tests.support.dagster_helpers import evaluations_by_check
from tests.support.published import republish_as_edited

ASSETS = [raw_prompts, conversations]
CHECKS = [
    conversations_quarantine_rate,
    conversations_unique_ids,
    conversations_turn_markers,
    conversations_multi_turn_counts,
    conversations_gx_suite,
]
NUM_SHARDS = 3


@pytest.fixture
def resources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("DFLASH_NUM_SHARDS", str(NUM_SHARDS))
    return {
        "store": DatasetStore(root=str(tmp_path / "store"), work_dir=str(tmp_path / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "generation": GenerationConfig(),
    }


def test_demo_data_materializes_and_every_check_passes(resources: dict, tmp_path: Path) -> None:
    result = dg.materialize([*ASSETS, *CHECKS], resources=resources)
    assert result.success
    checks = evaluations_by_check(result)
    assert set(checks) == {c.check_key.name for c in CHECKS}
    assert all(e.passed for e in checks.values()), {n: e.description for n, e in checks.items() if not e.passed}

    metadata = result.asset_materializations_for_node("conversations")[0].metadata
    assert metadata["input_rows"].value == metadata["rows"].value + metadata["quarantined"].value
    assert metadata["num_shards"].value == NUM_SHARDS and metadata["policy"].value == "all_turns"
    assert 0.1 <= metadata["multi_turn"].value / metadata["rows"].value <= 0.2, "the demo is 10-20% multi-turn"
    assert "| control_tokens |" in metadata["quarantined_by_reason"].value
    gx = checks["conversations_gx_suite"].metadata
    assert gx["failed_expectations"].value == 0 and "expect_column_values_to_be_unique" in gx["summary"].value

    stage = json.loads((tmp_path / "store" / layout.stage_manifest_key(layout.CONVERSATIONS)).read_text())
    assert set(stage["by_source"]) == {"alpaca_tasks", "openai_messages", "sharegpt_chats"}
    assert stage["rows"] >= 200
    # Each malformed demo row exercises its own rule; only those needing special data or files are absent.
    assert set(stage["quarantined_by_reason"]) == set(REASONS) - {
        "too_long",
        "duplicate_id",
        "unrecognized_format",
        "not_a_conversation",
        "unreadable_file",
        "line_too_long",
        "too_deep",
        "unparsable_transcript",
        "flattened_layout",
        "unknown_part",
        "misplaced_part",
    }


def test_quarantine_rate_above_the_limit_fails_the_blocking_check(resources: dict) -> None:
    config = dg.RunConfig(ops={"conversations": {"config": {"quarantine_rate_max": 0.01}}})
    result = dg.materialize([*ASSETS, *CHECKS], resources=resources, run_config=config, raise_on_error=False)
    assert not result.success
    evaluation = evaluations_by_check(result)["conversations_quarantine_rate"]
    assert not evaluation.passed
    assert evaluation.metadata["quarantine_rate"].value > 0.01 == evaluation.metadata["quarantine_rate_max"].value
    # The demo's exact duplicates are counted on their own, against their own limit, not as quarantined rows.
    duplicates = evaluation.metadata["duplicates"].value
    assert duplicates > 0 and evaluation.metadata["duplicate_rate_max"].value == 0.5
    bad = evaluation.metadata["quarantined"].value - duplicates
    assert evaluation.metadata["quarantine_rate"].value == bad / evaluation.metadata["input_rows"].value
    assert f"{duplicates} exact duplicates set aside" in evaluation.description


def test_corrupted_shard_fails_the_id_and_gx_checks(resources: dict, tmp_path: Path) -> None:
    assert dg.materialize(ASSETS, resources=resources).success
    shard_file = tmp_path / "store" / layout.shard_prefix(layout.CONVERSATIONS, 0) / "conversations.jsonl"
    lines = shard_file.read_bytes().splitlines()
    bad = json.loads(lines[0])
    bad["messages"] = [{"role": "narrator", "content": " "}] + bad["messages"]
    bad["generate_after"] = [0]
    shard_file.write_bytes(b"\n".join([*lines, lines[0], json.dumps(bad).encode()]) + b"\n")
    store = LocalStore(tmp_path / "store")
    republish_as_edited(store, read_shard_conversations_manifest(store, 0))

    result = dg.materialize(
        [*ASSETS, *CHECKS],
        resources=resources,
        selection=dg.AssetSelection.checks_for_assets(conversations),
        raise_on_error=False,
    )
    checks = evaluations_by_check(result)
    assert not checks["conversations_unique_ids"].passed
    assert checks["conversations_unique_ids"].metadata["duplicate_ids"].value == 2  # two copies of one id added
    assert checks["conversations_unique_ids"].metadata["shards_whose_ids_differ_from_manifest"].value == 1
    assert not checks["conversations_multi_turn_counts"].passed
    gx = checks["conversations_gx_suite"]
    assert not gx.passed
    summary = gx.metadata["summary"].value
    for failed in [
        "| conversations | expect_column_values_to_be_unique | id | FAIL",
        "| messages | expect_column_values_to_be_in_set | role | FAIL",
        "| messages | expect_column_values_to_be_between | visible_chars | FAIL",
        "| turns | expect_column_values_to_be_in_set | role | FAIL",
    ]:
        assert failed in summary, summary
    assert (
        "| turns | expect_column_pair_values_a_to_be_greater_than_b | message_index, previous_message_index | pass"
        in summary
    )


def test_sources_and_store_on_s3(s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The S3 path end to end: sources listed and read through the store's S3 resource, shards published to S3."""
    monkeypatch.setenv("DFLASH_NUM_SHARDS", "2")
    s3 = S3Resource()
    client = s3.get_client()
    for path in sorted(DEMO_DATA_DIR.iterdir()):
        client.upload_file(str(path), s3_bucket, f"incoming/{path.name}")
    resources = {
        "store": DatasetStore(root=f"s3://{s3_bucket}/run", work_dir=str(tmp_path / "work"), s3=s3),
        "tokenizer": TokenizerResource(),
        "generation": GenerationConfig(policy="first_turn"),
    }
    config = dg.RunConfig(ops={"raw_prompts": {"config": {"sources": [f"demo=s3://{s3_bucket}/incoming/"]}}})
    result = dg.materialize([*ASSETS, conversations_unique_ids], resources=resources, run_config=config)
    assert result.success
    store = resources["store"].open()
    stage = json.loads(store.get_bytes(layout.stage_manifest_key(layout.CONVERSATIONS)))
    assert list(stage["by_source"]) == ["demo"] and stage["by_policy"]["first_turn"]["turns"] == stage["rows"] >= 200
    assert {c.policy for shard in range(2) for c in read_conversations(store, shard)} == {"first_turn"}


def test_another_shard_count_is_refused_while_completions_exist_unless_superseded(
    resources: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert dg.materialize(ASSETS, resources=resources).success
    store = resources["store"].open()
    data = tmp_path / "completions.parquet"
    data.write_bytes(b"rows")
    for shard in range(NUM_SHARDS):
        publish_shard(store, ShardManifest(stage=layout.COMPLETIONS, shard=shard, rows=1), [("c.parquet", data)])

    monkeypatch.setenv("DFLASH_NUM_SHARDS", "5")  # the operator changed the shell, not the conversations
    refused = dg.materialize([conversations], resources=resources, raise_on_error=False)
    assert not refused.success
    [failure] = [e for e in refused.all_events if e.event_type == dg.DagsterEventType.STEP_FAILURE]
    message = failure.event_specific_data.error.to_string()  # with its cause
    assert f"have {NUM_SHARDS} shards" in message and "supersede_shards: true" in message, message
    assert published_shards(store, layout.COMPLETIONS) == list(range(NUM_SHARDS))

    config = {"ops": {"conversations": {"config": {"supersede_shards": True}}}}
    superseded = dg.materialize([conversations], resources=resources, run_config=config)
    metadata = superseded.asset_materializations_for_node("conversations")[0].metadata
    assert metadata["num_shards"].value == 5 and metadata["superseded"].value[layout.COMPLETIONS] == NUM_SHARDS
    assert published_shards(store, layout.COMPLETIONS) == []
