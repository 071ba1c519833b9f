"""Completions → token-exact DFlash training rows.

For every usable generation event: `input_ids = prompt_ids + output_ids` and `loss_mask` = 0 over the
prompt, 1 over the output, with the event's provenance (`records.PROVENANCE_FIELDS`: source, server,
`weight_version`, settings fingerprint, spec-decoding stats) — the ids exactly as sent to and returned by
SGLang, never re-tokenized (the prompt/output boundary comes from the engine, so no template mismatch can
creep in). The output ends with
the EOS `<|im_end|>` the model emitted, so the drafter learns to stop; the template's "\\n" after it is
never generated and never in a row.

**Exclusions**, each counted under its reason (first matching reason wins): `eval_contamination` (the
conversation shares an n-gram with an evaluation set, in the contamination report of the conversations
check, when its action is `quarantine`; `conversations.contamination`), `error` (the request failed: no
answer), `aborted` (finish_reason abort), `unknown_finish_reason`, `length_capped` (finish_reason length,
when `exclude_length_capped`, the default: the answer was cut by `max_new_tokens`, usually inside its
reasoning), `empty_output`, `duplicate_event` (an event recorded twice; the first is kept), and the two
`max_length` reasons below.

**`max_length`** (default 4,096, the length drafter trainers train at) and `length_policy` for a longer row:
* `keep` (default): stored whole; the manifest records what a trainer cutting at `max_length` loses.
* `truncate`: keeps its first `max_length` tokens — the whole prompt and the head of the output, exactly what
  SpecForge does to a longer row — and is marked `truncated`; its mask follows.
* `drop`: is excluded as `over_max_length`.
Under `keep` and `truncate`, a row whose prompt leaves fewer than 2 output tokens inside `max_length` (no
DFlash anchor at the trainer's length) is excluded as `prompt_fills_max_length`. The prompt is never cut: a
row without its context would teach the drafter the wrong distribution. Every manifest carries the
`training.lengths.LengthFigures` of its shard: rows over `max_length`, supervised tokens lost, a histogram.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Set
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dagster_project.conversations.contamination import EVAL_CONTAMINATION, quarantined_ids
from dagster_project.conversations.shards import read_shard_conversations_manifest, stale_conversations_fix
from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.generation_settings import GenerationSettings
from dagster_project.records import PROVENANCE_FIELDS, STATUS_EXCLUDED, STATUS_OK, TRAINING_SCHEMA
from dagster_project.store.dataclass_json import parse_record
from dagster_project.store.layout import COMPLETIONS, TRAINING_SET, lease_key, regenerate_command, shard_manifest_key
from dagster_project.store.lease import Lease, LeaseOptions, take_lease
from dagster_project.store.manifest import ids_digest, iter_parquet_batches, publish_shard, rows_mismatch
from dagster_project.store.storage import Store, sha256_bytes
from dagster_project.store.verdicts import describe_failures, failed_gates
from dagster_project.tokenizer import TokenizerIdentity, refuse_other_tokenizer
from dagster_project.training.gate_result import GateResult
from dagster_project.training.lengths import DROP, KEEP, MIN_OUTPUT_TOKENS, LengthFigures, kept_output
from dagster_project.training.outcomes import (
    ABORTED,
    DUPLICATE_EVENT,
    EMPTY_OUTPUT,
    ERROR,
    LENGTH_CAPPED,
    OVER_MAX_LENGTH,
    PAST_MAX_LENGTH,
    PROMPT_FILLS_MAX_LENGTH,
    TRAINED,
    UNKNOWN_FINISH_REASON,
)
from dagster_project.training.row_figures import list_buffers
from dagster_project.training.shards import (
    TRAINING_FILE,
    AssemblyOptions,
    GroupExclusions,
    TrainingShardManifest,
    TrainingShardWriter,
    TrainingSource,
)

UNKNOWN_SOURCE = "unknown"  # completions written before the source was recorded

COMPLETION_COLUMNS = [
    "event_id",
    "conversation_id",
    "turn_index",
    "status",
    "error_kind",
    "prompt_ids",
    "output_ids",
    "finish_reason",
    *(name for name, _ in PROVENANCE_FIELDS),
]


class CompletionsNotPublished(RuntimeError):
    pass


class CompletionsGated(RuntimeError):
    """The completions shard failed a blocking gate: it is not assembled unless the operator overrides it."""


class MixedModels(RuntimeError):
    """The completions shard holds answers of servers checked to serve different models: a drafter learns one."""


def refuse_mixed_models(manifest: CompletionsShardManifest, where: str) -> None:
    """`MixedModels` when the shard's answers came from servers of more than one model."""
    if len(manifest.served_models) > 1:
        models = ", ".join(f"{label}: {answers:,} answers" for label, answers in manifest.served_models.items())
        raise MixedModels(
            f"completions shard {manifest.shard} ({where}) holds answers of different models ({models}): a drafter "
            "learns one target model. Generate the shard again from an empty journal against a fleet of the one "
            "model (the fleet resource's served_model) before assembling it"
        )


