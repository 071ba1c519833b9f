"""The completions Parquet written from the journal before publishing: one row per planned event, or nothing."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from dagster_project.generation.journal import Journal
from dagster_project.generation.stage import JournalMismatch, write_completions_parquet
from dagster_project.records import STATUS_ERROR, STATUS_OK


def record(event_id: str, status: str = STATUS_OK, *, retryable: bool = False) -> dict:
    answered = status == STATUS_OK
    return {
        "event_id": event_id,
        "status": status,
        "retryable": retryable,
        "finish_reason": "stop" if answered else None,
        "error_kind": None if answered else "timeout",
        "prompt_ids": [1, 2, 3],
        "output_ids": [4, 5] if answered else None,
        "prompt_tokens": 3,
        "completion_tokens": 2 if answered else None,
    }


def test_a_retryable_error_superseded_by_a_result_is_published_once_as_the_result(tmp_path):
    with Journal(tmp_path / "j.jsonl") as journal:
        journal.append(record("a#turn0", STATUS_ERROR, retryable=True))  # a first run's timeout
        journal.append(record("b#turn0"))
        journal.append(record("a#turn0"))  # the resumed run's answer
        journal.append(record("gone#turn0"))  # an event the rebuilt conversations no longer plan
        written = write_completions_parquet(journal, tmp_path / "out.parquet", {"a#turn0", "b#turn0"})
    rows = pq.read_table(tmp_path / "out.parquet").to_pylist()
    assert [(row["event_id"], row["status"]) for row in rows] == [("b#turn0", STATUS_OK), ("a#turn0", STATUS_OK)]
    assert (written.rows, written.ok, written.errors, written.output_tokens) == (2, 2, 0, 4)
    assert written.event_ids == ["b#turn0", "a#turn0"]


class RepeatingJournal(Journal):
    """A journal whose final records repeat one: what a broken index of final records (two lines kept for one
    event) would hand the publisher."""

    def final_records(self):
        records = list(super().final_records())
        yield from records
        yield records[0]


@pytest.mark.parametrize(
    ("kind", "events", "refusal"),
    [
        (Journal, ["a#turn0"], r"\(2 planned, 1 rows written; missing e.g. \['b#turn0'\], repeated e.g. \[\]\)"),
        (
            RepeatingJournal,
            ["a#turn0", "b#turn0"],
            r"\(2 planned, 3 rows written; missing e.g. \[\], repeated e.g. \['a#turn0'\]\)",
        ),
    ],
    ids=["an event missing", "a record yielded twice"],
)
def test_a_journal_without_exactly_one_record_per_planned_event_is_refused_naming_it(tmp_path, kind, events, refusal):
    with kind(tmp_path / "j.jsonl") as journal:
        for event in events:
            journal.append(record(event))
        with pytest.raises(
            JournalMismatch,
            match=r"j.jsonl does not hold exactly one record per planned event " + refusal + r": nothing was published",
        ):
            write_completions_parquet(journal, tmp_path / "out.parquet", {"a#turn0", "b#turn0"})
