import os

import orjson
import pytest

from dagster_project.generation.journal import Journal, JournalBusy, JournalCorrupt, drop_records_between


def record(event_id: str, status: str = "ok", retryable: bool = False, **extra) -> dict:
    return {"event_id": event_id, "status": status, "retryable": retryable, "finish_reason": "stop", **extra}


def test_records_survive_reopen_and_duplicates_are_refused(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as journal:
        assert journal.append(record("a#turn0", history_message={"content": "hi", "reasoning_content": "r"}))
        assert journal.append(record("b#turn0"))
        assert not journal.append(record("a#turn0"))  # first final record wins
    with Journal(path) as journal:
        assert set(journal.entries) == {"a#turn0", "b#turn0"}
        assert journal.entries["a#turn0"].history_message == {"content": "hi", "reasoning_content": "r"}
        assert [r["event_id"] for r in journal.final_records()] == ["a#turn0", "b#turn0"]


def test_torn_last_line_is_cut_off_and_the_journal_stays_appendable(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as journal:
        journal.append(record("a#turn0"))
    good_size = path.stat().st_size
    with open(path, "ab") as handle:  # what a SIGKILL in the middle of a write leaves behind
        handle.write(orjson.dumps(record("b#turn0"))[:17])
    with Journal(path) as journal:
        assert journal.torn_bytes_dropped == 17
        assert set(journal.entries) == {"a#turn0"}
        assert path.stat().st_size == good_size
        journal.append(record("b#turn0"))
    with Journal(path) as journal:
        assert set(journal.entries) == {"a#turn0", "b#turn0"}


def test_a_complete_line_without_its_newline_counts_as_torn(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_bytes(orjson.dumps(record("a#turn0")) + b"\n" + orjson.dumps(record("b#turn0")))
    with Journal(path) as journal:
        assert set(journal.entries) == {"a#turn0"}


def test_damage_before_the_last_line_is_an_error(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_bytes(b'{"event_id": "a#tu\n' + orjson.dumps(record("b#turn0")) + b"\n")
    with pytest.raises(JournalCorrupt, match="line 1"):
        Journal(path)


def test_a_retryable_error_is_superseded_by_a_later_result_but_a_final_error_is_not(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as journal:
        journal.append(record("a#turn0", status="error", retryable=True))
        journal.append(record("b#turn0", status="error", retryable=False))
        assert not journal.is_final("a#turn0") and journal.is_final("b#turn0")
        assert journal.append(record("a#turn0"))
        assert not journal.append(record("b#turn0"))
    with Journal(path) as journal:
        # One record per event id, in journal order: the superseded error of a#turn0 (line 1) is not among them.
        finals = [(r["event_id"], r["status"]) for r in journal.final_records()]
        assert finals == [("b#turn0", "error"), ("a#turn0", "ok")]


def test_a_second_writer_of_the_same_journal_is_refused_naming_the_holder(tmp_path):
    path = tmp_path / "j.jsonl"
    with Journal(path) as journal:
        journal.append(record("a#turn0"))
        with pytest.raises(JournalBusy, match=f"in use by pid {os.getpid()}"):
            Journal(path)
        assert journal.append(record("b#turn0"))  # the refused opener changed nothing
    with Journal(path) as journal:
        assert set(journal.entries) == {"a#turn0", "b#turn0"}


def test_the_records_finished_in_a_window_are_dropped_and_the_rest_kept_in_order(tmp_path):
    """What a hold released without --override condemns: the answers a held run journaled (`drop_records_between`);
    the journal reopens with the rest, and the dropped events may be answered again."""
    path = tmp_path / "j.jsonl"
    with Journal(path) as journal:
        for event_id, finished_at in (("a#turn0", 10.0), ("b#turn0", 20.0), ("a#turn1", 25.0), ("c#turn0", 40.0)):
            journal.append(record(event_id, finished_at=finished_at))
    with open(path, "ab") as handle:
        handle.write(b'{"event_id": "d#turn0", "finis')  # a torn last line goes as opening would drop it

    assert drop_records_between(path, 20.0, 40.0).records == 2
    with Journal(path) as journal:
        assert [r["event_id"] for r in journal.final_records()] == ["a#turn0", "c#turn0"]
        assert journal.append(record("b#turn0", finished_at=50.0))  # asked again
    assert drop_records_between(path, 20.0, 40.0).records == 0  # once dropped, the window holds nothing of a later run
    assert drop_records_between(tmp_path / "none.jsonl", 0.0, 1.0).records == 0


def test_the_first_final_record_wins_when_the_file_holds_two(tmp_path):
    """A journal restored from checkpoints, or written by a late answer before the guard, may hold two final records
    of one event: reading it back, the first stands (the one a resume, the Parquet and the coverage all agree on)."""
    path = tmp_path / "j.jsonl"
    first = record("a#turn0", text="first answer")
    late = record("a#turn0", text="a late answer", finish_reason="length")
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in (first, record("b#turn0"), late)))
    with Journal(path) as journal:
        assert journal.entries["a#turn0"].finish_reason == "stop" and journal.entries["a#turn0"].line == 0
        assert [r.get("text") for r in journal.final_records() if r["event_id"] == "a#turn0"] == ["first answer"]