@dataclass
class AssemblyCounts:
    rows_in: int = 0
    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    prompt_tokens: int = 0
    truncated_rows: int = 0
    truncated_by_fit: int = 0
    max_row_tokens: int = 0
    exclusions: Counter = field(default_factory=Counter)
    finish_reasons: Counter = field(default_factory=Counter)
    lengths: LengthFigures = field(default_factory=LengthFigures)
    groups: Counter = field(default_factory=Counter)  # excluded rows by (source, turn index, reason)
    output_tokens: Counter = field(default_factory=Counter)  # by outcome: trained, past_max_length, each reason

    def add(self, batch: pa.RecordBatch) -> None:
        self.rows += batch.num_rows
        self.tokens += int(pc.sum(batch.column("num_tokens")).as_py() or 0)
        self.loss_tokens += int(pc.sum(batch.column("num_loss_tokens")).as_py() or 0)
        self.prompt_tokens += int(pc.sum(batch.column("prompt_tokens")).as_py() or 0)
        self.truncated_rows += int(pc.sum(batch.column("truncated")).as_py() or 0)
        # Truncated with its whole answer in the row: cut by `max_new_tokens: fit` when generated, not here.
        whole = pc.equal(batch.column("num_loss_tokens"), batch.column("completion_tokens"))
        self.truncated_by_fit += int(pc.sum(pc.and_(batch.column("truncated"), whole)).as_py() or 0)
        self.max_row_tokens = max(self.max_row_tokens, int(pc.max(batch.column("num_tokens")).as_py() or 0))
        self.finish_reasons.update(batch.column("finish_reason").to_pylist())


