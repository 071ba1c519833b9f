"""The events count through a hold, as the operator hand check saw it (a 4-shard job of 270 events held, released,
run again): "events 127/270" while the held runs drained, then "0/270" once they ended, the journaled answers
gone from every count with no word on why. They are shown as the held runs' own figure beside the events done, in
`dflash status`, its JSON and the page's first screen, until the shards run again (then counted once, in the run)."""

from __future__ import annotations

import dataclasses
import json
import time

from dagster_project.generation.heartbeat import write_heartbeat
from dagster_project.generation.line_hold import Hold, put_hold, release_hold
from dagster_project.generation.progress import Heartbeat
from dagster_project.ops.alerts import DEFAULT_THRESHOLDS
from dagster_project.ops.answers.cost import NO_PRICE
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.report import GLANCE_LINE_CHARS, report_sections
from dagster_project.ops.status import Status, answer_all, render_text, take_readings
from dagster_project.processes import this_process
from dagster_project.store.storage import LocalStore
from tests.support.heartbeats import heartbeat

HOST, PID, STARTED = this_process()
PLANNED = 270
HELD_AT = time.time() - 600
HOLD = Hold("thinking_structure", "55% blank", 0.55, 0.01, 103, "fleet", HELD_AT, shards=[0, 1])


def ended(shard: int, done: int, at: float) -> Heartbeat:
    """A run that stopped before publishing (state failed), `done` answers in its journal."""
    return heartbeat(shard, state="failed", done=done, updated_at=at)


def live(shard: int, done: int, resumed: int = 0) -> Heartbeat:
    """A run of this process, at work: `done` answers in its journal, `resumed` of them from earlier runs."""
    return dataclasses.replace(
        heartbeat(shard, done=done, host=HOST, pid=PID, process_start=STARTED, heartbeat_interval_s=5.0),
        resumed_events=resumed,
    )


def status_of(tmp_path, beats: list[Heartbeat], *, hold: Hold | None = None) -> Status:
    return answered(
        LocalStore(tmp_path), Readings(time.time(), 4, None, None, PLANNED, {}, beats, {}, None, None, hold=hold)
    )


def from_store(store: LocalStore) -> Status:
    """As `dflash status` reads the store (the 4 shards' plan of 270 events is no part of these tests)."""
    readings = take_readings(store, [], api_key=None, now=time.time())
    return answered(store, dataclasses.replace(readings, num_shards=4, events_planned=PLANNED))


def answered(store: LocalStore, readings: Readings) -> Status:
    return answer_all(
        store,
        readings,
        current_fingerprint=None,
        materialized=None,
        cost=NO_PRICE,
        thresholds=DEFAULT_THRESHOLDS,
        endpoints_known=False,
    )


def glance(status: Status) -> str:
    """The first screen's answer to question 1, as the page draws it."""
    return report_sections(status)[0].text.split("  \n")[1].removeprefix("1. ")


def test_while_held_the_held_runs_answers_stand_beside_the_events_done_in_status_its_json_and_the_page(tmp_path):
    draining = status_of(tmp_path, [live(0, 80), live(1, 47)], hold=HOLD)
    assert "events 127/270 (47.0%), shards running 2 (0-1)" in render_text(draining)

    # Shard 0's run ended (80 journaled), shard 1's drains on (47 so far): no answer leaves the count unsaid.
    half = status_of(tmp_path, [ended(0, 80, HELD_AT + 30), live(1, 47)], hold=HOLD)
    said = "events 47/270 (17.4%) + 80 answered by the held shard runs (kept or dropped at the release)"
    assert said in render_text(half)

    both = status_of(tmp_path, [ended(0, 80, HELD_AT + 30), ended(1, 47, HELD_AT + 40)], hold=HOLD)
    text = render_text(both)
    assert "   events 0/270 (0.0%) + 127 answered by the held shard runs (kept or dropped at the release), " in text
    progress = json.loads(json.dumps(dataclasses.asdict(both)))["progress"]
    assert (progress["events_done"], progress["held_runs_answers"]) == (0, 127)
    (page_progress,) = [section for section in report_sections(both) if section.title == "1. Progress vs plan"]
    assert page_progress.text.startswith("0 of 270 events (0.0%) + 127 answered by the held shard runs")
    # The first screen's line says it in a few words, and fits its line at 1,440 px, draining or drained.
    assert glance(both) == "0/270 events (0.0%) +127 held; ETA none"
    assert glance(half) == "47/270 events (17.4%) +80 held; ETA none"
    assert glance(draining) == "127/270 events (47.0%); ETA none (held)"
    assert all(len(line) <= GLANCE_LINE_CHARS for line in map(glance, (both, half, draining)))


def test_released_the_answers_stay_shown_until_the_shards_run_again_and_are_then_counted_once(tmp_path):
    """Read from the store as `dflash status` reads it: the held runs' last heartbeats and the released hold."""
    store = LocalStore(tmp_path)
    put_hold(store, HOLD)
    runs = [ended(0, 80, HELD_AT + 30), ended(1, 47, HELD_AT + 40)]
    for run in runs:
        write_heartbeat(store, run, first=True)
    release_hold(store, by="ops", reason="fixed the fleet", now=HELD_AT + 300)
    waiting = from_store(store)
    assert waiting.progress.held_runs_answers == 127 and not waiting.progress.held
    assert (
        "events 0/270 (0.0%) + 127 answered by the held shard runs (kept or dropped as the release said, once their "
        "shards run again)" in render_text(waiting)
    )
    assert glance(waiting) == "0/270 events (0.0%) +127 held; ETA none (idle)"

    # Shard 0 runs again from its journal (70 kept by the release, 5 more since); shard 1 not yet.
    write_heartbeat(store, live(0, 75, resumed=70), first=True)
    again = from_store(store)
    assert (again.progress.events_done, again.progress.held_runs_answers) == (75, 47)


def test_a_run_that_failed_with_no_hold_standing_is_no_held_run(tmp_path):
    """Failed before the hold (its own error): its answers are not the held runs', and nothing says so."""
    status = status_of(tmp_path, [ended(2, 9, HELD_AT - 60)], hold=HOLD)
    assert status.progress.held_runs_answers == 0 and "held shard runs" not in render_text(status)


def test_the_runs_the_standing_hold_stopped_are_not_listed_as_failed_shards(tmp_path):
    """While held, the hold's verdict names the held shards and the command: a "shard runs failed" alert listing
    the same runs again is noise. A run that failed on its own, before the hold, is still one."""
    status = status_of(tmp_path, [ended(0, 80, HELD_AT + 30), ended(1, 47, HELD_AT + 40), ended(2, 9, HELD_AT - 60)])
    assert status.progress.shards_failed == [0, 1, 2]  # no hold: each is a failed run
    held = status_of(
        tmp_path, [ended(0, 80, HELD_AT + 30), ended(1, 47, HELD_AT + 40), ended(2, 9, HELD_AT - 60)], hold=HOLD
    )
    assert held.progress.shards_failed == [2]
    assert [a.message for a in held.alerts if a.kind == "shards"] == ["shard runs failed and unpublished: [2]"]
