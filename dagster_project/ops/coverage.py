"""Is the entire dataset covered, each prompt exactly once? Answered by id, across every shard.

The planned generation events (from the conversations shards) and the recorded ones (from the published
completions shards) are loaded shard by shard into DuckDB, which joins them with bounded memory (it
spills to disk past its limit), so the answer never depends on counts that could hide a gap and a
duplicate cancelling out.

A store whose completions and conversations disagree is reported, not a crash: a conversations shard that
is not published (its events are unknown), a completions shard made from other conversations than those
published now, and completions shards beyond the conversations' shard count.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field, replace

import duckdb
import pyarrow as pa

from dagster_project.conversations.shards import conversations_in, read_shard_conversations_manifest
from dagster_project.generation.shards import iter_completion_batches, read_completions_manifest
from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.layout import COMPLETIONS
from dagster_project.store.manifest import published_shards, verify_shard
from dagster_project.store.storage import Store

COVERAGE_KEY = "reports/coverage.json"
_SAMPLE = 20


@dataclass(frozen=True, kw_only=True)
class DatasetCoverage:
    """Planned events against recorded ones, by id, across every shard (the samples hold up to 20 ids)."""

    computed_at: float
    shards: int
    shards_published: int
    conversations: int
    conversations_done: int
    conversations_partial: int
    conversations_missing: int
    conversations_with_errors: int
    conversations_in_several_shards: int
    events_planned: int
    events_recorded: int
    events_missing: int
    events_duplicated: int
    events_unexpected: int
    missing_sample: list[str] = field(default_factory=list)
    duplicated_sample: list[str] = field(default_factory=list)
    unexpected_sample: list[str] = field(default_factory=list)
    shards_damaged: list[int] = field(default_factory=list)
    # Where the completions and the conversations disagree (the store is not consistent).
    conversations_shards_missing: list[int] = field(default_factory=list)
    completions_from_other_conversations: list[int] = field(default_factory=list)
    completions_beyond_shard_count: list[int] = field(default_factory=list)

    @property
    def disagreements(self) -> list[str]:
        """What makes the completions disagree with the conversations, in words (empty when they agree)."""
        found = []
        if self.conversations_shards_missing:
            found.append(
                f"conversations shards not published: {self.conversations_shards_missing} (their planned events are "
                "unknown; re-materialize conversations)"
            )
        if self.completions_from_other_conversations:
            found.append(
                f"completions shards made from other conversations than those published now: "
                f"{self.completions_from_other_conversations} (re-materialize them)"
            )
        if self.completions_beyond_shard_count:
            found.append(
                f"completions shards beyond the conversations' {self.shards} shards: "
                f"{self.completions_beyond_shard_count} (left by another shard count; their events are not counted)"
            )
        return found

    @property
    def complete(self) -> bool:
        """Every shard is published."""
        return self.shards_published == self.shards

    @property
    def exactly_once(self) -> bool:
        """Every planned event has exactly one record and nothing else was recorded."""
        return (
            not self.shards_damaged
            and not self.disagreements
            and self.events_missing == 0
            and self.events_duplicated == 0
            and self.events_unexpected == 0
            and self.conversations_in_several_shards == 0
        )


def dataset_coverage(store: Store, num_shards: int, *, memory_limit: str = "1GB") -> DatasetCoverage:
    with tempfile.TemporaryDirectory(prefix="dflash-coverage-") as spill:
        con = duckdb.connect(config={"memory_limit": memory_limit, "temp_directory": spill})
        con.execute("CREATE TABLE planned (event_id VARCHAR, conversation_id VARCHAR, shard INTEGER)")
        con.execute("CREATE TABLE recorded (event_id VARCHAR, status VARCHAR, shard INTEGER)")
        published, damaged, unplanned, other = 0, [], [], []
        for shard in range(num_shards):
            shard_conversations = read_shard_conversations_manifest(store, shard)
            if shard_conversations is None:
                unplanned.append(shard)
            planned = [
                (c.event_id(t), c.id, shard)
                for c in (conversations_in(store, shard_conversations) if shard_conversations else ())
                for t in range(c.num_turns)
            ]
            if planned:
                columns = dict(zip(("event_id", "conversation_id", "shard"), zip(*planned)))
                con.register("planned_batch", pa.table(columns))
                con.execute("INSERT INTO planned SELECT * FROM planned_batch")
            manifest = read_completions_manifest(store, shard)
            if manifest is None:
                continue
            if verify_shard(store, manifest):  # its events count as missing, and the shard is named
                damaged.append(shard)
                continue
            made_from = manifest.conversations_ids_digest
            if shard_conversations is not None and made_from and made_from != shard_conversations.ids_digest:
                other.append(shard)
            published += 1
            for batch in iter_completion_batches(store, shard, ["event_id", "status"]):
                con.register("recorded_batch", pa.Table.from_batches([batch]))
                con.execute("INSERT INTO recorded SELECT event_id, status, ? FROM recorded_batch", [shard])
        return replace(
            _summarize(con, num_shards, published),
            shards_damaged=damaged,
            conversations_shards_missing=unplanned,
            completions_from_other_conversations=other,
            completions_beyond_shard_count=[s for s in published_shards(store, COMPLETIONS) if s >= num_shards],
        )


def _scalar(con: duckdb.DuckDBPyConnection, sql: str) -> int:
    return int(con.execute(sql).fetchone()[0])


def _sample(con: duckdb.DuckDBPyConnection, sql: str) -> list[str]:
    return [row[0] for row in con.execute(f"{sql} ORDER BY 1 LIMIT {_SAMPLE}").fetchall()]


def _summarize(con: duckdb.DuckDBPyConnection, num_shards: int, published: int) -> DatasetCoverage:
    con.execute(
        """CREATE TABLE counts AS
           SELECT p.event_id, p.conversation_id, count(r.event_id) AS records,
                  count(r.event_id) FILTER (WHERE r.status <> 'ok') AS errors
           FROM planned p LEFT JOIN recorded r USING (event_id) GROUP BY p.event_id, p.conversation_id"""
    )
    con.execute(
        """CREATE TABLE per_conversation AS
           SELECT conversation_id, min(records) AS least, max(records) AS most, sum(errors) AS errors
           FROM counts GROUP BY conversation_id"""
    )
    missing = "SELECT event_id FROM counts WHERE records = 0"
    duplicated = "SELECT event_id FROM recorded GROUP BY event_id HAVING count(*) > 1"
    unexpected = "SELECT event_id FROM recorded ANTI JOIN planned USING (event_id)"
    split = "SELECT conversation_id FROM planned GROUP BY conversation_id HAVING count(DISTINCT shard) > 1"
    return DatasetCoverage(
        computed_at=time.time(),
        shards=num_shards,
        shards_published=published,
        conversations=_scalar(con, "SELECT count(*) FROM per_conversation"),
        conversations_done=_scalar(con, "SELECT count(*) FROM per_conversation WHERE least >= 1"),
        conversations_partial=_scalar(con, "SELECT count(*) FROM per_conversation WHERE least = 0 AND most >= 1"),
        conversations_missing=_scalar(con, "SELECT count(*) FROM per_conversation WHERE most = 0"),
        conversations_with_errors=_scalar(con, "SELECT count(*) FROM per_conversation WHERE errors > 0"),
        conversations_in_several_shards=_scalar(con, f"SELECT count(*) FROM ({split})"),
        events_planned=_scalar(con, "SELECT count(*) FROM planned"),
        events_recorded=_scalar(con, "SELECT count(*) FROM recorded"),
        events_missing=_scalar(con, f"SELECT count(*) FROM ({missing})"),
        events_duplicated=_scalar(con, f"SELECT count(*) FROM ({duplicated})"),
        events_unexpected=_scalar(con, f"SELECT count(*) FROM ({unexpected})"),
        missing_sample=_sample(con, missing),
        duplicated_sample=_sample(con, duplicated),
        unexpected_sample=_sample(con, unexpected),
    )


def write_coverage(store: Store, coverage: DatasetCoverage) -> None:
    store.put_bytes(COVERAGE_KEY, to_json(coverage))


def read_coverage(store: Store) -> DatasetCoverage | None:
    return read_record(store, COVERAGE_KEY, DatasetCoverage)