def _exclusion_reasons(
    batch: pa.RecordBatch,
    options: AssemblyOptions,
    seen: set[str],
    lengths: LengthFigures,
    contaminated: Set[str] = frozenset(),
    cut_by_fit: np.ndarray | None = None,
) -> np.ndarray:
    """The exclusion reason of each row (None = kept); `seen` carries event ids across batches. The rows no other
    reason excluded are judged against `max_length` and added to `lengths`. `cut_by_fit`: the answers
    `max_new_tokens: fit` cut where the trainer would cut them: kept (truncated), not length-capped."""
    rows = batch.num_rows
    reasons = np.full(rows, None, dtype=object)
    status = np.asarray(batch.column("status").to_pylist(), dtype=object)
    finish = np.asarray(batch.column("finish_reason").to_pylist(), dtype=object)
    prompt_len = pc.list_value_length(batch.column("prompt_ids")).fill_null(0).to_numpy(zero_copy_only=False)
    output_len = pc.list_value_length(batch.column("output_ids")).fill_null(0).to_numpy(zero_copy_only=False)

    def exclude(condition: np.ndarray, reason: str) -> None:
        reasons[(reasons == None) & condition] = reason  # noqa: E711 (elementwise over an object array)

    if contaminated:
        conversations = batch.column("conversation_id").to_pylist()
        exclude(np.array([c in contaminated for c in conversations], dtype=bool), EVAL_CONTAMINATION)
    not_sent = status == STATUS_EXCLUDED
    if not_sent.any():  # each under the reason its record names (eval_contamination)
        kinds = np.asarray(_column_or_nulls(batch, "error_kind", pa.string()).to_pylist(), dtype=object)
        for reason in set(kinds[not_sent]):
            exclude(not_sent & (kinds == reason), reason or STATUS_EXCLUDED)
    exclude(status != STATUS_OK, ERROR)
    exclude(finish == "abort", ABORTED)
    exclude(np.array([reason not in ("stop", "length") for reason in finish], dtype=bool), UNKNOWN_FINISH_REASON)
    if options.exclude_length_capped:
        exclude((finish == "length") & ~(cut_by_fit if cut_by_fit is not None else False), LENGTH_CAPPED)
    exclude(output_len == 0, EMPTY_OUTPUT)
    for row, event in enumerate(batch.column("event_id").to_pylist()):
        if reasons[row] is None:
            if event in seen:
                reasons[row] = DUPLICATE_EVENT
            seen.add(event)
    judged = reasons == None  # noqa: E711
    lengths.add(prompt_len[judged], output_len[judged])
    if options.max_length is not None:
        if options.length_policy == DROP:
            exclude(prompt_len + output_len > options.max_length, OVER_MAX_LENGTH)
        else:
            exclude(prompt_len > options.max_length - MIN_OUTPUT_TOKENS, PROMPT_FILLS_MAX_LENGTH)
    return reasons


def _join(prompts: pa.Array, outputs: pa.Array, output_keep: np.ndarray) -> tuple[pa.ListArray, pa.ListArray]:
    """Per row, `prompt + output[:output_keep]` and its mask (0 on the prompt, 1 on the output), vectorized.

    Each row is two segments copied from the two flat value buffers; one gather builds them all.
    """
    prompt_offsets, prompt_values = list_buffers(prompts)
    output_offsets, output_values = list_buffers(outputs)
    rows = len(prompts)
    source = np.concatenate([prompt_values, output_values])
    segment_start = np.empty(2 * rows, dtype=np.int64)
    segment_start[0::2] = prompt_offsets[:-1]
    segment_start[1::2] = output_offsets[:-1] + prompt_values.size
    segment_len = np.empty(2 * rows, dtype=np.int64)
    segment_len[0::2] = np.diff(prompt_offsets)
    segment_len[1::2] = output_keep
    segment_dest = np.cumsum(segment_len) - segment_len
    gather = np.arange(int(segment_len.sum()), dtype=np.int64) + np.repeat(segment_start - segment_dest, segment_len)
    offsets = pa.array(np.concatenate([[0], np.cumsum(segment_len[0::2] + segment_len[1::2])]).astype(np.int32))
    mask = np.repeat(np.tile(np.array([0, 1], dtype=np.int8), rows), segment_len)
    return (
        pa.ListArray.from_arrays(offsets, pa.array(source[gather], pa.int32())),
        pa.ListArray.from_arrays(offsets, pa.array(mask, pa.int8())),
    )


def _column_or_nulls(batch: pa.RecordBatch, name: str, kind: pa.DataType) -> pa.Array:
    """A provenance column as `kind`; nulls where the completions were written before it was recorded."""
    if name not in batch.schema.names:
        return pa.nulls(batch.num_rows, kind)
    return batch.column(name).cast(kind)


