"""The view of Dagster the run_report asset records for `dflash status`: what it holds, read back as written."""

from __future__ import annotations

import dagster as dg
from dagster._daemon.types import DaemonHeartbeat

from dagster_project.assets.dagster_instance import daemon_heartbeat_at
from dagster_project.ops.answers.progress import DeadRun
from dagster_project.ops.dagster_view import (
    DAEMON_SILENT_S,
    REFRESH_OVERDUE_S,
    DagsterView,
    backfill_alerts,
    daemon_alerts,
    read_view,
    render_view,
    take_view,
    view_alerts,
    write_view,
)
from dagster_project.ops.pool_slots import DeadHolder, StuckPool
from dagster_project.ops.refresh import REFRESH_INTERVAL_S, SENSOR_TICK_S
from dagster_project.store.storage import LocalStore


def test_the_view_holds_every_dead_run_once_and_the_pool_alerts_with_their_command(tmp_path):
    heartbeat_dead = [DeadRun(3, "run-3", "node-a", 12, 100.0, True), DeadRun(4, None, "node-a", 13, 100.0, True)]
    stuck = StuckPool("sglang_fleet", 1, ["waiting"], [DeadHolder("run-3", "ended (FAILURE)"), DeadHolder("x", "gone")])
    view = take_view(200.0, {2, 0, 1}, heartbeat_dead, stuck=[stuck])
    assert view.materialized == [0, 1, 2]
    # The pool's reason wins over the heartbeat's for a run seen both ways; a run without an id is not Dagster's.
    assert view.dead_runs == [DeadHolder("run-3", "ended (FAILURE)"), DeadHolder("x", "gone")]
    assert len(view.pool_alerts) == 1 and "`dflash free-slots run-3 x`" in view.pool_alerts[0]

    store = LocalStore(tmp_path / "store")
    assert read_view(store) is None
    write_view(store, view)
    assert read_view(store) == view
    assert render_view(view, now=260.0).startswith(
        "Dagster (as of 60 s ago, recorded by run_report): 3 completions shards materialized; "
        "dead runs: run-3 (ended (FAILURE)); x (gone)"
    )
    assert render_view(DagsterView(taken_at=1.0, materialized=[]), now=2.0).endswith(
        "dead runs: none; daemon: none seen; `dflash status --dagster` reads the instance now"
    )


def test_a_daemon_silent_past_its_heartbeats_is_an_alert_with_its_age():
    with dg.DagsterInstance.ephemeral() as instance:
        assert daemon_heartbeat_at(instance) is None and daemon_alerts(None, 1000.0) == []  # the CLI alone: no daemon
        for daemon_type, at in (("SENSOR", 1000.0), ("SCHEDULER", 1010.0)):
            instance.add_daemon_heartbeat(DaemonHeartbeat(at, daemon_type, "daemon-1", errors=[]))
        beat = daemon_heartbeat_at(instance)
    assert beat == 1010.0 and daemon_alerts(beat, 1100.0) == []  # beating: 90 s is within its silence limit
    (alert,) = daemon_alerts(beat, 1310.0)  # `dflash status --dagster`, the daemon killed 300 s ago
    assert alert.kind == "daemon" and alert.message.startswith("Dagster daemon: no heartbeat for 300 s: queued runs")
    # Plain `dflash status`: the heartbeat the last run_report recorded, aged when it was recorded (the record's own
    # age is said first): aged now, a healthy daemon's beat read "149 s ago" between two refreshes (issue 45).
    view = take_view(1100.0, set(), [], [], daemon_heartbeat_at=beat)
    shown = render_view(view, 1310.0)
    assert shown.startswith("Dagster (as of 210 s ago, recorded by run_report)"), shown
    assert "daemon: last heartbeat 90 s before this record;" in shown and "300 s" not in shown


