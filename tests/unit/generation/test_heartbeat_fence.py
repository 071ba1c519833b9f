"""Heartbeats are fenced by the shard's lease like publishes: a run paused past its lease (SIGSTOP) whose shard
another run then took over writes nothing more for it when it resumes (SIGCONT), and stops."""

from __future__ import annotations

import asyncio

import pytest

from dagster_project.generation.heartbeat import ReportIntervals, ShardReporter
from dagster_project.generation.journal import Journal
from dagster_project.generation.progress import Heartbeat
from dagster_project.store.dataclass_json import read_record, to_json
from dagster_project.store.layout import COMPLETIONS, lease_key, progress_key
from dagster_project.store.lease import Lease, LeaseLost
from dagster_project.store.storage import LocalStore

SHARD, TTL_S = 0, 60.0
KEY = lease_key(COMPLETIONS, SHARD)


class Clock:
    """This host's wall clock, as the lease reads it: moved by the test, as a pause moves it."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def beat_of(run_id: str, state: str) -> Heartbeat:
    return Heartbeat(
        shard=SHARD, state=state, settings_fingerprint="f", started_at=0.0, updated_at=0.0, total_events=10,
        resumed_events=0, done_events=10, remaining_events=0, ok_events=10, run_id=run_id,
    )  # fmt: skip


def test_a_run_resumed_after_its_lease_was_taken_over_leaves_the_new_owners_progress_alone(tmp_path):
    store, clock = LocalStore(tmp_path / "store"), Clock()
    stale_lease = Lease(store, KEY, "node-a pid 1 run stale", ttl_s=TTL_S, clock=clock).acquire()
    with Journal(tmp_path / "j.jsonl") as journal:
        stale = ShardReporter(
            store, SHARD, journal, "f", lambda: beat_of("stale", "running"),
            ReportIntervals(heartbeat_interval_s=0.01), lease=stale_lease, run_id="stale",
        )  # fmt: skip
        asyncio.run(stale.beat())  # on time: its heartbeat is written
        assert read_record(store, progress_key(SHARD), Heartbeat).run_id == "stale"

        # SIGSTOP for twice the lease's time to live; meanwhile another run takes the shard and publishes it.
        clock.now += 2 * TTL_S
        Lease(store, KEY, "node-b pid 2 run owner", ttl_s=TTL_S, clock=clock).acquire()
        store.put_bytes(progress_key(SHARD), to_json(beat_of("owner", "published")))

        # SIGCONT: its next beat renews first, finds the lease lost, and writes nothing; its loop stops at once.
        asyncio.run(stale.beat())
        assert stale.fenced
        with pytest.raises(LeaseLost, match="now held by node-b pid 2 run owner"):
            asyncio.run(asyncio.wait_for(stale.run(), timeout=30))
        asyncio.run(stale.checkpoint_journal())
    owner = read_record(store, progress_key(SHARD), Heartbeat)
    assert (owner.run_id, owner.state) == ("owner", "published")
