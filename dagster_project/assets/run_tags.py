"""What a run is for, as the `dflash/purpose` tag every run of the project carries.

The named jobs tag their runs in their definitions (`shard_job`: shard, `refresh_run_report`: operator page, the
`shard_followups` sensor: shard follow-up). A run launched from an asset page's Materialize button, or by
`dagster asset materialize`, belongs to Dagster's hidden asset job (`__ASSET_JOB`), which takes no tags from the
definitions: its first asset tags it with what it materializes, so the runs list shows and filters it the same way.
"""

from __future__ import annotations

import dagster as dg

PURPOSE_TAG = "dflash/purpose"


def tag_asset_run(context: dg.AssetExecutionContext) -> None:
    """Tag a run that has no purpose yet with the assets it materializes (`materialize completions`)."""
    run = context.run
    if PURPOSE_TAG in run.tags:
        return
    assets = sorted(key.to_user_string() for key in run.asset_selection or {context.asset_key})
    context.instance.add_run_tags(run.run_id, {PURPOSE_TAG: "materialize " + ", ".join(assets)})
