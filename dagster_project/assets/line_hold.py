"""The Dagster side of a hold of the line (`generation.line_hold`): no further generating run starts.

The shard runs themselves stop admitting and end with a failure naming the hold. While a hold stands:

* `HoldingRunCoordinator`, the instance's run coordinator (dagster.yaml), cancels a generating run when it is
  submitted, before it is queued: it never launches, whoever submits it (a backfill, the UI, or the CLI's
  `dagster job backfill`, which submits its runs one by one and so goes on submitting after a hold);
* each shard run as it sees the hold (before its in-flight requests drain) and as it fails, and `line_hold_sensor`
  every tick, cancel the generating runs already queued, and
  each backfill that generates once none of its runs is still at work (cancelling it sooner would terminate the
  runs draining their in-flight requests): the backfill then launches no further run.

After `dflash hold release`, materialize the shards again (a new backfill): each resumes from its journal.
"""

import dagster as dg
from dagster._core.execution.backfill import BulkActionStatus  # not exported at the top level in 1.13
from dagster._core.storage.tags import BACKFILL_ID_TAG

from dagster_project.generation.line_hold import read_hold
from dagster_project.resources import DatasetStore
from dagster_project.resources.environment import store_from_env
from dagster_project.store import layout

HOLD_SENSOR_TICK_S = 15
_GENERATING = dg.AssetKey(layout.COMPLETIONS)
_AT_WORK = [dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def _generates(run: dg.DagsterRun) -> bool:
    return _GENERATING in (run.asset_selection or set()) or run.job_name == "shard_job"


def stop_launching(instance: dg.DagsterInstance, why: str) -> tuple[list[str], list[str]]:
    """Cancel the generating runs not started yet (queued, or created and not yet submitted) and the generating
    backfills none of whose runs is at work; return (runs cancelled, backfills cancelled)."""
    waiting = dg.RunsFilter(statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED])
    queued = [run for run in instance.get_runs(waiting) if _generates(run)]
    for run in queued:
        instance.report_run_canceled(run, message=f"not started: {why}")
    backfills = []
    for backfill in instance.get_backfills(status=BulkActionStatus.REQUESTED):
        runs = instance.get_runs(dg.RunsFilter(tags={BACKFILL_ID_TAG: backfill.backfill_id}))
        if any(run.status in _AT_WORK for run in runs):
            continue  # its generating runs are draining: cancelling now would terminate them
        selection = set(backfill.asset_selection or ())
        if _GENERATING in selection or backfill.job_name == "shard_job" or any(_generates(run) for run in runs):
            instance.update_backfill(backfill.with_status(BulkActionStatus.CANCELING))
            backfills.append(backfill.backfill_id)
    return [run.run_id for run in queued], backfills


@dg.sensor(
    minimum_interval_seconds=HOLD_SENSOR_TICK_S,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="While the line is held (a quality gate failed on the answers arriving: `dflash hold`), cancel the "
    "queued generating runs and the backfills that would launch more; the running ones stop by themselves.",
)
def line_hold_sensor(context: dg.SensorEvaluationContext, store: DatasetStore) -> dg.SkipReason:
    hold = read_hold(store.open())
    if hold is None:
        return dg.SkipReason("the line is not held")
    runs, backfills = stop_launching(context.instance, hold.headline())
    if runs or backfills:
        context.log.warning(
            f"{hold.headline()} — cancelled queued runs {runs or 'none'}, backfills {backfills or 'none'}"
        )
    return dg.SkipReason(hold.headline())


class HoldingRunCoordinator(dg.QueuedRunCoordinator):
    """Dagster's queued run coordinator (the same settings: dagster.yaml's `concurrency` and its own config), which
    refuses a generating run at its submission while the line is held: the run is cancelled, naming the hold, and
    never queued nor launched. Other runs, and every run while the line is not held, are queued as Dagster does."""

    def submit_run(self, context: dg.SubmitRunContext) -> dg.DagsterRun:
        run = context.dagster_run
        if _generates(run) and run.status == dg.DagsterRunStatus.NOT_STARTED:
            # The store as the definitions' `store` resource opens it: this runs in the process that submits.
            hold = read_hold(store_from_env().open())
            if hold is not None:
                self._instance.report_run_canceled(run, message=f"not started: {hold.headline()}")
                return self._instance.get_run_by_id(run.run_id) or run
        return super().submit_run(context)
