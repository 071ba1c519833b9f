"""The Great Expectations suite on a training shard: counts agree with the token lists, ids unique, ranges."""

from __future__ import annotations

import pyarrow as pa

from dagster_project.records import COMPLETION_SCHEMA, TRAINING_SCHEMA
from dagster_project.training.stage import AssemblyOptions, assemble_batch
from dagster_project.training.suite import ShardFrame, training_frame, validate_training_frame, validate_training_frames
from tests.support.training_shards import completion_row


def _training() -> pa.RecordBatch:
    rows = [completion_row(f"c{i}#turn0", [1, 2, 3], [10 + i, 11, 12, 248046], shard=5) for i in range(6)]
    batch, _ = assemble_batch(pa.RecordBatch.from_pylist(rows, schema=COMPLETION_SCHEMA), 5, AssemblyOptions(), set())
    return batch


def _validate(batches: list[pa.RecordBatch], rows: int = 6):
    return validate_training_frame(
        training_frame(batches), shard=5, rows=rows, max_length=None, finish_reasons=["stop"]
    )


def test_a_well_formed_shard_meets_every_expectation():
    outcome = _validate([_training()])
    assert outcome.success and outcome.evaluated == outcome.successful == 17
    assert outcome.message == "ok: all 17 expectations met"


def test_counts_that_disagree_with_the_lists_are_caught():
    rows = _training().to_pylist()
    rows[1]["num_loss_tokens"] = 9  # the column claims more supervised tokens than the mask holds
    rows[2]["loss_mask"][-1] = 2  # not a 0/1 mask
    rows[3]["event_id"] = rows[0]["event_id"]  # the same event twice
    outcome = _validate([pa.RecordBatch.from_pylist(rows, schema=TRAINING_SCHEMA)])
    assert not outcome.success
    for failure in (
        "expect_column_pair_values_to_be_equal on mask_sum vs num_loss_tokens: 2 unexpected (e.g. [(4, 9), (5, 4)])",
        "expect_column_values_to_be_between on mask_max: 1 unexpected (e.g. [2])",
        "expect_column_values_to_be_unique on event_id: 2 unexpected (e.g. ['c0#turn0', 'c0#turn0'])",
    ):
        assert failure in outcome.failed
    assert outcome.message.startswith("BLOCKED: ")


def test_an_empty_shard_fails_on_its_row_count_instead_of_erroring():
    outcome = _validate([], rows=6)
    assert not outcome.success
    assert outcome.failed == ["expect_table_row_count_to_equal on table: observed 0"]


def _shard(shard: int, *, bad: bool = False) -> ShardFrame:
    rows = [completion_row(f"s{shard}c{i}#turn0", [1, 2, 3], [10 + i, 11, 12, 248046], shard=shard) for i in range(4)]
    batch, _ = assemble_batch(
        pa.RecordBatch.from_pylist(rows, schema=COMPLETION_SCHEMA), shard, AssemblyOptions(), set()
    )
    if bad:  # the column claims more supervised tokens than the mask holds
        rows = batch.to_pylist()
        rows[1]["num_loss_tokens"] = 9
        batch = pa.RecordBatch.from_pylist(rows, schema=TRAINING_SCHEMA)
    return ShardFrame(shard, training_frame([batch]), rows=4, max_length=None, finish_reasons=["stop"])


def test_shards_validated_together_block_only_the_bad_one_with_its_own_message():
    shards = [_shard(1), _shard(2, bad=True), _shard(3)]
    outcomes = validate_training_frames(shards)
    assert list(outcomes) == [1, 2, 3]
    alone = validate_training_frame(shards[1].frame, shard=2, rows=4, max_length=None, finish_reasons=["stop"])
    assert not outcomes[2].success and outcomes[2].message == alone.message
    assert "expect_column_pair_values_to_be_equal on mask_sum vs num_loss_tokens: 1 unexpected" in outcomes[2].message
    for shard in (1, 3):
        assert outcomes[shard].success and outcomes[shard].message == "ok: all 17 expectations met"
        assert {"expectation": "expect_column_values_to_be_in_set", "value_set": [shard]} in [
            {"expectation": r["expectation"], "value_set": r["kwargs"].get("value_set")}
            for r in outcomes[shard].results
            if r["kwargs"].get("column") == "shard"
        ]


def test_shards_that_pass_together_each_report_their_own_passing_suite():
    outcomes = validate_training_frames([_shard(1), _shard(2)])
    for shard, outcome in outcomes.items():
        alone = validate_training_frame(
            _shard(shard).frame, shard=shard, rows=4, max_length=None, finish_reasons=["stop"]
        )
        assert (outcome.success, outcome.evaluated, outcome.successful, outcome.failed) == (True, 17, 17, [])
        assert sorted(_without_batch(outcome.results), key=str) == sorted(_without_batch(alone.results), key=str)


def test_a_row_filed_under_another_shard_fails_that_shard_even_when_validated_together():
    misfiled = _shard(2)
    misfiled.frame.loc[0, "shard"] = 1  # its rows say shard 1; shard 1's own check would not see it
    outcomes = validate_training_frames([_shard(1), misfiled])
    assert outcomes[1].success and not outcomes[2].success
    assert "expect_column_values_to_be_in_set on shard: 1 unexpected (e.g. [1])" in outcomes[2].failed


def _without_batch(results: list[dict]) -> list[dict]:
    return [{**r, "kwargs": {k: v for k, v in r["kwargs"].items() if k != "batch_id"}} for r in results]
