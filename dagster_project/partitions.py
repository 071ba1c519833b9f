"""Shard partitions: one Dagster partition per shard of conversations, and runs that cover several of them.

Dagster reads a partitions definition when the definitions load, so this one is static: its shard count is
`DFLASH_NUM_SHARDS` of the process that loads them. The same setting decides how many shards `conversations`
writes; every later stage takes the count from the conversations manifest (`published_num_shards`), and
`open_store` refuses a shard run whose partitions disagree with it.

A backfill of the shard assets launches one run per `DFLASH_SHARDS_PER_RUN` shards (`SHARD_BACKFILL_POLICY`):
a run's fixed cost (process, imports, tokenizer, instance events) is paid once per range instead of once per
shard. Each shard of the range keeps its own store prefix, manifest, lease and heartbeat, and gets its own
materialization and check evaluations: `materialize_shards` and `check_shards` below. A run of one shard
(`dagster asset materialize --partition`, the UI) works as before.
"""

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import dagster as dg

# The one type Dagster gives for "this evaluation judged that materialization"; dagster does not export it at top level.
from dagster._core.definitions.asset_checks.asset_check_evaluation import (
    AssetCheckEvaluationTargetMaterializationData,
)

from dagster_project import settings
from dagster_project.conversations.shards import ConversationsChanged, published_num_shards
from dagster_project.generation.overlap import overlapped
from dagster_project.generation.stage import ConversationsGated, ConversationsNotReady
from dagster_project.resources import DatasetStore
from dagster_project.store import layout
from dagster_project.store.storage import Store
from dagster_project.tokenizer import TokenizerMismatch
from dagster_project.training.export import LossMaskTooSmall, ShardNotCleared
from dagster_project.training.shards import TrainingShardNotPublished
from dagster_project.training.stage import CompletionsGated, CompletionsNotPublished

NUM_SHARDS = settings.num_shards()
shard_partitions = dg.StaticPartitionsDefinition(layout.partition_keys(NUM_SHARDS))
SHARDS_PER_RUN = settings.shards_per_run()
SHARD_BACKFILL_POLICY = dg.BackfillPolicy.multi_run(max_partitions_per_run=SHARDS_PER_RUN)
# A shard's stage refusing to run, its message naming the cause and the fix (an earlier stage to materialize, a
# gate to clear or override): the step fails with that line (`dg.Failure`), not a traceback through the stage's code.
REFUSALS = (
    ConversationsNotReady,
    ConversationsGated,
    CompletionsNotPublished,
    CompletionsGated,
    TrainingShardNotPublished,
    ShardNotCleared,
    LossMaskTooSmall,
    TokenizerMismatch,
    ConversationsChanged,
)


def open_store(store: DatasetStore) -> Store:
    """The opened store, refused if its conversations are sharded otherwise than these partitions: runs over
    them would leave shards out, or ask for shards that do not exist, without anything saying why."""
    data = store.open()
    published = published_num_shards(data)
    if published is not None and published != NUM_SHARDS:
        raise dg.Failure(
            f"the conversations in {data.url(layout.CONVERSATIONS)} have {published} shards, but these definitions "
            f"were loaded with {NUM_SHARDS} shard partitions: load them with DFLASH_NUM_SHARDS={published}, or "
            f"re-materialize conversations with DFLASH_NUM_SHARDS={NUM_SHARDS}"
        )
    return data


def unknown_partition_message(argv: Sequence[str], keys: Sequence[str]) -> str | None:
    """What to tell `dagster asset materialize --partition KEY` (or `--partition-range A...B`) when KEY is not one of
    these shard partitions `keys`; None for any other command line. Dagster's CLI checks the key only after loading
    the definitions, and answers an unknown one with a traceback naming no valid key: the definitions say it in a
    line when they load in that command (`refuse_unknown_partition`)."""
    program = Path(argv[0]) if argv else Path()
    is_dagster = program.name == "dagster" or (program.name == "__main__.py" and program.parent.name == "dagster")
    if not is_dagster or list(argv[1:3]) != ["asset", "materialize"]:
        return None
    asked: list[str] = []
    for index, arg in enumerate(argv):
        flag, _, value = arg.partition("=")
        if flag in ("--partition", "--partition-range"):
            value = value or (argv[index + 1] if index + 1 < len(argv) else "")
            asked += value.split("...") if flag == "--partition-range" else [value]
    unknown = [key for key in asked if key not in set(keys)]
    if not unknown or not keys:
        return None
    return (
        f"dagster asset materialize: {unknown[0]!r} is not a shard partition: these definitions have "
        f"{len(keys)} shards, {keys[0]} … {keys[-1]} (DFLASH_NUM_SHARDS={len(keys)} when they loaded). Pick one of "
        "those, or load the definitions with the shard count the conversations were built with (DFLASH_NUM_SHARDS; "
        "`dflash status` shows it)"
    )


