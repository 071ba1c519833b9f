"""The Great Expectations suite on a training shard: counts agree with the token lists, ids unique, ranges."""

from __future__ import annotations

import pyarrow as pa

from dagster_project.records import COMPLETION_SCHEMA, TRAINING_SCHEMA
from dagster_project.training.stage import AssemblyOptions, assemble_batch
from dagster_project.training.suite import training_frame, validate_training_frame
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
