"""Per-shard gates on completions. Blocking ones stop `training_set` of that shard in the same run, and each
records its verdict next to the shard (`store.verdicts`), so `training_set` refuses a failed shard in any later
run too (unless its config overrides the failed gates).
"""

from collections.abc import Iterator
from typing import Any

import dagster as dg

from dagster_project.assets.completions import completions
from dagster_project.checks.gate_checks import GateConfig, check_result, reported
from dagster_project.generation.shards import completions_manifest, iter_completion_batches, shard_coverage
from dagster_project.partitions import ShardCheck, check_shards, shard_partitions
from dagster_project.resources import DatasetStore, TokenizerResource
from dagster_project.resources.config_fields import config_fields
from dagster_project.store import layout
from dagster_project.store.manifest import verify_shard
from dagster_project.store.storage import Store
from dagster_project.store.verdicts import record_verdict
from dagster_project.tokenizer import special_ids
from dagster_project.training import gate_messages, gate_result, gate_sets, gates
from dagster_project.training.gate_sets import SPEC_ACCEPT_LENGTH_FLOOR

QUALITY_DESCRIPTIONS = {
    "error_rate": "Few generation events ended in an error (each is recorded with its reason, never as an answer).",
    "length_capped_rate": "Few answers hit max_new_tokens (they are unfinished, and excluded from training).",
    "thinking_structure": "Finished answers close </think> once after non-blank reasoning (thinking on).",
    "degenerate_answers": "No answer text repeated across many distinct prompts.",
    "short_answers": "Few empty or very short visible answers.",
    "ids_in_vocabulary": "Every prompt and output id lies inside the tokenizer's vocabulary.",
}


class CompletionsGateConfig(config_fields(gate_sets.CompletionShareLimits, GateConfig)):
    """Thresholds of the answer gates (see GateConfig) plus the completions' own (error and length-capped shares)."""


@dg.asset_check(asset=completions, partitions_def=shard_partitions, blocking=True)
def completions_exactly_once(context: dg.AssetCheckExecutionContext, store: DatasetStore) -> Iterator[ShardCheck]:
    """Every planned generation event of the shard has exactly one record: a result or an explicit error."""
    yield from check_shards(context, store, lambda shard, data: [_exactly_once(context, shard, data)])


def _exactly_once(context: dg.AssetCheckExecutionContext, shard: int, data: Store) -> dg.AssetCheckResult:
    manifest = completions_manifest(data, shard)
    coverage = shard_coverage(data, shard)
    verdict = gate_messages.actionable(
        gate_result.GateResult("exactly_once", coverage.exact, coverage.describe()),
        limits=None,
        where=gate_messages.COMPLETIONS_GATES,
        examples=[*coverage.missing, *coverage.duplicated, *coverage.unexpected],
    )
    record_verdict(data, manifest, "exactly_once", {} if coverage.exact else {"exactly_once": verdict.message})
    result = dg.AssetCheckResult(
        passed=coverage.exact,
        description=verdict.message,
        metadata={
            "expected_events": coverage.expected,
            "records": coverage.present,
            "missing": len(coverage.missing),
            "duplicated": len(coverage.duplicated),
            "unexpected": len(coverage.unexpected),
            "missing_sample": dg.MetadataValue.json(coverage.missing[:20]),
        },
    )
    return reported(context, "completions_exactly_once", result, shard)


@dg.asset_check(asset=completions, partitions_def=shard_partitions, blocking=True)
def completions_published(context: dg.AssetCheckExecutionContext, store: DatasetStore) -> Iterator[ShardCheck]:
    """The shard's manifest exists and every object it lists is in the store with its size and checksum."""
    yield from check_shards(context, store, lambda shard, data: [_published(context, shard, data)])


def _published(context: dg.AssetCheckExecutionContext, shard: int, data: Store) -> dg.AssetCheckResult:
    manifest = completions_manifest(data, shard)
    problems = verify_shard(data, manifest)
    verdict = gate_messages.actionable(
        gate_result.GateResult("published", not problems, "; ".join(problems) or "manifest and objects agree"),
        limits=None,
        where=gate_messages.COMPLETIONS_GATES,
    )
    record_verdict(data, manifest, "published", {"published": verdict.message} if problems else {})
    result = dg.AssetCheckResult(
        passed=not problems,
        description=verdict.message,
        metadata={
            "objects": len(manifest.objects),
            "bytes": manifest.stored_bytes,
            "problems": dg.MetadataValue.json(problems),
            "uri": dg.MetadataValue.path(data.url(layout.shard_manifest_key(layout.COMPLETIONS, manifest.shard))),
        },
    )
    return reported(context, "completions_published", result, shard)


