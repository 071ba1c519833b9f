"""6. Multi-turn: which policy, how many multi-turn conversations, how many turns."""

from __future__ import annotations

from dataclasses import dataclass

from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.answers.text import fmt


@dataclass(frozen=True)
class MultiTurnAnswer:
    policy: str | None
    multi_turn_conversations: int | None
    conversations: int | None
    generated_turns_planned: int
    history: str | None
    generated_turns_done: int = 0  # with a record so far (an answer or an error), of those planned


def answer_multi_turn(readings: Readings) -> MultiTurnAnswer:
    """Which policy, how many multi-turn conversations, how many turns generated."""
    conversations = readings.conversations
    return MultiTurnAnswer(
        policy=conversations.policy if conversations else None,
        multi_turn_conversations=conversations.multi_turn if conversations else None,
        conversations=conversations.rows if conversations else None,
        generated_turns_planned=readings.events_planned,
        history=conversations.history if conversations else None,
        generated_turns_done=readings.events_done,
    )


def generated_of_planned(t: MultiTurnAnswer) -> str:
    """The turns generated so far against those planned, e.g. "407 of 1,153 planned"."""
    return f"{fmt(t.generated_turns_done)} of {fmt(t.generated_turns_planned)} planned"


def render_multi_turn(multi_turn: MultiTurnAnswer) -> list[str]:
    t = multi_turn
    return [
        "6. Multi-turn",
        f"   policy {fmt(t.policy)}: {fmt(t.multi_turn_conversations)} multi-turn of {fmt(t.conversations)} "
        f"conversations; assistant turns generated {generated_of_planned(t)}",
    ]
