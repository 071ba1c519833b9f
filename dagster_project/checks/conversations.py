"""Checks on the `conversations` asset: quarantine rate, duplicate ids, turn markers, multi-turn counts, the GX suite.

Each reads what is published in the store (manifests and shards), not what the asset meant to write. Each
blocking check records its verdict on every conversations shard of the build it judged (`store.verdicts`), so a
`completions` run started later refuses a shard of gated conversations unless `override_failed_gates` is set;
a failure is also logged as an error, so the terminal says why.
"""

# No `from __future__ import annotations`: Dagster 1.13 resolves resource parameters from real annotations.
import dagster as dg

from dagster_project.assets.conversations import conversations
from dagster_project.assets.tables import counts_table
from dagster_project.checks.gate_checks import reported
from dagster_project.conversations.markers import marker_mismatch
from dagster_project.conversations.shards import (
    ConversationsManifest,
    ConversationsShardManifest,
    PolicyCounts,
    quarantine_verdict,
    read_all_conversations,
    read_conversations_manifest,
    record_stage_verdict,
    scan_shards,
)
from dagster_project.resources import DatasetStore, TokenizerResource
from dagster_project.store import layout
from dagster_project.store.storage import Store


def _stage_manifest(store: Store) -> ConversationsManifest:
    manifest = read_conversations_manifest(store)
    if manifest is None:
        raise dg.Failure(
            f"no {store.url(layout.stage_manifest_key(layout.CONVERSATIONS))}: the conversations stage is not published"
        )
    return manifest


def _judged(
    context: dg.AssetCheckExecutionContext,
    store: Store,
    manifest: ConversationsManifest,
    check: str,
    result,
    judged: list[ConversationsShardManifest] | None = None,
) -> dg.AssetCheckResult:
    """Record the blocking check's verdict on the build's shards (`judged`: the manifests of the shards it read, if
    it read them), log a failure, return the result."""
    record_stage_verdict(store, manifest, check, {} if result.passed else {check: result.description}, judged)
    return reported(context, f"conversations_{check}", result)


@dg.asset_check(
    asset=conversations,
    blocking=True,
    description="Quarantined rows (both stages), exact duplicates left out, stay below the run's "
    "quarantine_rate_max; exact duplicates stay below their own duplicate_rate_max; every input row is accounted for.",
)
def conversations_quarantine_rate(context: dg.AssetCheckExecutionContext, store: DatasetStore) -> dg.AssetCheckResult:
    data = store.open()
    manifest = _stage_manifest(data)
    passed, description = quarantine_verdict(manifest)
    result = dg.AssetCheckResult(
        passed=passed,
        description=description,
        metadata={
            "input_rows": manifest.input_rows,
            "conversations": manifest.rows,
            "quarantined": manifest.quarantined,
            "quarantine_rate": dg.MetadataValue.float(manifest.quarantine_rate),
            "quarantine_rate_max": dg.MetadataValue.float(manifest.quarantine_rate_max),
            "duplicates": manifest.duplicates,
            "duplicate_rate": dg.MetadataValue.float(manifest.duplicate_rate),
            "duplicate_rate_max": dg.MetadataValue.float(manifest.duplicate_rate_max),
            "duplicates_by_source": dg.MetadataValue.json(
                {name: totals.duplicates for name, totals in manifest.by_source.items() if totals.duplicates}
            ),
            "by_reason": dg.MetadataValue.md(counts_table("reason", manifest.quarantined_by_reason)),
            "by_stage": dg.MetadataValue.json(manifest.quarantined_by_stage),
            "by_source": dg.MetadataValue.md(counts_table("source", manifest.by_source)),
            "renamed_ids": manifest.renamed_ids,
        },
    )
    return _judged(context, data, manifest, "quarantine_rate", result)


@dg.asset_check(
    asset=conversations,
    blocking=True,
    description="Every published conversation id is unique, in the shard its id hashes to, "
    "and every shard matches its manifest.",
)
def conversations_unique_ids(context: dg.AssetCheckExecutionContext, store: DatasetStore) -> dg.AssetCheckResult:
    data = store.open()
    manifest = _stage_manifest(data)
    scan = scan_shards(data, manifest)
    problems = {
        "duplicate_ids": scan.duplicate_ids,
        "misplaced_ids": scan.misplaced_ids,
        "missing_shards": scan.missing_shards,
        "shards_from_another_build": scan.other_build_shards,
        "shards_whose_ids_differ_from_manifest": scan.digest_mismatches,
    }
    found = {name: values for name, values in problems.items() if values}
    if scan.rows != manifest.rows:
        found["row_count"] = [f"{scan.rows} in shards, {manifest.rows} in the manifest"]
    result = dg.AssetCheckResult(
        passed=not found,
        description="; ".join(f"{name}: {values[:5]}" for name, values in found.items()) or f"{scan.rows} unique ids",
        metadata={
            "conversations": scan.rows,
            "num_shards": manifest.num_shards,
            "renamed_ids": manifest.renamed_ids,
            **{name: len(values) for name, values in problems.items()},
            "examples": dg.MetadataValue.json({name: values[:20] for name, values in found.items()}),
        },
    )
    return _judged(context, data, manifest, "unique_ids", result, scan.manifests)


