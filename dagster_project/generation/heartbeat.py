"""What a running shard tells the outside world while it generates.

* every few seconds, its `Heartbeat` to `<store>/progress/shard=NNNNN.json` (read by `status`);
* every minute or so, what its journal gained since the last checkpoint, as one more append-only segment
  under `<store>/progress/journal/shard=NNNNN/<fingerprint>/<writer>/`, so a run resumed on another node
  loses at most that minute of work and no checkpoint of a run re-uploads what an earlier one stored;
* at each checkpoint and at its end, what its servers generated that is in no record (`generation.unrecorded`),
  under `<store>/progress/unrecorded/shard=NNNNN/<fingerprint>/<writer>.json`: a run stopped before it published (a
  hold, a failure) keeps its count, which the run that publishes the shard adds to its manifest's;
* at a slower pace, a progress line for Dagster's logs (each one is a database write).

It also renews the shard's lease (every checkpoint, or a quarter of the lease's time to live if that is
sooner). A store hiccup never stops generation: it is counted (`upload_failures`) and shown by `status`. A
lost lease does: another run has taken the shard over, so this one stops writing anything for it and its
`run` raises `LeaseLost`. Heartbeats are fenced by the lease: one is written only while the lease has a
renewal interval left, so a run paused past its expiry renews (and finds it lost) before it writes again.

Each heartbeat names its process (host, pid, start time), its Dagster run and its interval, so `status` sees a
killed run as dead at once on its own host (the pid is gone) and after two missed beats elsewhere.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dagster_project.generation.journal import Journal
from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.shards import unrecorded_of
from dagster_project.generation.unrecorded import Unrecorded
from dagster_project.processes import live_process, this_process
from dagster_project.store import object_index
from dagster_project.store.dataclass_json import parse_record, to_json
from dagster_project.store.layout import PROGRESS, SHARD_DIGITS, progress_key, unrecorded_prefix
from dagster_project.store.lease import Lease, LeaseLost
from dagster_project.store.storage import Store, StoreError

HEARTBEATS_PREFIX = PROGRESS + "/shard="
# States of a run at work: generating, or generated and publishing. ("failed" and "published" are final.)
ACTIVE_STATES = ("running", "generated")
# Heartbeats that do not say how often they beat (written before they did): silent this long means gone.
LEGACY_STALE_S = 60.0
# A run elsewhere is taken for dead after this many heartbeat intervals without one.
MISSED_BEATS = 2


def journal_segments_prefix(shard: int, fingerprint: str) -> str:
    """Where a shard's journal checkpoints live: `<writer>/<sequence>.jsonl` segments, each the complete lines
    one run appended since its previous segment. A writer is one run's reporter, named so that writers sort
    by the time they started (then host and pid)."""
    return f"{PROGRESS}/journal/shard={shard:0{SHARD_DIGITS}d}/{fingerprint}/"


def read_heartbeats(store: Store) -> list[Heartbeat]:
    """The last heartbeat of every shard run that reported, running or not: a finished run's from the store's
    index, a running one's from its own object (see `write_heartbeat`)."""
    return list(
        object_index.read_records(store, HEARTBEATS_PREFIX, Heartbeat, lambda key: key.endswith(".json")).values()
    )


def write_heartbeat(store: Store, heartbeat: Heartbeat, *, first: bool) -> None:
    """Write the shard's heartbeat. The index hears of the run's first one (readers then fetch the object while it
    runs) and of its last one (readers then take the index's copy): two index updates per run, not one a beat."""
    key = progress_key(heartbeat.shard)
    data = to_json(heartbeat)
    store.put_bytes(key, data)
    final = heartbeat.state not in ACTIVE_STATES
    if first or final:
        object_index.record(store, key, data, final=final)


def run_is_alive(heartbeat: Heartbeat, now: float, host: str | None = None) -> bool:
    """Whether the run that wrote this heartbeat is at work and still lives.

    On the host that runs it: its process exists. Elsewhere: it beat within `MISSED_BEATS` of its intervals.
    """
    if heartbeat.state not in ACTIVE_STATES:
        return False
    if heartbeat.pid and heartbeat.host == (host or socket.gethostname()):
        return live_process(heartbeat.pid, heartbeat.process_start) is not None
    silent_for = now - heartbeat.updated_at
    if heartbeat.heartbeat_interval_s:
        return silent_for <= MISSED_BEATS * heartbeat.heartbeat_interval_s
    return silent_for < LEGACY_STALE_S


