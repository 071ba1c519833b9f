"""The mixture of the training set: per source and per turn position, what went in, what was kept and how.

When a drafter accepts less on one kind of traffic, the first question is what that kind of traffic was in
the training set. For each source (the prompt file) and each turn position (1, 2, 3, 4+) this reports:
input rows (a source's rows read; a turn position's generated turns), rows quarantined or excluded by
reason (ingest and conversations quarantine, then the training set's exclusions, errors among them), rows
in the training set and their share of it, the error rate of generation, the truncation rate (rows cut by
`truncate`) and the share of rows longer than `max_length`, prompt and answer length percentiles (tokens;
the answer before any cut), MTP's accept length (mean and p10) and loss-mask sum percentiles. A source or turn
position whose share of the training set differs from its share of the input by more than
`max_share_shift_points` percentage points is flagged: something removed much more of it than of the rest.

Every figure is one DuckDB aggregate over the published training rows (scalar columns only, loaded shard by
shard, so memory holds no token list), the completions' status column and the manifests' counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pyarrow as pa

from dagster_project.conversations.shards import read_conversations_manifest
from dagster_project.conversations.stage import QUARANTINE_KEY as CONVERSATIONS_QUARANTINE_KEY
from dagster_project.generation.shards import iter_completion_batches
from dagster_project.ingest.shards import QUARANTINE_KEY as INGEST_QUARANTINE_KEY
from dagster_project.store.dataclass_json import to_json
from dagster_project.store.jsonl import read_jsonl_zst
from dagster_project.store.layout import COMPLETIONS, TRAINING_SET
from dagster_project.store.manifest import published_shards
from dagster_project.store.storage import Store
from dagster_project.store.transfer import local_copy
from dagster_project.training.lengths import LengthFigures
from dagster_project.training.shards import iter_training_batches, read_training_manifest
from dagster_project.training.stage import UNKNOWN_SOURCE

if TYPE_CHECKING:
    import duckdb

MAX_SHARE_SHIFT_POINTS = 5.0
LAST_TURN_POSITION = 4  # positions past it are counted together, as "4+"
PERCENTILES = (0.1, 0.5, 0.9)
TRAINING_COLUMNS = [
    "source",
    "turn_index",
    "prompt_tokens",
    "completion_tokens",
    "num_loss_tokens",
    "truncated",
    "spec_accept_length",
]


@dataclass(frozen=True)
class MixtureOptions:
    max_share_shift_points: float = field(
        default=MAX_SHARE_SHIFT_POINTS,
        metadata={
            "help": "Flag a source or turn position whose share of the training set differs from its share of "
            "the input by more than this many percentage points."
        },
    )


@dataclass(frozen=True)
class MixtureGroup:
    """One source, or one turn position: its figures (percentiles are p10, p50, p90; None without rows)."""

    name: str
    input_rows: int
    input_share: float
    excluded_by_reason: dict[str, int]
    training_rows: int
    share: float
    share_shift_points: float
    error_rate: float
    truncation_rate: float
    over_max_length_rate: float
    prompt_tokens: list[float] | None
    answer_tokens: list[float] | None
    accept_length_mean: float | None
    accept_length_p10: float | None
    loss_mask_sum: list[float] | None
    flagged: bool


@dataclass(frozen=True)
class MixtureReport:
    by_source: list[MixtureGroup]
    by_turn: list[MixtureGroup]
    training_rows: int
    max_length: int | None
    lengths: LengthFigures
    max_share_shift_points: float

    @property
    def flagged(self) -> list[str]:
        return [f"source {g.name}" for g in self.by_source if g.flagged] + [
            f"turn {g.name}" for g in self.by_turn if g.flagged
        ]


def turn_position_sql(column: str) -> str:
    """The turn position label of a 0-based turn index: '1', '2', '3', '4+'."""
    last = LAST_TURN_POSITION
    return f"CASE WHEN {column} + 1 >= {last} THEN '{last}+' ELSE CAST({column} + 1 AS VARCHAR) END"


def _quarantine_rows(store: Store) -> Iterator[tuple[str, str]]:
    for key in (INGEST_QUARANTINE_KEY, CONVERSATIONS_QUARANTINE_KEY):
        if store.exists(key):
            with local_copy(store, key) as path:
                for record in read_jsonl_zst(path):
                    yield record.get("source") or UNKNOWN_SOURCE, record.get("reason") or "unknown"


def _insert(con: duckdb.DuckDBPyConnection, table: str, batch: pa.RecordBatch, columns: str) -> None:
    """Append a batch's rows to `table`: its source (rows recorded before there was one: 'unknown'), `columns`."""
    if "source" not in batch.schema.names:
        batch = batch.append_column("source", pa.nulls(batch.num_rows, pa.string()))
    con.register("batch_rows", batch)
    con.execute(f"INSERT INTO {table} SELECT coalesce(source, '{UNKNOWN_SOURCE}'), {columns} FROM batch_rows")
    con.unregister("batch_rows")


