"""Asset `conversations` (group prepare): policy, dedup, ids, shards (see conversations/stage.py)."""

# No `from __future__ import annotations`: Dagster 1.13 cannot resolve string annotations of a Config.
import tempfile
from pathlib import Path

import dagster as dg
from pydantic import Field

from dagster_project import settings
from dagster_project.assets.raw_prompts import raw_prompts
from dagster_project.assets.run_tags import tag_asset_run
from dagster_project.assets.tables import counts_table
from dagster_project.conversations.stage import (
    DEFAULT_DUPLICATE_RATE_MAX,
    DEFAULT_MAX_PROMPT_TOKENS,
    DEFAULT_QUARANTINE_RATE_MAX,
    build_conversations,
)
from dagster_project.resources import DatasetStore, GenerationConfig, TokenizerResource
from dagster_project.store import layout
from dagster_project.tokenizer import tokenizer_identity


class ConversationsConfig(dg.Config):
    max_prompt_tokens: int = Field(
        default=DEFAULT_MAX_PROMPT_TOKENS,
        description="Rows whose last generated turn's prompt has more tokens than this are quarantined (too_long).",
    )
    quarantine_rate_max: float = Field(
        default=DEFAULT_QUARANTINE_RATE_MAX,
        description="The quarantine-rate check fails when more than this fraction of input rows is quarantined for "
        "any reason but exact duplicates.",
    )
    duplicate_rate_max: float = Field(
        default=DEFAULT_DUPLICATE_RATE_MAX,
        description="The quarantine-rate check fails when more than this fraction of input rows are exact duplicates "
        "of earlier rows (the first copy is kept; a high share usually means a source listed twice).",
    )
    supersede_shards: bool = Field(
        default=False,
        description="Rebuild with another shard count (DFLASH_NUM_SHARDS) although completions or training shards "
        "made from the old one are published: their manifests are withdrawn and the exports deleted (refused "
        "otherwise). Or build into a new store prefix instead.",
    )


@dg.asset(
    name=layout.CONVERSATIONS,
    deps=[raw_prompts],
    group_name="prompts",
    kinds={"json"},
    description=(
        "Normalized conversations under the multi-turn policy, deduplicated, with stable ids, published per "
        "shard (conversations/shard=NNNNN/); the shards are this asset's files, its partitions are downstream."
    ),
)
def conversations(
    context: dg.AssetExecutionContext,
    config: ConversationsConfig,
    store: DatasetStore,
    tokenizer: TokenizerResource,
    generation: GenerationConfig,
) -> dg.MaterializeResult:
    tag_asset_run(context)
    data = store.open()
    with tempfile.TemporaryDirectory(prefix="conversations-", dir=store.local_dir()) as work_dir:
        manifest = build_conversations(
            data,
            load_tokenizer=tokenizer.load,
            tokenizer=tokenizer_identity(tokenizer.load()),  # loaded with the run's resources already
            settings=generation.to_dataclass(),
            num_shards=settings.num_shards(),
            work_dir=Path(work_dir),
            max_prompt_tokens=config.max_prompt_tokens,
            quarantine_rate_max=config.quarantine_rate_max,
            duplicate_rate_max=config.duplicate_rate_max,
            supersede_shards=config.supersede_shards,
            log=context.log.info,
        )
    return dg.MaterializeResult(
        metadata={
            "rows": manifest.rows,
            "input_rows": manifest.input_rows,
            "quarantined": manifest.quarantined,
            "quarantine_rate": dg.MetadataValue.float(manifest.quarantine_rate),
            "duplicates": manifest.duplicates,
            "duplicate_rate": dg.MetadataValue.float(manifest.duplicate_rate),
            "quarantined_by_reason": dg.MetadataValue.md(counts_table("reason", manifest.quarantined_by_reason)),
            "by_source": dg.MetadataValue.md(counts_table("source", manifest.by_source)),
            "by_policy": dg.MetadataValue.md(counts_table("policy", manifest.by_policy)),
            "policy": manifest.policy,
            "history": manifest.history,
            "multi_turn": manifest.multi_turn,
            "turns": manifest.turns,
            "tool_calling": manifest.tool_calling,
            "renamed_ids": manifest.renamed_ids,
            "num_shards": manifest.num_shards,
            "superseded": dg.MetadataValue.json(manifest.superseded),
            "prompts_tokenized": manifest.prompts_tokenized,
            "ids_digest": manifest.ids_digest,
            "tokenizer": manifest.tokenizer.label(),
            "rows_per_s": manifest.input_rows / manifest.seconds if manifest.seconds else 0.0,
            "uri": dg.MetadataValue.path(data.url(layout.CONVERSATIONS)),
        }
    )
