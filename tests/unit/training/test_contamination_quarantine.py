"""A conversation caught by the contamination scan is excluded from the training set as eval_contamination
(action quarantine, the default), listed only (action report), and a report about other conversations is
refused."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dagster_project.conversations.contamination import (
    EVAL_CONTAMINATION,
    REPORT,
    ContaminationOptions,
    ContaminationReportStale,
    read_report,
    scan_conversations,
    write_report,
)
from dagster_project.generation.stage import not_to_send
from dagster_project.tokenizer import render_prompt_ids
from dagster_project.training.shards import iter_training_batches
from dagster_project.training.stage import AssemblyOptions, assemble_shard
from tests.support.ingest_helpers import run_stages
from tests.support.paths import require_shared
from tests.support.training_shards import completion_row, healthy_output, publish_completions, tokenizer

NOT_SENT_WHY = "matched to an evaluation set by the contamination report"
MT_BENCH_81 = (
    "Compose an engaging travel blog post about a recent trip to Hawaii, highlighting cultural experiences "
    "and must-see attractions."
)


@pytest.fixture
def outcome(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    questions = [f"Question {i}: how many apples does a farmer with {i} trees pick in a week?" for i in range(5)]
    questions[2] = "  " + MT_BENCH_81.upper().replace(" ", "   \n")  # whitespace and case only
    prompts.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": q}]}) for q in questions))
    return run_stages(tmp_path, [str(prompts)], num_shards=1)


def _assemble_all(outcome, tmp_path) -> tuple[set[str], dict]:
    tok = tokenizer()
    rows = [
        completion_row(c.event_id(0), render_prompt_ids(tok, c.messages), healthy_output(i), source=c.source)
        for i, c in enumerate(outcome.conversations)
    ]
    publish_completions(outcome.store, 0, rows)
    manifest = assemble_shard(outcome.store, 0, AssemblyOptions(), tmp_path / "staging")
    kept = {row["conversation_id"] for batch in iter_training_batches(outcome.store, 0) for row in batch.to_pylist()}
    return kept, manifest.exclusions


def test_a_contaminated_conversation_is_quarantined_from_the_training_set(outcome, tmp_path):
    eval_file = require_shared("data/eval_sets/mt_bench/question.jsonl")
    report = scan_conversations(outcome.store, ContaminationOptions(eval_files=[str(eval_file)]))
    write_report(outcome.store, report)
    assert (report.conversations, report.messages, report.eval_texts) == (5, 5, {"mt_bench/question.jsonl": 160})
    [match] = report.matches
    assert (match.eval_set, match.eval_item, match.shard) == ("mt_bench/question.jsonl", "81", 0)
    contaminated = match.conversation_id

    kept, exclusions = _assemble_all(outcome, tmp_path)
    assert exclusions == {EVAL_CONTAMINATION: 1}
    assert kept == {c.id for c in outcome.conversations} - {contaminated}
    # Generation reads the same verdict before it sends anything: the match is not sent.
    assert not_to_send(outcome.store, 0, print) == {contaminated: (EVAL_CONTAMINATION, NOT_SENT_WHY)}

    write_report(
        outcome.store, replace(report, options=ContaminationOptions(eval_files=[str(eval_file)], action=REPORT))
    )
    kept, exclusions = _assemble_all(outcome, tmp_path)
    assert exclusions == {} and contaminated in kept
    assert not_to_send(outcome.store, 0, print) == {}  # listed only: generated


def test_a_report_about_other_conversations_is_refused(outcome, tmp_path):
    report = scan_conversations(outcome.store, ContaminationOptions())
    write_report(outcome.store, replace(report, shard_digests={"0": "an earlier publication"}))
    assert read_report(outcome.store).matches == []
    with pytest.raises(ContaminationReportStale, match="run the conversations check eval_contamination again"):
        _assemble_all(outcome, tmp_path)
    said: list[str] = []  # generation sends everything, saying why; training_set refuses the report (above)
    assert not_to_send(outcome.store, 0, said.append) == {} and "sending every conversation" in said[0]