def test_plain_status_judges_the_recorded_beat_by_the_cadence_that_records_it():
    """The view is recorded at each refresh of the page (every REFRESH_INTERVAL_S while shards run): a beat it
    recorded 131-181 s ago is a healthy daemon between two refreshes, not a silent one."""
    beat = 1000.0
    healthy = take_view(1020.0, set(), [], [], daemon_heartbeat_at=beat)  # recorded 20 s after the daemon's beat
    # Every age a healthy daemon's record reaches between two refreshes (one interval, a tick, the refresh run's
    # time), with shards running since long before it or with none running.
    for now in (1151.0, 1201.0, 1020.0 + REFRESH_INTERVAL_S + SENSOR_TICK_S + 100.0):
        for since in (0.0, None):
            assert view_alerts(healthy, [], now, running_since=since, job_done=False) == [], (now, since)
    # While shards run the page is refreshed: a record older than one missed refresh is the daemon's silence.
    late = healthy.taken_at + REFRESH_OVERDUE_S
    (alert,) = view_alerts(healthy, [], late, running_since=0.0, job_done=False)
    recorded_age = late - beat  # the record was taken 20 s after the beat
    assert (
        alert.kind == "daemon" and f"no heartbeat recorded for {recorded_age:,.0f} s while shards run" in alert.message
    )
    assert f"refreshed every {REFRESH_INTERVAL_S} s while they do, last {REFRESH_OVERDUE_S:,.0f} s ago" in alert.message
    assert "`dflash status --dagster` reads its heartbeats now" in alert.message
    # Shards that started after the record (a job begun hours after the last run ended): the first refresh is due
    # from their start, not from the record.
    started = beat + 86_400.0
    assert view_alerts(healthy, [], started + 200.0, running_since=started, job_done=False) == []
    assert [
        a.kind for a in view_alerts(healthy, [], started + REFRESH_OVERDUE_S, running_since=started, job_done=False)
    ] == ["daemon"]
    # Nothing running: no refresh is due, so the record's age says nothing of the daemon (hours after the job ended).
    assert view_alerts(healthy, [], beat + 86_400.0, running_since=None, job_done=False) == []
    # Silent already when recorded (judged then by the instance's rule): said with the record's age.
    silent = take_view(1000.0 + DAEMON_SILENT_S + 30.0, set(), [], [], daemon_heartbeat_at=beat)
    for since in (0.0, None):
        (alert,) = view_alerts(silent, [], silent.taken_at + 10.0, running_since=since, job_done=False)
        assert alert.message.startswith("Dagster daemon: no heartbeat for 150 s as of 10 s ago: queued runs")
    assert (
        view_alerts(take_view(1000.0, set(), [], []), [], 1e9, running_since=0.0, job_done=False) == []
    )  # no daemon ever


def test_a_backfill_whose_runs_failed_is_said_so_where_dagster_lists_it_completed(tmp_path):
    import dagster as dg
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

    from dagster_project.assets.dagster_instance import BACKFILL_TAG, failed_backfills

    with dg.instance_for_test() as instance:
        for backfill_id, statuses in (("all-failed", ["FAILURE"] * 8), ("fine", ["SUCCESS"] * 2)):
            shards = [f"shard-{index:05d}" for index in range(len(statuses))]
            instance.add_backfill(
                PartitionBackfill(backfill_id, BulkActionStatus.COMPLETED, False, {}, 100.0, partition_names=shards)
            )
            for index, status in enumerate(statuses):
                tags = {BACKFILL_TAG: backfill_id}
                run_id = f"{backfill_id}-{index}"
                run = dg.DagsterRun(job_name="shard_job", run_id=run_id, status=dg.DagsterRunStatus(status), tags=tags)
                instance.add_run(run)
        found = failed_backfills(instance)
    assert [(b.backfill_id, b.failed, b.runs) for b in found] == [("all-failed", 8, 8)]
    store = LocalStore(tmp_path / "store")
    write_view(store, take_view(200.0, set(), [], [], failed_backfills=found))
    (alert,) = view_alerts(read_view(store), [], now=230.0, running_since=None, job_done=False)
    assert alert.kind == "backfill" and alert.message.startswith("backfill all-failed: 8 of 8 runs failed (Dagster")
    assert alert.message.endswith("(as of 30 s ago)")
    # Seen by hand (issue 45): the backfill a hold failed, its shards since made by another, still alerted beside
    # DONE. Once every shard is exported green, what it failed has been made: nothing left to do.
    assert view_alerts(read_view(store), [], now=230.0, running_since=None, job_done=True) == []
    assert backfill_alerts(found, job_done=True) == [] and len(backfill_alerts(found, job_done=False)) == 1
