"""What every gate returns (`GateResult`), and the wording its one-line verdict shares with the others."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SAMPLE = 5  # rows, answers or events a gate names as its examples


@dataclass(frozen=True)
class GateResult:
    name: str
    passed: bool
    message: str
    metadata: dict[str, Any] = field(default_factory=dict)


def verdict(passed: bool, text: str) -> str:
    return f"{'ok' if passed else 'BLOCKED'}: {text}"


def percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f}%" if whole else "0%"


def share_of(part: int, whole: int) -> float:
    return part / whole if whole else 0.0
