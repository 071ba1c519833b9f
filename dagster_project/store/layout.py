"""Where things live in the store and how shards are named.

Partition keys are `shard-00042`; the store prefix of that shard is `<stage>/shard=00042/`.
"""

from __future__ import annotations

import shlex

SHARD_DIGITS = 5
MANIFEST_NAME = "_manifest.json"

RAW_PROMPTS = "raw_prompts"
CONVERSATIONS = "conversations"
PILOT = "pilot"  # the pilot before the job: its records (`pilot/<fingerprint>.json`), and its asset
COMPLETIONS = "completions"
TRAINING_SET = "training_set"
EXPORTS = "exports"
PROGRESS = "progress"
LEASES = "leases"
HOLDS = "holds"
WATCH = PROGRESS + "/watch"


def partition_key(shard: int) -> str:
    return f"shard-{shard:0{SHARD_DIGITS}d}"


def shard_index(partition_key_: str) -> int:
    prefix, _, number = partition_key_.partition("-")
    if prefix != "shard" or not number.isdigit():
        raise ValueError(f"not a shard partition key: {partition_key_!r} (expected e.g. 'shard-00042')")
    return int(number)


def partition_keys(num_shards: int) -> list[str]:
    return [partition_key(i) for i in range(num_shards)]


# The assets a shard's stage feeds, which follow it when it is made again. A space after each comma (Dagster strips
# it; the command quotes the list): a line can break there, where the list as one 51-character word widened the
# operator's page past a 1,440 px window while the line was held (its alerts name these commands).
REGENERATED_WITH = {
    COMPLETIONS: "completions, training_set, specforge_export, hf_export",
    TRAINING_SET: "training_set, specforge_export, hf_export",
}


def regenerate_command(stage: str, shard: int) -> str:
    """The command that withdraws a published shard of `stage` and publishes it again, with what follows from it
    (conversations are built for every shard at once). Completions come back from the shard's journal: nothing
    answered is requested again."""
    select = "conversations" if stage == CONVERSATIONS else REGENERATED_WITH.get(stage, stage)
    command = f"dagster asset materialize -m dagster_project.definitions --select {shlex.quote(select)}"
    return command if stage == CONVERSATIONS else f"{command} --partition {partition_key(shard)}"


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


def hold_key() -> str:
    """The line's hold while one is in force (`generation.line_hold`): every shard run stops admitting."""
    return f"{HOLDS}/active.json"


def hold_log_key() -> str:
    return f"{HOLDS}/released.json"


def dropped_key(shard: int) -> str:
    """What releases of the line's holds dropped from the shard's journal (`line_stop.DroppedAtRelease`)."""
    return f"{PROGRESS}/dropped/shard={shard:0{SHARD_DIGITS}d}.json"


def unrecorded_prefix(shard: int, fingerprint: str) -> str:
    """What the shard's runs under these settings generated that is in no record (`generation.unrecorded`): one
    object per run, `<writer>.json`, so that a run stopped before it published (a hold, a failure) keeps its count."""
    return f"{PROGRESS}/unrecorded/shard={shard:0{SHARD_DIGITS}d}/{fingerprint}/"


def watch_key(shard: int) -> str:
    """A running shard's quality watch: its answers' figures so far, next to its heartbeat."""
    return f"{WATCH}/shard={shard:0{SHARD_DIGITS}d}.json"
