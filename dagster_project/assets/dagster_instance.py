"""`dflash status --dagster` and `dflash free-slots`: this node's Dagster instance asked and acted on in the command's
own process (importing Dagster costs it 5-7 CPU-s: plain `dflash status` shows the record `ops.dagster_view` keeps).
"""

from __future__ import annotations

import contextlib
import os
import typing
from pathlib import Path

import dagster as dg

from dagster_project.assets.pool_slots import processes_gone, stuck_pools
from dagster_project.ops.alerts import Alert
from dagster_project.ops.answers.progress import DeadRun
from dagster_project.ops.dagster_view import FailedBackfill
from dagster_project.ops.pool_slots import pool_alerts
from dagster_project.store import layout


@contextlib.contextmanager
def open_instance(command: str) -> typing.Iterator[dg.DagsterInstance]:
    """This node's Dagster instance (`DAGSTER_HOME`), opened once for the whole command."""
    home = os.environ.get("DAGSTER_HOME")
    if not home or not Path(home).is_dir():
        raise SystemExit(f"dflash {command}: no Dagster instance: set DAGSTER_HOME to the instance's directory")
    with dg.DagsterInstance.get() as instance:
        yield instance


def materialized_shards(instance: dg.DagsterInstance) -> set[int]:
    """Completions shards the Dagster instance recorded as materialized."""
    return {layout.shard_index(key) for key in instance.get_materialized_partitions(dg.AssetKey(layout.COMPLETIONS))}


# Dagster's tag on every run a backfill launched (`dagster._core.storage.tags.BACKFILL_ID_TAG`).
BACKFILL_TAG = "dagster/backfill"
# How many of the latest backfills are looked at: the ones an operator still looks at.
RECENT_BACKFILLS = 20


def failed_backfills(instance: dg.DagsterInstance) -> list[FailedBackfill]:
    """The latest backfills some of whose runs failed, with how many of how many (two counts per backfill)."""
    found = []
    for backfill in instance.get_backfills(limit=RECENT_BACKFILLS):
        tags = {BACKFILL_TAG: backfill.backfill_id}
        failed = instance.get_runs_count(dg.RunsFilter(tags=tags, statuses=[dg.DagsterRunStatus.FAILURE]))
        if failed:
            runs = instance.get_runs_count(dg.RunsFilter(tags=tags))
            found.append(FailedBackfill(backfill.backfill_id, runs, failed))
    return found


def fail_dead_runs(instance: dg.DagsterInstance, dead_runs: list[DeadRun]) -> list[str]:
    """Mark failed the Dagster runs still STARTED whose process this host saw gone (killed: nothing else would
    ever end them), and give back their pool slots; return their ids.

    Two ways to know a run is dead: its shard's heartbeat names a pid on this host that is gone, or (before it
    wrote any heartbeat: killed while starting, holding a slot of the fleet's pool) every process its events
    came from is gone. The second is only sound when the instance's storage is this host's SQLite file, so
    every run process of the instance ran here; runs on other hosts are left to their own run monitoring."""
    marked = []
    reasons = {
        dead.run_id: f"the run's process (pid {dead.pid} on {dead.host}) is gone: it was killed while it "
        f"generated shard {dead.shard} (seen by dflash status)"
        for dead in dead_runs
        if dead.process_checked and dead.run_id
    }
    for run_id in instance.event_log_storage.get_concurrency_run_ids() - reasons.keys():
        pids = processes_gone(instance, run_id)  # None where it cannot be told from this host
        if pids:
            reasons[run_id] = (
                f"the run's processes (pids {', '.join(map(str, sorted(pids)))}) are gone while it held a "
                f"slot of a concurrency pool: it was killed (seen by dflash status)"
            )
    for run_id, reason in reasons.items():
        run = instance.get_run_by_id(run_id)
        if run is not None and run.status in (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED):
            instance.report_run_failed(run, f"{reason}. Materialize the shard again: it resumes from its journal.")
            # A killed run never gives back its pool slot: without this, shard runs queue behind dead ones.
            instance.event_log_storage.free_concurrency_slots_for_run(run_id)
            marked.append(run_id)
    return marked


def daemon_heartbeat_at(instance: dg.DagsterInstance) -> float | None:
    """When the Dagster daemon last beat (the latest of its daemons' heartbeats); None when none ever did."""
    return max((beat.timestamp for beat in instance.get_daemon_heartbeats().values()), default=None)


def instance_pool_alerts(instance: dg.DagsterInstance, dead_runs: list[DeadRun]) -> list[Alert]:
    """Runs waiting on a pool slot that dead runs hold."""
    return pool_alerts(stuck_pools(instance, dead_runs))


def free_slots(instance: dg.DagsterInstance, run_id: str) -> str:
    """Give back the pool slots of a run that will never do it itself (marked failed if still STARTED); says so."""
    run = instance.get_run_by_id(run_id)
    if run is None:
        raise SystemExit(f"dflash free-slots: no run {run_id} in the instance at {os.environ['DAGSTER_HOME']}")
    if run.status in (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED):
        instance.report_run_failed(
            run, "its pool slots were freed by the operator (`dflash free-slots`): its process was gone"
        )
    instance.event_log_storage.free_concurrency_slots_for_run(run_id)
    return f"freed the pool slots of run {run_id} ({run.status.value})"
