"""`dflash status`, `dflash metrics` and `dflash free-slots`: the operator's answers and what they ask of Dagster.

Dagster is imported only with `--dagster` (and by `free-slots`); the answers otherwise use the view the run_report
asset recorded in the store."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import time
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster_project import settings
from dagster_project.cli.common import known_fleet_endpoints, open_configured_store
from dagster_project.store import layout

if TYPE_CHECKING:
    import dagster as dg

    from dagster_project.ops.answers.storage import StoreDelay
    from dagster_project.ops.live_view import WatchReading
    from dagster_project.ops.status_snapshot import StoreSnapshot
    from dagster_project.store.storage import Store


def cmd_status(args: argparse.Namespace, resources: Any) -> int:
    if args.watch is not None and (args.json or args.by_id):
        raise SystemExit("dflash status: --watch shows the answers live; give --json or --by-id without it")
    if args.watch is not None and args.watch <= 0:
        raise SystemExit(f"dflash status: --watch wants a positive number of seconds, got {args.watch}")
    store = open_configured_store()
    with _dagster_side(args.dagster) as instance:
        if args.by_id:
            from dagster_project.conversations.shards import published_num_shards
            from dagster_project.ops.coverage import dataset_coverage, write_coverage

            num_shards = published_num_shards(store)
            if num_shards is None:
                manifest = store.url(layout.stage_manifest_key(layout.CONVERSATIONS))
                raise SystemExit(f"no {manifest}: materialize conversations before asking for coverage by id")
            write_coverage(store, dataset_coverage(store, num_shards))
        if args.watch is not None:
            from dagster_project.ops.live_view import watch

            return watch(lambda: _watch_reading(store, instance), args.watch, store.uri)
        if args.json:
            status, notes, _ = _read_status(store, instance)
            print(json.dumps(dataclasses.asdict(status), indent=2, default=str))
        else:
            text, notes = _status_text(store, instance)
            print(text)
        for note in notes:
            print(note, file=sys.stderr)
    return 0


@contextlib.contextmanager
def _dagster_side(ask_instance: bool) -> typing.Iterator[dg.DagsterInstance | None]:
    """With `--dagster`, this node's instance; otherwise None: the answers use the view the run_report asset
    recorded in the store, and Dagster is not imported (5-7 CPU-s of a process that takes well under one)."""
    if not ask_instance:
        yield None
        return
    from dagster_project.assets.dagster_instance import open_instance

    with open_instance("status --dagster") as instance:
        yield instance


def _read_status(
    store: Store, instance: dg.DagsterInstance | None, *, from_snapshot: bool = True
) -> tuple[Any, list[str], StoreSnapshot]:
    """The answers, what was done on the way (Dagster runs marked failed because their process is gone), and what
    was read from the store (without an instance, the view of Dagster recorded there; None when none is).
    `from_snapshot`: a store that does not answer within the budget is shown from the last snapshot (else
    `StoreSlow` is raised)."""
    from dagster_project.ops.alerts import DEFAULT_THRESHOLDS
    from dagster_project.ops.answers.cost import FleetCost
    from dagster_project.ops.dagster_view import view_alerts
    from dagster_project.ops.status import answer_all

    taken, endpoints, delay, notes = _read_store(store, ask_view=instance is None, from_snapshot=from_snapshot)
    view = taken.view
    if instance:
        from dagster_project.assets.dagster_instance import materialized_shards

        materialized: set[int] | None = materialized_shards(instance)
    else:
        materialized = set(view.materialized) if view else None
    status = answer_all(
        store,
        taken.readings,
        current_fingerprint=None,
        materialized=materialized,
        cost=FleetCost(cost_per_gpu_hour=settings.cost_per_gpu_hour()),
        thresholds=DEFAULT_THRESHOLDS,
        endpoints_known=bool(endpoints),
        delay=delay,
    )
    dead_runs = status.progress.dead_runs
    job_done = bool(status.shards and status.shards.done)
    if instance:
        from dagster_project.assets.dagster_instance import (
            daemon_heartbeat_at,
            fail_dead_runs,
            failed_backfills,
            instance_pool_alerts,
        )
        from dagster_project.ops.dagster_view import backfill_alerts, daemon_alerts

        marked = fail_dead_runs(instance, dead_runs)
        # After the runs found dead here gave their slots back: what still blocks a run needs the operator.
        dagster_alerts = instance_pool_alerts(instance, dead_runs)
        dagster_alerts += backfill_alerts(failed_backfills(instance), job_done=job_done)
        dagster_alerts += daemon_alerts(daemon_heartbeat_at(instance), status.collected_at)
    else:
        running_since = min((beat.started_at for beat in taken.readings.live), default=None)
        marked, dagster_alerts = (
            [],
            view_alerts(view, dead_runs, status.collected_at, running_since=running_since, job_done=job_done),
        )
    status = dataclasses.replace(status, stale_nodes=taken.stale_nodes, alerts=[*status.alerts, *dagster_alerts])
    notes += [f"marked Dagster run {run_id} failed: its process is gone" for run_id in marked]
    return status, notes, taken


def _read_store(
    store: Store, *, ask_view: bool, from_snapshot: bool
) -> tuple[StoreSnapshot, list[str], StoreDelay | None, list[str]]:
    """Everything status reads from the store, with the fleet's probes (the endpoints it knows, and those probed),
    and notes. Read within the status budget (`DFLASH_STATUS_BUDGET_S`): when the store does not answer in time, the
    node's last snapshot of it, with the fleet probed now, and the delay that says so; otherwise the snapshot is
    replaced by what was read."""
    from dagster_project.generation import fleet_registry
    from dagster_project.ops.answers.storage import StoreDelay
    from dagster_project.ops.dagster_view import read_view
    from dagster_project.ops.status import probe_fleet, take_readings
    from dagster_project.ops.status_snapshot import StoreSnapshot, empty_snapshot, load_snapshot, save_snapshot
    from dagster_project.store.read_budget import BudgetedS3Store, StoreSlow, within_budget

    api_key = os.environ.get("SGLANG_API_KEY") or None
    budget_s, now = settings.status_budget_s(), time.time()
    bounded = within_budget(store, budget_s)
    try:
        endpoints = known_fleet_endpoints(bounded)
        taken = StoreSnapshot(
            store.uri,
            take_readings(bounded, endpoints, api_key=api_key, now=now),
            view=read_view(bounded) if ask_view else None,
            stale_nodes=fleet_registry.live_nodes(bounded, settings.fleet_stale_after_s())[1],
            first=_what_to_materialize_first(bounded),
        )
        if isinstance(bounded, BudgetedS3Store) and bounded.overrun:  # met by a reader that skips what fails
            raise bounded.overrun
    except StoreSlow as slow:
        if not from_snapshot:
            raise
        last = load_snapshot(settings.work_dir(), store.uri)
        taken = last or empty_snapshot(store.uri, now)
        # The servers the snapshot probed were the registry's then; a store too slow to read has no newer list.
        endpoints = list(taken.readings.fleet) or known_fleet_endpoints(None)
        probed = dataclasses.replace(taken.readings, fleet=probe_fleet(endpoints, api_key))
        taken = dataclasses.replace(taken, readings=probed)
        delay = StoreDelay(slow.last_call_s, budget_s, last.readings.now if last else None, time.time())
        return taken, endpoints, delay, []
    # A store read without a budget (a local one) is never shown from a snapshot: none is kept of it.
    kept = save_snapshot(settings.work_dir(), taken) if bounded is not store else None
    return taken, endpoints, None, [kept] if kept else []


def _status_text(store: Store, instance: dg.DagsterInstance | None) -> tuple[str, list[str]]:
    from dagster_project.ops.dagster_view import render_view
    from dagster_project.ops.status import render_text
    from dagster_project.shown_text import shown, shown_lines

    status, notes, taken = _read_status(store, instance)
    text = (f"{taken.first}\n\n" if taken.first else "") + render_text(status)
    # With --dagster the storage line's materialized count is the instance's, read now.
    text = text if instance else f"{text}\n{render_view(taken.view, status.collected_at)}"
    return shown_lines(text), [shown(note) for note in notes]


def _watch_reading(store: Store, instance: dg.DagsterInstance | None) -> WatchReading:
    from dagster_project.ops.dagster_view import render_view
    from dagster_project.ops.live_view import watch_reading

    status, notes, taken = _read_status(store, instance)
    more = "" if instance else render_view(taken.view, status.collected_at)
    return watch_reading(status, first=taken.first, notes=notes, more=more)


def _what_to_materialize_first(store: Store) -> str | None:
    """What an operator must materialize before the answers mean anything; None once conversations exist."""
    if store.exists(layout.stage_manifest_key(layout.CONVERSATIONS)):
        return None
    missing = "conversations" if store.exists(layout.stage_manifest_key(layout.RAW_PROMPTS)) else "raw_prompts"
    select = "conversations" if missing == "conversations" else "raw_prompts,conversations"
    return (
        f"NOTHING TO REPORT YET: {store.uri} has no {missing}. Materialize {select.replace(',', ' and ')} first "
        f"(`dagster asset materialize -m dagster_project.definitions --select {select}`, or Materialize in the "
        "UI), start a fleet (`dflash fleet up`), materialize the pilot (`--select pilot`), then the completions shards."
    )


def cmd_metrics(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.ops.metrics import render_metrics, serve_metrics

    store = open_configured_store()

    def read() -> Any:
        # Without the Dagster instance: a scrape reads, never marks runs failed (`dflash status --dagster` does). A
        # store too slow to answer within the budget fails the scrape: Prometheus keeps no old figures as new.
        return _read_status(store, None, from_snapshot=False)[0]

    if args.once:
        print(render_metrics(read()), end="")
        return 0
    server, thread = serve_metrics(read, args.host, args.port)
    print(f"dflash metrics: serving http://{args.host}:{server.server_port}/metrics for {store.uri}", file=sys.stderr)
    try:
        thread.join()
    except KeyboardInterrupt:
        server.shutdown()
    return 0


def cmd_free_slots(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.assets.dagster_instance import free_slots, open_instance

    with open_instance("free-slots") as instance:
        for run_id in args.run_ids:
            print(free_slots(instance, run_id))
    return 0


def cmd_repair_instance(args: argparse.Namespace, resources: Any) -> int:
    home = os.environ.get("DAGSTER_HOME")
    if not home or not Path(home).is_dir():
        raise SystemExit("dflash repair-instance: set DAGSTER_HOME to the instance's directory")
    from dagster_project.assets.instance_storage import repair_instance

    for done in repair_instance(home):
        print(done)
    return 0


def repair_instance_flags(repair: argparse.ArgumentParser) -> None:
    repair.set_defaults(func=cmd_repair_instance)


def status_flags(status: argparse.ArgumentParser) -> None:
    status.add_argument("--json", action="store_true", help="print the answers as JSON (machine-readable), once")
    status.add_argument(
        "--by-id",
        action="store_true",
        help="first recompute coverage by id across every shard (reads every shard's ids: minutes at full scale)",
    )
    status.add_argument(
        "--watch",
        type=float,
        nargs="?",
        const=10.0,
        metavar="SECONDS",
        help="a live view in the terminal, read again every SECONDS (default 10); Ctrl-C leaves it",
    )
    status.add_argument(
        "--dagster",
        action="store_true",
        help="ask this node's Dagster instance (DAGSTER_HOME) now, rather than show what the run_report asset "
        "recorded at its last refresh: which shards it materialized, runs waiting on pool slots that dead runs "
        "hold; and mark the runs found dead failed and free their pool slots (imports Dagster: several seconds)",
    )
    status.set_defaults(func=cmd_status)


def metrics_flags(metrics: argparse.ArgumentParser) -> None:
    from dagster_project.ops.metrics import DEFAULT_PORT

    metrics.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1: this machine only)"
    )
    metrics.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"the port to serve /metrics on (default {DEFAULT_PORT}; 0: any)"
    )
    metrics.add_argument(
        "--once", action="store_true", help="print the metrics once in Prometheus' text format; serve nothing"
    )
    metrics.set_defaults(func=cmd_metrics)


def free_slots_flags(free_slots: argparse.ArgumentParser) -> None:
    free_slots.add_argument(
        "run_ids", nargs="+", metavar="RUN_ID", help="the Dagster run ids holding the slots (the alert names them)"
    )
    free_slots.set_defaults(func=cmd_free_slots)