def refuse_unknown_partition(argv: Sequence[str] | None = None) -> None:
    """Stop `dagster asset materialize` asking for a shard these partitions lack, with one line (see
    `unknown_partition_message`), before Dagster's traceback. `argv`: this process's command line by default."""
    message = unknown_partition_message(sys.argv if argv is None else argv, shard_partitions.get_partition_keys())
    if message is not None:
        raise SystemExit(message)


@dataclass(frozen=True)
class ShardMaterialized:
    """What one shard of a run reports: its materialization's metadata, and its content's data version."""

    metadata: dict[str, object] = field(default_factory=dict)
    data_version: str | None = None


def materialize_shards(
    context: dg.AssetExecutionContext,
    store: DatasetStore,
    materialize: Callable[[int, Store], ShardMaterialized],
    at_once: int = 1,
) -> Iterator[dg.MaterializeResult | dg.AssetMaterialization]:
    """Materialize each shard of the run's partitions, `at_once` at a time (`generation.overlap`); one
    materialization per shard, with its metadata.

    A shard that fails stops the run (no further shard starts); the shards done beside or before it are still
    recorded as materialized (their data is published), so a retry of the range redoes only the rest in
    Dagster's view.
    """
    data = open_store(store)
    keys = list(context.partition_keys)
    done, error = overlapped(keys, lambda key: materialize(layout.shard_index(key), data), at_once)
    if error is not None:
        for key, shard in done:
            yield dg.AssetMaterialization(asset_key=context.asset_key, partition=key, metadata=shard.metadata)
        if isinstance(error, REFUSALS):
            raise dg.Failure(description=str(error)) from None
        raise error
    for key, shard in done:
        context.add_asset_metadata(shard.metadata, partition_key=key)
    # One output stands for every shard of the range and carries one data version: only a run of one shard can
    # give its content's (downstream shards then go stale in the UI exactly when it changes); a range's shards
    # take Dagster's own version (the run's).
    version = done[0][1].data_version if len(done) == 1 else None
    yield dg.MaterializeResult(data_version=dg.DataVersion(version) if version else None)


# What a check of shards yields: its results (a run of one shard), or each shard's evaluation and then the
# check's outputs (a range run).
ShardCheck = dg.AssetCheckResult | dg.AssetCheckEvaluation | dg.Output


def check_shards(
    context: dg.AssetCheckExecutionContext,
    store: DatasetStore,
    evaluate: Callable[[int, Store], Iterable[dg.AssetCheckResult]],
) -> Iterator[ShardCheck]:
    """Run a check on each shard of the run's partitions; one evaluation per shard and check.

    Dagster stores an `AssetCheckResult` of a range run without a partition (even a range of one), which would
    leave every shard's check unevaluated in the UI and to `all_deps_blocking_checks_passed`. In a range run each
    result becomes an evaluation of its own shard instead, and the check's outputs are given once at the end.
    A failed blocking evaluation fails the step as a result would: downstream steps of the run do not start.
    """
    data = open_store(store)
    if not context.has_partition_key_range:
        yield from evaluate(layout.shard_index(context.partition_key), data)
        return
    specs = {spec.name: spec for spec in context.check_specs}
    targets = _latest_materializations(context, context.partition_keys)
    for key in context.partition_keys:
        target = targets.get(key)
        for result in evaluate(layout.shard_index(key), data):
            spec = specs[result.check_name] if result.check_name else next(iter(specs.values()))
            yield dg.AssetCheckEvaluation(
                asset_key=spec.asset_key,
                check_name=spec.name,
                passed=result.passed,
                metadata=result.metadata,
                target_materialization_data=target,
                severity=result.severity,
                description=result.description,
                blocking=spec.blocking,
                partition=key,
            )
    for output in context.op_def.output_defs:
        yield dg.Output(None, output_name=output.name)


def _latest_materializations(
    context: dg.AssetCheckExecutionContext, keys: Sequence[str]
) -> dict[str, AssetCheckEvaluationTargetMaterializationData]:
    """Each shard's materialization a check of it judges (the UI shows an evaluation against it as current): two
    instance queries for the range, not one per shard and check step."""
    (asset_key,) = {spec.asset_key for spec in context.check_specs}
    latest = context.instance.get_latest_storage_id_by_partition(
        asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION, set(keys)
    )
    if not latest:
        return {}
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=asset_key, storage_ids=list(latest.values())), limit=len(latest)
    ).records
    return {
        record.partition_key: AssetCheckEvaluationTargetMaterializationData(
            storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp
        )
        for record in records
        if record.partition_key is not None
    }


# A shard's later stages follow its completions: when a shard is (re)generated, from a shard run, the UI's
# Materialize button on `completions` or a backfill, the automation sensor assembles and exports it in a run of
# its own, once the upstream's blocking gates passed. A shard run that does all three leaves nothing to do.
FOLLOWS_ITS_SHARD = dg.AutomationCondition.eager() & dg.AutomationCondition.all_deps_blocking_checks_passed()
