"""Shard partitions: one Dagster partition per shard of conversations.

Dagster reads a partitions definition when the definitions load, so this one is static: its shard count is
`DFLASH_NUM_SHARDS` of the process that loads them. The same setting decides how many shards `conversations`
writes; every later stage takes the count from the conversations manifest (`published_num_shards`), and
`open_shard` refuses a shard run whose partitions disagree with it.
"""

import dagster as dg

from dagster_project import settings
from dagster_project.conversations.shards import published_num_shards
from dagster_project.resources import DatasetStore
from dagster_project.store import layout
from dagster_project.store.storage import Store

NUM_SHARDS = settings.num_shards()
shard_partitions = dg.StaticPartitionsDefinition(layout.partition_keys(NUM_SHARDS))


def open_shard(
    context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext, store: DatasetStore
) -> tuple[int, Store]:
    """The shard of this run's partition, and the opened store.

    Refuses a store whose conversations are sharded otherwise than these partitions: runs over them would
    leave shards out, or ask for shards that do not exist, without anything saying why.
    """
    data = store.open()
    published = published_num_shards(data)
    if published is not None and published != NUM_SHARDS:
        raise dg.Failure(
            f"the conversations in {data.url(layout.CONVERSATIONS)} have {published} shards, but these definitions "
            f"were loaded with {NUM_SHARDS} shard partitions: load them with DFLASH_NUM_SHARDS={published}, or "
            f"re-materialize conversations with DFLASH_NUM_SHARDS={NUM_SHARDS}"
        )
    return layout.shard_index(context.partition_key), data


# A shard's later stages follow its completions: when a shard is (re)generated, from a shard run, the UI's
# Materialize button on `completions` or a backfill, the automation sensor assembles and exports it in a run of
# its own, once the upstream's blocking gates passed. A shard run that does all three leaves nothing to do.
FOLLOWS_ITS_SHARD = dg.AutomationCondition.eager() & dg.AutomationCondition.all_deps_blocking_checks_passed()