@dg.asset_check(asset=completions, partitions_def=shard_partitions)
def completions_spec_decoding(context: dg.AssetCheckExecutionContext, store: DatasetStore) -> Iterator[ShardCheck]:
    """MTP is on and pays off: accept length (completion tokens / verify passes) above a floor.

    A warning, not a gate: speculation changes speed, not the data.
    """
    yield from check_shards(context, store, lambda shard, data: [_spec_decoding(shard, data)])


def _spec_decoding(shard: int, data: Store) -> dg.AssetCheckResult:
    tokens = verify = without_stats = 0
    for batch in iter_completion_batches(data, shard, columns=["status", "completion_tokens", "spec_verify_ct"]):
        for status, completion, passes in zip(*(batch.column(i).to_pylist() for i in range(3))):
            if status != "ok":
                continue
            if passes:
                tokens += completion
                verify += passes
            else:
                without_stats += 1
    accept_length = tokens / verify if verify else None
    passed = accept_length is not None and accept_length >= SPEC_ACCEPT_LENGTH_FLOOR
    return dg.AssetCheckResult(
        passed=passed,
        severity=dg.AssetCheckSeverity.WARN,
        description=(
            f"accept length {accept_length:.2f}"
            if accept_length
            else "no request reported spec-decoding stats: MTP is off"
        )
        + ("" if passed else f" (floor {SPEC_ACCEPT_LENGTH_FLOOR})"),
        metadata={
            "accept_length": accept_length or 0.0,
            "floor": SPEC_ACCEPT_LENGTH_FLOOR,
            "verify_passes": verify,
            "requests_without_spec_stats": without_stats,
        },
    )


@dg.multi_asset_check(
    specs=[
        dg.AssetCheckSpec(name, asset=completions, blocking=True, partitions_def=shard_partitions, description=text)
        for name, text in QUALITY_DESCRIPTIONS.items()
    ],
)
def completions_quality(
    context: dg.AssetCheckExecutionContext,
    config: CompletionsGateConfig,
    store: DatasetStore,
    tokenizer: TokenizerResource,
) -> Iterator[ShardCheck]:
    """What the model answered, judged before a training row exists: errors, length caps, thinking, degeneracy."""
    tok = tokenizer.load()
    yield from check_shards(context, store, lambda shard, data: _quality(context, config, tok, shard, data))


def _quality(
    context: dg.AssetCheckExecutionContext, config: CompletionsGateConfig, tok: Any, shard: int, data: Store
) -> Iterator[dg.AssetCheckResult]:
    manifest = completions_manifest(data, shard)
    special = special_ids(tok)
    run = manifest.generation
    profile = gates.profile_completion_batches(
        iter_completion_batches(data, shard, gates.COMPLETION_GATE_COLUMNS), special, tok.decode
    )
    counts = gate_sets.EventCounts(
        rows=manifest.rows,
        errors=manifest.errors,
        errors_by_kind=run.errors_by_kind,
        length_capped=run.length_capped,
        max_new_tokens=manifest.settings.max_new_tokens,
    )
    results = gate_sets.completions_gates(
        counts,
        profile,
        vocab_size=special.vocab_size,
        enable_thinking=manifest.settings.enable_thinking,
        thresholds=config.to_dataclass(gates.GateThresholds),
        limits=config.to_dataclass(),
    )
    results = [
        gate_messages.actionable(
            r,
            limits=config,
            where=gate_messages.COMPLETIONS_GATES,
            examples=gate_messages.example_ids(r, profile, config),
            servers=gate_messages.writing_servers(r, profile, config),
        )
        for r in results
    ]
    record_verdict(data, manifest, "quality", {r.name: r.message for r in results if not r.passed})
    for result in results:
        if not result.passed:
            context.log.error(f"{layout.partition_key(shard)} {result.name}: {result.message}")
        yield check_result(completions.key, result)
