"""Is the entire dataset covered, each prompt exactly once? Answered by id, across every shard.

DuckDB reads the ids straight from the stored objects: the id and turn list of every conversation from the
conversations shards (JSON Lines, which have to be read whole), and only the `event_id` and `status` columns of
the completions shards' Parquet (a local file is read in place; on S3, by ranged GETs of the footer and those
column chunks, never the whole object). It joins planned against recorded events with bounded memory (it spills
to disk past its limit), so the answer never depends on counts that could hide a gap and a duplicate cancelling
out.

This is also where the stored shards are verified (the completions, and the training shards built on them):
every manifest is checked against its own object (read, or on S3 its listed ETag compared with the one its index
copy was made from), every object it lists is checked against one listing of the store (present, same size, and
on S3 the same ETag) and, for a local store, against its checksum. A damaged completions shard's events count as
missing and the shard is named; a damaged training shard is named. The index that
lets `dflash status` answer in a few requests is made to agree with the manifests read here.

A store whose completions and conversations disagree is reported, not a crash: a conversations shard that
is not published (its events are unknown), a completions shard made from other conversations than those
published now, and completions shards beyond the conversations' shard count.
"""

from __future__ import annotations

import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dagster_project.conversations.shards import ConversationsShardManifest, conversations_in
from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.records import STATUS_EXCLUDED, STATUS_OK
from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.layout import COMPLETIONS, CONVERSATIONS, TRAINING_SET, regenerate_command
from dagster_project.store.manifest import (
    ShardManifest,
    check_object,
    iter_parquet_batches,
    listing_problems,
    read_manifests_from_objects,
    read_published_manifests,
    verify_shard,
)
from dagster_project.store.storage import CorruptObject, LocalStore, ObjectInfo, Store
from dagster_project.store.transfer import arrow_filesystem, local_files
from dagster_project.training.shards import TrainingShardManifest

if TYPE_CHECKING:
    import duckdb

COVERAGE_KEY = "reports/coverage.json"
_SAMPLE = 20


@dataclass(frozen=True)
class DamagedShard:
    """A shard whose objects are not as published, and what is wrong with each (naming the object)."""

    shard: int
    problems: list[str]


@dataclass(frozen=True, kw_only=True)
class DatasetCoverage:
    """Planned events against recorded ones, by id, across every shard (the samples hold up to 20 ids)."""

    computed_at: float
    shards: int
    shards_published: int
    conversations: int
    conversations_done: int
    conversations_partial: int
    conversations_missing: int  # in shards whose completions are published (or damaged): a gap
    conversations_with_errors: int
    conversations_in_several_shards: int  # planned more than once: in two shards, or twice in one
    events_planned: int
    events_recorded: int
    events_missing: int  # in shards whose completions are published (or damaged): a gap
    events_duplicated: int
    events_unexpected: int
    # Planned in completions shards not published yet (not run, or running): to come, not missing.
    conversations_not_yet_published: int = 0
    events_not_yet_published: int = 0
    missing_sample: list[str] = field(default_factory=list)
    duplicated_sample: list[str] = field(default_factory=list)
    unexpected_sample: list[str] = field(default_factory=list)
    shards_damaged: list[int] = field(default_factory=list)
    damaged: list[DamagedShard] = field(default_factory=list)  # the same shards, with their damaged objects
    # Training shards whose objects are not as published (verified like the completions; their rows are not
    # counted here, but what is built on them is not green).
    training_damaged: list[DamagedShard] = field(default_factory=list)
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
                f"{self.completions_from_other_conversations} (conversations edited or rebuilt since; regenerate "
                f"each: `{regenerate_command(COMPLETIONS, self.completions_from_other_conversations[0])}`)"
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
        return self.events_not_yet_published == 0 and self.exact_so_far

    @property
    def exact_so_far(self) -> bool:
        """What is published is exact: no gap, duplicate or stray, nothing damaged (shards may remain to come)."""
        return (
            not self.shards_damaged
            and not self.disagreements
            and self.events_missing == 0
            and self.events_duplicated == 0
            and self.events_unexpected == 0
            and self.conversations_in_several_shards == 0
        )


