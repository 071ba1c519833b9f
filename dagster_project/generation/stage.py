"""Run one completions shard end to end: resume its journal, generate what is missing, publish it.

Publishing writes the shard's Parquet (one row per event: a result or an explicit error) and then its
manifest, only once the journal holds exactly one record per planned event.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dagster_project.conversations.shards import read_conversations
from dagster_project.generation.dispatch import Dispatcher
from dagster_project.generation.events import ShardGeneration
from dagster_project.generation.heartbeat import ShardReporter, restore_journal
from dagster_project.generation.journal import Journal
from dagster_project.generation_settings import GenerationSettings
from dagster_project.records import COMPLETION_SCHEMA, STATUS_OK
from dagster_project.store.layout import COMPLETIONS, CONVERSATIONS, shard_prefix
from dagster_project.store.manifest import ids_digest, publish_shard, read_shard_manifest
from dagster_project.store.storage import Store

ROWS_PER_GROUP = 256
PARQUET_NAME = "completions.parquet"


def journal_path(work_dir: Path, shard: int, fingerprint: str) -> Path:
    """Journals are per settings fingerprint: results made under other settings are never resumed into."""
    return work_dir / "journal" / shard_prefix(COMPLETIONS, shard) / f"{fingerprint}.jsonl"


def write_completions_parquet(journal: Journal, path: Path) -> dict[str, Any]:
    """Stream the journal's final records into one Parquet file; return counts for the manifest."""
    columns = COMPLETION_SCHEMA.names
    counts = {"rows": 0, "ok": 0, "errors": 0, "prompt_tokens": 0, "output_tokens": 0}
    event_ids: list[str] = []
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(
        path, COMPLETION_SCHEMA, compression="zstd", use_dictionary=["policy", "status", "server"]
    ) as writer:
        batch: list[dict[str, Any]] = []
        for record in journal.final_records():
            batch.append({name: record.get(name) for name in columns})
            event_ids.append(record["event_id"])
            ok = record["status"] == STATUS_OK
            counts["rows"] += 1
            counts["ok" if ok else "errors"] += 1
            counts["prompt_tokens"] += int(record.get("prompt_tokens") or 0)
            counts["output_tokens"] += int(record.get("completion_tokens") or 0) if ok else 0
            if len(batch) == ROWS_PER_GROUP:
                writer.write_table(pa.Table.from_pylist(batch, schema=COMPLETION_SCHEMA))
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=COMPLETION_SCHEMA))
    counts["event_ids"] = event_ids
    return counts


def generate_shard(
    store: Store,
    shard: int,
    *,
    tokenizer: Any,
    settings: GenerationSettings,
    dispatcher: Dispatcher,
    work_dir: Path,
    heartbeat_interval_s: float = 5.0,
    checkpoint_interval_s: float = 60.0,
    log_interval_s: float = 30.0,
    on_progress: Callable[[dict[str, Any]], None] | None = None,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """Generate and publish `completions/shard=NNNNN/`; return its manifest."""
    conversations_manifest = read_shard_manifest(store, CONVERSATIONS, shard)
    if conversations_manifest is None:
        raise RuntimeError(f"conversations shard {shard} is not published: materialize `conversations` first")
    conversations = list(read_conversations(store, shard))
    fingerprint = settings.fingerprint()
    policies = {c.policy for c in conversations}
    if policies - {settings.policy}:
        raise RuntimeError(
            f"conversations of shard {shard} were planned with policy {sorted(policies)} but generation is "
            f"configured with {settings.policy!r}: re-materialize `conversations` with the same policy"
        )

    local_journal = journal_path(work_dir, shard, fingerprint)
    if restore_journal(store, shard, fingerprint, local_journal):
        log(f"journal restored from the store's checkpoint (a resume on a new node): {local_journal}")
    with Journal(local_journal) as journal:
        if journal.torn_bytes_dropped:
            log(f"journal: dropped a torn last line ({journal.torn_bytes_dropped} bytes) left by a killed run")
        job = ShardGeneration(shard, conversations, tokenizer, settings, journal)
        reporter = ShardReporter(
            store,
            shard,
            journal,
            fingerprint,
            job.snapshot,
            heartbeat_interval_s=heartbeat_interval_s,
            checkpoint_interval_s=checkpoint_interval_s,
            log_interval_s=log_interval_s,
            on_progress=on_progress,
            log=log,
        )
        log(
            f"shard {shard}: {job.progress.total_events} events in {len(conversations)} conversations, "
            f"{job.progress.resumed_events} already in the journal"
        )
        summary = asyncio.run(job.run(dispatcher, reporter))
        missing = job.missing_events()
        if missing:
            raise RuntimeError(f"shard {shard}: {len(missing)} events did not end, e.g. {missing[:3]}")
        with tempfile.TemporaryDirectory(dir=work_dir) as staging:
            parquet = Path(staging) / PARQUET_NAME
            counts = write_completions_parquet(journal, parquet)
            expected = {c.event_id(t) for c in conversations for t in range(c.num_turns)}
            if len(counts["event_ids"]) != len(expected) or set(counts["event_ids"]) != expected:
                raise RuntimeError(f"shard {shard}: the journal does not hold exactly one record per planned event")
            manifest = publish_shard(
                store,
                COMPLETIONS,
                shard,
                [(PARQUET_NAME, parquet)],
                {
                    "rows": counts["rows"],
                    "ok": counts["ok"],
                    "errors": counts["errors"],
                    "prompt_tokens": counts["prompt_tokens"],
                    "output_tokens": counts["output_tokens"],
                    "ids_digest": ids_digest(counts["event_ids"]),
                    "conversations": len(conversations),
                    "conversations_ids_digest": conversations_manifest.get("ids_digest"),
                    "settings_fingerprint": fingerprint,
                    "settings": settings.as_dict(),
                    "generation": {k: summary[k] for k in ("lifetime", "spec", "finish_reasons", "errors_by_kind")},
                },
            )
    job.progress.state = "published"
    asyncio.run(reporter.beat())
    return manifest