def _load(con: duckdb.DuckDBPyConnection, store: Store) -> tuple[int | None, LengthFigures]:
    """Fill the tables the report is computed from; return max_length and the dataset-wide length figures."""
    con.execute(
        "CREATE TABLE training (source VARCHAR, turn_index INTEGER, prompt_tokens INTEGER, completion_tokens "
        "INTEGER, num_loss_tokens INTEGER, truncated BOOLEAN, spec_accept_length DOUBLE)"
    )
    con.execute("CREATE TABLE events (source VARCHAR, turn_index INTEGER, failed BOOLEAN)")
    con.execute("CREATE TABLE excluded (source VARCHAR, turn_index INTEGER, reason VARCHAR, rows BIGINT)")
    con.execute("CREATE TABLE quarantined (source VARCHAR, reason VARCHAR, rows BIGINT)")
    con.execute("CREATE TABLE inputs (source VARCHAR, rows BIGINT)")
    lengths, max_length = LengthFigures(), None
    for shard in published_shards(store, TRAINING_SET):
        manifest = read_training_manifest(store, shard)
        if manifest is None:
            continue
        max_length = manifest.assembly.max_length
        lengths.merge(manifest.lengths)
        groups = [(g.source, g.turn_index, g.reason, g.rows) for g in manifest.exclusions_by_group]
        if groups:
            con.executemany("INSERT INTO excluded VALUES (?, ?, ?, ?)", groups)
        for batch in iter_training_batches(store, shard, TRAINING_COLUMNS):
            _insert(con, "training", batch, ", ".join(TRAINING_COLUMNS[1:]))
    for shard in published_shards(store, COMPLETIONS):
        for batch in iter_completion_batches(store, shard, ["source", "turn_index", "status"]):
            _insert(con, "events", batch, "turn_index, status <> 'ok'")
    quarantined = Counter(_quarantine_rows(store))
    if quarantined:
        con.executemany("INSERT INTO quarantined VALUES (?, ?, ?)", [(*key, n) for key, n in quarantined.items()])
    stage = read_conversations_manifest(store)
    if stage is not None and stage.by_source:
        con.executemany("INSERT INTO inputs VALUES (?, ?)", [(s, c.input_rows) for s, c in stage.by_source.items()])
    return max_length, lengths


_FIGURES = """
SELECT {key} AS name,
       count(*) AS training_rows,
       avg(CASE WHEN truncated THEN 1 ELSE 0 END) AS truncation_rate,
       avg(CASE WHEN {max_length} IS NOT NULL AND prompt_tokens + completion_tokens > {max_length}
                THEN 1 ELSE 0 END) AS over_max_length_rate,
       quantile_cont(prompt_tokens, {percentiles}) AS prompt_tokens,
       quantile_cont(completion_tokens, {percentiles}) AS answer_tokens,
       avg(spec_accept_length) AS accept_length_mean,
       quantile_cont(spec_accept_length, 0.1) AS accept_length_p10,
       quantile_cont(num_loss_tokens, {percentiles}) AS loss_mask_sum
FROM training GROUP BY 1
"""