def dataset_coverage(store: Store, num_shards: int, *, memory_limit: str = "1GB") -> DatasetCoverage:
    # Imported here, as pyarrow.dataset below: every run process loads this module with the definitions, and only
    # the run report reads the dataset (duckdb and pyarrow.dataset, which imports pandas: ~0.5 s).
    import duckdb

    with (
        tempfile.TemporaryDirectory(prefix="dflash-coverage-") as spill,
        ThreadPoolExecutor(max_workers=2) as background,
    ):
        # Insertion order is of no use here (rows are told apart by their rowid, samples are sorted): without it
        # DuckDB loads in parallel with less memory.
        con = duckdb.connect(
            config={"memory_limit": memory_limit, "temp_directory": spill, "preserve_insertion_order": False}
        )
        # DuckDB (which releases the GIL) starts on the conversations the store's index names, read in a few
        # requests, while the manifests are read from their own objects and the completions verified. Where the
        # index turns out not to match them (a stale copy, which this check repairs), it reads them again.
        indexed = _planned(read_published_manifests(store, CONVERSATIONS, ConversationsShardManifest), num_shards)
        loading = background.submit(_load_planned, con.cursor(), store, indexed, Path(spill))
        # On S3 the completions are verified beside the conversations' manifests (both mostly wait on requests);
        # on a local store after them, in this thread: Python threads taking turns on the GIL cost CPU that
        # DuckDB uses.
        verifying = None if isinstance(store, LocalStore) else background.submit(_verified_completions, store)
        conversations, _ = read_manifests_from_objects(store, CONVERSATIONS, ConversationsShardManifest)
        planned = _planned(conversations, num_shards)
        completions, damaged = verifying.result() if verifying else _verified_completions(store)
        if loading.exception() is not None or _data_keys(planned) != _data_keys(indexed):
            _load_planned(con, store, planned, Path(spill))
        counted = {s: m for s, m in completions.items() if s < num_shards and s not in damaged}
        _load_recorded(con, store, counted)
        training, training_listed = read_manifests_from_objects(store, TRAINING_SET, TrainingShardManifest)
        training_damaged = damaged_shards(store, training, training_listed)
        return replace(
            _summarize(con, num_shards, len(counted), [s for s in range(num_shards) if s not in completions]),
            shards_damaged=sorted(s for s in damaged if s < num_shards),
            damaged=[DamagedShard(s, problems) for s, problems in sorted(damaged.items()) if s < num_shards],
            training_damaged=[
                DamagedShard(s, found) for s, found in sorted(training_damaged.items()) if s < num_shards
            ],
            conversations_shards_missing=[s for s in range(num_shards) if s not in planned],
            completions_from_other_conversations=[
                s for s, m in sorted(counted.items()) if s in planned and m.conversations_used.changed_in(planned[s])
            ],
            completions_beyond_shard_count=sorted(s for s in completions if s >= num_shards),
        )


def _planned(
    manifests: dict[int, ConversationsShardManifest], num_shards: int
) -> dict[int, ConversationsShardManifest]:
    return {s: manifests[s] for s in range(num_shards) if s in manifests}


def _data_keys(manifests: dict[int, ShardManifest]) -> list[str]:
    return [key for _, m in sorted(manifests.items()) for key in m.data_keys]


def _verified_completions(store: Store) -> tuple[dict[int, CompletionsShardManifest], dict[int, list[str]]]:
    completions, listed = read_manifests_from_objects(store, COMPLETIONS, CompletionsShardManifest)
    return completions, damaged_shards(store, completions, listed)


def damaged_shards(
    store: Store, manifests: dict[int, ShardManifest], listed: dict[str, ObjectInfo], workers: int = 4
) -> dict[int, list[str]]:
    """Shard → problems, for the shards whose objects are not as published. The listing settles presence, size
    and (on S3) the ETag; what it cannot settle (a local file's checksum, an S3 object published without its
    ETag recorded) is checked object by object."""
    problems = {s: found for s, m in manifests.items() if (found := listing_problems(m, listed))}
    unsettled = [
        m
        for s, m in manifests.items()
        if s not in problems and any(not (o.etag and listed[o.key].etag) for o in m.objects)
    ]
    # Threads for what waits: S3 requests, and the hashing of large local files (which releases the GIL). Small
    # local files are checked in this thread: handing them to threads took 2-4x the CPU of checking them (measured
    # at 1,830 shards of ~20 KB), CPU that DuckDB reading the ids beside this would use.
    waits = [not isinstance(store, LocalStore) or _bytes(m) >= _THREADED_HASH_BYTES for m in unsettled]
    threaded = [m for m, wait in zip(unsettled, waits) if wait]
    found = {m.shard: verify_shard(store, m) for m, wait in zip(unsettled, waits) if not wait}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        found |= dict(zip((m.shard for m in threaded), pool.map(lambda m: verify_shard(store, m), threaded)))
    return problems | {shard: issues for shard, issues in found.items() if issues}


