"""Completions → training rows: exact ids, the engine-boundary mask, exclusions with reasons, max_length policy."""

from __future__ import annotations

import time
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dagster_project.generation_settings import GenerationSettings
from dagster_project.records import COMPLETION_SCHEMA, TRAINING_SCHEMA
from dagster_project.store.layout import TRAINING_SET, lease_key, shard_prefix
from dagster_project.store.lease import Lease, LeaseLost
from dagster_project.store.manifest import ids_digest
from dagster_project.store.storage import LocalStore
from dagster_project.training import stage as assemble
from dagster_project.training.lengths import DROP, KEEP, TRUNCATE, LengthFigures
from dagster_project.training.row_gates import length_loss
from dagster_project.training.shards import TRAINING_FILE, iter_training_batches, read_training_manifest
from dagster_project.training.stage import AssemblyOptions, assemble_batch, assemble_shard, source_is_current
from tests.support.training_shards import completion_row, error_row, healthy_rows, publish_completions


def _assemble(rows: list[dict], options: AssemblyOptions | None = None) -> tuple[list[dict], dict]:
    completions = pa.RecordBatch.from_pylist(rows, schema=COMPLETION_SCHEMA)
    batch, excluded = assemble_batch(completions, 7, options or AssemblyOptions(), set())
    return batch.to_pylist(), dict(excluded)


def test_a_row_is_prompt_ids_then_output_ids_with_the_mask_on_the_output():
    rows, excluded = _assemble([completion_row("c#turn0", [11, 12, 13], [21, 22, 248046])])
    assert excluded == {}
    assert rows == [
        {
            "event_id": "c#turn0",
            "conversation_id": "c",
            "turn_index": 0,
            "shard": 7,
            "input_ids": [11, 12, 13, 21, 22, 248046],
            "loss_mask": [0, 0, 0, 1, 1, 1],
            "num_tokens": 6,
            "num_loss_tokens": 3,
            "prompt_tokens": 3,
            "completion_tokens": 3,
            "finish_reason": "stop",
            "truncated": False,
            "source": "demo",
            "server": "http://127.0.0.1:30000",
            "weight_version": "default",
            "settings_fingerprint": GenerationSettings().fingerprint(),
            "spec_verify_ct": 1,
            "spec_accept_length": 3.0,
            "spec_accept_rate": 0.5,
        }
    ]


def test_rows_of_completions_written_before_provenance_was_recorded_carry_nulls():
    row = completion_row("c#turn0", [11, 12], [21, 22])
    old = pa.RecordBatch.from_pylist([row], schema=COMPLETION_SCHEMA).drop_columns(["source", "weight_version"])
    batch, _ = assemble_batch(old, 0, AssemblyOptions(), set())
    assert batch.schema == TRAINING_SCHEMA
    assert batch.to_pylist()[0]["source"] is None and batch.to_pylist()[0]["server"] == row["server"]


def test_every_excluded_event_is_counted_under_its_reason():
    rows, excluded = _assemble(
        [
            completion_row("ok#turn0", [1, 2], [3, 4]),
            error_row("failed#turn0", [1, 2]),
            completion_row("capped#turn0", [1], [2, 3], finish_reason="length"),
            completion_row("aborted#turn0", [1], [2, 3], finish_reason="abort"),
            completion_row("odd#turn0", [1], [2, 3], finish_reason=None),
            completion_row("empty#turn0", [1], []),
            completion_row("ok#turn0", [1, 2], [3, 4]),
        ]
    )
    assert [row["event_id"] for row in rows] == ["ok#turn0"]
    assert excluded == {
        assemble.ERROR: 1,
        assemble.LENGTH_CAPPED: 1,
        assemble.ABORTED: 1,
        assemble.UNKNOWN_FINISH_REASON: 1,
        assemble.EMPTY_OUTPUT: 1,
        assemble.DUPLICATE_EVENT: 1,
    }


def test_length_capped_generations_can_be_kept():
    rows, excluded = _assemble(
        [completion_row("capped#turn0", [1], [2, 3], finish_reason="length")],
        AssemblyOptions(exclude_length_capped=False),
    )
    assert excluded == {} and rows[0]["finish_reason"] == "length" and rows[0]["loss_mask"] == [0, 1, 1]


