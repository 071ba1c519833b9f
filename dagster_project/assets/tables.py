"""Readable summaries of stage counts, for asset and check metadata (markdown tables)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

from dagster_project.ingest.quarantine import REASONS


def counts_table(label: str, counts: Mapping[str, Any]) -> str:
    """A markdown table of `{name: count}`, `{name: {column: count}}` or `{name: counts dataclass}`; reasons get
    their meaning."""
    if not counts:
        return f"no {label} counts"
    counts = {name: asdict(value) if is_dataclass(value) else value for name, value in counts.items()}
    columns = sorted({c for value in counts.values() if isinstance(value, Mapping) for c in value}, key=_column_order)
    header = [label, *(columns or ["rows"])]
    explain = label == "reason"
    if explain:
        header.append("meaning")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, value in counts.items():
        cells = [str(value.get(c, 0)) for c in columns] if isinstance(value, Mapping) else [str(value)]
        if explain:
            cells.append(REASONS.get(name, ""))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _column_order(column: str) -> tuple[int, str]:
    preferred = ["rows", "input_rows", "kept", "conversations", "quarantined"]
    return (preferred.index(column) if column in preferred else len(preferred), column)
