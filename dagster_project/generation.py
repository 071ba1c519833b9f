"""Generate one shard: plan each conversation's turns, dispatch them, journal every outcome, write Parquet.

Exactly-once: every event id (`<conversation>#turn<k>`) ends as one final record in the journal — a
result, or an error with its kind and reason. A rerun after a crash skips every final record and
requests only what is missing; a multi-turn conversation resumes at the turn where it stopped, its
history rebuilt from the journal.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from dagster_project.dispatch import Dispatcher, GenRequest, Outcome
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ingest import read_conversations
from dagster_project.journal import Journal
from dagster_project.layout import COMPLETIONS, CONVERSATIONS, progress_key, shard_prefix
from dagster_project.manifest import ids_digest, publish_shard, read_shard_manifest
from dagster_project.progress import ShardProgress
from dagster_project.records import COMPLETION_SCHEMA, STATUS_ERROR, STATUS_OK, Conversation
from dagster_project.storage import Store
from dagster_project.tokenizer import SpecialIds, render_prompt_ids, special_ids
from dagster_project.turns import prompt_messages

PREVIOUS_TURN_FAILED = "previous_turn_failed"
PREVIOUS_TURN_INCOMPLETE = "previous_turn_incomplete"
ROWS_PER_GROUP = 256


@dataclass
class _Pending:
    conversation: Conversation
    turn: int


class ShardGeneration:
    """Everything one shard run needs; `run()` drives the dispatcher until every event has ended."""

    def __init__(
        self,
        shard: int,
        conversations: list[Conversation],
        tokenizer: Any,
        settings: GenerationSettings,
        journal: Journal,
    ):
        self.shard = shard
        self.conversations = conversations
        self.tokenizer = tokenizer
        self.special: SpecialIds = special_ids(tokenizer)
        self.settings = settings
        self.fingerprint = settings.fingerprint()
        self.sampling_params = settings.sampling_params()
        self.journal = journal
        total = sum(c.num_turns for c in conversations)
        resumed = sum(1 for c in conversations for t in range(c.num_turns) if journal.is_final(c.event_id(t)))
        self.progress = ShardProgress(shard, total, self.fingerprint, resumed_events=resumed)

    # ---- planning ---------------------------------------------------------------------------------

    def _history(self, conversation: Conversation, upto: int) -> list[dict[str, str]]:
        return [self.journal.entries[conversation.event_id(t)].history_message or {} for t in range(upto)]

    def _next_request(self, conversation: Conversation) -> GenRequest | None:
        """On resume: the first turn of `conversation` without a final record, or None when all have ended.

        Turns after a failed or unfinished turn cannot be generated (their history would be missing);
        they end as errors that inherit whether the cause is worth retrying.
        """
        for turn in range(conversation.num_turns):
            entry = self.journal.entries.get(conversation.event_id(turn))
            if entry is None or not entry.final:
                return self._request(conversation, turn)
            if entry.status != STATUS_OK or entry.history_message is None:
                self._end_remaining(conversation, turn, entry.status, entry.finish_reason, entry.retryable)
                return None
        return None

    def _request(self, conversation: Conversation, turn: int) -> GenRequest:
        messages = prompt_messages(conversation, turn, self._history(conversation, turn))
        input_ids = render_prompt_ids(
            self.tokenizer,
            messages,
            enable_thinking=self.settings.enable_thinking,
            preserve_thinking=self.settings.preserve_thinking,
        )
        return GenRequest(
            key=conversation.event_id(turn),
            input_ids=input_ids,
            sampling_params=self.sampling_params,
            payload=_Pending(conversation, turn),
        )

    def _end_remaining(
        self, conversation: Conversation, failed_turn: int, status: str, finish_reason: str | None, retryable: bool
    ) -> None:
        if status == STATUS_OK:
            kind, cause = PREVIOUS_TURN_INCOMPLETE, f"finished with finish_reason {finish_reason!r}, not a complete answer"
        else:
            kind, cause = PREVIOUS_TURN_FAILED, "ended with an error"
        for turn in range(failed_turn + 1, conversation.num_turns):
            if self.journal.is_final(conversation.event_id(turn)):
                continue
            row = self._base_row(conversation, turn)
            row.update(
                status=STATUS_ERROR,
                error_kind=kind,
                error_message=f"not generated: turn {failed_turn} of this conversation {cause}",
                retryable=status != STATUS_OK and retryable,
            )
            self._journal(row)

    def initial_requests(self) -> Iterator[GenRequest]:
        for conversation in self.conversations:
            request = self._next_request(conversation)
            if request is not None:
                yield request

    # ---- outcomes ---------------------------------------------------------------------------------

    def _base_row(self, conversation: Conversation, turn: int) -> dict[str, Any]:
        row = {name: None for name in COMPLETION_SCHEMA.names}
        row.update(
            event_id=conversation.event_id(turn),
            conversation_id=conversation.id,
            turn_index=turn,
            num_turns=conversation.num_turns,
            policy=conversation.policy,
            shard=self.shard,
            settings_fingerprint=self.fingerprint,
            finished_at=time.time(),
            retryable=False,
            history_message=None,
        )
        return row

    def _outcome_row(self, outcome: Outcome) -> dict[str, Any]:
        pending: _Pending = outcome.request.payload
        row = self._base_row(pending.conversation, pending.turn)
        row.update(
            prompt_ids=outcome.request.input_ids,
            prompt_tokens=len(outcome.request.input_ids),
            server=outcome.server,
            attempts=outcome.attempts,
            client_latency_s=outcome.latency_s,
        )
        if outcome.error is not None:
            row.update(
                status=STATUS_ERROR,
                error_kind=outcome.error.kind,
                error_message=outcome.error.message,
                retryable=outcome.error.retryable,
            )
            return row
        result, meta = outcome.result, outcome.result.meta_info
        finish = result.finish_reason or {}
        row.update(
            status=STATUS_OK,
            rid=result.rid,
            output_ids=result.output_ids,
            text=result.text,
            finish_reason=finish.get("type"),
            finish_matched=None if finish.get("matched") is None else str(finish.get("matched")),
            prompt_tokens=meta.get("prompt_tokens", len(outcome.request.input_ids)),
            completion_tokens=meta.get("completion_tokens", len(result.output_ids)),
            cached_tokens=meta.get("cached_tokens"),
            spec_verify_ct=meta.get("spec_verify_ct"),
            spec_accept_length=meta.get("spec_accept_length"),
            spec_accept_rate=meta.get("spec_accept_rate"),
            spec_num_correct_drafts=meta.get("spec_num_correct_drafts"),
            spec_num_proposed_drafts=meta.get("spec_num_proposed_drafts"),
            e2e_latency_s=meta.get("e2e_latency"),
        )
        if pending.turn + 1 < pending.conversation.num_turns:
            row["history_message"] = self._history_message(result.output_ids, row["finish_reason"])
        return row

    def _history_message(self, output_ids: list[int], finish_reason: str | None) -> dict[str, str] | None:
        """What a later turn sees of this answer: its visible part (and its reasoning for preserve_thinking).

        An answer that did not finish (length cap, no `</think>`) cannot serve as history.
        """
        if finish_reason != "stop" or self.special.think_end not in output_ids:
            return None
        cut = output_ids.index(self.special.think_end)
        answer = [i for i in output_ids[cut + 1 :] if i not in self.special.eos_ids]
        return {
            "content": self.tokenizer.decode(answer, skip_special_tokens=True).strip(),
            "reasoning_content": self.tokenizer.decode(output_ids[:cut], skip_special_tokens=True).strip(),
        }

    def _journal(self, row: dict[str, Any]) -> None:
        if self.journal.append(row):
            self.progress.record(row)

    def on_outcome(self, outcome: Outcome) -> list[GenRequest]:
        row = self._outcome_row(outcome)
        self._journal(row)
        pending: _Pending = outcome.request.payload
        conversation, next_turn = pending.conversation, pending.turn + 1
        if next_turn >= conversation.num_turns:
            return []
        if row["status"] != STATUS_OK or row["history_message"] is None:
            self._end_remaining(conversation, pending.turn, row["status"], row["finish_reason"], row["retryable"])
            return []
        return [self._request(conversation, next_turn)]

    # ---- driving ----------------------------------------------------------------------------------

    async def run(
        self,
        dispatcher: Dispatcher,
        heartbeat: Callable[[dict[str, Any]], None] | None = None,
        heartbeat_interval_s: float = 5.0,
    ) -> dict[str, Any]:
        beating = asyncio.create_task(self._beat(dispatcher, heartbeat, heartbeat_interval_s)) if heartbeat else None
        try:
            await dispatcher.run(self.initial_requests(), self.on_outcome)
            self.progress.state = "generated"
        except BaseException:
            self.progress.state = "failed"
            raise
        finally:
            self.journal.sync()
            if beating is not None:
                beating.cancel()
                await asyncio.gather(beating, return_exceptions=True)
                await asyncio.to_thread(heartbeat, self.snapshot(dispatcher))
        return self.snapshot(dispatcher)

    def snapshot(self, dispatcher: Dispatcher | None = None) -> dict[str, Any]:
        servers = dispatcher.snapshot().get("servers", {}) if dispatcher is not None else {}
        return self.progress.snapshot(servers=servers)

    async def _beat(self, dispatcher: Dispatcher, heartbeat: Callable, interval_s: float) -> None:
        while True:
            # The store write is blocking I/O; keep it off the event loop that feeds the fleet.
            await asyncio.to_thread(heartbeat, self.snapshot(dispatcher))
            await asyncio.sleep(interval_s)

    def missing_events(self) -> list[str]:
        """Events without any record. Retryable errors count as ended here (a later run retries them)."""
        return [c.event_id(t) for c in self.conversations for t in range(c.num_turns) if c.event_id(t) not in self.journal.entries]


def write_completions_parquet(journal: Journal, path: Path) -> dict[str, Any]:
    """Stream the journal's final records into one Parquet file; return counts for the manifest."""
    columns = COMPLETION_SCHEMA.names
    counts = {"rows": 0, "ok": 0, "errors": 0, "prompt_tokens": 0, "output_tokens": 0}
    event_ids: list[str] = []
    path.parent.mkdir(parents=True, exist_ok=True)
    with pq.ParquetWriter(path, COMPLETION_SCHEMA, compression="zstd", use_dictionary=["policy", "status", "server"]) as writer:
        batch: list[dict[str, Any]] = []
        for record in journal.final_records():
            batch.append({name: record.get(name) for name in columns})
            event_ids.append(record["event_id"])
            counts["rows"] += 1
            counts["ok" if record["status"] == STATUS_OK else "errors"] += 1
            counts["prompt_tokens"] += int(record.get("prompt_tokens") or 0)
            counts["output_tokens"] += int(record.get("completion_tokens") or 0) if record["status"] == STATUS_OK else 0
            if len(batch) == ROWS_PER_GROUP:
                writer.write_table(pa.Table.from_pylist(batch, schema=COMPLETION_SCHEMA))
                batch = []
        if batch:
            writer.write_table(pa.Table.from_pylist(batch, schema=COMPLETION_SCHEMA))
    counts["event_ids"] = event_ids
    return counts


