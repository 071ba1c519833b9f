"""What the Dagster instance said at the last refresh of the operator's page, recorded in the store.

Importing Dagster costs a `dflash status` process 5-7 CPU-s, far more than its answers. So the process that has
the instance open anyway, the `run_report` asset (run at each refresh of the page: after every run of the pipeline
ends, every few minutes while shards run), records here what only Dagster knows: the completions shards it
materialized, the runs it still counts as alive whose process is gone, the runs waiting on a pool slot that
dead runs hold, and the backfills whose runs failed (which Dagster's own list shows as Completed). `dflash status`
shows that record with its age; `dflash status --dagster` asks the instance itself, and acts on what it finds
(marks dead runs failed and frees their slots).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dagster_project.ops.alerts import Alert
from dagster_project.ops.answers.progress import DeadRun
from dagster_project.ops.answers.text import ago
from dagster_project.ops.pool_slots import FREE_SLOTS_COMMAND, DeadHolder, StuckPool, pool_alerts
from dagster_project.ops.refresh import REFRESH_INTERVAL_S, SENSOR_TICK_S
from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.storage import Store

VIEW_KEY = "reports/dagster_view.json"
# What acts on dead runs: opens the instance, marks them failed and frees their pool slots.
ACTING_COMMAND = "dflash status --dagster"
HEARTBEAT_SAYS_DEAD = "its shard's heartbeat says it died"
# The daemon beats every 30 s (Dagster's default): silent for this long, it is gone (killed, or its host lost), and
# with it the run queue, run monitoring, sensors (this page's refresh among them) and backfills.
DAEMON_SILENT_S = 120.0
# Plain `dflash status` has only the beat the view recorded, and the view is recorded at each refresh of the page:
# every REFRESH_INTERVAL_S while shards run (asked for at a sensor tick, then run), once after a run ends, never
# while nothing runs. So a healthy daemon's view, while shards run, is up to one refresh interval, a sensor tick and
# the refresh run's own time old (from the record, or from the start of the shard runs where it is older): older
# than this, a refresh was missed. The sensor that asks for it is the daemon's: a missed refresh is the daemon's
# silence, seen through the page's cadence (the daemon's own limit is the slack for the refresh run's time).
REFRESH_OVERDUE_S = REFRESH_INTERVAL_S + SENSOR_TICK_S + DAEMON_SILENT_S


@dataclass(frozen=True)
class FailedBackfill:
    """A backfill some of whose runs failed: Dagster's backfill list shows it "Completed", in green, all the same."""

    backfill_id: str
    runs: int
    failed: int


def backfill_alerts(backfills: list[FailedBackfill], *, job_done: bool) -> list[Alert]:
    """Backfills some of whose runs failed, while the job is not done. Done (every shard exported with every blocking
    gate green), what they failed has been made since: after a hold, its released shards' rerun left "1 of 1 runs
    failed" beside DONE, an alarm with nothing to do."""
    if job_done:
        return []
    return [
        Alert(
            "backfill",
            f"backfill {backfill.backfill_id}: {backfill.failed} of {backfill.runs} runs failed (Dagster lists the "
            "backfill as Completed; each failed run's page says why, and the shards table here which gate)",
        )
        for backfill in backfills
    ]


@dataclass(frozen=True)
class DagsterView:
    taken_at: float
    materialized: list[int]  # completions shards
    dead_runs: list[DeadHolder] = field(default_factory=list)
    pool_alerts: list[str] = field(default_factory=list)  # each names the `dflash free-slots` command
    daemon_heartbeat_at: float | None = None  # the Dagster daemon's latest heartbeat (None: none ever seen)
    failed_backfills: list[FailedBackfill] = field(default_factory=list)


def take_view(
    taken_at: float,
    materialized: set[int],
    dead_runs: list[DeadRun],
    stuck: list[StuckPool],
    daemon_heartbeat_at: float | None = None,
    failed_backfills: Sequence[FailedBackfill] = (),
) -> DagsterView:
    """The record, from what the report already read: `dead_runs` from the heartbeats, `stuck` from the pools,
    `failed_backfills` from the instance's recent backfills."""
    holders = {run.run_id: DeadHolder(run.run_id, HEARTBEAT_SAYS_DEAD) for run in dead_runs if run.run_id}
    holders.update((holder.run_id, holder) for pool in stuck for holder in pool.dead_holders)
    return DagsterView(
        taken_at=taken_at,
        materialized=sorted(materialized),
        dead_runs=sorted(holders.values(), key=lambda holder: holder.run_id),
        pool_alerts=[alert.message for alert in pool_alerts(stuck)],
        daemon_heartbeat_at=daemon_heartbeat_at,
        failed_backfills=list(failed_backfills),
    )


