# No `from __future__ import annotations` here: Dagster 1.13 cannot resolve a string-annotated Config parameter.
from collections.abc import Callable, Iterator
from typing import Any

import dagster as dg
from pydantic import Field

from dagster_project.assets.run_tags import tag_asset_run
from dagster_project.assets.training_set import training_set
from dagster_project.partitions import (
    FOLLOWS_ITS_SHARD,
    SHARD_BACKFILL_POLICY,
    ShardMaterialized,
    materialize_shards,
    shard_partitions,
)
from dagster_project.resources import DatasetStore
from dagster_project.resources.config_fields import config_fields
from dagster_project.store.storage import Store
from dagster_project.training.export import ExportOptions, export_shard


class ExportConfig(config_fields(ExportOptions, dg.Config)):
    """What every export of a training shard takes: the loss-token minimum and the gate override."""

    override_failed_gates: bool = Field(
        default=False,
        description="Export a training shard that failed blocking gates (refused otherwise); a check that has not "
        "run on the shard still blocks it.",
    )


def export_shards(
    context: dg.AssetExecutionContext,
    config: ExportConfig,
    store: DatasetStore,
    export: Callable[..., Any],
    metadata: Callable[[Any, Store], dict[str, object]],
) -> Iterator[dg.MaterializeResult | dg.AssetMaterialization]:
    """Run one exporter on each shard of the run, warning about every failed gate the config overrode; each
    shard's materialization carries `metadata(what it wrote, the store)`."""
    tag_asset_run(context)

    def export_one(shard: int, data: Store) -> ShardMaterialized:
        written = export(
            data,
            shard,
            store.local_dir() / "staging",
            override_failed_gates=config.override_failed_gates,
            options=config.to_dataclass(),
        )
        for gate, message in written.overridden.items():
            context.log.warning(f"shard {shard}: failed training gate {gate} overridden by config: {message}")
        return ShardMaterialized(metadata(written, data))

    yield from materialize_shards(context, store, export_one)


@dg.asset(
    partitions_def=shard_partitions,
    backfill_policy=SHARD_BACKFILL_POLICY,
    deps=[training_set],
    group_name="shards",
    automation_condition=FOLLOWS_ITS_SHARD,
    kinds={"json"},
    description=(
        "SpecForge pre-tokenized JSONL ({input_ids, loss_mask} per line) of one training shard. "
        "Train on `cat exports/specforge/shard=*.jsonl > train.jsonl` (see dagster_project/training/export.py)."
    ),
)
def specforge_export(
    context: dg.AssetExecutionContext, config: ExportConfig, store: DatasetStore
) -> Iterator[dg.MaterializeResult | dg.AssetMaterialization]:
    yield from export_shards(context, config, store, export_shard, _specforge_metadata)


def _specforge_metadata(written: Any, data: Store) -> dict[str, object]:
    return {
        "rows": written.rows,
        "tokens": written.tokens,
        "loss_tokens": written.loss_tokens,
        "bytes": written.size,
        "sha256": written.sha256,
        "training_ids_digest": written.training_ids_digest,
        "gates_overridden": dg.MetadataValue.json(written.overridden),
        "uri": dg.MetadataValue.path(data.url(written.key)),
    }
