"""Training shards: their manifest, and their rows as Parquet, written and read one row group at a time.

Layout:
* `input_ids` as `list<int32>`, `loss_mask` as `list<int8>` (same file size as `list<bool>`, and it reads
  straight into the 0/1 integers trainers expect);
* zstd level 1: level 3 saves under 1% on token ids and writes ~1.7x slower here;
* dictionary encoding only on the low-cardinality strings (`finish_reason`, the provenance names): on token
  columns it slows writes ~40% for ~1.5% size;
* row groups of at most 1,024 rows or 4M tokens (~16 MB of ids), so a reader holds one group at a time
  and can seek to a row without decoding the file.

A column is never combined across row groups or files: the full set has more tokens than a `list`
array's int32 offsets can address (2^31).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from dagster_project.conversations.shards import ConversationsUsed
from dagster_project.generation_settings import GenerationSettings
from dagster_project.store.layout import TRAINING_SET
from dagster_project.store.manifest import ShardManifest, iter_parquet_batches, read_shard_manifest
from dagster_project.store.storage import Store
from dagster_project.tokenizer import TokenizerIdentity
from dagster_project.training.lengths import KEEP, LENGTH_POLICIES, MIN_OUTPUT_TOKENS, LengthFigures

TRAINING_FILE = "training.parquet"
ROWS_PER_GROUP = 1024
TOKENS_PER_GROUP = 4 * 1024 * 1024
COMPRESSION = "zstd"
COMPRESSION_LEVEL = 1
DICTIONARY_COLUMNS = ["finish_reason", "source", "server", "weight_version", "settings_fingerprint"]

DEFAULT_MAX_LENGTH = 4096  # the sequence length drafter trainers train at

if TYPE_CHECKING:  # readers of manifests alone (`dflash status`) never load pyarrow
    import pyarrow as pa


class TrainingShardNotPublished(RuntimeError):
    pass


@dataclass(frozen=True)
class AssemblyOptions:
    """How completions become rows (see `training.stage`); recorded in each shard's manifest."""

    max_length: int | None = field(
        default=DEFAULT_MAX_LENGTH,
        metadata={
            "help": "The trainer's sequence length in tokens (SpecForge, Model-Optimizer DFlash and DeepSpec train at "
            "4,096): rows and supervised tokens beyond it are counted in every manifest; none: no limit."
        },
    )
    length_policy: str = field(
        default=KEEP,
        metadata={
            "help": "Rows over max_length: 'keep' stores them whole and only records what a trainer cutting at "
            "max_length loses; 'truncate' cuts them at max_length (the loss mask follows, the row is marked "
            "truncated); 'drop' excludes them (over_max_length)."
        },
    )
    exclude_length_capped: bool = field(
        default=True, metadata={"help": "Exclude generations that hit max_new_tokens (finish_reason 'length')."}
    )

    def __post_init__(self) -> None:
        if self.length_policy not in LENGTH_POLICIES:
            raise ValueError(f"length_policy must be one of {LENGTH_POLICIES}, got {self.length_policy!r}")
        if self.max_length is not None and self.max_length < MIN_OUTPUT_TOKENS + 1:
            raise ValueError(
                f"max_length must leave room for a prompt and {MIN_OUTPUT_TOKENS} output tokens, got {self.max_length}"
            )


@dataclass(frozen=True)
class TrainingSource:
    """The completions shard the rows were assembled from, as it was published then."""

    completions_manifest_sha256: str = ""
    completions_ids_digest: str = ""
    settings_fingerprint: str = ""
    # A completions manifest that did not record its settings was made with the defaults.
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    # Blocking gates the completions shard failed and the operator overrode (`check/gate` → message).
    gates_overridden: dict[str, str] = field(default_factory=dict)
    # Quality-watch gates a released hold overrode while the completions were generated (gate → who, when, why).
    hold_overrides: dict[str, str] = field(default_factory=dict)
    # The answers per model their servers were checked to serve (the completions manifest's `served_models`).
    served_models: dict[str, int] = field(default_factory=dict)
    # What rendered the prompts (the completions manifest's); unknown for completions made before it was recorded.
    tokenizer: TokenizerIdentity = field(default_factory=TokenizerIdentity)
    # The conversations shard the completions were made from, as published then; and whether the operator accepted
    # that they had been edited since (`accept_stale_conversations`): the exports refuse the shard otherwise.
    conversations: ConversationsUsed = field(default_factory=ConversationsUsed)
    stale_conversations_accepted: bool = False


