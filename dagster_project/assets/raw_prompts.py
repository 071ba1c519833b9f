"""Asset `raw_prompts` (group ingest): every source row normalized or quarantined (see ingest/stage.py)."""

# No `from __future__ import annotations`: Dagster 1.13 cannot resolve string annotations of a Config.
import functools
import tempfile
from dataclasses import asdict
from pathlib import Path

import dagster as dg
from pydantic import Field

from dagster_project import settings
from dagster_project.assets.run_tags import tag_asset_run
from dagster_project.assets.tables import counts_table
from dagster_project.ingest.formats import (
    AUTO,
    CONTROL_TOKEN_MODES,
    CONTROL_TOKENS_QUARANTINE,
    FORMATS,
    ControlTokenPolicy,
)
from dagster_project.ingest.readers import MAX_LINE_BYTES
from dagster_project.ingest.stage import ingest_to_store
from dagster_project.resources import DatasetStore, TokenizerResource
from dagster_project.store import layout
from dagster_project.tokenizer import tokenizer_profile


class RawPromptsConfig(dg.Config):
    sources: list[str] = Field(
        default=settings.prompt_sources(),
        description="Source specs: a path, directory, glob or s3:// URI, optionally named as NAME=URI, with its "
        "own format and main field as NAME@FORMAT[:FIELD]=URI (e.g. c4@prompt:text=data/c4.jsonl).",
    )
    format: str = Field(
        default=AUTO,
        description=f"Row format of the files whose source sets none: {AUTO} (detected per file) or one of "
        f"{', '.join(FORMATS)}.",
    )
    control_tokens: str = Field(
        default=CONTROL_TOKENS_QUARANTINE,
        description="The model's control-token text (its special tokens and turn markers: Qwen3.6's <|im_start|>, "
        "<|im_end|>, ...; DeepSeek's <｜User｜>; Mistral's [INST]) in a row's content: "
        f"{' or '.join(CONTROL_TOKEN_MODES)}. `quarantine` sets the row aside (reason control_tokens); `literal` "
        "keeps it and encodes the text as ordinary text, never as a control token, so it cannot forge a turn.",
    )
    literal_control_token_sources: list[str] = Field(
        default=[],
        description="Source names whose control-token text is kept as literal text whatever `control_tokens` says.",
    )
    max_line_bytes: int = Field(
        default=MAX_LINE_BYTES,
        description="The longest row read, in bytes (decompressed): a longer JSON Lines row is skipped unread and "
        "quarantined (line_too_long), so a gzip bomb or a runaway line never holds more memory than this; a longer "
        "JSON array element or single-object .json file ends its file's reading (unreadable_file).",
    )


@dg.asset(
    name=layout.RAW_PROMPTS,
    group_name="prompts",
    kinds={"json"},
    description="Every source row, normalized to messages or quarantined with a reason (raw_prompts/ in the store).",
)
def raw_prompts(
    context: dg.AssetExecutionContext, config: RawPromptsConfig, store: DatasetStore, tokenizer: TokenizerResource
) -> dg.MaterializeResult:
    tag_asset_run(context)
    data = store.open()
    # The job's model's control tokens: what would forge a turn of its template (`DFLASH_TOKENIZER`).
    model_tokens = tokenizer_profile(tokenizer.load()).control_tokens
    policy = ControlTokenPolicy(config.control_tokens, frozenset(config.literal_control_token_sources), model_tokens)
    with tempfile.TemporaryDirectory(prefix="raw_prompts-", dir=store.local_dir()) as work_dir:
        manifest = ingest_to_store(
            data,
            config.sources,
            fmt=config.format,
            control_tokens=policy,
            work_dir=Path(work_dir),
            s3_client=functools.cache(store.s3.get_client),
            log=context.log.info,
            max_line_bytes=config.max_line_bytes,
        )
    return dg.MaterializeResult(
        metadata={
            "input_rows": manifest.input_rows,
            "accepted": manifest.accepted,
            "quarantined": manifest.quarantined,
            "quarantined_by_reason": dg.MetadataValue.md(counts_table("reason", manifest.quarantined_by_reason)),
            "control_tokens": config.control_tokens,
            "control_tokens_of": tokenizer.name_or_path,
            "literal_control_token_sources": ", ".join(config.literal_control_token_sources) or "none",
            "max_line_bytes": config.max_line_bytes,
            "by_source": dg.MetadataValue.md(counts_table("source", manifest.by_source)),
            "files": dg.MetadataValue.json([asdict(file) for file in manifest.files]),
            "file_notes": dg.MetadataValue.md(
                "\n".join(f"- {file.uri}: {file.note}" for file in manifest.files if file.note) or "none"
            ),
            "rows_per_s": manifest.input_rows / manifest.seconds if manifest.seconds else 0.0,
            "uri": dg.MetadataValue.path(data.url(layout.RAW_PROMPTS)),
        }
    )
