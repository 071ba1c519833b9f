"""The training set as a Hugging Face `datasets` Parquet layout, with its dataset card.

    exports/hf/README.md                the dataset card: a YAML header naming the files (config `default`,
                                        split `train`), then sources, counts, settings and the checks passed
    exports/hf/data/train-00042.parquet one file per training shard, every training column (ids, mask,
                                        counts, provenance), row groups as the training shard's
    exports/hf/_shards/shard=00042.json what that file holds (`HfShardExport`); the card is rebuilt from these

A trainer loads it without glue: `datasets.load_dataset("parquet", data_files="<prefix>/data/*.parquet",
split="train")`, or `load_dataset("<local copy of the prefix>")`, which reads the card's header. The same
shards are refused as for SpecForge (`export.cleared_manifest`, `export.ThinMasks`): one not cleared by its
checks, and one holding a row under the loss-token minimum.

Each export step rebuilds the card once, after its shards, from every shard record present (a rebuild reads
every record: once per shard would make a backfill's exports quadratic), so the card lists what the prefix
holds once the last step ends. Steps of runs side by side may replace each other's card; a step whose upload
was replaced before its check rebuilds it from the records as they then stand.
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from dagster_project.generation_settings import GenerationSettings
from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.layout import EXPORTS, SHARD_DIGITS
from dagster_project.store.manifest import rows_mismatch
from dagster_project.store.storage import Store, StoreError
from dagster_project.store.verdicts import REQUIRED_VERDICTS, read_verdict
from dagster_project.tokenizer import TokenizerIdentity
from dagster_project.training.export import ExportOptions, ThinMasks, cleared_manifest
from dagster_project.training.lengths import LengthFigures
from dagster_project.training.shards import AssemblyOptions, TrainingShardWriter, iter_training_batches
from dagster_project.training.stage import UNKNOWN_SOURCE

HF_PREFIX = f"{EXPORTS}/hf/"
CARD_KEY = f"{HF_PREFIX}README.md"
DATA_PATTERN = "data/train-*.parquet"
_RECORDS = f"{HF_PREFIX}_shards/"
CARD_ATTEMPTS = 3


@dataclass(frozen=True)
class HfShardExport:
    """What one shard's Parquet file in the export holds, and what cleared it."""

    shard: int
    key: str
    size: int = 0
    sha256: str | None = None
    rows: int = 0
    tokens: int = 0
    loss_tokens: int = 0
    rows_by_source: dict[str, int] = field(default_factory=dict)
    training_ids_digest: str = ""
    settings_fingerprint: str = ""
    settings: GenerationSettings = field(default_factory=GenerationSettings)
    served_models: dict[str, int] = field(default_factory=dict)  # answers per model their servers served
    tokenizer: TokenizerIdentity = field(default_factory=TokenizerIdentity)  # what rendered the prompts
    stale_conversations_accepted: bool = False  # made from conversations edited since, accepted by the operator
    assembly: AssemblyOptions = field(default_factory=AssemblyOptions)
    lengths: LengthFigures = field(default_factory=LengthFigures)
    output_tokens_by_outcome: dict[str, int] = field(default_factory=dict)  # the training manifest's
    checks_passed: list[str] = field(default_factory=list)
    overridden: dict[str, str] = field(default_factory=dict)  # failed gates exported anyway: `check/gate` → message
    hold_overrides: dict[str, str] = field(default_factory=dict)  # watch holds released as false alarms
    exported_at: float = 0.0


def data_key(shard: int) -> str:
    return f"{HF_PREFIX}data/train-{shard:0{SHARD_DIGITS}d}.parquet"


def record_key(shard: int) -> str:
    return f"{_RECORDS}shard={shard:0{SHARD_DIGITS}d}.json"


