"""Conversations the contamination report quarantines are not sent: each of their turns ends as an `excluded`
record naming its reason, so exactly-once coverage counts it (never missing, never an error), and the training
set excludes it under that reason."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from dagster_project.generation.events import ShardGeneration
from dagster_project.generation.journal import Journal
from dagster_project.generation.stage import write_completions_parquet
from dagster_project.generation_settings import GenerationSettings
from dagster_project.records import EVAL_CONTAMINATION, STATUS_EXCLUDED
from dagster_project.training.shards import AssemblyOptions
from dagster_project.training.stage import COMPLETION_COLUMNS, assemble_batch
from tests.unit.generation.test_resume_plan import two_turns

WHY = (EVAL_CONTAMINATION, "matched to an evaluation set by the contamination report")


def test_a_quarantined_conversation_is_not_requested_and_each_turn_is_counted_excluded(tmp_path, tokenizer):
    kept, matched = two_turns("kept"), two_turns("matched")
    with Journal(tmp_path / "journal.jsonl") as journal:
        job = ShardGeneration(0, [kept, matched], tokenizer, GenerationSettings(), journal, {"matched": WHY})
        assert [request.key for request in job.initial_requests()] == ["kept#turn0"]
        assert job.progress.excluded_by_reason == {EVAL_CONTAMINATION: 2} and not job.progress.errors_by_kind
        assert job.progress.remaining_events() == 2  # only the conversation sent
        for turn in (0, 1):
            journal.append({"event_id": f"kept#turn{turn}", "status": "ok", "retryable": False})
        planned = {"kept#turn0", "kept#turn1", "matched#turn0", "matched#turn1"}
        written = write_completions_parquet(journal, tmp_path / "completions.parquet", planned)
    assert (written.rows, written.ok, written.errors, written.excluded) == (4, 2, 0, 2)
    assert dict(written.counts.excluded_by_reason) == {EVAL_CONTAMINATION: 2}
    table = pq.read_table(tmp_path / "completions.parquet")
    not_sent = [row for row in table.to_pylist() if row["status"] == STATUS_EXCLUDED]
    assert [row["error_message"] for row in not_sent] == [f"not generated: {WHY[1]}"] * 2
    batch = pa.RecordBatch.from_pylist(not_sent, schema=table.schema).select(COMPLETION_COLUMNS)
    _, excluded = assemble_batch(batch, 0, AssemblyOptions(), set())  # no report read: the record says why
    assert excluded == {EVAL_CONTAMINATION: 2}
