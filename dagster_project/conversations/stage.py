"""Stage 2 (`conversations`): the ingest snapshot → policy-applied, deduplicated, sharded conversations.

For each snapshot row, in input order:

1. the multi-turn policy (`turns.apply_policy`) decides which replies are generated;
2. **duplicates** (`duplicate`): two rows are duplicates when they would send the model exactly the same
   requests (`turns.request_key`: with history `generated` the source's answers are never shown, so
   rows that differ only there are duplicates). The first row is kept; digests live in an on-disk
   index (`dedup.SeenIndex`), so memory does not grow with the dataset. A duplicate is set aside in the
   quarantine file but is not a bad row: the manifest counts duplicates on their own (`duplicates`,
   `duplicate_rate`, per source), with their own limit (`duplicate_rate_max`), and `quarantine_rate` leaves
   them out;
3. **token budget** (`too_long`): the prompt of the last generated turn, rendered with the chat
   template (the source's own answers standing in for the earlier generated ones), must fit in
   `max_prompt_tokens`, counted with the real tokenizer (`budget.PromptBudget`);
4. **empty answers shown** (`empty_content`): with history `source` a prompt shows the source's
   assistant messages, so one that is empty (no text, no tool call) before a generated turn rejects the
   row; with history `generated` (`all_turns`) the source's answers are never shown and may be empty;
5. **id**: the source's id when present and not taken yet, else `h-` + a hash of the normalized
   messages; if that is taken too the row is quarantined (`duplicate_id`) rather than merged. A row
   whose own id was taken is kept under its hash id, counted (`renamed_ids` in the manifest) and marked
   (`extra.renamed_from`);
6. **shard** = `sharding.shard_of(id, num_shards)`; rows are buffered per shard on local disk, then every
   shard is published (data, then its manifest), then the stage manifest.

What a row's steps read of the row alone (1, its digest for 2, a byte bound for 3, 4, its hash id for 5) is
drafted beside the stage in worker processes (`drafts`); what depends on the rows before it is decided here, in
input order.

**The shard count belongs to the conversations**: every later stage takes it from their manifest, and the
shards of completions and training sets are made from these shards. Rebuilding with another count while any
of those are published is refused (`ShardCountChanged`) unless the operator supersedes them
(`supersede_shards`): their manifests are then withdrawn and the exports deleted before the new shards are
published, so nothing downstream pairs an old shard with new conversations.

Store layout: `conversations/shard=NNNNN/{conversations.jsonl,_manifest.json}`,
`conversations/quarantine.jsonl.zst` (this stage's rejected rows) and `conversations/_manifest.json`,
which carries the accounting of both stages: input_rows = rows + quarantined.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from dagster_project.conversations.budget import PromptBudget
from dagster_project.conversations.dedup import SeenIndex
from dagster_project.conversations.drafts import Draft, drafted_batches, worker_pool
from dagster_project.conversations.sharding import shard_of
from dagster_project.conversations.shards import (
    ConversationsManifest,
    PolicyCounts,
    ShardBuffers,
    SourceTotals,
    publish_shards,
    read_conversations_manifest,
    read_shard_conversations_manifest,
    remove_stale_shards,
)
from dagster_project.conversations.turns import POLICY_HISTORY
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ingest.quarantine import DUPLICATE, Accounting, SourceCounts, quarantine_record
from dagster_project.ingest.shards import (
    PROMPTS_KEY,
    RawPromptsManifest,
    read_raw_prompts_manifest,
)
from dagster_project.store import layout
from dagster_project.store.jsonl import JsonlZstWriter
from dagster_project.store.manifest import published_shards, put_object, withdraw_shards, write_stage_manifest
from dagster_project.store.storage import Store
from dagster_project.tokenizer import TokenizerIdentity
from dagster_project.workers import cycle_collector_paused

STAGE = "conversations"
QUARANTINE_KEY = f"{layout.CONVERSATIONS}/quarantine.jsonl.zst"
DEFAULT_MAX_PROMPT_TOKENS = 16384  # with 32K new tokens, multi-turn history still fits a 64K context
DEFAULT_QUARANTINE_RATE_MAX = 0.10
# Exact duplicates lose nothing (the first copy is kept), so they are not bad rows: they have their own limit, high
# enough for the overlap of public sets and low enough to catch a source listed twice.
DEFAULT_DUPLICATE_RATE_MAX = 0.50
# What is built from the conversations shards, shard for shard.
DOWNSTREAM_STAGES = (layout.COMPLETIONS, layout.TRAINING_SET)


class ShardCountChanged(RuntimeError):
    """The conversations would be rebuilt with another shard count while shards made from them are published."""


def published_shard_count(store: Store) -> int | None:
    """The shard count of the conversations in the store: the stage manifest's, or (when a rebuild stopped
    before writing it) that of a published shard; None when there are none."""
    manifest = read_conversations_manifest(store)
    if manifest is not None:
        return manifest.num_shards
    shards = published_shards(store, layout.CONVERSATIONS)
    shard_manifest = read_shard_conversations_manifest(store, shards[0]) if shards else None
    return shard_manifest.num_shards if shard_manifest is not None else None


def supersede_downstream(
    store: Store, num_shards: int, *, supersede: bool, log: Callable[[str], None] = lambda _: None
) -> dict[str, int]:
    """Before conversations are built with `num_shards` shards: refuse (`ShardCountChanged`) when shards made
    from conversations of another count are published, or, with `supersede`, withdraw them all (and delete the
    exports made from them). Returns the shards withdrawn per stage."""
    previous = published_shard_count(store)
    downstream = {stage: published_shards(store, stage) for stage in DOWNSTREAM_STAGES}
    exports = [info.key for info in store.list(f"{layout.EXPORTS}/")]
    other_count = previous is not None and previous != num_shards
    beyond = any(shard >= num_shards for shards in downstream.values() for shard in shards)
    if not (other_count or beyond) or not (any(downstream.values()) or exports):
        return {}
    made = ", ".join(f"{len(shards)} {stage} shards" for stage, shards in downstream.items())
    if not supersede:
        was = f"{previous} shards" if previous is not None else "another shard count"
        raise ShardCountChanged(
            f"the conversations in {store.url(layout.CONVERSATIONS)} have {was}, and {made} and {len(exports)} "
            f"exports were made from them. Rebuilding them with {num_shards} shards would move conversations to "
            "other shards: the published shards would no longer match their conversations, and an event could end "
            "up in two training shards. Either keep the shard count"
            + (f" (DFLASH_NUM_SHARDS={previous})" if previous is not None else "")
            + "; or build into a new store prefix (DFLASH_STORE); or supersede the old shards: materialize "
            "conversations with config supersede_shards: true, which withdraws their manifests and deletes the "
            "exports, so every shard is made again from the new conversations"
        )
    withdrawn = {stage: len(withdraw_shards(store, stage)) for stage in DOWNSTREAM_STAGES}
    for key in exports:
        store.delete(key)
    log(f"superseded the shards made from {previous} conversations shards: withdrew {made}, {len(exports)} exports")
    return {**withdrawn, layout.EXPORTS: len(exports)}


class ConversationBuilder:
    """Decides drafted snapshot rows (`drafts.Draft`), one at a time in input order: a kept row goes to its shard's
    buffer, a rejected one to the quarantine; `accounting` counts every row."""

    def __init__(self, budget: PromptBudget, seen: SeenIndex, buffers: ShardBuffers, quarantine: JsonlZstWriter):
        self.budget = budget
        self.seen = seen
        self.num_shards = buffers.num_shards
        self.keep = buffers.append
        self.quarantine = quarantine
        self.accounting = Accounting()
        self.renamed_ids = 0  # rows kept under their hash id because their own id was taken
        self.tool_calling = 0
        self._kept_from: Counter[str] = Counter()  # this batch's kept rows per source

    def build_batch(self, drafts: list[Draft]) -> None:
        """Keep or quarantine each drafted row, decided in order (one batch of lookups in the on-disk index for all
        of them)."""
        candidates = (i for d in drafts for i in (d.source_id, d.hashed_id) if i)
        self.seen.prefetch((d.digest for d in drafts), candidates)
        for draft in drafts:
            self._decide(draft)
        self.seen.commit()
        # Counted per batch: a call per kept row costs more than the rest of the accounting.
        for source, kept in self._kept_from.items():
            self.accounting.keep(source, kept)
        self._kept_from.clear()

    def _decide(self, draft: Draft) -> None:
        first = self.seen.first_with_content(draft.digest)
        if first is not None:
            return self._reject(draft, DUPLICATE, f"same generation requests as {first}", duplicate_of=first)
        if draft.empty_shown is not None:
            return self._reject(
                draft,
                "empty_content",
                f"assistant message {draft.empty_shown} is empty and history {draft.history} shows it in a prompt",
            )
        if draft.may_exceed_budget:
            conversation = draft.conversation()
            prompt = conversation.messages[: conversation.generate_after[-1] + 1]
            over = self.budget.tokens_over(prompt, conversation.tools)
            if over is not None:
                return self._reject(draft, "too_long", f"prompt of {over} tokens > budget {self.budget.max_tokens}")
        source_id, hashed_id = draft.source_id, draft.hashed_id
        claimed = source_id if source_id and self.seen.claim_id(source_id) else None
        if claimed is None and self.seen.claim_id(hashed_id):
            claimed = hashed_id
        if claimed is None:
            return self._reject(draft, "duplicate_id", f"ids {source_id!r} and {hashed_id!r} are taken by earlier rows")
        self.seen.add_content(draft.digest, claimed)
        self.tool_calling += draft.calls_tools
        self._kept_from[draft.source] += 1
        if claimed == draft.provisional_id:
            return self.keep(draft.shard, claimed, draft.line, draft.multi_turn, draft.turns)
        # Kept under its hash id: its own id was taken by an earlier row (a handful of rows are parsed again).
        conversation = draft.conversation()
        conversation.id = claimed
        conversation.shard = shard_of(claimed, self.num_shards)
        conversation.extra["renamed_from"] = source_id
        self.renamed_ids += 1
        return self.keep(conversation.shard, claimed, orjson.dumps(conversation), draft.multi_turn, draft.turns)

    def _reject(self, draft: Draft, reason: str, detail: str, **extra: Any) -> None:
        self.accounting.reject(draft.source, reason)
        self.quarantine.write(
            quarantine_record(
                stage=STAGE,
                reason=reason,
                detail=detail,
                id=draft.provisional_id,
                source=draft.source,
                source_file=draft.source_file,
                source_row=draft.source_row,
                **extra,
            )
        )


def build_conversations(
    store: Store,
    *,
    load_tokenizer: Callable[[], Any],
    tokenizer: TokenizerIdentity,
    settings: GenerationSettings,
    num_shards: int,
    work_dir: Path,
    max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
    quarantine_rate_max: float = DEFAULT_QUARANTINE_RATE_MAX,
    duplicate_rate_max: float = DEFAULT_DUPLICATE_RATE_MAX,
    supersede_shards: bool = False,
    log: Callable[[str], None] = lambda _: None,
) -> ConversationsManifest:
    """Build and publish every conversations shard from the ingest snapshot; return the stage manifest.

    `load_tokenizer` is called only when a prompt may not fit the token budget (`budget.PromptBudget`); `tokenizer`
    is its identity, recorded in every manifest (the completions of a shard are refused under another).
    `supersede_shards`: when shards made from conversations of another shard count are published, withdraw
    them (refused otherwise; see `supersede_downstream`)."""
    raw = read_raw_prompts_manifest(store)
    if raw is None:
        raise LookupError(
            f"no {store.url(layout.stage_manifest_key(layout.RAW_PROMPTS))}: materialize raw_prompts first"
        )
    superseded = supersede_downstream(store, num_shards, supersede=supersede_shards, log=log)
    started = time.perf_counter()
    build_id = uuid.uuid4().hex
    workspace = work_dir / layout.CONVERSATIONS / build_id
    snapshot = store.download(PROMPTS_KEY, workspace / "prompts.jsonl.zst")
    # A half-rebuilt stage must not look complete to readers.
    store.delete(layout.stage_manifest_key(layout.CONVERSATIONS))

    budget = PromptBudget(
        load_tokenizer,
        max_prompt_tokens,
        enable_thinking=settings.enable_thinking,
        preserve_thinking=settings.preserve_thinking,
    )
    buffers = ShardBuffers(workspace / "shards", num_shards)
    with worker_pool(snapshot) as pool:  # drafting, then publishing
        with SeenIndex(workspace / "seen") as seen, JsonlZstWriter(workspace / "quarantine.jsonl.zst") as quarantine:
            builder = ConversationBuilder(budget, seen, buffers, quarantine)
            batches = drafted_batches(snapshot, settings.policy, num_shards, max_prompt_tokens, pool=pool)
            with cycle_collector_paused():
                for drafts in batches:
                    builder.build_batch(drafts)
        buffers.flush()
        snapshot.unlink()
        built_s = time.perf_counter() - started
        log(
            f"{builder.accounting.kept} conversations, {builder.accounting.quarantined} quarantined, "
            f"{builder.renamed_ids} kept under a hash id because their own id was taken, in {built_s:.1f}s"
        )
        shard_manifests = publish_shards(
            store, buffers, policy=settings.policy, build_id=build_id, tokenizer=tokenizer, pool=pool, log=log
        )
    stale = remove_stale_shards(store, num_shards)
    quarantine_object = put_object(store, QUARANTINE_KEY, quarantine.path)
    quarantine.path.unlink()
    accounting = builder.accounting
    rows = sum(m.rows for m in shard_manifests)
    counts = PolicyCounts(rows, sum(c.multi_turn for c in buffers.counts), sum(c.turns for c in buffers.counts))
    _check_accounting(raw, accounting, rows)
    quarantined_by_reason = Counter(raw.quarantined_by_reason) + accounting.by_reason
    quarantined = sum(quarantined_by_reason.values())
    duplicates = quarantined_by_reason[DUPLICATE]
    return write_stage_manifest(
        store,
        ConversationsManifest(
            num_shards=num_shards,
            policy=settings.policy,
            build_id=build_id,
            input_rows=raw.input_rows,
            rows=rows,
            normalized=rows,
            quarantined=quarantined,
            quarantine_rate=(quarantined - duplicates) / raw.input_rows if raw.input_rows else 0.0,
            duplicates=duplicates,
            duplicate_rate=duplicates / raw.input_rows if raw.input_rows else 0.0,
            duplicate_rate_max=duplicate_rate_max,
            quarantined_by_reason=dict(sorted(quarantined_by_reason.items())),
            quarantined_by_stage={"ingest": raw.quarantined, STAGE: accounting.quarantined},
            by_source=_by_source(raw.by_source, accounting.by_source),
            history=POLICY_HISTORY[settings.policy],
            multi_turn=counts.multi_turn,
            renamed_ids=builder.renamed_ids,
            tool_calling=builder.tool_calling,
            turns=counts.turns,
            by_policy={settings.policy: counts},
            ids_digest=hashlib.sha256("".join(m.ids_digest for m in shard_manifests).encode()).hexdigest(),
            quarantine_rate_max=quarantine_rate_max,
            max_prompt_tokens=max_prompt_tokens,
            tokenizer=tokenizer,
            prompts_tokenized=budget.exact_counts,
            enable_thinking=settings.enable_thinking,
            preserve_thinking=settings.preserve_thinking,
            stale_shards_removed=stale,
            superseded=superseded,
            seconds=time.perf_counter() - started,
            quarantine_object=quarantine_object,
        ),
    )


def _check_accounting(raw: RawPromptsManifest, accounting: Accounting, rows: int) -> None:
    """Every input row is a published conversation or quarantined by one of the two stages."""
    quarantined = raw.quarantined + accounting.quarantined
    if rows != accounting.kept or raw.input_rows != rows + quarantined:
        raise RuntimeError(
            f"accounting does not add up: {raw.input_rows} input rows, {rows} published conversations "
            f"({accounting.kept} built), {quarantined} quarantined"
        )


def _by_source(ingested: dict[str, SourceCounts], built: dict[str, SourceCounts]) -> dict[str, SourceTotals]:
    """Per source, over both stages: rows read by ingest, conversations built, rows quarantined by either, exact
    duplicates among them."""
    totals = {}
    for name in sorted(set(ingested) | set(built)):
        read, kept = ingested.get(name, SourceCounts()), built.get(name, SourceCounts())
        by_reason = Counter(read.by_reason) + Counter(kept.by_reason)
        totals[name] = SourceTotals(
            input_rows=read.rows,
            conversations=kept.kept,
            quarantined=read.quarantined + kept.quarantined,
            quarantined_by_reason=dict(sorted(by_reason.items())),
            duplicates=by_reason[DUPLICATE],
        )
    return totals
