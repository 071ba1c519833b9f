"""A release keeps what is good: the hold records its onset (the first answer that fails the holding gate on its
own), and a release without --override condemns the journal's answers from there, not from the held run's start;
`--drop-all` condemns them from the run's start, as before."""

from __future__ import annotations

import pytest

from dagster_project.generation.journal import Journal, drop_records_between
from dagster_project.generation.line_hold import read_hold, release_hold
from dagster_project.generation.line_stop import LineStop, WatchOptions, condemned_answers
from dagster_project.generation_settings import GenerationSettings
from dagster_project.store.storage import LocalStore
from dagster_project.tokenizer import special_ids
from dagster_project.training.watch_figures import AnswerQualityWatch
from tests.support.training_shards import disaster_rows, healthy_rows, tokenizer

GOOD, BAD = 30, 60  # answers before the fleet went bad, and after


def _watch() -> AnswerQualityWatch:
    tok = tokenizer()
    return AnswerQualityWatch(special_ids(tok), tok.decode, settings=GenerationSettings())


def _switched_bad(start: float = 1000.0, run: int = 0) -> list[dict]:
    """A run's answers, one a second from `start`: `GOOD` healthy ones, then `BAD` empty-reasoning "OK." ones
    (event ids of their own for each `run`)."""
    rows = healthy_rows(GOOD, shard=2 * run) + disaster_rows(BAD, broken_share=1.0, shard=2 * run + 1)
    for second, row in enumerate(rows):
        row["finished_at"] = start + second
    return rows


def _held(store: LocalStore, rows: list[dict], started_at: float = 999.0) -> LineStop:
    stop = LineStop(store, 4, _watch(), "fp", run_id="run-1", options=WatchOptions(watch_min_answers=50))
    stop.started_at = started_at
    for row in rows:
        stop.observe(row)
    stop.close()
    assert read_hold(store) is not None
    return stop


def test_the_hold_records_as_its_onset_the_first_answer_that_fails_the_gate_on_its_own(tmp_path):
    store = LocalStore(tmp_path)
    rows = _switched_bad()
    _held(store, rows)
    hold = read_hold(store)
    assert hold.gate == "thinking_structure"
    assert hold.onset == rows[GOOD]["finished_at"] == 1000.0 + GOOD


def test_the_fleets_onset_is_its_earliest_failing_answer_whichever_run_wrote_it():
    """The fleet's rows come run by run: the onset is by finish time, not by the run that judged them."""
    watch = _watch()
    late, early = _switched_bad(start=2000.0, run=1), _switched_bad(start=1000.0, run=2)
    rows = [watch.compact(row) for row in late + early]
    assert watch.judge(rows).onset == 1000.0 + GOOD


def test_a_release_condemns_from_the_onset_and_keeps_the_good_answers_before_it(tmp_path):
    store = LocalStore(tmp_path)
    rows = _switched_bad()
    _held(store, rows)
    release_hold(store, by="test", reason="restarted the fleet", now=5000.0)
    assert condemned_answers(store, 4, "fp") == (1000.0 + GOOD, 5000.0)

    journal = tmp_path / "j.jsonl"
    with Journal(journal) as writing:
        for row in rows:
            writing.append(row)
    dropped = drop_records_between(journal, *condemned_answers(store, 4, "fp"))
    assert dropped.records == BAD and dropped.output_tokens == sum(row["completion_tokens"] for row in rows[GOOD:])
    with Journal(journal) as kept:
        assert [r["event_id"] for r in kept.final_records()] == [row["event_id"] for row in rows[:GOOD]]


def test_another_shard_held_by_the_same_hold_is_condemned_from_its_runs_start(tmp_path):
    """The onset was found in shard 4's answers: shard 5's answers after its last report were not seen, so its run is
    condemned whole."""
    store = LocalStore(tmp_path)
    _held(store, _switched_bad())
    other = LineStop(store, 5, _watch(), "fp", run_id="run-2")
    other.started_at = 1500.0
    assert other.poll() is not None  # it sees the hold: its report says held
    release_hold(store, by="test", reason="restarted the fleet", now=5000.0)
    assert condemned_answers(store, 5, "fp") == (1500.0, 5000.0)
    assert condemned_answers(store, 4, "fp") == (1000.0 + GOOD, 5000.0)


def test_drop_all_condemns_the_held_runs_answers_from_its_start_as_before(tmp_path):
    store = LocalStore(tmp_path)
    _held(store, _switched_bad(), started_at=999.0)
    release_hold(store, by="test", reason="not sure when it went bad", drop_all=True, now=5000.0)
    assert condemned_answers(store, 4, "fp") == (999.0, 5000.0)


def test_an_onset_the_watch_cannot_see_whole_is_unknown_and_the_run_is_condemned_whole(tmp_path, monkeypatch):
    """A run with more answers than the watch keeps may have failed before its window: no onset is claimed."""
    monkeypatch.setattr("dagster_project.training.watch_figures.WINDOW", 50)
    store = LocalStore(tmp_path)
    watch = _watch()
    stop = LineStop(store, 4, watch, "fp", run_id="run-1", options=WatchOptions(watch_min_answers=40))
    stop.started_at = 999.0
    for row in _switched_bad():
        stop.observe(row)
    stop.close()
    hold = read_hold(store)
    assert hold is not None and hold.onset is None
    release_hold(store, by="test", reason="restarted the fleet", now=5000.0)
    assert condemned_answers(store, 4, "fp") == (999.0, 5000.0)


@pytest.mark.parametrize("override", [True, False])
def test_a_false_alarm_condemns_nothing_with_or_without_an_onset(tmp_path, override):
    store = LocalStore(tmp_path)
    _held(store, _switched_bad())
    release_hold(store, by="test", reason="r", override=[read_hold(store).gate] if override else [], now=5000.0)
    assert (condemned_answers(store, 4, "fp") is None) == override