def journal_path(work_dir: Path, shard: int, fingerprint: str) -> Path:
    """Journals are per settings fingerprint: results made under other settings are never resumed into."""
    return work_dir / "journal" / shard_prefix(COMPLETIONS, shard) / f"{fingerprint}.jsonl"


def generate_shard(
    store: Store,
    shard: int,
    *,
    tokenizer: Any,
    settings: GenerationSettings,
    dispatcher: Dispatcher,
    work_dir: Path,
    heartbeat_interval_s: float = 5.0,
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

    def heartbeat(snapshot: dict[str, Any]) -> None:
        store.put_bytes(progress_key(shard), orjson.dumps(snapshot))

    with Journal(journal_path(work_dir, shard, fingerprint)) as journal:
        if journal.torn_bytes_dropped:
            log(f"journal: dropped a torn last line ({journal.torn_bytes_dropped} bytes) left by a killed run")
        job = ShardGeneration(shard, conversations, tokenizer, settings, journal)
        log(
            f"shard {shard}: {job.progress.total_events} events in {len(conversations)} conversations, "
            f"{job.progress.resumed_events} already in the journal"
        )
        summary = asyncio.run(job.run(dispatcher, heartbeat, heartbeat_interval_s))
        missing = job.missing_events()
        if missing:
            raise RuntimeError(f"shard {shard}: {len(missing)} events did not end, e.g. {missing[:3]}")
        with tempfile.TemporaryDirectory(dir=work_dir) as staging:
            parquet = Path(staging) / "completions.parquet"
            counts = write_completions_parquet(journal, parquet)
            expected = {c.event_id(t) for c in conversations for t in range(c.num_turns)}
            if set(counts["event_ids"]) != expected or len(counts["event_ids"]) != len(expected):
                raise RuntimeError(f"shard {shard}: journal does not hold exactly one record per planned event")
            manifest = publish_shard(
                store,
                COMPLETIONS,
                shard,
                [("completions.parquet", parquet)],
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
    summary["state"] = "published"
    heartbeat(summary)
    return manifest
