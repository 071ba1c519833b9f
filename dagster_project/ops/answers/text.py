"""How the answers write numbers and times in text: "—" for what is unknown."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

# Lists in a sentence (shards, settings, sources) show this many items, then a count of the rest.
SHOWN_IN_LINE = 12


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def as_of(timestamp: float) -> str:
    """When a reading was taken: 2026-12-01 15:04:05 UTC."""
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(timestamp: float | None, now: float) -> str:
    return f"{now - timestamp:,.0f} s ago" if timestamp else "never"


def dollars(value: float | None) -> str:
    """$1,234.57, or — when unknown."""
    return "—" if value is None else f"${value:,.2f}"


def number(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def counted(count: int, noun: str) -> str:
    """ "1 answer", "3 answers": a count and its noun in agreement (a noun whose plural is its +s)."""
    return f"{count:,} {noun}{'s' * (count != 1)}"


def some(items: Sequence[object], limit: int = SHOWN_IN_LINE) -> str:
    """A list in a sentence, cut after `limit` items so a text stays short at 1,830 shards."""
    shown = ", ".join(map(str, items[:limit])) or "none"
    return shown + (f" … (+{len(items) - limit:,} more)" if len(items) > limit else "")


def counts_in_line(counts: Mapping[str, int]) -> str:
    """ "sharegpt 200, ultrachat 32": each name and its count, the largest first (then by name), cut as `some`; a
    name from the data is escaped with the line it is in (`shown_text`)."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return some([f"{name} {count:,}" for name, count in ranked])


def counted_shards(shards: Sequence[int]) -> str:
    """Shards in a sentence, their count first: "2 (0-1)", not a bare "0" (shard 0) that reads as none; or "none"."""
    return f"{len(shards):,} ({shard_list(list(shards))})" if shards else "none"


def shard_list(shards: list[int], limit: int = SHOWN_IN_LINE) -> str:
    """Shards in a sentence, runs of consecutive ones as ranges ("0-17, 19"), cut after `limit` parts so a line
    stays short at 1,830 shards."""
    parts: list[str] = []
    for shard in sorted(shards):
        if parts and parts[-1].split("-")[-1] == str(shard - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{shard}"
        else:
            parts.append(str(shard))
    shown = ", ".join(parts[:limit]) or "none"
    return shown + (f" … (+{len(parts) - limit:,} more)" if len(parts) > limit else "")


def utc(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
