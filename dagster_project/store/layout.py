"""Where things live in the store and how shards are named.

Partition keys are `shard-00042`; the store prefix of that shard is `<stage>/shard=00042/`.
"""

from __future__ import annotations

SHARD_DIGITS = 5
MANIFEST_NAME = "_manifest.json"

RAW_PROMPTS = "raw_prompts"
CONVERSATIONS = "conversations"
COMPLETIONS = "completions"
TRAINING_SET = "training_set"
EXPORTS = "exports"
PROGRESS = "progress"
LEASES = "leases"


def partition_key(shard: int) -> str:
    return f"shard-{shard:0{SHARD_DIGITS}d}"


def shard_index(partition_key_: str) -> int:
    prefix, _, number = partition_key_.partition("-")
    if prefix != "shard" or not number.isdigit():
        raise ValueError(f"not a shard partition key: {partition_key_!r} (expected e.g. 'shard-00042')")
    return int(number)


def partition_keys(num_shards: int) -> list[str]:
    return [partition_key(i) for i in range(num_shards)]


def shard_prefix(stage: str, shard: int) -> str:
    return f"{stage}/shard={shard:0{SHARD_DIGITS}d}/"


def shard_manifest_key(stage: str, shard: int) -> str:
    return shard_prefix(stage, shard) + MANIFEST_NAME


def stage_manifest_key(stage: str) -> str:
    return f"{stage}/{MANIFEST_NAME}"


def progress_key(shard: int) -> str:
    return f"{PROGRESS}/shard={shard:0{SHARD_DIGITS}d}.json"


def lease_key(stage: str, shard: int) -> str:
    return f"{LEASES}/{stage}/shard={shard:0{SHARD_DIGITS}d}.json"