def assemble_batch(
    batch: pa.RecordBatch,
    shard: int,
    options: AssemblyOptions,
    seen: set[str],
    lengths: LengthFigures | None = None,
    contaminated: Set[str] = frozenset(),
    groups: Counter | None = None,
    output_tokens: Counter | None = None,
    settings: GenerationSettings | None = None,
) -> tuple[pa.RecordBatch, Counter]:
    """Training rows (TRAINING_SCHEMA) for one batch of completions, and the excluded rows counted by reason;
    the rows' figures against `max_length` are added to `lengths`; rows of `contaminated` conversations are
    excluded as `eval_contamination`; `groups` counts the excluded rows by (source, turn index, reason);
    `output_tokens` every output token of the batch by where it went (`count_output_tokens`); `settings`: the
    completions' generation settings (what tells the answers `max_new_tokens: fit` cut)."""
    lengths = lengths if lengths is not None else LengthFigures(options.max_length, options.length_policy)
    fit_cut = _cut_by_fit(batch, settings)
    reasons = _exclusion_reasons(batch, options, seen, lengths, contaminated, fit_cut)
    if groups is not None:
        sources = _column_or_nulls(batch, "source", pa.string()).fill_null(UNKNOWN_SOURCE).to_pylist()
        turns = batch.column("turn_index").to_pylist()
        groups.update((sources[i], turns[i], reason) for i, reason in enumerate(reasons) if reason is not None)
    kept = batch.filter(pa.array(reasons == None))  # noqa: E711
    prompt_len = pc.list_value_length(kept.column("prompt_ids")).to_numpy(zero_copy_only=False).astype(np.int64)
    output_len = pc.list_value_length(kept.column("output_ids")).to_numpy(zero_copy_only=False).astype(np.int64)
    within = kept_output(prompt_len, output_len, options.max_length)
    output_keep = output_len if options.length_policy == KEEP else within
    if output_tokens is not None:
        count_output_tokens(output_tokens, batch, reasons, int(within.sum()), int(output_len.sum()))
    input_ids, loss_mask = _join(kept.column("prompt_ids"), kept.column("output_ids"), output_keep)
    rows = kept.num_rows
    training = pa.RecordBatch.from_arrays(
        [
            kept.column("event_id"),
            kept.column("conversation_id"),
            kept.column("turn_index").cast(pa.int32()),
            pa.array(np.full(rows, shard, dtype=np.int32)),
            input_ids,
            loss_mask,
            pa.array((prompt_len + output_keep).astype(np.int32)),
            pa.array(output_keep.astype(np.int32)),
            pa.array(prompt_len.astype(np.int32)),
            pa.array(output_len.astype(np.int32)),
            kept.column("finish_reason"),
            pa.array((output_keep < output_len) | fit_cut[reasons == None]),  # noqa: E711 (cut here, or by fit)
            *(_column_or_nulls(kept, name, kind) for name, kind in PROVENANCE_FIELDS),
        ],
        schema=TRAINING_SCHEMA,
    )
    return training, Counter(reason for reason in reasons if reason is not None)


def _cut_by_fit(batch: pa.RecordBatch, settings: GenerationSettings | None) -> np.ndarray:
    """Each row: whether its answer stopped at its `max_new_tokens: fit` cap."""
    if settings is None or settings.fit_max_length is None:
        return np.zeros(batch.num_rows, dtype=bool)
    prompt = pc.list_value_length(batch.column("prompt_ids")).fill_null(0).to_pylist()
    output = pc.list_value_length(batch.column("output_ids")).fill_null(0).to_pylist()
    finish = batch.column("finish_reason").to_pylist()
    return np.array([settings.cut_by_fit(*row) for row in zip(prompt, output, finish, strict=True)], dtype=bool)


def count_output_tokens(counted: Counter, batch: pa.RecordBatch, reasons: np.ndarray, within: int, kept: int) -> None:
    """Every output token of `batch` under one outcome, so that they add up to what was generated: an excluded
    row's under its reason, a kept row's under `trained` up to `max_length` and `past_max_length` beyond it (cut
    here, or by the trainer under `keep`). What the waste ledger (`ops.answers.waste`) reads."""
    output_len = pc.list_value_length(batch.column("output_ids")).fill_null(0).to_numpy(zero_copy_only=False)
    for reason in set(reasons[reasons != None]):  # noqa: E711 (elementwise over an object array)
        counted[reason] += int(output_len[reasons == reason].sum())
    counted[TRAINED] += within
    counted[PAST_MAX_LENGTH] += kept - within


