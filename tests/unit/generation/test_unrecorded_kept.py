"""A shard run that stops before it publishes (a hold, a failure) keeps what its servers generated that is in no
record: its reporter stores the count at each checkpoint and at its end, and the run that publishes the shard adds
every earlier run's count to its own in the manifest (the waste ledger's causes)."""

from __future__ import annotations

import asyncio

from dagster_project.generation.heartbeat import ReportIntervals, ShardReporter, read_runs_unrecorded
from dagster_project.generation.journal import Journal
from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.shards import GenerationSummary, RowCounts
from dagster_project.generation.unrecorded import PROBES, STOPPED_IN_FLIGHT, Unrecorded
from dagster_project.store.storage import LocalStore

SHARD, FINGERPRINT = 3, "fp"


def _beat(counts: dict, done: int = 10) -> Heartbeat:
    servers = {"http://a": {"unrecorded": counts}}
    return Heartbeat(
        shard=SHARD, state="running", settings_fingerprint=FINGERPRINT, started_at=0.0, updated_at=0.0,
        total_events=10, resumed_events=0, done_events=done, remaining_events=10 - done, ok_events=done,
        servers=servers,
    )  # fmt: skip


def _reporter(store: LocalStore, journal: Journal, beat: list[Heartbeat], run_id: str) -> ShardReporter:
    return ShardReporter(store, SHARD, journal, FINGERPRINT, lambda: beat[0], ReportIntervals(), run_id=run_id)


def test_a_stopped_runs_count_reaches_the_manifest_of_the_run_that_publishes(tmp_path):
    store = LocalStore(tmp_path / "store")
    held_counts = {"answers": {STOPPED_IN_FLIGHT: 4, PROBES: 2}, "tokens": {STOPPED_IN_FLIGHT: 310, PROBES: 2}}
    with Journal(tmp_path / "j.jsonl") as journal:
        held_beat = [_beat({"answers": {PROBES: 2}, "tokens": {PROBES: 2}}, done=4)]
        held = _reporter(store, journal, held_beat, "held-run")
        asyncio.run(held.record_unrecorded())  # a checkpoint
        held_beat[0] = _beat(held_counts, done=6)
        asyncio.run(held.record_unrecorded())  # its end: the requests its stop aborted are in
        publishing_beat = [_beat({"answers": {PROBES: 2}, "tokens": {PROBES: 2}})]
        publishing = _reporter(store, journal, publishing_beat, "next-run")
        asyncio.run(publishing.record_unrecorded())

    assert read_runs_unrecorded(store, SHARD, FINGERPRINT) == Unrecorded.of(held_counts) + Unrecorded.of(
        {"answers": {PROBES: 2}, "tokens": {PROBES: 2}}
    )
    stopped = read_runs_unrecorded(store, SHARD, FINGERPRINT, leaving_out=publishing.writer)
    assert stopped == Unrecorded.of(held_counts)
    assert read_runs_unrecorded(store, SHARD, "other settings") == Unrecorded()

    summary = GenerationSummary.of(publishing_beat[0], RowCounts(), None, stopped)
    assert summary.unrecorded_output_tokens == {STOPPED_IN_FLIGHT: 310, PROBES: 4}
    assert summary.unrecorded_answers == {STOPPED_IN_FLIGHT: 4, PROBES: 4}
