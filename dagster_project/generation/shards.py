"""A published completions shard: its manifest, reading its rows, and the coverage rule that ties it to its
conversations."""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dagster_project.conversations.shards import ConversationsUsed, read_conversations
from dagster_project.generation.progress import Heartbeat, Rates, SpecDecodingStats
from dagster_project.generation.unrecorded import LOST_HEDGES, RESENT_ORIGINAL, Unrecorded
from dagster_project.generation_settings import GenerationSettings
from dagster_project.store.layout import COMPLETIONS
from dagster_project.store.manifest import ShardManifest, iter_parquet_batches, read_shard_manifest
from dagster_project.store.storage import Store
from dagster_project.tokenizer import TokenizerIdentity

if TYPE_CHECKING:  # readers of manifests alone (`dflash status`) never load pyarrow
    import pyarrow as pa


class ShardNotPublished(RuntimeError):
    pass


@dataclass(frozen=True)
class GenerationSummary:
    """How the shard's answers were generated: the rates and spec-decoding figures of the run that generated
    them (None when unknown: a run that found every answer already in its journal measured nothing), and the
    finish reasons and error kinds of the published rows."""

    lifetime: Rates | None = None
    spec: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    # Answers the run's servers generated that are in no row, and their output tokens, by cause
    # (`dispatch_types.Unrecorded`: refused, failed, lost hedges, aborted originals, probes): paid for, never trained.
    # Attempts cancelled before they answered report no tokens.
    unrecorded_answers: dict[str, int] = field(default_factory=dict)
    unrecorded_output_tokens: dict[str, int] = field(default_factory=dict)
    # Manifests written before `unrecorded_*`: lost hedges' and aborted originals' tokens, without answers.
    lost_hedge_output_tokens: int = 0
    resent_original_output_tokens: int = 0
    excluded_by_reason: dict[str, int] = field(default_factory=dict)  # events not sent, by reason
    # Of the `length` finish reasons, the answers cut at their fitted cap (where the trainer would cut them).
    cut_by_fit: int = 0
    # Answers a hold condemned, dropped from the journal when it was released and generated again, and their output
    # tokens: paid for, in no row (`line_stop.DroppedAtRelease`).
    dropped_at_release: int = 0
    dropped_at_release_output_tokens: int = 0

    @property
    def length_capped(self) -> int:
        """The answers cut by max_new_tokens: finish_reason `length`, less those fit cut."""
        return _length_capped(self.finish_reasons, self.cut_by_fit)

    @property
    def unrecorded(self) -> Unrecorded:
        """Answers in no row and their tokens by cause; a manifest written before they were counted gives its lost
        hedges' and aborted originals' tokens (answers unknown: 0)."""
        if self.unrecorded_output_tokens or not (self.lost_hedge_output_tokens or self.resent_original_output_tokens):
            return Unrecorded(Counter(self.unrecorded_answers), Counter(self.unrecorded_output_tokens))
        tokens = {LOST_HEDGES: self.lost_hedge_output_tokens, RESENT_ORIGINAL: self.resent_original_output_tokens}
        return Unrecorded(Counter(), Counter({cause: n for cause, n in tokens.items() if n}))

    @classmethod
    def of(
        cls,
        heartbeat: Heartbeat,
        rows: RowCounts,
        earlier: GenerationSummary | None = None,
        stopped_runs: Unrecorded | None = None,
    ) -> GenerationSummary:
        """The run's rates, or when it generated nothing (a re-run of a finished shard) those of the run that
        published the same rows before (`earlier`), if any; the counts of the rows themselves. The answers in no
        row: the run's, and those the shard's runs that stopped before publishing recorded (`stopped_runs`)."""
        generated = heartbeat.done_events > heartbeat.resumed_events
        if generated or earlier is None:
            lifetime, spec = (heartbeat.lifetime if generated else None), heartbeat.spec
            unrecorded = (unrecorded_of(heartbeat) if generated else Unrecorded()) + (stopped_runs or Unrecorded())
        else:
            lifetime, spec, unrecorded = earlier.lifetime, earlier.spec, earlier.unrecorded
        return cls(
            lifetime,
            spec,
            dict(rows.finish_reasons),
            dict(rows.errors_by_kind),
            dict(unrecorded.answers),
            dict(unrecorded.tokens),
            excluded_by_reason=dict(rows.excluded_by_reason),
            cut_by_fit=rows.cut_by_fit,
        )


def unrecorded_of(heartbeat: Heartbeat) -> Unrecorded:
    """What the run's servers generated that is in no row, by cause (their dispatcher's counts)."""
    return sum((Unrecorded.of(view.get("unrecorded") or {}) for view in heartbeat.servers.values()), Unrecorded())