def restore_journal(store: Store, shard: int, fingerprint: str, local_path: Path) -> int:
    """Seed a missing local journal from the store's segments (a resume on another node); returns the bytes
    restored (0: a local journal exists, or nothing was checkpointed).

    The segments of every writer, oldest writer first, concatenated: where two runs both recorded an event,
    the journal's own rule decides (the first final record stands; a retryable error is superseded)."""
    if local_path.exists():
        return 0
    keys = sorted(info.key for info in store.list(journal_segments_prefix(shard, fingerprint)))
    if not keys:
        return 0
    local_path.parent.mkdir(parents=True, exist_ok=True)
    staging = local_path.with_name(f".{local_path.name}.restoring")
    with open(staging, "wb") as out:
        for key in keys:  # one segment in memory at a time: one checkpoint interval's lines
            out.write(store.get_bytes(key))
    os.replace(staging, local_path)
    return local_path.stat().st_size


@dataclass(frozen=True)
class RunUnrecorded:
    """One shard run's answers in no record and their output tokens, by cause, as its reporter last wrote them."""

    run_id: str | None = None
    answers: dict[str, int] = field(default_factory=dict)
    tokens: dict[str, int] = field(default_factory=dict)


def read_runs_unrecorded(store: Store, shard: int, fingerprint: str, *, leaving_out: str = "") -> Unrecorded:
    """What the shard's runs under these settings recorded of their answers in no record, summed; the run of writer
    `leaving_out` is left out (the run that publishes counts its own from its dispatcher)."""
    prefix = unrecorded_prefix(shard, fingerprint)
    total = Unrecorded()
    for info in store.list(prefix):
        if info.key != f"{prefix}{leaving_out}.json":
            record = parse_record(store, info.key, RunUnrecorded, store.get_bytes(info.key))
            total += Unrecorded.of({"answers": record.answers, "tokens": record.tokens})
    return total


@dataclass(frozen=True)
class ReportIntervals:
    """How often a running shard reports (the `completions` op config)."""

    heartbeat_interval_s: float = field(
        default=5.0, metadata={"help": "Progress snapshot to the store (read by `dflash status`)."}
    )
    checkpoint_interval_s: float = field(
        default=60.0,
        metadata={
            "help": "Journal lines new since the last checkpoint to the store: a resume elsewhere loses at most this."
        },
    )
    log_interval_s: float = field(
        default=30.0, metadata={"help": "Progress line and observation in Dagster (each one a database write)."}
    )


