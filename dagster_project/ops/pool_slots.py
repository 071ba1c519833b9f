"""Runs waiting forever for a slot of a concurrency pool (`sglang_fleet`) that dead runs hold.

A run killed while it held a slot never gives it back: Dagster frees the slots of a run that *ended* only through
the daemon's run monitoring (`free_slots_after_run_end_seconds`), and a run whose process was killed stays
STARTED with its slot (the default run launcher cannot tell it died). Runs queued behind it then wait without a
word. Dagster 1.13 has no CLI command to free a slot (only the UI's pool page, or GraphQL's
`freeConcurrencySlotsForRun`), so the project's is named: `dflash free-slots RUN_ID...`.

This module words the alert from what the Dagster layer found (`StuckPool`); reading the instance is
`assets.pool_slots`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from dagster_project.ops.alerts import Alert

FREE_SLOTS_COMMAND = "dflash free-slots"
# Runs named in a sentence; the rest counted.
SHOWN_RUNS = 5


@dataclass(frozen=True)
class DeadHolder:
    """A run holding a pool slot that it will never give back, and how we know it is dead."""

    run_id: str
    why: str  # "ended (FAILURE)", "its processes (pids 12, 13) are gone", ...


@dataclass(frozen=True)
class StuckPool:
    """A pool with runs waiting for a slot while dead runs hold some."""

    pool: str
    limit: int | None
    waiting_runs: list[str]
    dead_holders: list[DeadHolder]

    @property
    def free_command(self) -> str:
        return f"{FREE_SLOTS_COMMAND} " + " ".join(holder.run_id for holder in self.dead_holders)

    def message(self) -> str:
        waiting = _some(self.waiting_runs)
        holders = _some([f"{holder.run_id} ({holder.why})" for holder in self.dead_holders])
        limit = f" (limit {self.limit})" if self.limit is not None else ""
        return (
            f"run{'s' if len(self.waiting_runs) > 1 else ''} {waiting} wait{'' if len(self.waiting_runs) > 1 else 's'} "
            f"for a slot of pool `{self.pool}`{limit} held by dead runs that will never give it back: {holders}. "
            f"Free their slots: `{self.free_command}`"
        )


def pool_alerts(stuck: list[StuckPool]) -> list[Alert]:
    return [Alert("pool", pool.message()) for pool in stuck]


def _some(items: list[str]) -> str:
    shown = ", ".join(items[:SHOWN_RUNS])
    return shown + (f" (+{len(items) - SHOWN_RUNS} more)" if len(items) > SHOWN_RUNS else "")
