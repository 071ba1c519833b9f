"""`max_new_tokens: fit` (`fit_max_length`): each request asks for what the trainer's row leaves after its prompt, a
prompt that leaves no room is not sent, and the answers it cuts are kept as truncated (not length-capped)."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from dagster_project.generation.events import PREVIOUS_TURN_INCOMPLETE, ShardGeneration
from dagster_project.generation.journal import Journal
from dagster_project.generation.stage import write_completions_parquet
from dagster_project.generation_settings import GenerationSettings
from dagster_project.records import (
    COMPLETION_SCHEMA,
    PREVIOUS_TURN_FIT_CUT,
    PROMPT_FILLS_MAX_LENGTH,
    STATUS_ERROR,
    STATUS_EXCLUDED,
    STATUS_OK,
)
from dagster_project.tokenizer import special_ids
from dagster_project.training import outcomes
from dagster_project.training.shards import AssemblyOptions
from dagster_project.training.stage import assemble_batch
from dagster_project.training.suite import answer_ends, training_frame, validate_training_frame
from dagster_project.training.watch_figures import AnswerQualityWatch
from tests.support.training_shards import completion_row, healthy_output
from tests.unit.generation.test_resume_plan import journaled, two_turns

FIT = GenerationSettings(max_new_tokens=32768, fit_max_length=4096)
FIT_1024 = GenerationSettings(max_new_tokens=32768, fit_max_length=1024)  # the trainer's max_length 1,024


def test_the_cap_is_what_the_row_leaves_and_unset_changes_no_fingerprint():
    assert FIT.request_cap(600) == 3496 and GenerationSettings().request_cap(600) == 32768
    assert GenerationSettings(max_new_tokens=1000, fit_max_length=4096).request_cap(600) == 1000  # the cap binds
    assert FIT.cut_by_fit(600, 3496, "length") and not FIT.cut_by_fit(600, 3000, "stop")
    assert not GenerationSettings().cut_by_fit(600, 32768, "length")  # capped by max_new_tokens: not fit's cut
    assert GenerationSettings().fingerprint() == "46cdac2920d65871"  # as before fit existed
    assert FIT.fingerprint() != GenerationSettings().fingerprint()
    with pytest.raises(ValueError, match="fit_max_length must leave room"):
        GenerationSettings(fit_max_length=2)


def test_each_request_asks_for_the_room_left_and_a_prompt_that_fills_the_row_is_not_sent(tmp_path, tokenizer):
    short, long = two_turns("short"), two_turns("long")
    long.messages[0]["content"] = "word " * 200  # a ~200-token first prompt
    settings = GenerationSettings(fit_max_length=150)
    with Journal(tmp_path / "journal.jsonl") as journal:
        job = ShardGeneration(0, [short, long], tokenizer, settings, journal)
        [request] = list(job.initial_requests())
        assert request.key == "short#turn0"
        assert request.sampling_params["max_new_tokens"] == 150 - len(request.input_ids)
        assert job.progress.excluded_by_reason == {PROMPT_FILLS_MAX_LENGTH: 2}  # both turns of "long"
        assert journal.entries["long#turn1"].final
        # The store shows where the fit boundary fell: the unsent turn's rendered prompt is recorded, past the row.
        assert journal.entries["long#turn0"].prompt_tokens > 150


def test_an_answer_fit_cut_is_kept_truncated_not_length_capped_and_counted_apart(tmp_path):
    rows = [
        completion_row("cut#turn0", [1] * 96, [2] * 4000, finish_reason="length"),  # stopped at its fitted cap
        completion_row("capped#turn0", [1] * 96, [2] * 30, finish_reason="length"),  # below it: capped otherwise
    ]
    batch = pa.RecordBatch.from_pylist(rows, schema=COMPLETION_SCHEMA)
    counted: Counter = Counter()
    training, excluded = assemble_batch(batch, 0, AssemblyOptions(), set(), output_tokens=counted, settings=FIT)
    assert training.column("event_id").to_pylist() == ["cut#turn0"] and training.column("truncated").to_pylist() == [
        True
    ]
    assert excluded == {outcomes.LENGTH_CAPPED: 1} and counted[outcomes.TRAINED] == 4000
    with Journal(tmp_path / "journal.jsonl") as journal:
        for row in rows:
            journal.append({**row, "retryable": False})
        written = write_completions_parquet(journal, tmp_path / "c.parquet", {"cut#turn0", "capped#turn0"}, FIT)
    assert written.counts.cut_by_fit == 1 and written.counts.finish_reasons["length"] == 2


def _cut_rows(fit: GenerationSettings, count: int) -> list[dict]:
    """`count` answers, a third of them stopped by `length` at what the settings allow their prompt (of 96 tokens
    and more: prompts differ, and so do the fit-cut answers' lengths, or the supervised length's concentration
    would hold on them)."""
    return [
        completion_row(f"c{i}#turn0", [1] * (96 + i), healthy_output(i), finish_reason="stop")
        if i % 3
        else completion_row(f"c{i}#turn0", [1] * (96 + i), [2] * fit.request_cap(96 + i), finish_reason="length")
        for i in range(count)
    ]


@pytest.mark.parametrize("fit_on", [True, False], ids=["fit-cut", "length-capped"])
def test_the_watch_counts_a_fit_cut_answer_as_fit_cut_and_a_truly_capped_fleet_still_holds(fit_on, tokenizer):
    # The same answers: cut at a 1,024-token row's budget under fit, or at max_new_tokens (as many tokens) without.
    settings = FIT_1024 if fit_on else GenerationSettings(max_new_tokens=FIT_1024.request_cap(96))
    watch = AnswerQualityWatch(special_ids(tokenizer), tokenizer.decode, settings=settings)
    for row in _cut_rows(FIT_1024, 60):
        watch.observe(row)
    judged = watch.judge(watch.rows())
    capped = next(f for f in judged.figures if f.gate == "length_capped_rate")
    if fit_on:
        assert judged.failed is None and capped.figure == 0.0 and capped.passed
    else:
        assert judged.failed is not None and judged.failed.gate == "length_capped_rate" and capped.figure > 0.3


def test_the_suite_passes_fit_cut_rows_and_blocks_truly_capped_ones():
    rows = _cut_rows(FIT_1024, 12)
    batch = pa.RecordBatch.from_pylist(rows, schema=COMPLETION_SCHEMA)
    options = AssemblyOptions(max_length=1024, exclude_length_capped=False)  # keeps the `length` rows to judge
    training, _ = assemble_batch(batch, 0, options, set(), settings=FIT_1024)
    assert training.num_rows == 12

    def suite(settings: GenerationSettings | None):
        frame = training_frame([training], settings)
        return validate_training_frame(frame, shard=0, rows=12, max_length=1024, finish_reasons=answer_ends(True))

    assert suite(FIT_1024).success, suite(FIT_1024).message
    blocked = suite(GenerationSettings(max_new_tokens=FIT_1024.request_cap(96)))  # cut by max_new_tokens: capped
    assert not blocked.success and "finish_reason: 4 unexpected" in blocked.message, blocked.message


def test_a_later_turn_after_a_fit_cut_answer_is_not_sent_and_no_error(tmp_path, tokenizer):
    cut, capped = two_turns("cut"), two_turns("capped")
    fit = GenerationSettings(fit_max_length=1024)
    with Journal(tmp_path / "journal.jsonl") as journal:  # what an earlier run journaled
        journal.append(
            journaled("cut#turn0", STATUS_OK, finish_reason="length", prompt_tokens=24, completion_tokens=1000)
        )
        journal.append(
            journaled("capped#turn0", STATUS_OK, finish_reason="length", prompt_tokens=24, completion_tokens=9)
        )

    with Journal(tmp_path / "journal.jsonl") as journal:
        job = ShardGeneration(0, [cut, capped], tokenizer, fit, journal)
        assert list(job.initial_requests()) == []
        assert job.progress.excluded_by_reason == {PREVIOUS_TURN_FIT_CUT: 1}
    records = {record["event_id"]: record for record in journal.final_records()}
    assert records["cut#turn1"]["status"] == STATUS_EXCLUDED
    assert records["cut#turn1"]["error_kind"] == PREVIOUS_TURN_FIT_CUT
    assert "fit_max_length 1,024" in records["cut#turn1"]["error_message"]
    # An answer cut short of its budget is not fit's cut: the later turn is an error, as before.
    assert records["capped#turn1"]["status"] == STATUS_ERROR
    assert records["capped#turn1"]["error_kind"] == PREVIOUS_TURN_INCOMPLETE