@dataclass
class ShardReporter:
    store: Store
    shard: int
    journal: Journal
    fingerprint: str
    snapshot: Callable[[], Heartbeat]
    intervals: ReportIntervals = ReportIntervals()
    on_progress: Callable[[Heartbeat], None] | None = None
    log: Callable[[str], None] = lambda message: None
    # The shard's lease, renewed as the run goes; None: the caller holds no lease (tests, tools).
    lease: Lease | None = None
    run_id: str | None = None
    # Bytes at the head of the local journal the store already holds: what was restored from it. A journal kept
    # on this node by an earlier run (0) goes up whole as this run's first segment.
    checkpointed_bytes: int = 0
    upload_failures: int = field(default=0, init=False)
    # Set when the lease is lost: another run owns the shard now, and this one writes nothing more for it.
    fenced: bool = field(default=False, init=False)
    _lost: LeaseLost | None = field(default=None, init=False)
    segments_written: int = field(default=0, init=False)
    _writer: str = field(
        default_factory=lambda: f"{time.time_ns():020d}-{socket.gethostname()}-{os.getpid()}", init=False
    )
    _beaten: bool = field(default=False, init=False)  # a heartbeat of this run is in the store
    _unrecorded_stored: Unrecorded = field(default_factory=Unrecorded, init=False)

    @property
    def writer(self) -> str:
        """This run's name among the shard's writers (its journal segments' folder, its unrecorded count's key)."""
        return self._writer

    def report(self) -> Heartbeat:
        host, pid, start = this_process()
        calls = self.store.calls
        return replace(
            self.snapshot(),
            upload_failures=self.upload_failures,
            store_calls=calls.made,
            store_retries=dict(calls.retried),
            host=host,
            pid=pid,
            process_start=start,
            run_id=self.run_id,
            heartbeat_interval_s=self.intervals.heartbeat_interval_s,
        )

    def _put_heartbeat(self, heartbeat: Heartbeat) -> None:
        write_heartbeat(self.store, heartbeat, first=not self._beaten)
        self._beaten = True

    def _segment_key(self) -> str:
        prefix = journal_segments_prefix(self.shard, self.fingerprint)
        return f"{prefix}{self._writer}/{self.segments_written:08d}.jsonl"

    async def _guarded(self, what: str, call: Callable[..., Any], *args: Any) -> bool:
        # Store writes are blocking I/O: keep them off the event loop that feeds the fleet.
        try:
            await asyncio.to_thread(call, *args)
            return True
        except (StoreError, OSError) as exc:
            self.upload_failures += 1
            self.log(f"{what} of shard {self.shard} failed (generation goes on): {exc}")
            return False

    async def renew_lease(self) -> None:
        """Extend the lease; `LeaseLost` (and nothing more written) if another run took the shard over."""
        if self.lease is None:
            return
        if self._lost is not None:
            raise self._lost
        try:
            await asyncio.to_thread(self.lease.renew)
        except LeaseLost as lost:
            self.fenced, self._lost = True, lost
            raise
        except (StoreError, OSError) as exc:  # the next renewal may succeed: the lease has time left
            self.upload_failures += 1
            self.log(f"lease renewal of shard {self.shard} failed (generation goes on): {exc}")

    async def checkpoint_journal(self) -> None:
        """Upload the journal's complete lines that the store does not hold yet, as the next segment. A failed
        upload is retried whole at the next checkpoint (its lines stay pending)."""
        if self.fenced:
            return
        self.journal.sync()
        with open(self.journal.path, "rb") as handle:
            handle.seek(self.checkpointed_bytes)
            pending = handle.read()
        complete = pending.rfind(b"\n") + 1  # a line being written now goes with the next segment
        if not complete:
            return
        if await self._guarded("journal checkpoint", self.store.put_bytes, self._segment_key(), pending[:complete]):
            self.checkpointed_bytes += complete
            self.segments_written += 1

    async def record_unrecorded(self) -> None:
        """Store what the run's servers generated that is in no record so far, when it changed: a run that stops
        before it publishes keeps its count. A failed write is retried at the next checkpoint."""
        counted = unrecorded_of(self.snapshot())
        if self.fenced or counted == self._unrecorded_stored:
            return
        record = RunUnrecorded(self.run_id, dict(counted.answers), dict(counted.tokens))
        key = f"{unrecorded_prefix(self.shard, self.fingerprint)}{self._writer}.json"
        if await self._guarded("record of the answers in no record", self.store.put_bytes, key, to_json(record)):
            self._unrecorded_stored = counted

    async def beat(self) -> None:
        """Write the heartbeat, fenced by the lease like a publish: a run paused past its lease's expiry (SIGSTOP,
        a long pause) renews it first, and finding it taken over writes nothing (its `run` raises `LeaseLost`),
        so the progress of the run that owns the shard now is never overwritten by this one's "running"."""
        if not self.fenced and await self._lease_is_ours():
            await self._guarded("heartbeat", self._put_heartbeat, self.report())

    async def _lease_is_ours(self) -> bool:
        """The lease is this run's, with at least one renewal interval left by this host's clock; a renewal first
        where less is left (never in a run that renews on time)."""
        lease = self.lease
        if lease is None or lease.record is None:
            return True  # no lease to fence by (a caller without one)
        if lease.clock() < lease.record.expires_at - lease.renew_every_s:
            return True
        try:
            await self.renew_lease()
        except LeaseLost:
            return False
        return lease.record is not None and lease.clock() < lease.record.expires_at

    async def run(self) -> None:
        """Until cancelled: heartbeats, journal checkpoints, lease renewals and progress logs, each at its own
        pace. Returns only by raising `LeaseLost`."""
        last_checkpoint = last_log = last_renewal = time.monotonic()
        renew_every = min(self.intervals.checkpoint_interval_s, self.lease.renew_every_s) if self.lease else 0.0
        while True:
            await self.beat()
            if self._lost is not None:
                raise self._lost  # found lost before the beat: stop now, not at the next renewal
            now = time.monotonic()
            if self.lease is not None and now - last_renewal >= renew_every:
                await self.renew_lease()
                last_renewal = now
            if now - last_checkpoint >= self.intervals.checkpoint_interval_s:
                await self.checkpoint_journal()
                await self.record_unrecorded()
                last_checkpoint = now
            if self.on_progress is not None and now - last_log >= self.intervals.log_interval_s:
                self.on_progress(self.report())
                last_log = now
            await asyncio.sleep(self.intervals.heartbeat_interval_s)