def _groups(
    con: duckdb.DuckDBPyConnection, key: str, inputs_sql: str, excluded_sql: str, max_length: int | None, shift: float
) -> list[MixtureGroup]:
    percentiles = "[" + ", ".join(str(p) for p in PERCENTILES) + "]"
    figures = {
        row[0]: row
        for row in con.execute(
            _FIGURES.format(key=key, max_length="NULL" if max_length is None else max_length, percentiles=percentiles)
        ).fetchall()
    }
    inputs = dict(con.execute(inputs_sql).fetchall())
    errors = dict(
        con.execute(f"SELECT {key}, avg(CASE WHEN failed THEN 1 ELSE 0 END) FROM events GROUP BY 1").fetchall()
    )
    excluded: dict[str, dict[str, int]] = {}
    for name, reason, rows in con.execute(excluded_sql).fetchall():
        excluded.setdefault(name, {})[reason] = int(rows)
    total_in = sum(inputs.values())
    total_rows = sum(row[1] for row in figures.values())
    groups = []
    for name in sorted(set(inputs) | set(figures) | set(excluded)):
        row = figures.get(name)
        training_rows = row[1] if row else 0
        input_share = inputs.get(name, 0) / total_in if total_in else 0.0
        share = training_rows / total_rows if total_rows else 0.0
        moved = 100 * (share - input_share)
        groups.append(
            MixtureGroup(
                name=name,
                input_rows=int(inputs.get(name, 0)),
                input_share=input_share,
                excluded_by_reason=dict(sorted(excluded.get(name, {}).items())),
                training_rows=training_rows,
                share=share,
                share_shift_points=moved,
                error_rate=float(errors.get(name) or 0.0),
                truncation_rate=float(row[2]) if row else 0.0,
                over_max_length_rate=float(row[3]) if row else 0.0,
                prompt_tokens=row[4] if row else None,
                answer_tokens=row[5] if row else None,
                accept_length_mean=row[6] if row else None,
                accept_length_p10=row[7] if row else None,
                loss_mask_sum=row[8] if row else None,
                flagged=abs(moved) > shift,
            )
        )
    return groups


def mixture_report(store: Store, options: MixtureOptions | None = None) -> MixtureReport:
    """The mixture of the training set now published (see the module's docstring)."""
    import duckdb  # here: every run process loads this module with the definitions; only the report needs it

    options = options or MixtureOptions()
    with duckdb.connect() as con:
        max_length, lengths = _load(con, store)
        shift = options.max_share_shift_points
        turn = turn_position_sql("turn_index")
        by_source = _groups(
            con,
            "source",
            # A store without a conversations manifest (rows published directly) counts generated turns as input.
            "SELECT source, sum(rows) FROM inputs GROUP BY 1"
            if con.execute("SELECT count(*) FROM inputs").fetchone()[0]
            else "SELECT source, count(*) FROM events GROUP BY 1",
            "SELECT source, reason, sum(rows) FROM (SELECT source, reason, rows FROM quarantined "
            "UNION ALL SELECT source, reason, rows FROM excluded) GROUP BY 1, 2",
            max_length,
            shift,
        )
        by_turn = _groups(
            con,
            turn,
            f"SELECT {turn}, count(*) FROM events GROUP BY 1",
            f"SELECT {turn}, reason, sum(rows) FROM excluded GROUP BY 1, 2",
            max_length,
            shift,
        )
        training_rows = con.execute("SELECT count(*) FROM training").fetchone()[0]
    return MixtureReport(by_source, by_turn, int(training_rows), max_length, lengths, shift)


def _number(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _triple(values: list[float] | None) -> str:
    return "—" if values is None else " / ".join(_number(v) for v in values)


def markdown_table(groups: list[MixtureGroup], label: str) -> str:
    header = (
        f"| {label} | input rows | quarantined / excluded | rows in set | share (input) | error | truncated "
        "| > max_length | prompt p10/50/90 | answer p10/50/90 | accept mean | accept p10 | loss sum p10/50/90 |"
    )
    lines = [header, "|---|" + "---:|" * 2 + "---|" + "---:|" * 10]
    for g in groups:
        reasons = ", ".join(f"{reason} {n:,}" for reason, n in g.excluded_by_reason.items()) or "—"
        lines.append(
            f"| {g.name}{' ⚠' if g.flagged else ''} | {g.input_rows:,} | {reasons} | {g.training_rows:,} "
            f"| {g.share:.1%} ({g.input_share:.1%}) | {g.error_rate:.1%} | {g.truncation_rate:.1%} "
            f"| {g.over_max_length_rate:.1%} | {_triple(g.prompt_tokens)} | {_triple(g.answer_tokens)} "
            f"| {_number(g.accept_length_mean, 2)} | {_number(g.accept_length_p10, 2)} | {_triple(g.loss_mask_sum)} |"
        )
    return "\n".join(lines)


REPORT_KEY = "reports/mixture.json"


def write_report(store: Store, report: MixtureReport) -> None:
    store.put_bytes(REPORT_KEY, to_json(report))
