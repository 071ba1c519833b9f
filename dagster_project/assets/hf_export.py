# No `from __future__ import annotations` here: Dagster 1.13 cannot resolve a string-annotated Config parameter.
import dagster as dg

from dagster_project.assets.specforge_export import ExportConfig, export_partition
from dagster_project.assets.training_set import training_set
from dagster_project.partitions import FOLLOWS_ITS_SHARD, shard_partitions
from dagster_project.resources import DatasetStore
from dagster_project.training.hf_export import CARD_KEY, export_hf_shard


@dg.asset(
    partitions_def=shard_partitions,
    deps=[training_set],
    group_name="shards",
    automation_condition=FOLLOWS_ITS_SHARD,
    kinds={"parquet"},
    description=(
        "Hugging Face `datasets` Parquet layout of one training shard (exports/hf/data/), and the dataset card "
        "(exports/hf/README.md) rewritten over every exported shard. "
        'Load with load_dataset("parquet", data_files="exports/hf/data/*.parquet").'
    ),
)
def hf_export(context: dg.AssetExecutionContext, config: ExportConfig, store: DatasetStore) -> dg.MaterializeResult:
    written, data = export_partition(context, config, store, export_hf_shard)
    return dg.MaterializeResult(
        metadata={
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
    )
