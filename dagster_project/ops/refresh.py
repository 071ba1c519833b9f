"""When the operator's page (the `run_report` asset) is worth recomputing: the decision of its refresh sensor.

Two things make the page out of date:

* a run of the pipeline ended (a shard published or failed, a backfill's last run ended): its state changed
  once, and the page must show it at the next sensor tick, whether or not any shard still runs;
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
from dagster_project.store.storage import Store

# How often the sensor looks (Dagster's sensor interval): a run's end shows on the page within this, plus the
# refresh run's own time.
SENSOR_TICK_S = 30
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
) -> RefreshDecision:
    """`latest_end`: the latest end of a pipeline run or backfill (not the page's own refreshes), None when none
    ever ended. A refresh in progress answers for nothing that ended after it was asked for, so the cursor stays
    where it is until the next refresh can be asked for: no end is lost. `stuck_waiting`: the runs waiting now on a
    pool slot that dead runs hold; one not told before asks for a refresh, so the page's alert names it."""
    ended = latest_end is not None and latest_end > cursor.ended_until
    due = bool(shards_running) and now - cursor.requested_at >= REFRESH_INTERVAL_S
    stuck = bool(set(stuck_waiting) - set(cursor.told_waiting))
    if not ended and not due and not stuck:
        waiting = "no run ended since the last refresh"
        return RefreshDecision(None, waiting + ("" if shards_running else " and no shard run is in progress"), cursor)
    if refresh_in_progress:
        return RefreshDecision(None, "the previous refresh is still running", cursor)
    if ended:
        reason = f"a run ended at {time.strftime('%H:%M:%S', time.gmtime(latest_end))} UTC"
    elif stuck:
        reason = "runs wait on pool slots held by dead runs"
    else:
        reason = f"shards {shards_running} are running"
    new_cursor = RefreshCursor(
        ended_until=max(cursor.ended_until, latest_end or 0.0), requested_at=now, told_waiting=stuck_waiting
    )
    return RefreshDecision(reason, None, new_cursor, recount=not shards_running)


def shards_running(store: Store, now: float | None = None) -> list[int]:
    """The shards whose runs are generating or publishing now (live heartbeats)."""
    now = time.time() if now is None else now
    return sorted(beat.shard for beat in read_heartbeats(store) if run_is_alive(beat, now))
