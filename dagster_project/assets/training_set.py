# No `from __future__ import annotations` here: Dagster 1.13 cannot resolve a string-annotated Config parameter.
from collections.abc import Iterator
from dataclasses import asdict

import dagster as dg
from pydantic import Field

from dagster_project.assets.run_tags import tag_asset_run
from dagster_project.partitions import (
    FOLLOWS_ITS_SHARD,
    SHARD_BACKFILL_POLICY,
    ShardMaterialized,
    materialize_shards,
    shard_partitions,
)
from dagster_project.resources import DatasetStore, TokenizerResource
from dagster_project.resources.config_fields import config_fields
from dagster_project.store import layout
from dagster_project.store.lease import LeaseOptions
from dagster_project.store.storage import Store
from dagster_project.tokenizer import tokenizer_identity
from dagster_project.training.shards import AssemblyOptions
from dagster_project.training.stage import assemble_shard


class TrainingSetConfig(config_fields(AssemblyOptions, config_fields(LeaseOptions, dg.Config))):
    """How completions become training rows (the policy is recorded in each shard's manifest)."""

    override_failed_gates: bool = Field(
        default=False,
        description="Assemble a completions shard that failed blocking gates in an earlier run (refused otherwise); "
        "the overridden gates are recorded in the training manifest.",
    )
    accept_stale_conversations: bool = Field(
        default=False,
        description="Assemble a completions shard made from conversations that were edited (rebuilt with other "
        "content) after it was generated (refused otherwise: regenerate it); recorded in the training manifest, "
        "and the exports then take the shard.",
    )


@dg.asset(
    partitions_def=shard_partitions,
    backfill_policy=SHARD_BACKFILL_POLICY,
    deps=[dg.AssetKey(layout.COMPLETIONS)],
    group_name="shards",
    automation_condition=FOLLOWS_ITS_SHARD,
    kinds={"parquet"},
    description="Token-exact DFlash rows: input_ids = prompt_ids + output_ids as SGLang saw them; loss on the output.",
)
def training_set(
    context: dg.AssetExecutionContext, config: TrainingSetConfig, store: DatasetStore, tokenizer: TokenizerResource
) -> Iterator[dg.MaterializeResult | dg.AssetMaterialization]:
    tag_asset_run(context)
    yield from materialize_shards(
        context, store, lambda shard, data: _assemble(context, config, store, tokenizer, shard, data)
    )


def _assemble(
    context: dg.AssetExecutionContext,
    config: TrainingSetConfig,
    store: DatasetStore,
    tokenizer: TokenizerResource,
    shard: int,
    data: Store,
) -> ShardMaterialized:
    manifest = assemble_shard(
        data,
        shard,
        config.to_dataclass(),
        store.local_dir() / "staging",
        tokenizer=tokenizer_identity(tokenizer.load()),
        accept_stale_conversations=config.accept_stale_conversations,
        override_failed_gates=config.override_failed_gates,
        run_id=context.run_id,
        lease=config.to_dataclass(LeaseOptions),
    )
    if manifest.source.stale_conversations_accepted:
        context.log.warning(
            f"shard {shard}: made from conversations edited since, accepted by config (accept_stale_conversations)"
        )
    for gate, message in manifest.source.gates_overridden.items():
        context.log.warning(f"shard {shard}: failed completions gate {gate} overridden by config: {message}")
    context.log.info(
        f"shard {shard}: {manifest.rows} rows, {manifest.loss_tokens} supervised tokens; "
        f"{manifest.excluded} of {manifest.rows_in} events excluded {manifest.exclusions or ''}"
    )
    return ShardMaterialized(
        {
            "rows": manifest.rows,
            "rows_in": manifest.rows_in,
            "excluded": manifest.excluded,
            "exclusions": dg.MetadataValue.json(manifest.exclusions),
            "tokens": manifest.tokens,
            "loss_tokens": manifest.loss_tokens,
            "prompt_tokens": manifest.prompt_tokens,
            "avg_loss_tokens": manifest.loss_tokens / manifest.rows if manifest.rows else 0.0,
            "truncated_rows": manifest.truncated_rows,
            "rows_over_max_length": manifest.lengths.rows_over,
            "supervised_tokens_beyond_max_length": manifest.lengths.supervised_tokens_beyond,
            "supervised_share_beyond_max_length": manifest.lengths.lost_share,
            "length_histogram": dg.MetadataValue.json(manifest.lengths.histogram),
            "max_row_tokens": manifest.max_row_tokens,
            "row_groups": manifest.row_groups,
            "assembly": dg.MetadataValue.json(asdict(manifest.assembly)),
            "settings_fingerprint": manifest.source.settings_fingerprint,
            "tokenizer": manifest.source.tokenizer.label(),
            "stale_conversations_accepted": manifest.source.stale_conversations_accepted,
            "ids_digest": manifest.ids_digest,
            "gates_overridden": dg.MetadataValue.json(manifest.source.gates_overridden),
            "uri": dg.MetadataValue.path(data.url(layout.shard_prefix(layout.TRAINING_SET, shard))),
        }
    )
