"""Reading a published completions shard, and the coverage rule that ties it to its conversations."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from dagster_project.conversations.shards import read_conversations
from dagster_project.store.layout import COMPLETIONS
from dagster_project.store.manifest import data_keys, iter_parquet_batches, read_shard_manifest
from dagster_project.store.storage import Store


class ShardNotPublished(RuntimeError):
    pass


def completions_manifest(store: Store, shard: int) -> dict:
    manifest = read_shard_manifest(store, COMPLETIONS, shard)
    if manifest is None:
        raise ShardNotPublished(f"completions shard {shard} has no manifest: it is not published")
    return manifest


def iter_completion_batches(store: Store, shard: int, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Stream a published shard's rows, one Parquet row group at a time (memory bounded by a row group)."""
    return iter_parquet_batches(store, data_keys(completions_manifest(store, shard)), columns)


@dataclass
class Coverage:
    expected: int
    present: int
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicated: dict[str, int] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return not (self.missing or self.unexpected or self.duplicated)

    def describe(self) -> str:
        if self.exact:
            return f"every planned event ({self.expected}) has exactly one record"
        parts = []
        if self.missing:
            parts.append(f"{len(self.missing)} planned events have no record (e.g. {self.missing[:3]})")
        if self.duplicated:
            parts.append(f"{len(self.duplicated)} events have several records (e.g. {list(self.duplicated)[:3]})")
        if self.unexpected:
            parts.append(f"{len(self.unexpected)} records belong to no planned event (e.g. {self.unexpected[:3]})")
        return "; ".join(parts)


def shard_coverage(store: Store, shard: int) -> Coverage:
    """Compare, by id, the events planned from the shard's conversations with the records published."""
    expected = {c.event_id(t) for c in read_conversations(store, shard) for t in range(c.num_turns)}
    counts: Counter = Counter()
    for batch in iter_completion_batches(store, shard, columns=["event_id"]):
        counts.update(batch.column("event_id").to_pylist())
    return Coverage(
        expected=len(expected),
        present=sum(counts.values()),
        missing=sorted(expected - counts.keys()),
        unexpected=sorted(counts.keys() - expected),
        duplicated={k: v for k, v in counts.items() if v > 1},
    )
