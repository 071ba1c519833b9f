"""5. Coverage of the dataset: every input row accounted for, every conversation planned, every event done once."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from dagster_project.conversations.shards import SourceTotals
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.text import ago, counts_in_line, fmt
from dagster_project.ops.coverage import DatasetCoverage


@dataclass(frozen=True)
class CoverageAnswer:
    input_rows: int | None
    normalized: int | None
    quarantined: int | None
    quarantined_by_reason: dict[str, int] | None
    # Exact duplicates among the quarantined (the first copy kept): not bad rows, with their own limit.
    duplicates: int | None
    duplicate_rate: float | None
    conversations: int | None
    by_source: dict[str, SourceTotals] | None
    # Rows kept under their hash id because their own id was taken, and conversations that call tools.
    renamed_ids: int | None
    tool_calling: int | None
    events_planned: int
    events_in_published_shards: int
    errors_in_published_shards: int
    # By id, across shards: written by the run_report asset or `dflash status --by-id`.
    by_id: DatasetCoverage | None
    # Events with a record that says why they were not sent (matched to an evaluation set), by reason.
    excluded_in_published_shards: dict[str, int] = field(default_factory=dict)


def answer_coverage(readings: Readings) -> CoverageAnswer:
    """Every input row accounted for, every conversation planned, every event done once."""
    # Before the conversations stage runs, the ingest stage's counts are all there is.
    rows = readings.conversations or readings.raw
    conversations = readings.conversations
    return CoverageAnswer(
        input_rows=rows.input_rows if rows else None,
        normalized=conversations.normalized if conversations else None,
        quarantined=rows.quarantined if rows else None,
        quarantined_by_reason=rows.quarantined_by_reason if rows else None,
        duplicates=conversations.duplicates if conversations else None,
        duplicate_rate=conversations.duplicate_rate if conversations else None,
        conversations=conversations.rows if conversations else None,
        by_source=conversations.by_source if conversations else None,
        renamed_ids=conversations.renamed_ids if conversations else None,
        tool_calling=conversations.tool_calling if conversations else None,
        events_planned=readings.events_planned,
        events_in_published_shards=sum(m.rows for m in readings.published.values()),
        errors_in_published_shards=sum(m.errors for m in readings.published.values()),
        by_id=readings.coverage_by_id,
        excluded_in_published_shards=dict(
            sum((Counter(m.generation.excluded_by_reason) for m in readings.published.values()), Counter())
        ),
    )


def by_id_summary(b: DatasetCoverage) -> str:
    """The coverage by id in a line. Mid-run, what the completions shards not published yet plan is "not yet
    published" (to come); "missing" is only what a published (or damaged) shard lacks: a gap."""
    to_come = b.conversations_not_yet_published
    return (
        f"conversations {fmt(b.conversations)} = done {fmt(b.conversations_done)} + partial "
        f"{fmt(b.conversations_partial)} + missing {fmt(b.conversations_missing)}"
        + (f" + not yet published {fmt(to_come)}" if to_come else "")
        + f"; events missing {fmt(b.events_missing)}"
        + (f", not yet published {fmt(b.events_not_yet_published)}" if b.events_not_yet_published else "")
        + f", duplicated {fmt(b.events_duplicated)}, unexpected {fmt(b.events_unexpected)}"
    )


def _by_id_lines(by_id: DatasetCoverage | None, now: float) -> list[str]:
    if not by_id:
        return ["   by id: not computed yet (materialize run_report, or dflash status --by-id)"]
    return [
        f"   by id ({ago(by_id.computed_at, now)}): {by_id_summary(by_id)}",
        *(f"   ALERT: {problem}" for problem in by_id.disagreements),
        *([f"   ALERT: damaged completions shards: {by_id.shards_damaged}"] if by_id.shards_damaged else []),
        *(f"      shard {damage.shard}: {'; '.join(damage.problems)}" for damage in by_id.damaged),
    ]


def render_coverage(coverage: CoverageAnswer, now: float) -> list[str]:
    c = coverage
    sources = {name: totals.conversations for name, totals in (c.by_source or {}).items()}
    by_source = f"({counts_in_line(sources)})" if sources else "—"
    reasons = f" ({counts_in_line(c.quarantined_by_reason)})" if c.quarantined_by_reason else ""
    return [
        "5. Coverage",
        f"   input rows {fmt(c.input_rows)} → normalized {fmt(c.normalized)} + quarantined {fmt(c.quarantined)}"
        f"{reasons}",
        *(
            [
                f"   exact duplicates {fmt(c.duplicates)} ({c.duplicate_rate:.1%}): the first copy kept, "
                "not counted as bad rows"
            ]
            if c.duplicates and c.duplicate_rate is not None
            else []
        ),
        f"   conversations {fmt(c.conversations)} by source {by_source}; events planned {fmt(c.events_planned)}, "
        f"in published shards {fmt(c.events_in_published_shards)} (errors {fmt(c.errors_in_published_shards)}"
        + "".join(f", not sent: {reason} {n:,}" for reason, n in sorted(c.excluded_in_published_shards.items()))
        + ")",
        f"   tool-calling conversations {fmt(c.tool_calling)}; ids renamed (own id taken, kept under a hash id) "
        f"{fmt(c.renamed_ids)}",
        *_by_id_lines(c.by_id, now),
    ]