_THREADED_HASH_BYTES = 1 << 20


def _bytes(manifest: ShardManifest) -> int:
    return sum(obj.size for obj in manifest.objects)


def _unreadable() -> tuple[type[Exception], ...]:
    """What DuckDB raises for an object that is not what it should be (truncated, overwritten, not JSON Lines)."""
    import duckdb

    return (duckdb.InvalidInputException, duckdb.IOException, duckdb.ConversionException)


# DuckDB turns each conversation's generated turns into event ids exactly as `Conversation.event_id` does, and
# keeps its shard (from the file it was read from).
_CONVERSATIONS = """
    CREATE TABLE conversations AS
    SELECT id, len(generate_after) AS turns, f.shard
    FROM read_json(?, format = 'newline_delimited', auto_detect = false, filename = true,
                   columns = {'id': 'VARCHAR', 'generate_after': 'INTEGER[]'}) c
    JOIN shard_files f USING (filename)
"""
_PLANNED_EVENTS = """
    CREATE TABLE planned AS
    SELECT id || '#turn' || unnest(range(turns)) AS event_id, rowid AS conversation, shard FROM conversations
"""


def _load_planned(
    con: duckdb.DuckDBPyConnection, store: Store, manifests: dict[int, ConversationsShardManifest], spill: Path
) -> None:
    con.execute("DROP TABLE IF EXISTS conversations; DROP TABLE IF EXISTS planned; DROP TABLE IF EXISTS shard_files")
    shards = [s for s, m in sorted(manifests.items()) for _ in m.data_keys]  # in `_data_keys` order
    paths = [str(path) for path in local_files(store, _data_keys(manifests), spill)]
    published = [(m, obj) for _, m in sorted(manifests.items()) for obj in m.data_objects]
    for (manifest, obj), path in zip(published, paths):  # what DuckDB reads is what was published
        check_object(store, manifest, obj, None if isinstance(store, LocalStore) else Path(path))
    if not paths:
        con.execute("CREATE TABLE conversations (id VARCHAR, turns INTEGER, shard INTEGER)")
        con.execute("CREATE TABLE planned (event_id VARCHAR, conversation BIGINT, shard INTEGER)")
        return
    con.execute(
        "CREATE TABLE shard_files AS SELECT unnest(?::VARCHAR[]) AS filename, unnest(?::INTEGER[]) AS shard",
        [paths, shards],
    )
    try:
        con.execute(_CONVERSATIONS, [paths])
    except _unreadable() as exc:
        for manifest in manifests.values():  # name the damaged object, as reading it line by line does
            for _ in conversations_in(store, manifest):
                pass
        raise CorruptObject(
            f"the conversations shards in {store.url(CONVERSATIONS)} are not all readable: {exc}"
        ) from exc
    con.execute(_PLANNED_EVENTS)
    if not isinstance(store, LocalStore):
        for path in paths:  # read: the downloads are done with
            Path(path).unlink()


# Straight from the objects to one row per recorded event id (the records themselves are never kept).
# An event not sent by design (`excluded`, with its reason) has its record and no error.
_PER_EVENT = f"""
    CREATE TABLE per_event AS
    SELECT event_id, count(*) AS records,
           count(*) FILTER (WHERE status NOT IN ('{STATUS_OK}', '{STATUS_EXCLUDED}')) AS errors
    FROM {{source}} GROUP BY event_id
"""


def _load_recorded(
    con: duckdb.DuckDBPyConnection, store: Store, manifests: dict[int, CompletionsShardManifest]
) -> None:
    import pyarrow as pa  # here, not at the top: `dflash status` reads this module's answers without it

    keys = _data_keys(manifests)
    if not keys:
        con.execute("CREATE TABLE per_event (event_id VARCHAR, records BIGINT, errors BIGINT)")
        return
    try:
        if isinstance(store, LocalStore):
            paths = [str(path) for path in local_files(store, keys, Path())]
            con.execute(_PER_EVENT.format(source="read_parquet(?)"), [paths])
        else:  # DuckDB reads the two columns through pyarrow's S3 file system: ranged GETs, no downloads
            import pyarrow.dataset as ds

            recorded = pa.schema([("event_id", pa.string()), ("status", pa.string())])

            filesystem, root = arrow_filesystem(store)
            objects = ds.dataset(
                [f"{root}/{key}" for key in keys], schema=recorded, format="parquet", filesystem=filesystem
            )
            con.register("completion_objects", objects)
            con.execute(_PER_EVENT.format(source="completion_objects"))
    except (*_unreadable(), pa.ArrowException, OSError) as exc:
        for manifest in manifests.values():  # name the damaged object
            for _ in iter_parquet_batches(store, manifest, ["event_id"]):
                pass
        raise CorruptObject(f"the completions shards in {store.url(COMPLETIONS)} are not all readable: {exc}") from exc


