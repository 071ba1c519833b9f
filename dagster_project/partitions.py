"""Shard partitions: one Dagster partition per shard of conversations (DESIGN §4).

The shard count is a setting (`DFLASH_NUM_SHARDS`), fixed when definitions load and recorded in the
conversations manifest; the completions asset refuses to run against conversations sharded differently.
"""

import dagster as dg

from dagster_project import settings
from dagster_project.store import layout

shard_partitions = dg.StaticPartitionsDefinition(layout.partition_keys(settings.num_shards()))
