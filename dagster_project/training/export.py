"""SpecForge export: one pre-tokenized JSON Lines file per training shard.

Each line is `{"input_ids": [...], "loss_mask": [...]}` — SpecForge's pre-tokenized contract
(`specforge/data/prompt_builder.py::prepare_prompt_tasks`): a file whose
first record has both keys is read as is, without SpecForge's own chat template or masking. SpecForge
checks equal lengths, 0/1 masks and non-empty rows, truncates to its `max_length`, and drops rows under
`min_loss_tokens`; DFlash drops rows without two consecutive supervised tokens. Rows are written in the
training shard's order, so line k of a shard file is row k of `training_set/shard=NNNNN/`.

**Pointing SpecForge at the set.** Its `train_data_path` takes one file (a directory must be an HF
`save_to_disk` dataset), so concatenate the shards; zero-padded names keep `sort` order = shard order:

    cat <store>/exports/specforge/shard=*.jsonl > train.jsonl     # then: train_data_path: train.jsonl

SpecForge loads a JSONL file into Python lists, ~45 bytes per token: fine for a pilot, but the full
2.3B-token set would need ~100 GB of RAM. For that, build the HF dataset directory it reads lazily from the
training Parquet (`datasets.Dataset.from_parquet(files).select_columns(["input_ids", "loss_mask"])
.save_to_disk(dir)`) and point `train_data_path` at the directory.

**Only cleared shards are exported.** Blocking checks stop the export in the run that fails them, but not
a later run that selects the export alone (Dagster does not carry blocking across runs). So each training
check records its verdict next to the shard (`training_set/shard=NNNNN/_verdicts/<check>.json`, tied to
that publication: re-assembling the shard removes it; see `store.verdicts`), and the export refuses a shard
without a passing verdict from every check in `REQUIRED_VERDICTS`, naming each failed gate. An operator who
has looked at the failures may export such a shard anyway (`override_failed_gates`); a check that has not
run on the shard is never overridden.

**What each export did is recorded** next to the training shard (`training_set/shard=NNNNN/_exports/specforge.json`,
a `store.verdicts.ExportOutcome` tied to that publication like a verdict): exported, with the failed gates it
overrode, or refused and why. `dflash status` reads these to tell exported shards from refused ones.

**Never a row a trainer cannot learn from.** Whatever the gates said or an operator overrode, the export
refuses a shard holding a row whose loss mask sums to less than `min_loss_tokens` (default 2, one DFlash
anchor; ModelOpt refuses an all-zero mask outright), naming the rows, and writes nothing.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

from dagster_project.conversations.shards import (
    ConversationsChanged,
    read_shard_conversations_manifest,
    stale_conversations_fix,
)
from dagster_project.store import verdicts
from dagster_project.store.layout import EXPORTS, SHARD_DIGITS, TRAINING_SET
from dagster_project.store.manifest import rows_mismatch
from dagster_project.store.storage import CorruptObject, Store
from dagster_project.store.verdicts import REQUIRED_VERDICTS, read_verdict
from dagster_project.training.lengths import MIN_OUTPUT_TOKENS
from dagster_project.training.row_figures import list_buffers, row_sums
from dagster_project.training.shards import TrainingShardManifest, iter_training_batches, training_manifest

SPECFORGE_PREFIX = f"{EXPORTS}/specforge/"
EXPORT_COLUMNS = ["event_id", "input_ids", "loss_mask"]
_SAMPLE = 5


class ShardNotCleared(RuntimeError):
    """The training shard has not passed its checks (since it was last published)."""


class LossMaskTooSmall(RuntimeError):
    """The training shard holds rows with (almost) nothing to train on; nothing of it is exported."""


@dataclass(frozen=True)
class ExportOptions:
    min_loss_tokens: int = field(
        default=MIN_OUTPUT_TOKENS,
        metadata={
            "help": "A row whose loss mask sums to less than this stops the export of its shard, gates overridden "
            "or not (2: one DFlash anchor; an all-zero mask is always refused)."
        },
    )

    def __post_init__(self) -> None:
        if self.min_loss_tokens < 1:
            raise ValueError(
                f"min_loss_tokens must be at least 1 (an all-zero mask is never exported), got {self.min_loss_tokens}"
            )


@dataclass
class ThinMasks:
    """Rows under `min_loss_tokens`, gathered over a shard so the refusal names how many and which."""

    min_loss_tokens: int
    rows: int = 0
    all_zero: int = 0
    sample: list[str] = field(default_factory=list)

    def check(self, batch: pa.RecordBatch) -> None:
        sums = row_sums(batch.column("loss_mask"))
        thin = np.flatnonzero(sums < self.min_loss_tokens)
        self.rows += int(thin.size)
        self.all_zero += int((sums == 0).sum())
        events = batch.column("event_id")
        self.sample.extend(events[int(i)].as_py() for i in thin[: _SAMPLE - len(self.sample)])

    def refuse(self, shard: int) -> None:
        if self.rows:
            raise LossMaskTooSmall(
                f"training_set shard {shard} holds {self.rows} rows whose loss mask sums to less than "
                f"{self.min_loss_tokens} ({self.all_zero} all zero), e.g. {self.sample}: a trainer learns nothing "
                "from them (ModelOpt refuses an all-zero mask, DFlash needs two consecutive supervised tokens), so "
                "nothing of the shard was exported. Re-assemble it with training_set (its gates name the cause)"
            )


@dataclass(frozen=True)
class ExportedShard:
    """What `export_shard` wrote: one JSON Lines object, and what it holds."""

    key: str
    size: int
    sha256: str | None
    rows: int
    tokens: int
    loss_tokens: int
    training_ids_digest: str
    # Failed gates exported anyway (`override_failed_gates`), as `check/gate` → message.
    overridden: dict[str, str] = field(default_factory=dict)


@dataclass
class JsonlCounts:
    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0


def verdict_key(shard: int, check: str) -> str:
    return verdicts.verdict_key(TRAINING_SET, shard, check)


def record_verdict(store: Store, manifest: TrainingShardManifest, check: str, failures: dict[str, str]) -> None:
    """Record a check's outcome on this publication of the shard; `failures` maps a gate to its message."""
    verdicts.record_verdict(store, manifest, check, failures)