def _summarize(
    con: duckdb.DuckDBPyConnection, num_shards: int, published: int, unpublished: list[int]
) -> DatasetCoverage:
    """A few passes over the planned and recorded ids; a sample of ids only where there is something to show.
    What is not recorded in the `unpublished` completions shards is still to come, not missing."""
    con.execute("CREATE TABLE unpublished AS SELECT unnest(?::INTEGER[]) AS shard", [unpublished])
    # One join answers both sides: recorded events that match no planned one gather in the group of no
    # conversation (NULL), the unexpected events.
    con.execute(
        """CREATE TABLE per_conversation AS
           SELECT p.conversation, count(*) AS events, count(*) FILTER (WHERE e.records IS NULL) AS missing,
                  min(coalesce(e.records, 0)) AS least, max(coalesce(e.records, 0)) AS most,
                  sum(coalesce(e.errors, 0)) AS errors,
                  any_value(p.shard) IN (SELECT shard FROM unpublished) AS to_come
           FROM planned p FULL JOIN per_event e USING (event_id) GROUP BY p.conversation"""
    )
    conversations, done, partial, missing_conversations, with_errors, planned, missing, to_come, to_come_events = (
        con.execute(
            """SELECT count(*), count(*) FILTER (WHERE least >= 1), count(*) FILTER (WHERE least = 0 AND most >= 1),
                      count(*) FILTER (WHERE most = 0 AND NOT to_come), count(*) FILTER (WHERE errors > 0),
                      sum(events), sum(missing) FILTER (WHERE NOT to_come),
                      count(*) FILTER (WHERE most = 0 AND to_come), sum(missing) FILTER (WHERE to_come)
               FROM per_conversation WHERE conversation IS NOT NULL"""
        ).fetchone()
    )
    unexpected_events = con.execute("SELECT sum(events) FROM per_conversation WHERE conversation IS NULL").fetchone()
    recorded, duplicated = con.execute(
        "SELECT sum(records), count(*) FILTER (WHERE records > 1) FROM per_event"
    ).fetchone()
    unexpected = "SELECT event_id FROM per_event ANTI JOIN planned USING (event_id)"
    samples = {
        "missing": (
            "SELECT event_id FROM planned ANTI JOIN per_event USING (event_id) "
            "WHERE shard NOT IN (SELECT shard FROM unpublished)",
            missing,
        ),
        "duplicated": ("SELECT event_id FROM per_event WHERE records > 1", duplicated),
        "unexpected": (unexpected, int(unexpected_events[0] or 0)),
    }
    # A conversation planned twice (in two shards, or twice in one) would be generated twice.
    several = "SELECT id FROM conversations GROUP BY id HAVING count(*) > 1"
    return DatasetCoverage(
        computed_at=time.time(),
        shards=num_shards,
        shards_published=published,
        conversations=conversations,
        conversations_done=done,
        conversations_partial=partial,
        conversations_missing=missing_conversations,
        conversations_with_errors=with_errors,
        conversations_in_several_shards=int(con.execute(f"SELECT count(*) FROM ({several})").fetchone()[0]),
        events_planned=int(planned or 0),
        events_recorded=int(recorded or 0),
        events_missing=int(missing or 0),
        conversations_not_yet_published=to_come,
        events_not_yet_published=int(to_come_events or 0),
        events_duplicated=duplicated,
        events_unexpected=samples["unexpected"][1],
        **{f"{name}_sample": _sample(con, sql) if count else [] for name, (sql, count) in samples.items()},
    )


def _sample(con: duckdb.DuckDBPyConnection, sql: str) -> list[str]:
    return [row[0] for row in con.execute(f"{sql} ORDER BY 1 LIMIT {_SAMPLE}").fetchall()]


def write_coverage(store: Store, coverage: DatasetCoverage) -> None:
    store.put_bytes(COVERAGE_KEY, to_json(coverage))


def read_coverage(store: Store) -> DatasetCoverage | None:
    return read_record(store, COVERAGE_KEY, DatasetCoverage)
