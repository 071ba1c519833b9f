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
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster_project import settings
from dagster_project.cli.common import known_fleet_endpoints, open_configured_store
from dagster_project.store import layout

if TYPE_CHECKING:
    import dagster as dg

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
            from dagster_project.ops.terminal import watch

            return watch(lambda: _status_text(store, instance), args.watch, store.uri)
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


def _read_status(store: Store, instance: dg.DagsterInstance | None) -> tuple[Any, list[str], Any]:
    """The answers, what was done on the way (Dagster runs marked failed because their process is gone), and
    without an instance the view of Dagster recorded in the store (None when none is)."""
    from dagster_project.generation import fleet_registry
    from dagster_project.ops.answers.cost import FleetCost
    from dagster_project.ops.dagster_view import read_view, view_alerts
    from dagster_project.ops.status import collect_status

    stale_after_s = settings.fleet_stale_after_s()
    endpoints = known_fleet_endpoints(store)
    view = None if instance else read_view(store)
    if instance:
        from dagster_project.assets.dagster_instance import materialized_shards

        materialized: set[int] | None = materialized_shards(instance)
    else:
        materialized = set(view.materialized) if view else None
    status = collect_status(
        store,
        endpoints,
        api_key=os.environ.get("SGLANG_API_KEY") or None,
        materialized=materialized,
        cost=FleetCost(cost_per_gpu_hour=settings.cost_per_gpu_hour()),
    )
    _, stale = fleet_registry.live_nodes(store, stale_after_s)
    dead_runs = status.progress.dead_runs
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
        dagster_alerts = instance_pool_alerts(instance, dead_runs) + backfill_alerts(failed_backfills(instance))
        dagster_alerts += daemon_alerts(daemon_heartbeat_at(instance), status.collected_at)
    else:
        marked, dagster_alerts = [], view_alerts(view, dead_runs, status.collected_at)
    status = dataclasses.replace(status, stale_nodes=stale, alerts=[*status.alerts, *dagster_alerts])
    return status, [f"marked Dagster run {run_id} failed: its process is gone" for run_id in marked], view


def _status_text(store: Store, instance: dg.DagsterInstance | None) -> tuple[str, list[str]]:
    from dagster_project.ops.dagster_view import render_view
    from dagster_project.ops.status import render_text

    status, notes, view = _read_status(store, instance)
    first = _what_to_materialize_first(store)
    text = (f"{first}\n\n" if first else "") + render_text(status)
    # With --dagster the storage line's materialized count is the instance's, read now.
    return (text if instance else f"{text}\n{render_view(view, status.collected_at)}"), notes


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
        # Without the Dagster instance: a scrape reads, never marks runs failed (`dflash status --dagster` does).
        return _read_status(store, None)[0]

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
