"""A shard run's heartbeat as tests need one: a run 10 events long, `done` of them answered."""

from __future__ import annotations

import time
from typing import Any

from dagster_project.generation.progress import Heartbeat


def heartbeat(
    shard: int, *, state: str = "running", done: int = 4, updated_at: float | None = None, **process: Any
) -> Heartbeat:
    """`process`: who writes it (host, pid, process_start, run_id, heartbeat_interval_s)."""
    updated_at = time.time() if updated_at is None else updated_at
    return Heartbeat(
        shard=shard,
        state=state,
        settings_fingerprint="f",
        started_at=updated_at - 60,
        updated_at=updated_at,
        total_events=10,
        resumed_events=0,
        done_events=done,
        remaining_events=10 - done,
        ok_events=done,
        **process,
    )
