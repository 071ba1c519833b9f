"""The pipeline's Dagster definitions: assets per stage, their checks, resources and the shard job."""

from __future__ import annotations

import atexit
import gc
import warnings

import dagster as dg

# Partitioned asset checks are a preview feature in Dagster 1.13; they are what gives per-shard gates.
# Silenced before the asset modules are imported, since the warning fires when a check is defined.
warnings.filterwarnings("ignore", category=dg.PreviewWarning)
warnings.filterwarnings("ignore", category=dg.BetaWarning)

from dagster_project.assets import (  # noqa: E402
    completions,
    conversations,
    fleet_tuning,
    hf_export,
    line_hold,
    mixture_report,
    pilot,
    raw_prompts,
    run_report,
    specforge_export,
    training_set,
)
from dagster_project.checks import completions as completions_checks  # noqa: E402
from dagster_project.checks import contamination as contamination_checks  # noqa: E402
from dagster_project.checks import conversations as conversations_checks  # noqa: E402
from dagster_project.checks import training_set as training_set_checks  # noqa: E402
from dagster_project.partitions import refuse_unknown_partition, shard_partitions  # noqa: E402
from dagster_project.resources import resources_from_env  # noqa: E402

# A shard run is one process per shard. At exit, CPython's last garbage collections walk every object the
# imports made (dagster, pyarrow, transformers: millions of objects): about a second of each run's teardown,
# spent on memory the exit returns anyway. Frozen objects are left out of those collections. Nothing relies
# on them: every file the pipeline writes is closed or flushed explicitly (the journal after each event).
atexit.register(gc.freeze)

STAGES = [
    raw_prompts,
    conversations,
    pilot,
    completions,
    training_set,
    specforge_export,
    hf_export,
    mixture_report,
    run_report,
    fleet_tuning,
]
CHECKS = [conversations_checks, contamination_checks, completions_checks, training_set_checks]

# `dagster asset materialize --partition shard-99999`: one line naming the shards there are, not Dagster's traceback.
refuse_unknown_partition()

SHARD_ASSETS = dg.AssetSelection.assets("completions", "training_set", "specforge_export", "hf_export")

shard_job = dg.define_asset_job(
    "shard_job",
    selection=SHARD_ASSETS,
    partitions_def=shard_partitions,
    description="Generate, assemble and export one shard, with their gates: pick a shard and launch; backfill it "
    "over all shards.",
    tags={"dflash/purpose": "shard"},
)

# Runs `FOLLOWS_ITS_SHARD`: a shard whose completions were (re)made alone gets assembled and exported.
shard_followups = dg.AutomationConditionSensorDefinition(
    "shard_followups",
    target=SHARD_ASSETS,
    default_status=dg.DefaultSensorStatus.RUNNING,
    run_tags={"dflash/purpose": "shard follow-up"},
    description="Assembles and exports a shard whose completions were materialized without them.",
)

defs = dg.Definitions(
    assets=dg.load_assets_from_modules(STAGES),
    asset_checks=dg.load_asset_checks_from_modules(CHECKS),
    jobs=[shard_job, run_report.refresh_run_report],
    sensors=[shard_followups, run_report.run_report_refresh, line_hold.line_hold_sensor],
    resources=resources_from_env(),
    # A shard run's steps are sequential (generate, gate, assemble, gate, export). One process per run loads
    # the tokenizer once and spares ~3 s of process start per step: ~45 s per shard, ~14 CPU-hours over
    # 1,830 shards. Runs still execute in parallel, one per shard.
    executor=dg.in_process_executor,
)
