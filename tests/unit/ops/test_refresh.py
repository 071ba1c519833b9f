"""When the operator's page is refreshed: the refresh sensor's decision, from its cursor (no Dagster)."""

from __future__ import annotations

from dagster_project.generation.progress import Heartbeat
from dagster_project.ops.refresh import REFRESH_INTERVAL_S, RefreshCursor, decide_refresh, shards_running
from dagster_project.store.dataclass_json import to_json
from dagster_project.store.layout import progress_key
from dagster_project.store.storage import LocalStore
from tests.unit.ops.test_report import beat

NOW = 1_000_000.0


def test_a_run_that_ended_since_the_last_refresh_asks_for_one_even_with_no_shard_running():
    cursor = RefreshCursor(ended_until=NOW - 600, requested_at=NOW - 60)
    decision = decide_refresh(cursor, latest_end=NOW - 10, shards_running=[], refresh_in_progress=False, now=NOW)
    assert decision.reason and "a run ended" in decision.reason
    assert decision.cursor == RefreshCursor(ended_until=NOW - 10, requested_at=NOW)
    assert decision.recount  # nothing runs any more: the page at rest counts coverage by id
    again = decide_refresh(decision.cursor, latest_end=NOW - 10, shards_running=[], refresh_in_progress=False, now=NOW)
    assert again.reason is None and again.cursor == decision.cursor  # that end is answered: once only


def test_an_end_during_a_refresh_waits_for_it_and_is_not_lost():
    cursor = RefreshCursor(ended_until=NOW - 600, requested_at=NOW - 20)
    busy = decide_refresh(cursor, latest_end=NOW - 5, shards_running=[3], refresh_in_progress=True, now=NOW)
    assert busy.reason is None and "still running" in busy.skip_reason and busy.cursor == cursor
    later = decide_refresh(busy.cursor, latest_end=NOW - 5, shards_running=[3], refresh_in_progress=False, now=NOW + 30)
    assert later.reason and not later.recount  # a shard still runs: the recount by id waits


def test_running_shards_refresh_every_interval_and_nothing_happens_when_all_is_quiet():
    cursor = RefreshCursor(
        ended_until=NOW - 600, requested_at=NOW - REFRESH_INTERVAL_S + 1, shards_were_running=True, recounted=False
    )
    soon = decide_refresh(cursor, latest_end=NOW - 600, shards_running=[1, 2], refresh_in_progress=False, now=NOW)
    assert soon.reason is None
    due = decide_refresh(cursor, latest_end=NOW - 600, shards_running=[1, 2], refresh_in_progress=False, now=NOW + 1)
    assert due.reason == "shards [1, 2] are running" and due.cursor.ended_until == NOW - 600
    quiet = decide_refresh(
        RefreshCursor(), latest_end=None, shards_running=[], refresh_in_progress=False, now=NOW + 1e6
    )
    assert quiet.reason is None and "no shard run is in progress" in quiet.skip_reason


def test_the_cursor_round_trips_and_starts_empty():
    cursor = RefreshCursor(ended_until=12.5, requested_at=30.0)
    assert RefreshCursor.from_json(cursor.to_json()) == cursor
    assert RefreshCursor.from_json(None) == RefreshCursor()


def test_the_refresh_reads_which_shards_run_from_their_heartbeats(tmp_path):
    store = LocalStore(tmp_path / "store")
    assert shards_running(store) == []
    store.put_bytes(progress_key(0), to_json(beat()))
    store.put_bytes(progress_key(1), to_json(Heartbeat(**{**beat().__dict__, "shard": 1, "state": "published"})))
    assert shards_running(store) == [0]


def test_a_run_newly_stuck_behind_dead_runs_asks_for_a_refresh_once():
    cursor = RefreshCursor(ended_until=NOW - 600, requested_at=NOW - 60)
    stuck = decide_refresh(
        cursor, latest_end=None, shards_running=[], refresh_in_progress=False, now=NOW, stuck_waiting=("run-b",)
    )
    assert stuck.reason == "runs wait on pool slots held by dead runs" and stuck.cursor.told_waiting == ("run-b",)
    assert RefreshCursor.from_json(stuck.cursor.to_json()) == stuck.cursor
    again = decide_refresh(
        stuck.cursor, latest_end=None, shards_running=[], refresh_in_progress=False, now=NOW, stuck_waiting=("run-b",)
    )
    assert again.reason is None


def test_a_hold_and_its_release_each_ask_for_a_refresh_once_even_while_shards_run():
    cursor = RefreshCursor(ended_until=NOW - 600, requested_at=NOW - 5, shards_were_running=True, recounted=False)
    held = decide_refresh(
        cursor, latest_end=None, shards_running=[0, 1], refresh_in_progress=False, now=NOW, latest_hold_event=NOW - 2
    )
    assert held.reason and "the line was held or released" in held.reason
    again = decide_refresh(
        held.cursor,
        latest_end=None,
        shards_running=[0, 1],
        refresh_in_progress=False,
        now=NOW + 15,
        latest_hold_event=NOW - 2,
    )
    assert again.reason is None
    busy = decide_refresh(
        held.cursor,
        latest_end=None,
        shards_running=[],
        refresh_in_progress=True,
        now=NOW + 30,
        latest_hold_event=NOW + 25,
    )
    assert busy.reason is None and busy.cursor == held.cursor  # the release waits for the refresh in flight
    released = decide_refresh(
        busy.cursor,
        latest_end=None,
        shards_running=[],
        refresh_in_progress=False,
        now=NOW + 45,
        latest_hold_event=NOW + 25,
    )
    assert released.reason and "held or released" in released.reason and released.recount


def test_generation_starting_and_stopping_each_ask_for_a_refresh_and_the_stop_recounts_coverage():
    at_rest = RefreshCursor(ended_until=NOW - 600, requested_at=NOW - 60)
    started = decide_refresh(at_rest, latest_end=None, shards_running=[4], refresh_in_progress=False, now=NOW)
    assert started.reason == "shards [4] started" and not started.recount
    running = decide_refresh(
        started.cursor, latest_end=None, shards_running=[4, 5], refresh_in_progress=False, now=NOW + 15
    )
    assert running.reason is None  # another shard joining is for the regular refresh
    stopped = decide_refresh(
        running.cursor, latest_end=None, shards_running=[], refresh_in_progress=False, now=NOW + 30
    )
    assert stopped.reason and "recounted" in stopped.reason and stopped.recount
    rest = decide_refresh(stopped.cursor, latest_end=None, shards_running=[], refresh_in_progress=False, now=NOW + 45)
    assert rest.reason is None


def test_the_latest_hold_event_is_the_standing_hold_or_the_last_release(tmp_path):
    from dagster_project.generation.line_hold import Hold, put_hold, release_hold
    from dagster_project.ops.refresh import latest_hold_event

    store = LocalStore(tmp_path / "store")
    assert latest_hold_event(store) is None
    hold = Hold("short_answers", "90% short", figure=0.9, threshold=0.1, sample_size=40, scope="fleet", held_at=NOW)
    put_hold(store, hold)
    assert latest_hold_event(store) == NOW
    release_hold(store, by="op", reason="fixed", now=NOW + 100)
    assert latest_hold_event(store) == NOW + 100
