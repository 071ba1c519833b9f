"""When the operator's page (the `run_report` asset) is worth recomputing: the decision of its refresh sensor.

What makes the page out of date:

* a run of the pipeline ended (a shard published or failed, a backfill's last run ended): its state changed
  once, and the page must show it at the next sensor tick, whether or not any shard still runs;
* the line was held or released: the page's verdict changes at once (within a tick and the refresh run's time);
* generation started (no shard ran at the last refresh, one runs now) or stopped (the last one ended): "shards
  running" changes meaning, and once none runs the page recounts coverage by id, so a finished job never reads
  "done 0" until some later refresh;
* shard runs are in progress (live heartbeats): their figures move all the time, so the page follows them every
  `REFRESH_INTERVAL_S`;
* a run started waiting for a pool slot that dead runs hold (`ops.pool_slots`): the page's alert names them.

The sensor reads run records and heartbeats; this module only decides, from the cursor the sensor keeps, so the
rules are plain functions with plain tests.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass

from dagster_project.generation.heartbeat import read_heartbeats, run_is_alive
from dagster_project.generation.line_hold import read_hold, read_hold_log
from dagster_project.store.storage import Store

# How often the sensor looks (Dagster's sensor interval): a run's end, a hold or a release shows on the page within
# this, plus the refresh run's own time (~10 s to start a run on a quiet head node).
SENSOR_TICK_S = 15
# While shards run and none ends, the page follows their heartbeats this often.
REFRESH_INTERVAL_S = 180


@dataclass(frozen=True)
class RefreshCursor:
    """What the refreshes asked for so far have covered (the sensor's cursor, as JSON)."""

    # The latest end of a run or a backfill a refresh was asked for after (epoch seconds).
    ended_until: float = 0.0
    # When the last refresh was asked for.
    requested_at: float = 0.0
    # Runs waiting on a pool slot held by dead runs that a refresh was asked for (the page's alert names them).
    told_waiting: tuple[str, ...] = ()
    # The latest hold or release of the line a refresh was asked for after (epoch seconds).
    hold_events_until: float = 0.0
    # Whether shards ran at the last refresh asked for, and whether that refresh recounted coverage by id.
    shards_were_running: bool = False
    recounted: bool = True

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | None) -> RefreshCursor:
        if not text:
            return cls()
        fields = json.loads(text)
        return cls(**{**fields, "told_waiting": tuple(fields.get("told_waiting", ()))})


@dataclass(frozen=True)
class RefreshDecision:
    """Whether to ask for a refresh now: `reason` when so (None: skip, `skip_reason` says why), the cursor to keep,
    and whether the refresh recounts coverage by id (only once no shard runs: it reads every shard's ids)."""

    reason: str | None
    skip_reason: str | None
    cursor: RefreshCursor
    recount: bool = False


def decide_refresh(
    cursor: RefreshCursor,
    *,
    latest_end: float | None,
    shards_running: list[int],
    refresh_in_progress: bool,
    now: float,
    stuck_waiting: tuple[str, ...] = (),
    latest_hold_event: float | None = None,
) -> RefreshDecision:
    """`latest_end`: the latest end of a pipeline run or backfill (not the page's own refreshes), None when none
    ever ended. A refresh in progress answers for nothing that happened after it was asked for, so the cursor stays
    where it is until the next refresh can be asked for: no event is lost. `stuck_waiting`: the runs waiting now on
    a pool slot that dead runs hold; one not told before asks for a refresh, so the page's alert names it.
    `latest_hold_event`: when the line was last held or released (None: never)."""
    ended = latest_end is not None and latest_end > cursor.ended_until
    hold_changed = latest_hold_event is not None and latest_hold_event > cursor.hold_events_until
    started = bool(shards_running) and not cursor.shards_were_running
    # The last refresh saw shards running (so it did not recount): the first tick with none asks for the recount.
    stopped = not shards_running and not cursor.recounted
    due = bool(shards_running) and now - cursor.requested_at >= REFRESH_INTERVAL_S
    stuck = bool(set(stuck_waiting) - set(cursor.told_waiting))
    if not (ended or hold_changed or started or stopped or due or stuck):
        waiting = "no run ended since the last refresh"
        return RefreshDecision(None, waiting + ("" if shards_running else " and no shard run is in progress"), cursor)
    if refresh_in_progress:
        return RefreshDecision(None, "the previous refresh is still running", cursor)
    if hold_changed:
        reason = f"the line was held or released at {_utc(latest_hold_event)}"
    elif ended:
        reason = f"a run ended at {_utc(latest_end)}"
    elif stuck:
        reason = "runs wait on pool slots held by dead runs"
    elif started:
        reason = f"shards {shards_running} started"
    elif stopped:
        reason = "no shard runs any more: coverage by id is recounted"
    else:
        reason = f"shards {shards_running} are running"
    recount = not shards_running
    new_cursor = RefreshCursor(
        ended_until=max(cursor.ended_until, latest_end or 0.0),
        requested_at=now,
        told_waiting=stuck_waiting,
        hold_events_until=max(cursor.hold_events_until, latest_hold_event or 0.0),
        shards_were_running=bool(shards_running),
        recounted=recount,
    )
    return RefreshDecision(reason, None, new_cursor, recount=recount)


def _utc(moment: float | None) -> str:
    return f"{time.strftime('%H:%M:%S', time.gmtime(moment or 0.0))} UTC"


def latest_hold_event(store: Store) -> float | None:
    """When the line was last held or released: the standing hold's time, or the latest release; None if never."""
    hold = read_hold(store)
    released = read_hold_log(store).last_release_at
    latest = max(hold.held_at if hold else 0.0, released)
    return latest or None


def shards_running(store: Store, now: float | None = None) -> list[int]:
    """The shards whose runs are generating or publishing now (live heartbeats)."""
    now = time.time() if now is None else now
    return sorted(beat.shard for beat in read_heartbeats(store) if run_is_alive(beat, now))
