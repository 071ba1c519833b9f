"""Which runs hold a concurrency pool's slots while dead, read from the Dagster instance (the wording of the alert
is `ops.pool_slots`'s).

A holder is dead when its run ended (a slot outlives its run until the daemon's run monitoring frees it, never
without a daemon), or when it is still STARTED but every process its events came from is gone. The second is
only sound when the instance's storage is this host's SQLite file, so every run process of the instance ran
here; elsewhere only `known_dead` (runs whose shard heartbeat says their process is gone) counts.
"""

from __future__ import annotations

from collections.abc import Iterable

import dagster as dg
import psutil

from dagster_project.ops.answers.progress import DeadRun
from dagster_project.ops.pool_slots import DeadHolder, StuckPool

ENDED = (dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)
ACTIVE = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED)


def storage_is_local(instance: dg.DagsterInstance) -> bool:
    ref = instance.get_ref()
    storage = ref.storage_data or ref.run_storage_data
    return storage is not None and "sqlite" in storage.class_name.lower()


def run_process_ids(instance: dg.DagsterInstance, run_id: str) -> set[int]:
    """The processes a run's events came from: its run process and its step workers (read from the few events
    that start them, not the run's whole log of progress observations)."""
    starts = {dg.DagsterEventType.RUN_START, dg.DagsterEventType.ENGINE_EVENT, dg.DagsterEventType.STEP_WORKER_STARTED}
    records = instance.get_records_for_run(run_id, of_type=starts).records
    return {record.event_log_entry.dagster_event.pid for record in records if record.event_log_entry.dagster_event.pid}


def processes_gone(instance: dg.DagsterInstance, run_id: str) -> set[int] | None:
    """The pids of a run whose every process is gone on this host; None when some lives or it cannot be told."""
    if not storage_is_local(instance):
        return None
    pids = run_process_ids(instance, run_id)
    return pids if pids and not any(psutil.pid_exists(pid) for pid in pids) else None


def _dead_holder(instance: dg.DagsterInstance, run_id: str, known_dead: dict[str, str]) -> DeadHolder | None:
    run = instance.get_run_by_id(run_id)
    if run is None or run.status in ENDED:
        return DeadHolder(run_id, f"ended ({run.status.value})" if run else "deleted")
    if run.status not in ACTIVE:
        return None
    if run_id in known_dead:
        return DeadHolder(run_id, known_dead[run_id])
    gone = processes_gone(instance, run_id)
    return DeadHolder(run_id, f"its processes (pids {', '.join(map(str, sorted(gone)))}) are gone") if gone else None


def stuck_pools(instance: dg.DagsterInstance, dead_runs: Iterable[DeadRun] = ()) -> list[StuckPool]:
    """Every pool with a run waiting for a slot while dead runs hold some; `dead_runs`: the shard runs whose
    heartbeat says they died (`status`'s). A few queries per pool with waiting runs; nothing when no run waits."""
    known_dead = {dead.run_id: "its shard's heartbeat says it died" for dead in dead_runs if dead.run_id}
    storage = instance.event_log_storage
    if not storage.supports_global_concurrency_limits:
        return []
    stuck = []
    for pool in sorted(storage.get_concurrency_keys()):
        info = storage.get_concurrency_info(pool)
        waiting = sorted(info.pending_run_ids - info.active_run_ids)
        if not waiting:
            continue
        holders = [_dead_holder(instance, run_id, known_dead) for run_id in sorted(info.active_run_ids)]
        dead = [holder for holder in holders if holder is not None]
        if dead:
            stuck.append(StuckPool(pool, info.limit, waiting, dead))
    return stuck


def tell_waiting_runs(instance: dg.DagsterInstance, stuck: list[StuckPool]) -> None:
    """Write the alert into the log of each waiting run that does not have it yet (the run page shows it under the
    run's own "blocked by limit" line): once per run and set of dead holders, however often this is called."""
    for pool in stuck:
        message = pool.message()
        for run_id in pool.waiting_runs:
            events = instance.get_records_for_run(run_id, of_type=dg.DagsterEventType.ENGINE_EVENT).records
            if any(record.event_log_entry.dagster_event.message == message for record in events):
                continue
            run = instance.get_run_by_id(run_id)
            if run is not None:
                instance.report_engine_event(message, dagster_run=run)