def uncleared(store: Store, manifest: TrainingShardManifest, *, override_failed_gates: bool = False) -> list[str]:
    """Why the shard may not be exported yet (empty when every required check passed on this publication, or
    failed but `override_failed_gates`)."""
    reasons = []
    for check in REQUIRED_VERDICTS:
        verdict = read_verdict(store, manifest, check)
        if verdict is None:
            reasons.append(f"{check} has not run on this publication of the shard")
        elif not verdict.passed and not override_failed_gates:
            reasons.extend(f"{check}/{gate}: {message}" for gate, message in verdict.failures.items())
    return reasons


def specforge_key(shard: int) -> str:
    return f"{SPECFORGE_PREFIX}shard={shard:0{SHARD_DIGITS}d}.jsonl"


def write_specforge_jsonl(batches: Iterable[pa.RecordBatch], path: Path, thin: ThinMasks) -> JsonlCounts:
    """Write the rows' `input_ids` and `loss_mask` as JSON Lines; return row and token counts. Rows under the
    loss-token minimum are counted in `thin` (the caller refuses the file then)."""
    counts = JsonlCounts()
    with open(path, "wb") as out:
        for batch in batches:
            thin.check(batch)
            offsets, ids = list_buffers(batch.column("input_ids"))
            mask_offsets, mask = list_buffers(batch.column("loss_mask"))
            if not np.array_equal(offsets, mask_offsets):
                raise ValueError("input_ids and loss_mask differ in length on some row")
            out.writelines(
                orjson.dumps(
                    {"input_ids": ids[start:end], "loss_mask": mask[start:end]},
                    option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE,
                )
                for start, end in zip(offsets[:-1], offsets[1:], strict=True)
            )
            counts.rows += batch.num_rows
            counts.tokens += int(ids.size)
            counts.loss_tokens += int(mask.sum(dtype=np.int64))
    return counts


def cleared_manifest(
    store: Store, shard: int, *, override_failed_gates: bool = False, asset: str = "specforge_export"
) -> tuple[TrainingShardManifest, dict[str, str]]:
    """The training shard's manifest and the failed gates overridden; `ShardNotCleared` if `asset` may not export
    it, `ConversationsChanged` if it was made from conversations edited since and not accepted as such."""
    manifest = training_manifest(store, shard)
    if not manifest.source.stale_conversations_accepted:
        manifest.source.conversations.refuse_if_changed(
            read_shard_conversations_manifest(store, shard),
            f"training_set shard {shard}",
            stale_conversations_fix(shard),
        )
    reasons = uncleared(store, manifest, override_failed_gates=override_failed_gates)
    if reasons:
        fix = (
            "run the training_set checks on it"
            if all("has not run" in reason for reason in reasons)
            else "fix the cause and re-materialize training_set (or, having looked, set override_failed_gates: "
            f"true in {asset}'s config)"
        )
        raise ShardNotCleared(
            f"training_set shard {shard} is not cleared for export: " + "; ".join(reasons) + f". To export it: {fix}"
        )
    return manifest, verdicts.failed_gates(store, manifest)


def export_shard(
    store: Store,
    shard: int,
    staging_dir: Path,
    *,
    override_failed_gates: bool = False,
    options: ExportOptions = ExportOptions(),
) -> ExportedShard:
    """Write `exports/specforge/shard=NNNNN.jsonl` from the published training shard; return what was written.

    `override_failed_gates`: export a shard that failed training gates anyway (they are in `overridden`). A row
    under `options.min_loss_tokens` refuses the shard (`LossMaskTooSmall`) whatever the gates said."""
    manifest = training_manifest(store, shard)
    try:
        manifest, overridden = cleared_manifest(store, shard, override_failed_gates=override_failed_gates)
        staging_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=staging_dir) as staging:
            path = Path(staging) / "specforge.jsonl"
            thin = ThinMasks(options.min_loss_tokens)
            counts = write_specforge_jsonl(iter_training_batches(store, shard, EXPORT_COLUMNS), path, thin)
            thin.refuse(shard)
            if counts.rows != manifest.rows or counts.loss_tokens != manifest.loss_tokens:
                raise rows_mismatch(store, manifest, counts.rows)
            info = store.put_file(specforge_key(shard), path)
    except (ShardNotCleared, LossMaskTooSmall, ConversationsChanged) as refusal:
        verdicts.record_export_outcome(store, manifest, overridden={}, refused=str(refusal))
        raise
    except CorruptObject as damage:  # `status` shows the training shard damaged, naming the object
        verdicts.record_export_outcome(store, manifest, overridden={}, refused=str(damage), damaged=True)
        raise
    verdicts.record_export_outcome(store, manifest, key=info.key, overridden=overridden)
    return ExportedShard(
        key=info.key,
        size=info.size,
        sha256=info.sha256,
        rows=counts.rows,
        tokens=counts.tokens,
        loss_tokens=counts.loss_tokens,
        training_ids_digest=manifest.ids_digest,
        overridden=overridden,
    )