@dataclass(frozen=True)
class GroupExclusions:
    """Completions rows of one source and turn excluded for one reason (what the mixture report reads)."""

    source: str
    turn_index: int
    reason: str
    rows: int


@dataclass(frozen=True, kw_only=True)
class TrainingShardManifest(ShardManifest):
    """rows_in completions rows = rows kept + the rows excluded, by reason. `ids_digest` is over kept event ids."""

    stage: str = TRAINING_SET
    rows_in: int
    tokens: int
    loss_tokens: int
    prompt_tokens: int
    truncated_rows: int = 0
    truncated_by_fit: int = 0  # of those, cut when generated (`max_new_tokens: fit`), not here
    max_row_tokens: int = 0
    row_groups: int = 0
    exclusions: dict[str, int] = field(default_factory=dict)
    exclusions_by_group: list[GroupExclusions] = field(default_factory=list)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    # Every output token of the completions rows by where it went: `trained` (within max_length), `past_max_length`
    # (of kept rows), each exclusion reason; they sum to the shard's generated output. Empty: assembled before.
    output_tokens_by_outcome: dict[str, int] = field(default_factory=dict)
    assembly: AssemblyOptions = field(default_factory=AssemblyOptions)
    # Rows against max_length: how many are longer, the supervised tokens lost past it, a length histogram.
    lengths: LengthFigures = field(default_factory=LengthFigures)
    # When the contamination report applied was computed (0: there was none, so nothing was checked).
    contamination_report_at: float = 0.0
    source: TrainingSource = field(default_factory=TrainingSource)

    @property
    def excluded(self) -> int:
        return sum(self.exclusions.values())


class TrainingShardWriter:
    """Buffers training batches and writes them as row groups bounded by rows and by tokens."""

    def __init__(self, path: Path, *, rows_per_group: int = ROWS_PER_GROUP, tokens_per_group: int = TOKENS_PER_GROUP):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.rows_per_group = rows_per_group
        self.tokens_per_group = tokens_per_group
        import pyarrow.parquet as pq

        from dagster_project.records import TRAINING_SCHEMA

        self._writer = pq.ParquetWriter(
            path,
            TRAINING_SCHEMA,
            compression=COMPRESSION,
            compression_level=COMPRESSION_LEVEL,
            use_dictionary=DICTIONARY_COLUMNS,
        )
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._pending_tokens = 0
        self.rows = 0
        self.row_groups = 0

    def write(self, batch: pa.RecordBatch) -> None:
        """Add rows; a group is flushed as soon as it is full, by row count or by tokens."""
        tokens = batch.column("num_tokens").to_numpy()
        start = 0
        for end in range(1, batch.num_rows + 1):
            self._pending_tokens += int(tokens[end - 1])
            self._pending_rows += 1
            if self._pending_rows >= self.rows_per_group or self._pending_tokens >= self.tokens_per_group:
                self._pending.append(batch.slice(start, end - start))
                start = end
                self._flush()
        if start < batch.num_rows:
            self._pending.append(batch.slice(start))

    def _flush(self) -> None:
        if self._pending_rows:
            import pyarrow as pa

            table = pa.Table.from_batches(self._pending, schema=self._writer.schema)
            self._writer.write_table(table, row_group_size=self._pending_rows)
            self.rows += self._pending_rows
            self.row_groups += 1
        self._pending, self._pending_rows, self._pending_tokens = [], 0, 0

    def close(self) -> None:
        self._flush()
        self._writer.close()

    def __enter__(self) -> TrainingShardWriter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def read_training_manifest(store: Store, shard: int) -> TrainingShardManifest | None:
    return read_shard_manifest(store, TRAINING_SET, shard, TrainingShardManifest)


def training_manifest(store: Store, shard: int) -> TrainingShardManifest:
    manifest = read_training_manifest(store, shard)
    if manifest is None:
        raise TrainingShardNotPublished(f"training_set shard {shard} has no manifest: materialize `training_set` first")
    return manifest


def iter_training_batches(store: Store, shard: int, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    return iter_parquet_batches(store, training_manifest(store, shard), columns)