def assemble_batches(
    batches: Iterable[pa.RecordBatch],
    shard: int,
    options: AssemblyOptions,
    lengths: LengthFigures,
    contaminated: Set[str] = frozenset(),
    groups: Counter | None = None,
    output_tokens: Counter | None = None,
    settings: GenerationSettings | None = None,
) -> Iterator[tuple[pa.RecordBatch, Counter, list[str]]]:
    """Stream `assemble_batch` over a shard; also yields each input batch's event ids (for the source digest)."""
    seen: set[str] = set()
    for batch in batches:
        training, excluded = assemble_batch(
            batch, shard, options, seen, lengths, contaminated, groups, output_tokens, settings
        )
        yield training, excluded, batch.column("event_id").to_pylist()


def _completions_source(store: Store, shard: int) -> tuple[CompletionsShardManifest, str]:
    """The published completions manifest and the sha256 of its bytes (which tells one publication from another)."""
    key = shard_manifest_key(COMPLETIONS, shard)
    if not store.exists(key):
        raise CompletionsNotPublished(f"completions shard {shard} has no manifest: materialize `completions` first")
    raw = store.get_bytes(key)
    return parse_record(store, key, CompletionsShardManifest, raw), sha256_bytes(raw)


def assemble_shard(
    store: Store,
    shard: int,
    options: AssemblyOptions,
    staging_dir: Path,
    *,
    tokenizer: TokenizerIdentity = TokenizerIdentity(),
    accept_stale_conversations: bool = False,
    override_failed_gates: bool = False,
    run_id: str | None = None,
    lease: LeaseOptions = LeaseOptions(),
) -> TrainingShardManifest:
    """Build and publish `training_set/shard=NNNNN/` from the published completions shard; return its manifest.

    Refuses a completions shard that failed a blocking gate (its checks' verdicts on this publication), naming
    the gate, unless `override_failed_gates` (the overridden gates are then recorded in the manifest); one made
    under another tokenizer than the run's, `tokenizer` (`TokenizerMismatch`; the asset passes the run's, unknown
    compares with nothing); and one made from conversations
    edited since (`ConversationsChanged`), unless `accept_stale_conversations` (recorded in the manifest). One run
    at a time: the shard's lease is held while it is assembled and published (`run_id` names the holder).
    """
    source, source_sha256 = _completions_source(store, shard)
    refuse_mixed_models(source, store.url(shard_manifest_key(COMPLETIONS, shard)))
    refuse_other_tokenizer(
        source.tokenizer,
        tokenizer,
        f"completions shard {shard}",
        "its rows would mix with rows rendered by another chat template. Regenerate it under this tokenizer: "
        f"`{regenerate_command(COMPLETIONS, shard)}`, or run training_set with the tokenizer it was made under "
        "(DFLASH_TOKENIZER)",
    )
    conversations_now = read_shard_conversations_manifest(store, shard)
    stale = conversations_now is not None and source.conversations_used.changed_in(conversations_now)
    if not accept_stale_conversations:
        source.conversations_used.refuse_if_changed(
            conversations_now, f"completions shard {shard}", stale_conversations_fix(shard)
        )
    gated = failed_gates(store, source)  # what the completions checks recorded on this publication
    if gated and not override_failed_gates:
        raise CompletionsGated(
            f"completions shard {shard} ({store.url(shard_manifest_key(COMPLETIONS, shard))}) failed blocking "
            f"gates: {describe_failures(gated)}. Fix the cause and re-materialize completions of this shard; or, "
            "having looked at them, set override_failed_gates: true in training_set's config to assemble it anyway"
        )
    contaminated, report = quarantined_ids(store, shard)
    with take_lease(store, lease_key(TRAINING_SET, shard), run_id=run_id, options=lease) as held:
        return _assemble(
            store,
            shard,
            options,
            staging_dir,
            source,
            source_sha256,
            gated,
            stale,
            held,
            contaminated,
            report.computed_at if report is not None else 0.0,
        )


