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


def answer_multi_turn(readings: Readings) -> MultiTurnAnswer:
    """Which policy, how many multi-turn conversations, how many turns generated."""
    conversations = readings.conversations
    return MultiTurnAnswer(
        policy=conversations.policy if conversations else None,
        multi_turn_conversations=conversations.multi_turn if conversations else None,
        conversations=conversations.rows if conversations else None,
        generated_turns_planned=readings.events_planned,
        history=conversations.history if conversations else None,
    )


def render_multi_turn(multi_turn: MultiTurnAnswer) -> list[str]:
    t = multi_turn
    return [
        "6. Multi-turn",
        f"   policy {t.policy}: {fmt(t.multi_turn_conversations)} multi-turn of {fmt(t.conversations)} "
        f"conversations, {fmt(t.generated_turns_planned)} assistant turns generated",
    ]
