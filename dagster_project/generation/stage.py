"""Run one completions shard end to end: resume its journal, generate what is missing, publish it.

Publishing writes the shard's Parquet (one row per event: a result or an explicit error) and then its
manifest, only once the journal holds exactly one record per planned event.

One writer per shard: the run holds the shard's lease in the store (`store.lease`) from before it opens the
journal until it has published, renews it as it goes, and once more just before publishing; a second run of
the shard, here or on another node, refuses naming the holder, and a run whose lease was taken over stops
without publishing.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dagster_project.conversations.contamination import ContaminationReportStale, quarantined_ids
from dagster_project.conversations.shards import (
    ConversationsUsed,
    read_conversations,
    read_shard_conversations_manifest,
)
from dagster_project.generation.dispatch import Dispatcher
from dagster_project.generation.events import ShardGeneration
from dagster_project.generation.heartbeat import (
    ReportIntervals,
    ShardReporter,
    journal_segments_prefix,
    read_runs_unrecorded,
    restore_journal,
)
from dagster_project.generation.journal import Journal, drop_records_between
from dagster_project.generation.line_hold import Hold, LineHeld, read_hold, read_hold_log
from dagster_project.generation.line_stop import (
    LineStop,
    QualityWatch,
    WatchOptions,
    condemned_answers,
    read_dropped_at_release,
    record_dropped_at_release,
)
from dagster_project.generation.preflight import check_before_dispatch
from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.shards import (
    CompletionsShardManifest,
    GenerationSummary,
    RowCounts,
    read_completions_manifest,
)
from dagster_project.generation_settings import GenerationSettings
from dagster_project.records import COMPLETION_SCHEMA, EVAL_CONTAMINATION, STATUS_EXCLUDED, STATUS_OK
from dagster_project.store.layout import COMPLETIONS, lease_key, shard_prefix
from dagster_project.store.lease import LeaseLost, LeaseOptions, take_lease
from dagster_project.store.manifest import ids_digest, publish_shard
from dagster_project.store.storage import Store
from dagster_project.store.verdicts import describe_failures, failed_gates
from dagster_project.tokenizer import refuse_other_tokenizer, tokenizer_identity

ROWS_PER_GROUP = 256
PARQUET_NAME = "completions.parquet"


def journal_path(work_dir: Path, shard: int, fingerprint: str) -> Path:
    """Journals are per settings fingerprint: results made under other settings are never resumed into."""
    return work_dir / "journal" / shard_prefix(COMPLETIONS, shard) / f"{fingerprint}.jsonl"


@dataclass
class WrittenCompletions:
    """What the Parquet file holds, for the manifest: rows = ok + errors + excluded, one per event id."""

    rows: int = 0
    ok: int = 0
    errors: int = 0
    excluded: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    event_ids: list[str] = field(default_factory=list)
    counts: RowCounts = field(default_factory=RowCounts)
    served_models: Counter = field(default_factory=Counter)  # answers per model their servers were checked to serve


class JournalMismatch(RuntimeError):
    """The journal's final records are not exactly one per planned event: the shard must not be published."""


