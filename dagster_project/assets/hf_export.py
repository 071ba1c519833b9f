# No `from __future__ import annotations` here: Dagster 1.13 cannot resolve a string-annotated Config parameter.
from collections.abc import Iterator
from typing import Any

import dagster as dg

from dagster_project.assets.specforge_export import ExportConfig, export_shards
from dagster_project.assets.training_set import training_set
from dagster_project.partitions import FOLLOWS_ITS_SHARD, SHARD_BACKFILL_POLICY, shard_partitions
from dagster_project.resources import DatasetStore
from dagster_project.store.storage import Store
from dagster_project.training.hf_export import CARD_KEY, export_hf_shard, write_dataset_card


@dg.asset(
    partitions_def=shard_partitions,
    backfill_policy=SHARD_BACKFILL_POLICY,
    deps=[training_set],
    group_name="shards",
    automation_condition=FOLLOWS_ITS_SHARD,
    kinds={"parquet"},
    description=(
        "Hugging Face `datasets` Parquet layout of one training shard (exports/hf/data/), and the dataset card "
        "(exports/hf/README.md) rebuilt over every exported shard once the run's shards are exported. "
        'Load with load_dataset("parquet", data_files="exports/hf/data/*.parquet").'
    ),
)
def hf_export(
    context: dg.AssetExecutionContext, config: ExportConfig, store: DatasetStore
) -> Iterator[dg.MaterializeResult | dg.AssetMaterialization]:
    yield from export_shards(context, config, store, export_hf_shard, _hf_metadata)
    write_dataset_card(store.open())


def _hf_metadata(written: Any, data: Store) -> dict[str, object]:
    return {
        "rows": written.rows,
        "tokens": written.tokens,
        "loss_tokens": written.loss_tokens,
        "rows_by_source": dg.MetadataValue.json(written.rows_by_source),
        "bytes": written.size,
        "sha256": written.sha256,
        "checks_passed": dg.MetadataValue.json(written.checks_passed),
        "gates_overridden": dg.MetadataValue.json(written.overridden),
        "uri": dg.MetadataValue.path(data.url(written.key)),
        "dataset_card": dg.MetadataValue.path(data.url(CARD_KEY)),
    }