@dataclass
class RowCounts:
    """Finish reasons of the answers, kinds of the errors and reasons of the events not sent, over a shard's rows."""

    finish_reasons: Counter = field(default_factory=Counter)
    errors_by_kind: Counter = field(default_factory=Counter)
    excluded_by_reason: Counter = field(default_factory=Counter)
    cut_by_fit: int = 0  # answers that stopped at their `max_new_tokens: fit` cap (finish_reason length)

    @property
    def length_capped(self) -> int:
        return _length_capped(self.finish_reasons, self.cut_by_fit)


def _length_capped(finish_reasons: Mapping[str, int], cut_by_fit: int) -> int:
    """What `length_capped_rate` counts: the `length` finish reasons that are not fit's cut
    (`GenerationSettings.answer_end`)."""
    return finish_reasons.get("length", 0) - cut_by_fit


@dataclass(frozen=True, kw_only=True)
class CompletionsShardManifest(ShardManifest):
    """rows = ok + errors + excluded: one record per planned event. `ids_digest` is over event ids."""

    stage: str = COMPLETIONS
    ok: int = 0
    errors: int = 0
    excluded: int = 0  # not sent, by design (`records.STATUS_EXCLUDED`): matched to an evaluation set
    prompt_tokens: int = 0
    output_tokens: int = 0
    conversations: int = 0
    conversations_ids_digest: str = ""
    conversations_content_digest: str = ""  # `ConversationsUsed.content_digest` of the shard's conversations
    settings_fingerprint: str = ""
    # What rendered the prompts (`tokenizer.tokenizer_identity`); unknown for a shard made before it was recorded.
    tokenizer: TokenizerIdentity = field(default_factory=TokenizerIdentity)
    # A manifest that did not record its settings was made with the defaults.
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    # The answers per model their servers were checked to serve (`ModelIdentity.label`); answers of servers that
    # were not checked are not counted. More than one model: the training set refuses the shard.
    served_models: dict[str, int] = field(default_factory=dict)
    generation: GenerationSummary = field(default_factory=GenerationSummary)
    # What let the shard generate: the passed pilot of its settings, or the operator's skip (`pilot_record`).
    pilot: str = ""
    pilot_skipped: bool = False
    # Watch gates a released hold overrode (`dflash hold release --override GATE`) while this shard was made.
    hold_overrides: dict[str, str] = field(default_factory=dict)  # gate → who, when, why

    @property
    def conversations_used(self) -> ConversationsUsed:
        """The conversations shard this shard was made from, as it was published then."""
        return ConversationsUsed(self.conversations_ids_digest, self.conversations_content_digest)

    @property
    def avg_output_tokens(self) -> float:
        return self.output_tokens / self.ok if self.ok else 0.0

    @property
    def data_version(self) -> str:
        """Changes when the shard's content does (the objects' checksums) or its settings; not when the same rows
        are published again (a resumed run). What marks the shard's downstream stale in Dagster."""
        digest = hashlib.sha256(self.settings_fingerprint.encode())
        for stored in sorted(self.objects, key=lambda o: o.key):
            if stored.key in self.data_keys:
                digest.update(f"\n{stored.key}:{stored.sha256 or stored.size}".encode())
        return f"{self.settings_fingerprint}-{digest.hexdigest()[:16]}"


def read_completions_manifest(store: Store, shard: int) -> CompletionsShardManifest | None:
    return read_shard_manifest(store, COMPLETIONS, shard, CompletionsShardManifest)


def completions_manifest(store: Store, shard: int) -> CompletionsShardManifest:
    manifest = read_completions_manifest(store, shard)
    if manifest is None:
        raise ShardNotPublished(f"completions shard {shard} has no manifest: it is not published")
    return manifest


def iter_completion_batches(store: Store, shard: int, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Stream a published shard's rows, one Parquet row group at a time (memory bounded by a row group)."""
    return iter_parquet_batches(store, completions_manifest(store, shard), columns)


@dataclass
class Coverage:
    expected: int
    present: int
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicated: dict[str, int] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return not (self.missing or self.unexpected or self.duplicated)

    def describe(self) -> str:
        if self.exact:
            return f"every planned event ({self.expected}) has exactly one record"
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} planned events have no record (e.g. {self.missing[:3]})")
        if self.duplicated:
            parts.append(f"{len(self.duplicated)} events have several records (e.g. {list(self.duplicated)[:3]})")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} records belong to no planned event (e.g. {self.unexpected[:3]})")
        return "; ".join(parts)


def shard_coverage(store: Store, shard: int) -> Coverage:
    """Compare, by id, the events planned from the shard's conversations with the records published."""
    expected = {c.event_id(t) for c in read_conversations(store, shard) for t in range(c.num_turns)}
    counts: Counter = Counter()
    for batch in iter_completion_batches(store, shard, columns=["event_id"]):
        counts.update(batch.column("event_id").to_pylist())
    return Coverage(
        expected=len(expected),
        present=sum(counts.values()),
        missing=sorted(expected - counts.keys()),
        unexpected=sorted(counts.keys() - expected),
        duplicated={k: v for k, v in counts.items() if v > 1},
    )