def write_completions_parquet(
    journal: Journal, path: Path, planned: set[str], settings: GenerationSettings | None = None
) -> WrittenCompletions:
    """Stream the journal's final record of each `planned` event into one Parquet file; return counts for the
    manifest. A journal may hold events the shard no longer plans (its conversations were rebuilt: another shard
    count, other sources): they are left out. The check before publishing: `JournalMismatch` unless the file
    holds exactly one row per planned event. `settings`: what tells the answers `max_new_tokens: fit` cut."""
    columns = COMPLETION_SCHEMA.names
    written = WrittenCompletions()
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(
        path, COMPLETION_SCHEMA, compression="zstd", use_dictionary=["policy", "status", "server", "served_model"]
    ) as writer:
        batch: list[dict[str, Any]] = []
        for record in journal.final_records():
            if record["event_id"] not in planned:
                continue
            batch.append({name: record.get(name) for name in columns})
            written.event_ids.append(record["event_id"])
            written.rows += 1
            if record["status"] != STATUS_EXCLUDED:  # (an excluded turn's prompt, where measured, was never sent)
                written.prompt_tokens += int(record.get("prompt_tokens") or 0)
            if record["status"] == STATUS_OK:
                written.ok += 1
                written.output_tokens += int(record.get("completion_tokens") or 0)
                if record.get("served_model"):
                    written.served_models[record["served_model"]] += 1
                written.counts.finish_reasons[record.get("finish_reason") or "unknown"] += 1
                if settings is not None and settings.cut_by_fit(
                    int(record.get("prompt_tokens") or 0),
                    int(record.get("completion_tokens") or 0),
                    record.get("finish_reason"),
                ):
                    written.counts.cut_by_fit += 1
            elif record["status"] == STATUS_EXCLUDED:
                written.excluded += 1
                written.counts.excluded_by_reason[record.get("error_kind") or "unknown"] += 1
            else:
                written.errors += 1
                written.counts.errors_by_kind[record.get("error_kind") or "unknown"] += 1
            if len(batch) == ROWS_PER_GROUP:
                writer.write_table(pa.Table.from_pylist(batch, schema=COMPLETION_SCHEMA))
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=COMPLETION_SCHEMA))
    seen = set(written.event_ids)
    if len(seen) != written.rows or seen != planned:
        repeated = [event for event, count in Counter(written.event_ids).items() if count > 1]
        raise JournalMismatch(
            f"{journal.path} does not hold exactly one record per planned event ({len(planned)} planned, "
            f"{written.rows} rows written; missing e.g. {sorted(planned - seen)[:3]}, repeated e.g. {repeated[:3]}): "
            "nothing was published"
        )
    return written


@dataclass(frozen=True)
class PilotNote:
    """What cleared the shard's settings for generation (`pilot_record.clearance`), for its manifest."""

    message: str = ""
    skipped: bool = False


def not_to_send(store: Store, shard: int, log: Callable[[str], None]) -> dict[str, tuple[str, str]]:
    """The shard's conversations the contamination report quarantines (action `quarantine`), read before anything
    is sent: paying for answers `training_set` would exclude buys nothing. A report that scanned another
    publication of the shard names other conversations: then everything is sent, and `training_set` (which
    refuses such a report) decides once the check has run again."""
    try:
        ids, _ = quarantined_ids(store, shard)
    except ContaminationReportStale as stale:
        log(f"sending every conversation: {stale}")
        return {}
    if ids:
        log(f"shard {shard}: {len(ids)} conversations matched to evaluation sets are not sent ({EVAL_CONTAMINATION})")
    return dict.fromkeys(ids, (EVAL_CONTAMINATION, "matched to an evaluation set by the contamination report"))


class ConversationsNotReady(RuntimeError):
    """The shard's conversations are not published, or were planned under another policy: the message says what
    to materialize first."""


class ConversationsGated(RuntimeError):
    """The conversations shard failed a blocking gate: no generation from it unless the operator overrides it."""


