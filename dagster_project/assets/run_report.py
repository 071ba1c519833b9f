import time
from dataclasses import asdict, replace
from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from dagster_project.assets.dagster_instance import daemon_heartbeat_at, failed_backfills, materialized_shards
from dagster_project.assets.pool_slots import stuck_pools, tell_waiting_runs
from dagster_project.assets.run_tags import PURPOSE_TAG, tag_asset_run
from dagster_project.conversations.shards import published_num_shards
from dagster_project.generation.heartbeat import read_heartbeats
from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.ops.alerts import AlertThresholds
from dagster_project.ops.coverage import dataset_coverage, read_coverage, write_coverage
from dagster_project.ops.dagster_view import backfill_alerts, daemon_alerts, take_view, write_view
from dagster_project.ops.pool_slots import pool_alerts
from dagster_project.ops.refresh import (
    REFRESH_INTERVAL_S,
    SENSOR_TICK_S,
    RefreshCursor,
    decide_refresh,
    latest_hold_event,
    shards_running,
)
from dagster_project.ops.report import Table, plot_metrics, render_markdown, report_sections
from dagster_project.ops.report_chart import CHART_KEY, ReportPoint, inline_charts, progress_chart, run_history
from dagster_project.ops.status import Status, collect_status, render_text
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet
from dagster_project.resources.config_fields import config_fields
from dagster_project.store import layout
from dagster_project.store.manifest import read_published_manifests

RUN_REPORT = "run_report"
# The chart draws at most this many earlier reports (one every few minutes: about a day of a running job).
CHART_POINTS = 500
IN_PROGRESS = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]
ENDED = [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED]
# Run records and backfills read per tick for the latest end: ends come a few per tick at most.
RECENT_ENDS = 50


class RunReportConfig(config_fields(AlertThresholds, dg.Config)):
    """When the report raises an alert (its `operator_alerts` check warns), and whether it recounts coverage."""

    recompute_coverage: bool = Field(
        default=True,
        description="Recount coverage by id across every shard (reads every completions shard's ids); off: "
        "report the last count (the periodic refreshes, so they stay cheap while shards run).",
    )


def _table_value(table: Table) -> dg.TableMetadataValue:
    """A table the asset page draws in place (Markdown tables only open in a dialog there)."""
    return dg.MetadataValue.table(
        records=[dg.TableRecord(dict(zip(table.columns, row))) for row in table.rows],
        schema=dg.TableSchema(columns=[dg.TableColumn(name, "string") for name in table.columns]),
    )


def page_metadata(status: Status, points: list[ReportPoint]) -> dict[str, dg.MetadataValue]:
    """The page as metadata entries in reading order: each section's short text and its tables, which the asset
    page shows in place, then the inline charts."""
    entries: dict[str, dg.MetadataValue] = {"as_of": dg.MetadataValue.timestamp(status.collected_at)}
    for section in report_sections(status):
        if section.text:
            entries[section.title] = dg.MetadataValue.md(section.text)
        entries.update((label, _table_value(table)) for label, table in section.tables)
    entries.update((label, dg.MetadataValue.md(chart)) for label, chart in inline_charts(points, status).items())
    return entries


def _earlier_points(instance: dg.DagsterInstance) -> list[ReportPoint]:
    """The figures of earlier reports, from Dagster's own record of them: what the chart draws over time."""
    records = instance.fetch_materializations(dg.AssetKey(RUN_REPORT), limit=CHART_POINTS).records
    points = []
    for record in records:
        metadata = record.asset_materialization.metadata if record.asset_materialization else {}
        if "events_done" not in metadata:
            continue
        accept = metadata.get("accept_length")
        points.append(ReportPoint(record.timestamp, int(metadata["events_done"].value), accept and accept.value))
    return points


