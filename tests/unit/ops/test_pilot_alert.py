"""A blocked pilot is an alert: the fleet answers as its gates refused, and no shard starts with its settings."""

from __future__ import annotations

from dagster_project.ops.alerts import pilot_alerts
from dagster_project.pilot_record import PILOT_COMMAND, PilotRecord

THINKING = "BLOCKED: 100% of finished answers (9/9) have empty reasoning before </think>; limit 1%"
SHORT = "BLOCKED: 100% of finished answers (9/9) are shorter than 8 characters, most often 'OK.'; limit 10%"


def test_a_blocked_pilot_names_its_gates_what_they_saw_and_the_command_and_a_passed_one_says_nothing():
    blocked = PilotRecord(
        False,
        "46cdac2920d65871",
        finished_at=1.8e9,
        answers=9,
        failed_gates={"completions/thinking_structure": THINKING, "completions/short_answers": SHORT},
    )
    (alert,) = pilot_alerts(blocked)
    assert alert.kind == "pilot"
    assert "pilot of 9 answers at 2027-01-15 08:00 UTC (settings 46cdac2920d65871) was BLOCKED by" in alert.message
    assert "completions/short_answers, completions/thinking_structure" in alert.message
    # What the first of them saw, its first clause: the figure, not every detail of its message.
    assert (
        "(completions/short_answers: BLOCKED: 100% of finished answers (9/9) are shorter than 8 characters, most "
        "often 'OK.')" in alert.message
    )
    assert alert.message.endswith(f"`{PILOT_COMMAND}`")
    assert pilot_alerts(PilotRecord(True, "46cdac2920d65871", answers=9)) == []
    assert pilot_alerts(None) == []