def test_truncation_keeps_the_prompt_and_the_head_of_the_output():
    source = [
        completion_row("fits#turn0", [1, 2], [3, 4, 5]),
        completion_row("long#turn0", [1, 2, 3], [4, 5, 6, 7, 8]),
        completion_row("no-room#turn0", [1, 2, 3, 4, 5], [6, 7]),
    ]
    rows, excluded = _assemble(source, AssemblyOptions(max_length=6, length_policy=TRUNCATE))
    assert excluded == {assemble.PROMPT_FILLS_MAX_LENGTH: 1}
    fits, long = rows
    assert (fits["input_ids"], fits["truncated"]) == ([1, 2, 3, 4, 5], False)
    assert long["input_ids"] == [1, 2, 3, 4, 5, 6] and long["loss_mask"] == [0, 0, 0, 1, 1, 1]
    assert (long["truncated"], long["num_loss_tokens"], long["completion_tokens"]) == (True, 3, 5)

    rows, excluded = _assemble(source, AssemblyOptions(max_length=6, length_policy=DROP))
    assert [row["event_id"] for row in rows] == ["fits#turn0"]
    assert excluded == {assemble.OVER_MAX_LENGTH: 2}


@pytest.mark.parametrize("policy", [KEEP, TRUNCATE, DROP])
def test_a_10k_token_answer_under_each_length_policy(policy, tmp_path):
    prompt, answer = list(range(100, 150)), [7 + i % 900 for i in range(10_000)]
    store = LocalStore(tmp_path / "store")
    publish_completions(store, 0, [completion_row("long#turn0", prompt, answer), *healthy_rows(3)])
    manifest = assemble_shard(store, 0, AssemblyOptions(length_policy=policy), tmp_path / "staging")
    rows = {row["event_id"]: row for batch in iter_training_batches(store, 0) for row in batch.to_pylist()}

    lengths = manifest.lengths
    assert (lengths.max_length, lengths.policy, lengths.rows, lengths.rows_over) == (4096, policy, 4, 1)
    assert lengths.histogram["<=16384"] == 1 and sum(lengths.histogram.values()) == 4
    short_supervised = sum(len(row["output_ids"]) for row in healthy_rows(3))
    assert lengths.supervised_tokens == 10_000 + short_supervised
    if policy == KEEP:
        long = rows["long#turn0"]
        assert (long["num_tokens"], sum(long["loss_mask"]), long["truncated"]) == (10_050, 10_000, False)
        assert lengths.supervised_tokens_beyond == 10_050 - 4096  # what a trainer at 4,096 cuts
    elif policy == TRUNCATE:
        long = rows["long#turn0"]
        assert long["input_ids"] == prompt + answer[: 4096 - 50]
        assert long["loss_mask"] == [0] * 50 + [1] * (4096 - 50)
        assert (long["num_tokens"], long["num_loss_tokens"], long["truncated"]) == (4096, 4046, True)
        assert manifest.truncated_rows == 1 and lengths.supervised_tokens_beyond == 10_050 - 4096
    else:
        assert "long#turn0" not in rows and manifest.exclusions == {assemble.OVER_MAX_LENGTH: 1}
        assert lengths.supervised_tokens_beyond == 10_000
    assert len(rows) + manifest.excluded == 4

    gate = length_loss(lengths, max_lost_share=0.10)
    assert not gate.passed and gate.message.startswith("BLOCKED: ")
    assert f"({lengths.supervised_tokens_beyond}/{lengths.supervised_tokens})" in gate.message
    assert length_loss(lengths, max_lost_share=1.0).passed


def test_length_figures_add_up_across_shards():
    first, second = LengthFigures(10, TRUNCATE), LengthFigures(10, TRUNCATE)
    first.add([4, 2], [10, 3])  # 14 tokens: 6 output tokens fit, 4 lost; 5 tokens: fits
    second.add([9], [5])  # the prompt leaves 1 output token: no anchor, all 5 lost
    first.merge(second)
    assert (first.rows, first.rows_over, first.supervised_tokens, first.supervised_tokens_beyond) == (3, 2, 18, 9)
    assert first.histogram["<=256"] == 3 and first.lost_share == 9 / 18

    short_answers = LengthFigures(10, KEEP)
    short_answers.add([2, 3], [1, 1])  # one-token answers that fit lose nothing
    unlimited = LengthFigures(None, KEEP)
    unlimited.add([50_000], [9])
    assert short_answers.supervised_tokens_beyond == 0 and unlimited.supervised_tokens_beyond == 0


def test_options_refuse_a_policy_they_do_not_know():
    with pytest.raises(ValueError, match="length_policy must be one of"):
        AssemblyOptions(max_length=100, length_policy="middle")
    with pytest.raises(ValueError, match="max_length must leave room"):
        AssemblyOptions(max_length=2)


