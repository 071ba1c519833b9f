"""`max_new_tokens: fit` (`fit_max_length`): each request asks for what the trainer's row leaves after its prompt, a
prompt that leaves no room is not sent, and the answers it cuts are kept as truncated (not length-capped)."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest

from dagster_project.generation.events import ShardGeneration
from dagster_project.generation.journal import Journal
from dagster_project.generation.stage import write_completions_parquet
from dagster_project.generation_settings import GenerationSettings
from dagster_project.records import COMPLETION_SCHEMA, PROMPT_FILLS_MAX_LENGTH
from dagster_project.training import outcomes
from dagster_project.training.shards import AssemblyOptions
from dagster_project.training.stage import assemble_batch
from tests.support.training_shards import completion_row
from tests.unit.generation.test_resume_plan import two_turns

FIT = GenerationSettings(max_new_tokens=32768, fit_max_length=4096)


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
