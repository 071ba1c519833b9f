"""Per-shard gates on completions. Blocking ones stop `training_set` of that shard in the same run."""

import dagster as dg

from dagster_project import layout
from dagster_project.assets.completions import completions
from dagster_project.completions_io import completions_manifest, iter_completion_batches, shard_coverage
from dagster_project.manifest import verify_shard
from dagster_project.partitions import shard_partitions
from dagster_project.resources import DatasetStore

SPEC_ACCEPT_LENGTH_FLOOR = 1.5


@dg.asset_check(asset=completions, partitions_def=shard_partitions, blocking=True)
def completions_exactly_once(context: dg.AssetCheckExecutionContext, store: DatasetStore) -> dg.AssetCheckResult:
    """Every planned generation event of the shard has exactly one record: a result or an explicit error."""
    coverage = shard_coverage(store.open(), layout.shard_index(context.partition_key))
    return dg.AssetCheckResult(
        passed=coverage.exact,
        description=coverage.describe(),
        metadata={
            "expected_events": coverage.expected,
            "records": coverage.present,
            "missing": len(coverage.missing),
            "duplicated": len(coverage.duplicated),
            "unexpected": len(coverage.unexpected),
            "missing_sample": dg.MetadataValue.json(coverage.missing[:20]),
        },
    )


@dg.asset_check(asset=completions, partitions_def=shard_partitions, blocking=True)
def completions_published(context: dg.AssetCheckExecutionContext, store: DatasetStore) -> dg.AssetCheckResult:
    """The shard's manifest exists and every object it lists is in the store with its size and checksum."""
    data = store.open()
    manifest = completions_manifest(data, layout.shard_index(context.partition_key))
    problems = verify_shard(data, manifest)
    return dg.AssetCheckResult(
        passed=not problems,
        description="; ".join(problems) or "manifest and objects agree",
        metadata={
            "objects": len(manifest["objects"]),
            "bytes": sum(o["size"] for o in manifest["objects"]),
            "problems": dg.MetadataValue.json(problems),
            "uri": dg.MetadataValue.path(data.url(layout.shard_manifest_key(layout.COMPLETIONS, manifest["shard"]))),
        },
    )


@dg.asset_check(asset=completions, partitions_def=shard_partitions)
def completions_spec_decoding(context: dg.AssetCheckExecutionContext, store: DatasetStore) -> dg.AssetCheckResult:
    """MTP is on and pays off: accept length (completion tokens / verify passes) above a floor.

    A warning, not a gate: speculation changes speed, not the data.
    """
    tokens = verify = without_stats = 0
    shard = layout.shard_index(context.partition_key)
    for batch in iter_completion_batches(store.open(), shard, columns=["status", "completion_tokens", "spec_verify_ct"]):
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
            f"accept length {accept_length:.2f}" if accept_length else "no request reported spec-decoding stats: MTP is off"
        )
        + ("" if passed else f" (floor {SPEC_ACCEPT_LENGTH_FLOOR})"),
        metadata={
            "accept_length": accept_length or 0.0,
            "floor": SPEC_ACCEPT_LENGTH_FLOOR,
            "verify_passes": verify,
            "requests_without_spec_stats": without_stats,
        },
    )
