"""The pipeline's Dagster definitions: assets per stage, their checks, resources and the shard job."""

from __future__ import annotations

import os
import warnings

import dagster as dg

# Partitioned asset checks are a preview feature in Dagster 1.13; they are what gives per-shard gates.
# Silenced before the asset modules are imported, since the warning fires when a check is defined.
warnings.filterwarnings("ignore", category=dg.PreviewWarning)
warnings.filterwarnings("ignore", category=dg.BetaWarning)

from dagster_aws.s3 import S3Resource  # noqa: E402

from dagster_project import settings  # noqa: E402
from dagster_project.assets import (  # noqa: E402
    completions,
    conversations,
    raw_prompts,
    run_report,
    specforge_export,
    training_set,
)
from dagster_project.checks import completions as completions_checks  # noqa: E402
from dagster_project.checks import conversations as conversations_checks  # noqa: E402
from dagster_project.checks import training_set as training_set_checks  # noqa: E402
from dagster_project.partitions import shard_partitions  # noqa: E402
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource  # noqa: E402

STAGES = [raw_prompts, conversations, completions, training_set, specforge_export, run_report]
CHECKS = [conversations_checks, completions_checks, training_set_checks]


def _resources() -> dict:
    # Credentials, endpoint, region and profile reach boto3 through its own environment chain
    # (AWS_ACCESS_KEY_ID, AWS_PROFILE, AWS_ENDPOINT_URL, ...): nothing secret is set here.
    s3 = S3Resource()
    return {
        "s3": s3,
        "store": DatasetStore(root=settings.store_uri(), s3=s3),
        "tokenizer": TokenizerResource(name_or_path=settings.tokenizer_name()),
        "generation": GenerationConfig(),
        "fleet": SGLangFleet(
            endpoints=settings.sglang_endpoints(),
            router_url=settings.sglang_router(),
            fleet_dir=str(settings.fleet_dir()),
            api_key=dg.EnvVar("SGLANG_API_KEY") if os.environ.get("SGLANG_API_KEY") else None,
        ),
    }


shard_job = dg.define_asset_job(
    "shard_job",
    selection=dg.AssetSelection.assets("completions", "training_set", "specforge_export"),
    partitions_def=shard_partitions,
    description="Generate, assemble and export one shard; backfill it over all shards.",
)

defs = dg.Definitions(
    assets=dg.load_assets_from_modules(STAGES),
    asset_checks=dg.load_asset_checks_from_modules(CHECKS),
    jobs=[shard_job],
    resources=_resources(),
    # A shard run's steps are sequential (generate, gate, assemble, gate, export). One process per run loads
    # the tokenizer once and spares ~3 s of process start per step: ~45 s per shard, ~14 CPU-hours over
    # 1,830 shards. Runs still execute in parallel, one per shard.
    executor=dg.in_process_executor,
)