@dg.asset(
    deps=[layout.COMPLETIONS],
    group_name="operations",
    kinds={"duckdb"},
    check_specs=[
        dg.AssetCheckSpec(
            "dataset_exactly_once",
            asset=RUN_REPORT,
            description="Across all shards, by id: every planned generation event has exactly one record.",
        ),
        dg.AssetCheckSpec(
            "materialized_shards_in_store",
            asset=RUN_REPORT,
            description="Every completions shard Dagster recorded as materialized has its manifest and intact objects.",
        ),
        dg.AssetCheckSpec(
            "operator_alerts",
            asset=RUN_REPORT,
            description="Nothing needs the operator: MTP on and accepting, servers neither swamped nor idle while "
            "work waits nor set aside, the ETA within the plan, no shard failed, unpublished, blocked by a gate, "
            "overridden, damaged or refused, the fleet reachable.",
        ),
    ],
    # One line: Dagster's asset page draws the description above the metadata, so a long one pushes the page's
    # verdict ("At a glance", its first entry) below a laptop's first screen.
    description="The operator's page: the verdict and the six answers at a glance, then each in detail (below).",
)
def run_report(
    context: dg.AssetExecutionContext,
    config: RunReportConfig,
    store: DatasetStore,
    fleet: SGLangFleet,
    generation: GenerationConfig,
) -> dg.MaterializeResult:
    tag_asset_run(context)
    data = store.open()
    num_shards = published_num_shards(data)
    if num_shards is None:
        raise dg.Failure("conversations are not materialized yet: nothing to report on")
    coverage = None if config.recompute_coverage else read_coverage(data)
    if coverage is None:
        coverage = dataset_coverage(data, num_shards)
        write_coverage(data, coverage)
    endpoints = fleet.known_endpoints(data)  # none without a fleet: the report still answers from the store
    materialized = materialized_shards(context.instance)
    status = collect_status(
        data,
        endpoints,
        api_key=fleet.api_key,
        current_fingerprint=generation.to_dataclass().fingerprint(),
        materialized=materialized,
        cost=fleet.cost(),
        thresholds=config.to_dataclass(),
    )
    stuck = stuck_pools(context.instance, status.progress.dead_runs)
    backfills = failed_backfills(context.instance)  # Dagster's list shows them Completed: the page says otherwise
    job_done = bool(status.shards and status.shards.done)
    status = replace(
        status, alerts=[*status.alerts, *pool_alerts(stuck), *backfill_alerts(backfills, job_done=job_done)]
    )
    # What `dflash status` shows of Dagster without importing it.
    daemon_beat = daemon_heartbeat_at(context.instance)
    status = replace(status, alerts=[*status.alerts, *daemon_alerts(daemon_beat, status.collected_at)])
    view = take_view(
        status.collected_at,
        materialized,
        status.progress.dead_runs,
        stuck,
        daemon_heartbeat_at=daemon_beat,
        failed_backfills=backfills,
    )
    write_view(data, view)
    context.log.info("\n" + render_text(status))
    figures = plot_metrics(status)
    points = run_history(
        [
            *_earlier_points(context.instance),
            ReportPoint(status.collected_at, status.progress.events_done, status.mtp.accept_length_window),
        ],
        read_published_manifests(data, layout.COMPLETIONS, CompletionsShardManifest).values(),
        [beat.started_at for beat in read_heartbeats(data)],
    )
    data.put_bytes(CHART_KEY, progress_chart(points, status))
    storage = status.storage
    return dg.MaterializeResult(
        metadata={
            **page_metadata(status, points),
            **figures,
            "chart": dg.MetadataValue.path(data.url(CHART_KEY)),
            "report": dg.MetadataValue.md(render_markdown(status)),  # the whole page in one document, to copy
            "status": dg.MetadataValue.json(asdict(status)),
            "mtp_on": status.mtp.mtp_on,
            "stale_shards": dg.MetadataValue.json(storage.stale_shards),
            "not_in_store": dg.MetadataValue.json(storage.materialized_not_in_store),
        },
        check_results=[
            dg.AssetCheckResult(
                check_name="dataset_exactly_once",
                # Events of shards not published yet are to come; a gap in a published shard, a duplicate or a
                # stray never is.
                passed=coverage.exact_so_far,
                description=(
                    f"{coverage.events_recorded:,} records for {coverage.events_planned:,} planned events in "
                    f"{coverage.shards_published}/{coverage.shards} published shards: "
                    f"{coverage.events_missing:,} missing, {coverage.events_not_yet_published:,} not yet published, "
                    f"{coverage.events_duplicated:,} duplicated, "
                    f"{coverage.events_unexpected:,} unexpected; damaged shards {coverage.shards_damaged or 'none'}"
                    + "".join(f"; shard {damage.shard}: {'; '.join(damage.problems)}" for damage in coverage.damaged)
                    + "".join(f"; {problem}" for problem in coverage.disagreements)
                ),
                # Lists (the id samples, the damaged shards) as JSON, counts as numbers.
                metadata={
                    name: dg.MetadataValue.json(value) if isinstance(value, list) else value
                    for name, value in asdict(coverage).items()
                },
            ),
            dg.AssetCheckResult(
                check_name="materialized_shards_in_store",
                passed=not storage.materialized_not_in_store,
                description=(
                    f"{len(materialized)} materialized shards; not intact in the store: "
                    f"{storage.materialized_not_in_store or 'none'}"
                ),
                metadata={"materialized": len(materialized), "shards_published": storage.shards_published},
            ),
            dg.AssetCheckResult(
                check_name="operator_alerts",
                passed=not status.alerts,
                severity=dg.AssetCheckSeverity.WARN,
                description="; ".join(f"[{alert.kind}] {alert.message}" for alert in status.alerts) or "no alerts",
                metadata={
                    "alerts": len(status.alerts),
                    "kinds": dg.MetadataValue.json(sorted({alert.kind for alert in status.alerts})),
                },
            ),
        ],
    )