def test_a_shard_is_assembled_streamed_and_published_with_its_manifest(tmp_path):
    store = LocalStore(tmp_path / "store")
    rows = healthy_rows(40, shard=3)
    rows[5] = error_row(rows[5]["event_id"], rows[5]["prompt_ids"], shard=3)
    rows[9].update(finish_reason="length")
    source = publish_completions(store, 3, rows, GenerationSettings(max_new_tokens=4096))

    manifest = assemble_shard(store, 3, AssemblyOptions(), tmp_path / "staging")

    kept = [row for i, row in enumerate(rows) if i not in (5, 9)]
    assert manifest == read_training_manifest(store, 3)
    assert manifest.rows == 38 and manifest.rows_in == 40
    assert manifest.exclusions == {assemble.ERROR: 1, assemble.LENGTH_CAPPED: 1}
    assert manifest.ids_digest == ids_digest(row["event_id"] for row in kept)
    assert manifest.loss_tokens == sum(len(row["output_ids"]) for row in kept)
    assert manifest.tokens == sum(len(row["prompt_ids"]) + len(row["output_ids"]) for row in kept)
    assert manifest.assembly == AssemblyOptions(max_length=4096, length_policy="keep", exclude_length_capped=True)
    assert manifest.source.settings.max_new_tokens == 4096
    assert manifest.source.settings_fingerprint == source.settings_fingerprint
    assert manifest.data_keys == [shard_prefix(TRAINING_SET, 3) + TRAINING_FILE]

    training = [row for batch in iter_training_batches(store, 3) for row in batch.to_pylist()]
    assert [row["input_ids"] for row in training] == [row["prompt_ids"] + row["output_ids"] for row in kept]
    parquet = pq.ParquetFile(store.root / manifest.data_keys[0])
    assert parquet.schema_arrow == TRAINING_SCHEMA
    column = parquet.metadata.row_group(0).column(TRAINING_SCHEMA.get_field_index("input_ids"))
    assert column.compression == "ZSTD"
    assert source_is_current(store, manifest).passed


def test_republished_completions_make_the_training_shard_stale(tmp_path):
    store = LocalStore(tmp_path / "store")
    rows = healthy_rows(6)
    publish_completions(store, 0, rows)
    manifest = assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")
    publish_completions(store, 0, rows[:5])
    stale = source_is_current(store, manifest)
    assert not stale.passed
    assert (
        stale.message
        == "BLOCKED: completions were republished after this training shard was assembled — re-materialize training_set"
    )


def test_a_training_manifest_that_does_not_account_for_every_completions_row_is_blocked(tmp_path):
    store = LocalStore(tmp_path / "store")
    rows = healthy_rows(6)
    rows[2] = error_row(rows[2]["event_id"], rows[2]["prompt_ids"])
    publish_completions(store, 0, rows)
    manifest = assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")
    assert (manifest.rows, manifest.exclusions) == (5, {assemble.ERROR: 1})
    assert source_is_current(store, manifest).passed

    # The same completions publication, but one row neither kept nor excluded: 5 rows + 0 excluded ≠ 6.
    unbalanced = source_is_current(store, replace(manifest, exclusions={}))
    assert not unbalanced.passed
    assert unbalanced.message == "BLOCKED: 5 rows + 0 excluded ≠ 6 completions rows"
    assert not source_is_current(store, replace(manifest, rows=6)).passed  # 6 + 1 ≠ 6


def test_an_unpublished_completions_shard_is_refused(tmp_path):
    with pytest.raises(assemble.CompletionsNotPublished, match="completions shard 4 has no manifest"):
        assemble_shard(LocalStore(tmp_path), 4, AssemblyOptions(), tmp_path / "staging")


class TakenOverOnAcquire(LocalStore):
    """A store in which another run takes the training lease over as soon as this run has acquired it: the
    assembling run was paused past the lease's expiry (SIGSTOP, a long pause) and the other run found it expired."""

    def put_if(self, key: str, data: bytes, version: str | None) -> str:
        written = super().put_if(key, data, version)
        if key == lease_key(TRAINING_SET, 0) and version is None:  # this run's first take of the lease
            Lease(self, key, "node-b pid 2 run other", clock=lambda: time.time() + 10_000).acquire()
        return written


def test_a_training_run_whose_lease_was_taken_over_does_not_publish(tmp_path):
    store = TakenOverOnAcquire(tmp_path / "store")
    publish_completions(store, 0, healthy_rows(4))
    with pytest.raises(LeaseLost, match="now held by node-b pid 2 run other.*without publishing"):
        assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")
    assert read_training_manifest(store, 0) is None
    assert not any(store.list(shard_prefix(TRAINING_SET, 0)))  # not even the Parquet object