def _assemble(
    store: Store,
    shard: int,
    options: AssemblyOptions,
    staging_dir: Path,
    source: CompletionsShardManifest,
    source_sha256: str,
    overridden: dict[str, str],
    stale_accepted: bool,
    held: Lease,
    contaminated: Set[str],
    contamination_report_at: float,
) -> TrainingShardManifest:
    counts = AssemblyCounts(lengths=LengthFigures(options.max_length, options.length_policy))
    kept_ids: list[str] = []
    source_ids: list[str] = []
    staging_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=staging_dir) as staging:
        path = Path(staging) / TRAINING_FILE
        with TrainingShardWriter(path) as writer:
            batches = iter_parquet_batches(store, source, COMPLETION_COLUMNS)
            for training, excluded, events in assemble_batches(
                batches,
                shard,
                options,
                counts.lengths,
                contaminated,
                counts.groups,
                counts.output_tokens,
                source.settings,
            ):
                writer.write(training)
                counts.add(training)
                counts.exclusions.update(excluded)
                kept_ids.extend(training.column("event_id").to_pylist())
                source_ids.extend(events)
        counts.rows_in = len(source_ids)
        if counts.rows_in != source.rows or ids_digest(source_ids) != source.ids_digest:
            raise rows_mismatch(store, source, counts.rows_in)
        manifest = TrainingShardManifest(
            shard=shard,
            rows=counts.rows,
            ids_digest=ids_digest(kept_ids),
            rows_in=counts.rows_in,
            tokens=counts.tokens,
            loss_tokens=counts.loss_tokens,
            prompt_tokens=counts.prompt_tokens,
            truncated_rows=counts.truncated_rows,
            truncated_by_fit=counts.truncated_by_fit,
            max_row_tokens=counts.max_row_tokens,
            row_groups=writer.row_groups,
            exclusions=dict(sorted(counts.exclusions.items())),
            exclusions_by_group=[GroupExclusions(*key, rows) for key, rows in sorted(counts.groups.items())],
            finish_reasons=dict(sorted(counts.finish_reasons.items())),
            output_tokens_by_outcome=dict(sorted(counts.output_tokens.items())),
            assembly=options,
            lengths=counts.lengths,
            contamination_report_at=contamination_report_at,
            source=TrainingSource(
                completions_manifest_sha256=source_sha256,
                completions_ids_digest=source.ids_digest,
                settings_fingerprint=source.settings_fingerprint,
                settings=source.settings,
                gates_overridden=overridden,
                hold_overrides=source.hold_overrides,
                served_models=source.served_models,
                tokenizer=source.tokenizer,
                conversations=source.conversations_used,
                stale_conversations_accepted=stale_accepted,
            ),
        )
        held.renew()  # LeaseLost: another run took the shard over, and this one must not publish
        return publish_shard(store, manifest, [(TRAINING_FILE, path)])


def source_is_current(store: Store, manifest: TrainingShardManifest) -> GateResult:
    """The training shard was assembled from the completions shard now published, and accounts for every row."""
    source, source_sha256 = _completions_source(store, manifest.shard)
    assembled_from = manifest.source.completions_manifest_sha256
    current = assembled_from == source_sha256
    balanced = manifest.rows + manifest.excluded == source.rows
    metadata = {
        "rows": manifest.rows,
        "excluded_rows": manifest.excluded,
        "exclusions": manifest.exclusions,
        "completions_rows": source.rows,
        "completions_manifest_sha256": source_sha256,
        "assembled_from_sha256": assembled_from,
    }
    if not current:
        text = (
            "BLOCKED: completions were republished after this training shard was assembled "
            "— re-materialize training_set"
        )
    elif not balanced:
        text = f"BLOCKED: {manifest.rows} rows + {manifest.excluded} excluded ≠ {source.rows} completions rows"
    else:
        text = f"ok: {manifest.rows} rows + {manifest.excluded} excluded = the {source.rows} completions rows"
    return GateResult("source_is_current", current and balanced, text, metadata)
