"""Per-shard gates on `training_set`. All blocking: a failed gate stops `specforge_export` in the same run.

The row-level gates share one streaming pass over the shard (`training_set_gates`, one check per gate);
the Great Expectations suite is a check of its own (`gx_suite`). Each also records its verdict next to the
shard, so an export in a later run refuses a shard that failed (see dagster_project/training/export.py).
"""

# No `from __future__ import annotations` here: Dagster 1.13 cannot resolve a string-annotated Config parameter.
from collections.abc import Iterator
from typing import Any

import dagster as dg

from dagster_project.assets.training_set import training_set
from dagster_project.checks.gate_checks import GateConfig, check_result, reported
from dagster_project.generation.shards import completions_manifest
from dagster_project.partitions import ShardCheck, check_shards, shard_partitions
from dagster_project.resources import DatasetStore, TokenizerResource
from dagster_project.resources.config_fields import config_fields
from dagster_project.store import layout
from dagster_project.store.manifest import iter_parquet_batches
from dagster_project.store.storage import Store
from dagster_project.tokenizer import special_ids, tokenizer_profile
from dagster_project.training import gate_messages, gate_result, gate_sets, gates
from dagster_project.training.export import record_verdict
from dagster_project.training.lengths import KEEP, LengthGateOptions
from dagster_project.training.shards import TrainingShardManifest, iter_training_batches, training_manifest
from dagster_project.training.stage import source_is_current
from dagster_project.training.suite import (
    FRAME_COLUMNS,
    ShardFrame,
    SuiteOutcome,
    answer_ends,
    training_frame,
    validate_training_frames,
)
from dagster_project.training.tool_call_gate import ToolCallGateOptions

GATE_DESCRIPTIONS = {
    "loss_sum_floor": "Few rows under the supervised-token floor (default 32 = 2 × the DFlash block size).",
    "loss_sum_concentration": "No single loss_mask sum on a large share of rows (the '87% at 6' failure).",
    "consecutive_supervised": "Every row has two consecutive supervised tokens (a DFlash anchor).",
    "ids_in_vocabulary": "Every id lies inside the tokenizer's vocabulary.",
    "thinking_structure": "Finished answers close </think> once after non-blank reasoning (thinking on).",
    "degenerate_answers": "No answer text repeated across many distinct prompts.",
    "short_answers": "Few empty or very short visible answers.",
    "malformed_tool_calls": "Few malformed Qwen3.6 <tool_call> blocks among the tool calls the model wrote (not "
    "judged, and said so, for a model whose template writes calls in another form).",
    "ids_match_completions": "Rows are exactly the completions' prompt_ids + output_ids, mask 1 on the output.",
    "length_loss": "Few supervised tokens lost to max_length (cut, dropped, or cut by the trainer under 'keep').",
    "source_is_current": "Built from the completions shard now published; every event kept or excluded with a reason.",
}


class TrainingGateConfig(config_fields(ToolCallGateOptions, config_fields(LengthGateOptions, GateConfig))):
    """Thresholds of the training-set gates (see GateConfig), and of the length_loss and malformed_tool_calls
    gates."""


@dg.multi_asset_check(
    specs=[
        dg.AssetCheckSpec(name, asset=training_set, blocking=True, partitions_def=shard_partitions, description=text)
        for name, text in GATE_DESCRIPTIONS.items()
    ],
)
def training_set_gates(
    context: dg.AssetCheckExecutionContext,
    config: TrainingGateConfig,
    store: DatasetStore,
    tokenizer: TokenizerResource,
) -> Iterator[ShardCheck]:
    tok = tokenizer.load()
    yield from check_shards(context, store, lambda shard, data: _gates(context, config, tok, shard, data))


def _gates(
    context: dg.AssetCheckExecutionContext, config: TrainingGateConfig, tok: Any, shard: int, data: Store
) -> Iterator[dg.AssetCheckResult]:
    manifest = training_manifest(data, shard)
    special = special_ids(tok)
    profile = gates.profile_training_batches(
        iter_training_batches(data, shard, gates.TRAINING_GATE_COLUMNS), special, tok.decode
    )
    completion_batches = iter_parquet_batches(
        data, completions_manifest(data, shard), ["event_id", "prompt_ids", "output_ids"]
    )
    results = gate_sets.training_gates(
        profile,
        completion_batches,
        manifest.lengths,
        vocab_size=special.vocab_size,
        enable_thinking=manifest.source.settings.enable_thinking,
        thresholds=config.to_dataclass(gates.GateThresholds),
        tool_calls=config.to_dataclass(ToolCallGateOptions),
        tool_calls_known=tokenizer_profile(tok).tool_calls_known,
        length=config.to_dataclass(LengthGateOptions),
    )
    results.append(source_is_current(data, manifest))
    where = gate_messages.TRAINING_GATES
    results = [
        gate_messages.actionable(
            r,
            limits=config,
            where=where,
            examples=gate_messages.example_ids(r, profile, config),
            servers=gate_messages.writing_servers(r, profile, config),
        )
        for r in results
    ]
    record_verdict(data, manifest, "gates", {r.name: r.message for r in results if not r.passed})
    for result in results:
        if not result.passed:
            context.log.error(f"{layout.partition_key(shard)} {result.name}: {result.message}")
        yield check_result(training_set.key, result)


@dg.asset_check(asset=training_set, partitions_def=shard_partitions, blocking=True, name="gx_suite")
def training_set_gx_suite(context: dg.AssetCheckExecutionContext, store: DatasetStore) -> Iterator[ShardCheck]:
    """Great Expectations 1.x suite on the shard's rows: counts agree with the token lists, ids unique, ranges."""
    manifests: dict[int, TrainingShardManifest] = {}
    outcomes: dict[int, SuiteOutcome] = {}

    def evaluate(shard: int, data: Store) -> list[dg.AssetCheckResult]:
        if not outcomes:  # the first shard's evaluation validates every shard of the run at once
            manifests.update({s: training_manifest(data, s) for s in map(layout.shard_index, context.partition_keys)})
            outcomes.update(validate_training_frames([_shard_frame(data, m) for m in manifests.values()]))
        return [_gx_result(context, data, manifests[shard], outcomes[shard])]

    yield from check_shards(context, store, evaluate)


def _shard_frame(data: Store, manifest: TrainingShardManifest) -> ShardFrame:
    assembly = manifest.assembly
    return ShardFrame(
        shard=manifest.shard,
        frame=training_frame(iter_training_batches(data, manifest.shard, FRAME_COLUMNS), manifest.source.settings),
        rows=manifest.rows,
        max_length=None if assembly.length_policy == KEEP else assembly.max_length,
        finish_reasons=answer_ends(assembly.exclude_length_capped),
    )


def _gx_result(
    context: dg.AssetCheckExecutionContext, data: Store, manifest: TrainingShardManifest, outcome: SuiteOutcome
) -> dg.AssetCheckResult:
    verdict = gate_messages.actionable(
        gate_result.GateResult("gx_suite", outcome.success, outcome.message),
        limits=None,
        where=gate_messages.TRAINING_GATES,
    )
    record_verdict(data, manifest, "gx_suite", {} if outcome.success else {"gx_suite": verdict.message})
    result = dg.AssetCheckResult(
        passed=outcome.success,
        description=verdict.message,
        metadata={
            "message": verdict.message,
            "evaluated_expectations": outcome.evaluated,
            "successful_expectations": outcome.successful,
            "failed_expectations": dg.MetadataValue.json(outcome.failed),
            "results": dg.MetadataValue.json(outcome.results),
        },
    )
    return reported(context, "gx_suite", result, manifest.shard)