def generate_shard(
    store: Store,
    shard: int,
    *,
    tokenizer: Any,
    settings: GenerationSettings,
    dispatcher: Dispatcher,
    work_dir: Path,
    intervals: ReportIntervals = ReportIntervals(),
    on_progress: Callable[[Heartbeat], None] | None = None,
    log: Callable[[str], None] = lambda message: None,
    run_id: str | None = None,
    lease: LeaseOptions = LeaseOptions(),
    override_failed_gates: bool = False,
    pilot: PilotNote = PilotNote(),
    watch: QualityWatch | None = None,
    watch_options: WatchOptions = WatchOptions(),
    on_hold: Callable[[Hold], None] = lambda hold: None,
) -> CompletionsShardManifest:
    """Generate and publish `completions/shard=NNNNN/`; return its manifest. `run_id`: the Dagster run, named
    in the shard's lease and heartbeats. `pilot`: what cleared the settings (recorded in the manifest).

    Refuses a conversations shard that failed a blocking conversations check (their verdicts on this build),
    naming the gate, unless `override_failed_gates`. With a `watch`, every answer is watched and a hold of the
    line (`generation.line_hold`, by this run or any other) stops admission: the run then raises `LineHeld`, having
    journaled what was in flight; it refuses to start while a hold stands. `on_hold`: called once when this run
    first sees a hold, before its in-flight requests drain."""
    hold = read_hold(store)
    if hold is not None:
        raise LineHeld(hold, shard)
    conversations_manifest = read_shard_conversations_manifest(store, shard)
    if conversations_manifest is None:
        raise ConversationsNotReady(
            f"conversations shard {shard} is not published: materialize `conversations` first "
            "(`dagster asset materialize -m dagster_project.definitions --select raw_prompts,conversations`)"
        )
    gated = failed_gates(store, conversations_manifest)  # what the conversations checks recorded on this build
    if gated and not override_failed_gates:
        raise ConversationsGated(
            f"conversations shard {shard} failed blocking gates: {describe_failures(gated)}. Fix the cause and "
            "re-materialize conversations; or, having looked at them, set override_failed_gates: true in "
            "completions' config to generate from them anyway"
        )
    run_tokenizer = tokenizer_identity(tokenizer)
    refuse_other_tokenizer(
        conversations_manifest.tokenizer,
        run_tokenizer,
        f"conversations shard {shard}",
        "this shard's prompts would be rendered otherwise than the other shards'. Run completions with the "
        "tokenizer the conversations were built with (DFLASH_TOKENIZER), or rebuild conversations under this one "
        "and regenerate the shards made under the other",
    )
    if gated:
        log(f"generating from gated conversations (override_failed_gates): {describe_failures(gated)}")
    conversations = list(read_conversations(store, shard))
    fingerprint = settings.fingerprint()
    policies = {c.policy for c in conversations}
    if policies - {settings.policy}:
        raise ConversationsNotReady(
            f"conversations of shard {shard} were planned with policy {sorted(policies)} but generation is "
            f"configured with {settings.policy!r}: re-materialize `conversations` with the same policy"
        )
    check_before_dispatch(store, settings, dispatcher, log)  # every server holds the longest request, or stop
    excluded = not_to_send(store, shard, log)

    with (
        take_lease(store, lease_key(COMPLETIONS, shard), run_id=run_id, options=lease) as held,
        _open_journal(store, shard, fingerprint, work_dir, log) as (journal, restored_bytes),
        _EndsFailed() as ending,
    ):
        if journal.torn_bytes_dropped:
            log(f"journal: dropped a torn last line ({journal.torn_bytes_dropped} bytes) left by a killed run")
        job = ShardGeneration(shard, conversations, tokenizer, settings, journal, excluded)
        if watch is not None:
            job.line_stop = LineStop(
                store, shard, watch, fingerprint, run_id=run_id, options=watch_options, log=log, on_hold=on_hold
            )
        reporter = ShardReporter(
            store,
            shard,
            journal,
            fingerprint,
            job.snapshot,
            intervals,
            on_progress=on_progress,
            log=log,
            lease=held,
            run_id=run_id,
            checkpointed_bytes=restored_bytes,
        )
        ending.job, ending.reporter = job, reporter
        log(
            f"shard {shard}: {job.progress.total_events} events in {len(conversations)} conversations, "
            f"{job.progress.resumed_events} already in the journal"
        )
        last_heartbeat = asyncio.run(job.run(dispatcher, reporter))
        if job.line_stop is not None and job.line_stop.held is not None:
            job.progress.state = "failed"
            asyncio.run(reporter.beat())
            raise LineHeld(job.line_stop.held, shard)
        missing = job.missing_events()
        if missing:
            raise RuntimeError(f"shard {shard}: {len(missing)} events did not end, e.g. {missing[:3]}")
        with tempfile.TemporaryDirectory(dir=work_dir) as staging:
            parquet = Path(staging) / PARQUET_NAME
            expected = {c.event_id(t) for c in conversations for t in range(c.num_turns)}
            written = write_completions_parquet(journal, parquet, expected, settings)
            dropped = read_dropped_at_release(store, shard, fingerprint)
            # The runs of the shard that stopped before publishing (held, failed) recorded theirs.
            stopped_runs = read_runs_unrecorded(store, shard, fingerprint, leaving_out=reporter.writer)
            earlier = _earlier_summary(store, shard, fingerprint)
            summary = GenerationSummary.of(last_heartbeat, written.counts, earlier, stopped_runs)
            manifest = CompletionsShardManifest(
                shard=shard,
                rows=written.rows,
                ids_digest=ids_digest(written.event_ids),
                ok=written.ok,
                errors=written.errors,
                excluded=written.excluded,
                prompt_tokens=written.prompt_tokens,
                output_tokens=written.output_tokens,
                conversations=len(conversations),
                conversations_ids_digest=conversations_manifest.ids_digest,
                conversations_content_digest=ConversationsUsed.of(conversations_manifest).content_digest,
                settings_fingerprint=fingerprint,
                tokenizer=run_tokenizer,
                settings=settings,
                served_models=dict(sorted(written.served_models.items())),
                generation=replace(
                    summary,
                    dropped_at_release=dropped.answers,
                    dropped_at_release_output_tokens=dropped.output_tokens,
                ),
                pilot=pilot.message,
                pilot_skipped=pilot.skipped,
                hold_overrides=read_hold_log(store).override_records if watch is not None else {},
            )
            # A slow store fails the run, naming the store, past its deadline (retried calls alone never end).
            with store.deadline(f"publishing completions shard {shard}"):
                held.renew()  # LeaseLost: another run took the shard over, and this one must not publish
                published = publish_shard(store, manifest, [(PARQUET_NAME, parquet)])
        job.progress.state = "published"
        asyncio.run(reporter.beat())  # while the lease is held: a run that takes the shard next beats after it
    return published