def export_hf_shard(
    store: Store,
    shard: int,
    staging_dir: Path,
    *,
    override_failed_gates: bool = False,
    options: ExportOptions | None = None,
) -> HfShardExport:
    """Write the shard's Parquet file and its record; return the record (the card: `write_dataset_card`)."""
    manifest, overridden = cleared_manifest(
        store, shard, override_failed_gates=override_failed_gates, asset="hf_export"
    )
    thin = ThinMasks((options or ExportOptions()).min_loss_tokens)
    sources: Counter = Counter()
    staging_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=staging_dir) as staging:
        path = Path(staging) / "train.parquet"
        with TrainingShardWriter(path) as writer:
            for batch in iter_training_batches(store, shard):
                thin.check(batch)
                sources.update(batch.column("source").fill_null(UNKNOWN_SOURCE).to_pylist())
                writer.write(batch)
        thin.refuse(shard)
        if writer.rows != manifest.rows:
            raise rows_mismatch(store, manifest, writer.rows)
        info = store.put_file(data_key(shard), path)
    record = HfShardExport(
        shard=shard,
        key=info.key,
        size=info.size,
        sha256=info.sha256,
        rows=manifest.rows,
        tokens=manifest.tokens,
        loss_tokens=manifest.loss_tokens,
        rows_by_source=dict(sorted(sources.items())),
        training_ids_digest=manifest.ids_digest,
        settings_fingerprint=manifest.source.settings_fingerprint,
        settings=manifest.source.settings,
        served_models=manifest.source.served_models,
        tokenizer=manifest.source.tokenizer,
        stale_conversations_accepted=manifest.source.stale_conversations_accepted,
        assembly=manifest.assembly,
        lengths=manifest.lengths,
        output_tokens_by_outcome=manifest.output_tokens_by_outcome,
        checks_passed=[
            check for check in REQUIRED_VERDICTS if (verdict := read_verdict(store, manifest, check)) and verdict.passed
        ],
        overridden=overridden,
        hold_overrides=manifest.source.hold_overrides,
        exported_at=time.time(),
    )
    store.put_bytes(record_key(shard), to_json(record))
    return record


def write_dataset_card(store: Store) -> str:
    """Rebuild the dataset card from every shard record present and upload it; return it. Another run's step
    may upload its card between this upload and its check (the check then sees other bytes): the card is then
    rebuilt from the records as they stand, at most `CARD_ATTEMPTS` times, so a damaged upload still fails."""
    attempt = 1
    while True:
        card = dataset_card(exported_records(store))
        try:
            store.put_bytes(CARD_KEY, card.encode())
            return card
        except StoreError:
            if attempt == CARD_ATTEMPTS:
                raise
            attempt += 1


def exported_records(store: Store) -> list[HfShardExport]:
    """The record of every shard in the export, by shard."""
    keys = sorted(info.key for info in store.list(_RECORDS) if info.key.endswith(".json"))
    return [record for key in keys if (record := read_record(store, key, HfShardExport)) is not None]


def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _generated_not_trained(outcomes: Counter) -> str:
    """The exported shards' output tokens by where they went (`training.outcomes`): trained, or why not."""
    generated = sum(outcomes.values())
    if not generated:
        return "Not recorded for these shards (assembled before the split of their output was)."
    rows = [[outcome, f"{n:,}", f"{n / generated:.1%}"] for outcome, n in sorted(outcomes.items(), key=lambda i: -i[1])]
    return (
        f"Of the {generated:,} output tokens the target model generated for these shards' rows, where each went "
        "(shards a gate blocked are not exported; `dflash status` has the whole job's ledger):\n\n"
        + _table(["outcome", "output tokens", "share"], rows)
    )


