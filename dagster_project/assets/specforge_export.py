import dagster as dg

from dagster_project.assets.training_set import training_set
from dagster_project.partitions import open_shard, shard_partitions
from dagster_project.resources import DatasetStore
from dagster_project.training.export import export_shard


@dg.asset(
    partitions_def=shard_partitions,
    deps=[training_set],
    group_name="exports",
    kinds={"json"},
    description=(
        "SpecForge pre-tokenized JSONL ({input_ids, loss_mask} per line) of one training shard. "
        "Train on `cat exports/specforge/shard=*.jsonl > train.jsonl` (see dagster_project/training/export.py)."
    ),
)
def specforge_export(context: dg.AssetExecutionContext, store: DatasetStore) -> dg.MaterializeResult:
    shard, data = open_shard(context, store)
    written = export_shard(data, shard, store.local_dir() / "staging")
    return dg.MaterializeResult(
        metadata={
            "rows": written.rows,
            "tokens": written.tokens,
            "loss_tokens": written.loss_tokens,
            "bytes": written.size,
            "sha256": written.sha256,
            "training_ids_digest": written.training_ids_digest,
            "uri": dg.MetadataValue.path(data.url(written.key)),
        }
    )