class _EndsFailed:
    """A clean failure after generation (a full work dir, a failed upload, a slow store's deadline) ends the
    run's heartbeat as failed: left at "generated", status would take the run for one that died. Not after a lost
    lease: the shard is another run's then, and nothing more is written for it. (A failure while generating ends
    it as failed already: `ShardGeneration.run`.)"""

    job: ShardGeneration | None = None
    reporter: ShardReporter | None = None

    def __enter__(self) -> _EndsFailed:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        if error is None or isinstance(error, LeaseLost) or self.job is None or self.reporter is None:
            return
        if self.job.progress.state == "generated":
            self.job.progress.state = "failed"
            asyncio.run(self.reporter.beat())


def _earlier_summary(store: Store, shard: int, fingerprint: str) -> GenerationSummary | None:
    """How the shard's published answers were generated, if they were made with these settings."""
    earlier = read_completions_manifest(store, shard)
    return earlier.generation if earlier is not None and earlier.settings_fingerprint == fingerprint else None


def _utc(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@contextmanager
def _open_journal(
    store: Store, shard: int, fingerprint: str, work_dir: Path, log: Callable[[str], None]
) -> Iterator[tuple[Journal, int]]:
    """The shard's local journal, seeded from the store's checkpoint segments when this node has none, and how
    many of its bytes came from there (the store holds them already)."""
    local_journal = journal_path(work_dir, shard, fingerprint)
    restored = restore_journal(store, shard, fingerprint, local_journal)
    if restored:
        log(f"journal restored from the store's checkpoint (a resume on a new node): {restored} bytes, {local_journal}")
    condemned = condemned_answers(store, shard, fingerprint)
    if condemned is not None:
        since, until = condemned
        dropped = drop_records_between(local_journal, since, until)
        # The store's checkpoints still hold them: gone too, and this run checkpoints its journal whole, first thing.
        for info in list(store.list(journal_segments_prefix(shard, fingerprint))):
            store.delete(info.key)
        restored = 0
        if dropped.records:  # the ledger's `dropped_at_release`: paid for, generated again
            record_dropped_at_release(store, shard, fingerprint, dropped.records, dropped.output_tokens)
        log(
            f"shard {shard}: {dropped.records} answers ({dropped.output_tokens:,} output tokens) journaled from "
            f"{_utc(since)} to the hold's release at {_utc(until)} are dropped and asked again (the hold was "
            "released without --override: from the first answer that failed its gate on its own, or with "
            "--drop-all or an unknown onset from the held run's start); the answers before are kept"
        )
    with Journal(local_journal) as journal:
        yield journal, restored