refresh_run_report = dg.define_asset_job(
    "refresh_run_report",
    selection=[RUN_REPORT],
    description="Recompute the operator's page (the run_report asset) and its alerts.",
    tags={"dflash/purpose": "operator page"},
)


def _is_page_refresh(run: dg.DagsterRun) -> bool:
    """A run that only recomputes this page (the sensor's, or the asset page's Materialize button, which the asset
    tags `materialize run_report`): its end changes nothing the page shows."""
    return run.job_name == refresh_run_report.name or run.tags.get(PURPOSE_TAG) == f"materialize {RUN_REPORT}"


def latest_pipeline_end(instance: dg.DagsterInstance, after: float) -> float | None:
    """The latest end, after `after`, of a run of the pipeline (success, failure or cancel) or of a backfill;
    None when nothing ended since. One query each, whatever the number of runs: the run records updated since
    (a run's record is updated when it ends), and the latest backfills. A plain sensor reading them rather than
    a run-status sensor, which calls its function once per ended run: 1,830 shard runs ending would ask for
    1,830 refreshes, where one tick's single refresh shows them all."""
    since = datetime.fromtimestamp(after, UTC)
    records = instance.get_run_records(
        dg.RunsFilter(statuses=ENDED, updated_after=since), limit=RECENT_ENDS, order_by="update_timestamp"
    )
    ends = [record.end_time for record in records if record.end_time and not _is_page_refresh(record.dagster_run)]
    ends += [
        backfill.backfill_end_timestamp
        for backfill in instance.get_backfills(limit=RECENT_ENDS)
        if backfill.backfill_end_timestamp
    ]
    return max((end for end in ends if end > after), default=None)


@dg.sensor(
    job=refresh_run_report,
    minimum_interval_seconds=SENSOR_TICK_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Refresh run_report, so its page, plots and alerts are current: at the next tick after any run of "
    "the pipeline or a backfill ends (success or failure), the line is held or released, or generation starts or "
    f"stops, and every {REFRESH_INTERVAL_S // 60} minutes while shard runs are in progress (live heartbeats).",
)
def run_report_refresh(context: dg.SensorEvaluationContext, store: DatasetStore) -> dg.SensorResult:
    cursor = RefreshCursor.from_json(context.cursor)
    now = time.time()
    in_progress = context.instance.get_runs_count(dg.RunsFilter(job_name=refresh_run_report.name, statuses=IN_PROGRESS))
    stuck = stuck_pools(context.instance)
    # Each waiting run is told once, in its own log, which runs hold its slot and the command that frees them.
    tell_waiting_runs(context.instance, stuck)
    opened = store.open()
    decision = decide_refresh(
        cursor,
        latest_end=latest_pipeline_end(context.instance, cursor.ended_until),
        shards_running=shards_running(opened, now),
        refresh_in_progress=bool(in_progress),
        now=now,
        stuck_waiting=tuple(sorted({run_id for pool in stuck for run_id in pool.waiting_runs})),
        latest_hold_event=latest_hold_event(opened),
    )
    if decision.reason is None:
        return dg.SensorResult(skip_reason=decision.skip_reason, cursor=decision.cursor.to_json())
    # While shards run, the page and the alerts follow the heartbeats and the recount by id (every shard's ids)
    # waits; once none runs, the refresh recounts, so the page at rest is complete.
    config = {"ops": {RUN_REPORT: {"config": {"recompute_coverage": decision.recount}}}}
    return dg.SensorResult(
        run_requests=[dg.RunRequest(run_config=config, tags={"dflash/refresh_reason": decision.reason})],
        cursor=decision.cursor.to_json(),
    )