def dataset_card(records: list[HfShardExport]) -> str:
    """The README.md of the export: the `datasets` header, then what the rows are and what made them."""
    rows = sum(r.rows for r in records)
    tokens, loss_tokens = sum(r.tokens for r in records), sum(r.loss_tokens for r in records)
    sources: Counter = Counter()
    settings: dict[str, GenerationSettings] = {}
    shards_per_settings: Counter = Counter()
    assembly: Counter = Counter()
    lengths = LengthFigures()
    outcomes: Counter = Counter()
    models: Counter = Counter()
    tokenizers: dict[str, TokenizerIdentity] = {}
    shards_per_tokenizer: Counter = Counter()
    for record in records:
        tokenizers[record.tokenizer.fingerprint] = record.tokenizer
        shards_per_tokenizer[record.tokenizer.fingerprint] += 1
        models.update(record.served_models)
        outcomes.update(record.output_tokens_by_outcome)
        sources.update(record.rows_by_source)
        settings[record.settings_fingerprint] = record.settings
        shards_per_settings[record.settings_fingerprint] += 1
        assembly[(record.assembly.max_length, record.assembly.length_policy)] += 1
        lengths.merge(record.lengths)
    cleared = [r.shard for r in records if set(r.checks_passed) == set(REQUIRED_VERDICTS)]
    overridden = [f"shard {r.shard}: {gate}: {message}" for r in records for gate, message in r.overridden.items()]
    stale_accepted = [r.shard for r in records if r.stale_conversations_accepted]
    watch_overrides = sorted({f"{gate}: {message}" for r in records for gate, message in r.hold_overrides.items()})
    header = "\n".join(
        [
            "---",
            "configs:",
            "- config_name: default",
            "  data_files:",
            "  - split: train",
            f"    path: {DATA_PATTERN}",
            "tags:",
            "- speculative-decoding",
            "- dflash",
            "- self-distillation",
            "---",
        ]
    )
    sections = [
        header,
        "# DFlash drafter training set (self-distilled)",
        "Token-exact rows for a speculative-decoding drafter: `input_ids` is a prompt as the target model was sent "
        "it followed by the target model's own answer, exactly as the engine returned it; `loss_mask` is 0 over "
        "the prompt and 1 over the answer. Each row also names its source, the server, the model revision "
        "(`weight_version`), the settings fingerprint, the finish reason and MTP's accept length.",
        "## Tools",
        "A conversation that defines tools has them rendered in every prompt by the chat template, in OpenAI's "
        'form: a spec the source gave bare, as `{name, description, parameters}`, was wrapped as `{"type": '
        '"function", "function": …}` before rendering, and the JSON Schema types the function-calling '
        "leaderboard writes as Python's (`dict`, `float`, `tuple`) were renamed to `object`, `number` and `array`.",
        "## Counts",
        _table(
            ["shards", "rows", "tokens", "supervised tokens"],
            [[len(records), f"{rows:,}", f"{tokens:,}", f"{loss_tokens:,}"]],
        ),
        "## Sources",
        _table(
            ["source", "rows", "share"],
            [[source, f"{n:,}", f"{n / rows:.1%}" if rows else "—"] for source, n in sorted(sources.items())],
        ),
        "## Target model",
        "The model the answering servers were checked to serve before their first request (name, architecture, "
        "vocabulary, end-of-sequence id):\n\n"
        + _table(
            ["model", "answers"],
            [[label, f"{n:,}"] for label, n in sorted(models.items())] or [["not recorded", "—"]],
        ),
        "## Tokenizer and chat template",
        "The tokenizer that rendered the prompts, by fingerprint (of its vocabulary, special tokens and chat "
        "template; `training_set` refuses a shard made under another tokenizer than its run's):\n\n"
        + _table(
            ["fingerprint", "tokenizer", "vocabulary", "special tokens", "chat template", "shards"],
            [
                [
                    fingerprint or "not recorded",
                    identity.name or "—",
                    identity.vocabulary or "—",
                    identity.special_tokens or "—",
                    identity.chat_template or "—",
                    shards_per_tokenizer[fingerprint],
                ]
                for fingerprint, identity in sorted(tokenizers.items())
            ],
        ),
        "## Generation settings",
        _table(
            ["fingerprint", "shards", "settings"],
            [
                [fingerprint, shards_per_settings[fingerprint], "`" + orjson.dumps(asdict(kind)).decode() + "`"]
                for fingerprint, kind in sorted(settings.items())
            ],
        ),
        "## Length",
        _table(
            ["max_length", "length_policy", "shards"],
            [[length, policy, n] for (length, policy), n in sorted(assembly.items(), key=str)],
        )
        + f"\n\n{lengths.rows_over:,} of {lengths.rows:,} rows were longer than max_length; "
        f"{lengths.supervised_tokens_beyond:,} of {lengths.supervised_tokens:,} supervised tokens "
        f"({lengths.lost_share:.1%}) lie beyond it (cut, dropped, or left for the trainer to cut under `keep`).\n\n"
        + _table(["row length (tokens)", "rows"], [[label, n] for label, n in lengths.histogram.items()]),
        "## Generated, not trained",
        _generated_not_trained(outcomes),
        "## Checks",
        f"{len(cleared)} of {len(records)} shards passed every check ({', '.join(REQUIRED_VERDICTS)}: the "
        "row-level gates — loss-mask floor and concentration, DFlash anchors, vocabulary, thinking structure, "
        "degenerate and short answers, ids equal to the completions, length loss — and the Great Expectations "
        "suite). No row has a loss mask under the export's minimum."
        + ("\n\nFailed gates exported anyway by an operator:\n" + "\n".join(f"- {line}" for line in overridden))
        * bool(overridden)
        + (
            "\n\nMade from conversations edited after they were generated, accepted by an operator "
            f"(`accept_stale_conversations`): shards {stale_accepted}"
        )
        * bool(stale_accepted)
        + (
            "\n\nQuality-watch gates overridden while generating (a hold of the line released as a false alarm):\n"
            + "\n".join(f"- {line}" for line in watch_overrides)
        )
        * bool(watch_overrides),
        "## Loading",
        "```python\nfrom datasets import load_dataset\n\n"
        f'rows = load_dataset("parquet", data_files="{DATA_PATTERN}", split="train")\n'
        'rows = rows.select_columns(["input_ids", "loss_mask"])\n```',
    ]
    return "\n\n".join(sections) + "\n"