def daemon_alerts(heartbeat_at: float | None, now: float) -> list[Alert]:
    """The daemon silent past `DAEMON_SILENT_S`, read from the instance's own daemon heartbeats (a node that never
    ran one, the CLI alone, has nothing to say)."""
    if heartbeat_at is None or now - heartbeat_at < DAEMON_SILENT_S:
        return []
    return [_daemon_alert(f"no heartbeat for {now - heartbeat_at:,.0f} s")]


def recorded_daemon_alerts(view: DagsterView | None, now: float, *, running_since: float | None) -> list[Alert]:
    """The daemon as plain `dflash status` can tell from the recorded view: silent when it was recorded (judged by
    `daemon_alerts` then), or, while shards run (`running_since`: the start of the oldest live shard run; None when
    none runs), a refresh of the page overdue, `REFRESH_OVERDUE_S` after the later of the record and that start (its
    sensor did not tick). While nothing runs no refresh is due: the record's age says nothing of the daemon."""
    beat = view.daemon_heartbeat_at if view else None
    if view is None or beat is None:
        return []
    if daemon_alerts(beat, view.taken_at):
        return [_daemon_alert(f"no heartbeat for {view.taken_at - beat:,.0f} s as of {ago(view.taken_at, now)}")]
    if running_since is not None and now - max(view.taken_at, running_since) >= REFRESH_OVERDUE_S:
        return [
            _daemon_alert(
                f"no heartbeat recorded for {now - beat:,.0f} s while shards run (the page, which records it, is "
                f"refreshed every {REFRESH_INTERVAL_S:,} s while they do, last {ago(view.taken_at, now)}: "
                f"the daemon's sensor missed a refresh; `{ACTING_COMMAND}` reads its heartbeats now)"
            )
        ]
    return []


def _daemon_alert(silence: str) -> Alert:
    return Alert(
        "daemon",
        f"Dagster daemon: {silence}: queued runs do not start, dead runs are not detected and sensors (this page's "
        "refresh among them) do not tick; start it again (`dagster-daemon run` on this DAGSTER_HOME, or `make dev`)",
    )


def write_view(store: Store, view: DagsterView) -> None:
    store.put_bytes(VIEW_KEY, to_json(view))


def read_view(store: Store) -> DagsterView | None:
    return read_record(store, VIEW_KEY, DagsterView)


def render_view(view: DagsterView | None, now: float) -> str:
    if view is None:
        return (
            "Dagster: no view recorded yet (the run_report asset records one at each refresh); "
            f"`{ACTING_COMMAND}` reads the instance now"
        )
    dead = "; ".join(f"{holder.run_id} ({holder.why})" for holder in view.dead_runs) or "none"
    # The beat's age when the record was taken, not now: aged now, a healthy daemon's beat read "149 s ago" between
    # two refreshes of the page, which reads as a daemon silent that long (its silence is the `daemon` alert's call).
    beat = view.daemon_heartbeat_at
    daemon = f"last heartbeat {view.taken_at - beat:,.0f} s before this record" if beat else "none seen"
    return (
        f"Dagster (as of {ago(view.taken_at, now)}, recorded by run_report): {len(view.materialized)} completions "
        f"shards materialized; dead runs: {dead}; daemon: {daemon}; `{ACTING_COMMAND}` reads the instance now"
    )


def view_alerts(
    view: DagsterView | None, dead_runs: list[DeadRun], now: float, *, running_since: float | None, job_done: bool
) -> list[Alert]:
    """The recorded pool alerts, with their age, the daemon's silence as the view tells it, and the runs seen dead
    now (their heartbeat) that only the instance can end, with the commands that do it."""
    alerts = [] if view is None else [Alert("pool", f"{m} (as of {ago(view.taken_at, now)})") for m in view.pool_alerts]
    alerts += recorded_daemon_alerts(view, now, running_since=running_since)
    if view is not None:
        alerts += [
            Alert(alert.kind, f"{alert.message} (as of {ago(view.taken_at, now)})")
            for alert in backfill_alerts(view.failed_backfills, job_done=job_done)
        ]
    run_ids = sorted({run.run_id for run in dead_runs if run.run_id})
    if run_ids:
        alerts.append(
            Alert(
                "dead_runs",
                f"runs {', '.join(run_ids)} died (their shard's heartbeat says so) and Dagster does not know it: "
                f"`{ACTING_COMMAND}` marks them failed and frees their pool slots "
                f"(or `{FREE_SLOTS_COMMAND} {' '.join(run_ids)}`)",
            )
        )
    return alerts