@dg.asset_check(
    asset=conversations,
    blocking=True,
    description="Every conversation's last prompt, rendered by the chat template, holds exactly the control tokens "
    "the template writes (the model's own: Qwen3.6's <|im_start|>/<|im_end|>, DeepSeek's <｜User｜>, ...), none from "
    "its content: no text forges a turn.",
)
def conversations_turn_markers(
    context: dg.AssetCheckExecutionContext, store: DatasetStore, tokenizer: TokenizerResource
) -> dg.AssetCheckResult:
    data = store.open()
    manifest = _stage_manifest(data)
    flags = {"enable_thinking": manifest.enable_thinking, "preserve_thinking": manifest.preserve_thinking}
    loaded = tokenizer.load()
    checked, mismatches, judged = 0, {}, []
    for contents in read_all_conversations(data, manifest.num_shards):
        judged.append(contents.manifest)
        for conversation in contents.conversations:
            checked += 1
            problem = marker_mismatch(loaded, conversation, **flags)
            if problem is not None:
                mismatches[conversation.id] = problem
    examples = dict(list(mismatches.items())[:5])
    result = dg.AssetCheckResult(
        passed=not mismatches,
        description=(
            f"{len(mismatches)} of {checked} prompts have other control tokens than their turns: {examples}"
            if mismatches
            else f"{checked} prompts, each with exactly its turns' markers"
        ),
        metadata={"prompts": checked, "mismatches": len(mismatches), "examples": dg.MetadataValue.json(examples)},
    )
    return _judged(context, data, manifest, "turn_markers", result, judged)


@dg.asset_check(
    asset=conversations,
    description="Multi-turn conversations and generated turns by policy, recounted from the shards, "
    "match the manifest.",
)
def conversations_multi_turn_counts(store: DatasetStore) -> dg.AssetCheckResult:
    data = store.open()
    manifest = _stage_manifest(data)
    counted = scan_shards(data, manifest).by_policy
    expected = {policy: counts for policy, counts in manifest.by_policy.items() if counts.conversations}
    totals = PolicyCounts(
        conversations=sum(c.conversations for c in counted.values()),
        multi_turn=sum(c.multi_turn for c in counted.values()),
        turns=sum(c.turns for c in counted.values()),
    )
    return dg.AssetCheckResult(
        passed=counted == expected,
        description=(
            f"{totals.multi_turn} multi-turn of {totals.conversations} conversations, {totals.turns} turns to generate"
            if counted == expected
            else f"shards hold {counted}, the manifest says {expected}"
        ),
        metadata={
            "policy": manifest.policy,
            "history": manifest.history,
            "conversations": totals.conversations,
            "multi_turn": totals.multi_turn,
            "multi_turn_rate": dg.MetadataValue.float(
                totals.multi_turn / totals.conversations if totals.conversations else 0.0
            ),
            "turns": totals.turns,
            "turns_per_conversation": dg.MetadataValue.float(
                totals.turns / totals.conversations if totals.conversations else 0.0
            ),
            "by_policy": dg.MetadataValue.md(counts_table("policy", counted)),
        },
    )


@dg.asset_check(
    asset=conversations,
    blocking=True,
    description="Great Expectations 1.x suites on the published conversations: roles, non-empty content, "
    "unique ids, turn structure.",
)
def conversations_gx_suite(context: dg.AssetCheckExecutionContext, store: DatasetStore) -> dg.AssetCheckResult:
    from dagster_project.conversations.suite import ConversationSuites, shard_chunks

    data = store.open()
    manifest = _stage_manifest(data)
    summary = ConversationSuites().validate(shard_chunks(data, manifest.num_shards), manifest.num_shards)
    failed = summary.failed()
    result = dg.AssetCheckResult(
        passed=summary.success,
        description=(
            f"{len(summary.outcomes)} expectations passed"
            if not failed
            else "failed: " + ", ".join(f"{o.suite}.{o.expectation}({o.columns}) x{o.unexpected}" for o in failed)
        ),
        metadata={
            "expectations": len(summary.outcomes),
            "failed_expectations": len(failed),
            "chunks": summary.chunks,
            "rows_validated": dg.MetadataValue.json(summary.rows),
            "summary": dg.MetadataValue.md(summary.markdown()),
        },
    )
    return _judged(context, data, manifest, "gx_suite", result)
