"""While the line is held, Dagster launches no further generating run: the queued ones are cancelled, and a
backfill that generates is cancelled once none of its runs is still draining (cancelling it sooner would terminate
them), through the instance's own run and backfill APIs."""

from __future__ import annotations

import time

import dagster as dg
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.storage.tags import BACKFILL_ID_TAG

from dagster_project.assets.line_hold import stop_launching

COMPLETIONS = dg.AssetKey("completions")


def _run(instance, run_id: str, status: dg.DagsterRunStatus, **tags: str) -> dg.DagsterRun:
    return instance.add_run(
        dg.DagsterRun(job_name="__ASSET_JOB", run_id=run_id, status=status, asset_selection={COMPLETIONS}, tags=tags)
    )


def test_queued_generating_runs_are_cancelled_and_the_backfill_once_its_runs_have_drained():
    with dg.instance_for_test() as instance:
        backfill = PartitionBackfill(
            "bf1", BulkActionStatus.REQUESTED, False, {}, time.time(), asset_selection=[COMPLETIONS]
        )
        instance.add_backfill(backfill)
        draining = _run(instance, "draining", dg.DagsterRunStatus.STARTED, **{BACKFILL_ID_TAG: "bf1"})
        # Not yet submitted (a queued run needs a code location's origin, which an instance alone cannot make).
        _run(instance, "queued", dg.DagsterRunStatus.NOT_STARTED, **{BACKFILL_ID_TAG: "bf1"})
        page = dg.DagsterRun(job_name="refresh_run_report", run_id="page", status=dg.DagsterRunStatus.NOT_STARTED)
        instance.add_run(page)

        assert stop_launching(instance, "held") == (["queued"], [])
        assert instance.get_run_by_id("queued").status == dg.DagsterRunStatus.CANCELED
        assert instance.get_run_by_id("page").status == dg.DagsterRunStatus.NOT_STARTED  # not a generating run
        assert instance.get_backfill("bf1").status == BulkActionStatus.REQUESTED  # its run still drains

        instance.report_run_failed(draining, "LINE HELD")
        assert stop_launching(instance, "held") == ([], ["bf1"])
        assert instance.get_backfill("bf1").status == BulkActionStatus.CANCELING
