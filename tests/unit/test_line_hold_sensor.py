"""While the line is held, Dagster launches no further generating run: the queued ones are cancelled, and a
backfill that generates is cancelled once none of its runs is still draining (cancelling it sooner would terminate
them), through the instance's own run and backfill APIs."""

from __future__ import annotations

import time

import dagster as dg
from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill
from dagster._core.remote_origin import InProcessCodeLocationOrigin, RemoteJobOrigin, RemoteRepositoryOrigin
from dagster._core.storage.tags import BACKFILL_ID_TAG
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from dagster_project.assets.line_hold import HoldingRunCoordinator, stop_launching
from dagster_project.generation.line_hold import Hold, put_hold, release_hold
from dagster_project.store.storage import LocalStore
from tests.support.dagster_helpers import dagster_home

COMPLETIONS = dg.AssetKey("completions")
HELD = Hold("short_answers", "BLOCKED: 87% short", 0.87, 0.01, 120, "run", time.time(), shards=[0])


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


def _submitted(instance, run_id: str, job_name: str = "__ASSET_JOB", **selection) -> dg.DagsterRun:
    """A run submitted as `dagster job backfill` and the backfill daemon submit theirs: through the instance's run
    coordinator, with the origin a queued run needs (the project's code location)."""
    location = InProcessCodeLocationOrigin(LoadableTargetOrigin(module_name="dagster_project.definitions"))
    origin = RemoteJobOrigin(RemoteRepositoryOrigin(location, "__repository__"), job_name)
    run = instance.add_run(dg.DagsterRun(job_name=job_name, run_id=run_id, remote_job_origin=origin, **selection))
    return instance.run_coordinator.submit_run(dg.SubmitRunContext(run, workspace=None))


def test_while_the_line_is_held_a_generating_run_is_cancelled_at_its_submission_never_queued(tmp_path, monkeypatch):
    """dagster.yaml's run coordinator: the CLI's `dagster job backfill` submits its runs one by one, after the hold
    too, and the queue launches a queued run within a second; refused at submission, such a run never launches."""
    monkeypatch.setenv("DFLASH_STORE", str(tmp_path / "store"))
    instance = dg.DagsterInstance.from_config(str(dagster_home(tmp_path / "home")))
    try:
        assert isinstance(instance.run_coordinator, HoldingRunCoordinator)
        assert _submitted(instance, "before", "shard_job").status == dg.DagsterRunStatus.QUEUED  # not held

        hold = put_hold(LocalStore(tmp_path / "store"), HELD)
        refused = _submitted(instance, "after", "shard_job")
        assert refused.status == dg.DagsterRunStatus.CANCELED
        assert _submitted(instance, "asset", asset_selection={COMPLETIONS}).status == dg.DagsterRunStatus.CANCELED
        assert _submitted(instance, "page", "refresh_run_report").status == dg.DagsterRunStatus.QUEUED  # not generating
        logs = [e.message for e in instance.all_logs("after")]
        assert any(hold.headline() in (message or "") for message in logs), logs
        assert not [e for e in instance.all_logs("after") if e.dagster_event_type == dg.DagsterEventType.RUN_ENQUEUED]

        release_hold(LocalStore(tmp_path / "store"), by="test", reason="fleet fixed")
        assert _submitted(instance, "released", "shard_job").status == dg.DagsterRunStatus.QUEUED
    finally:
        instance.dispose()
