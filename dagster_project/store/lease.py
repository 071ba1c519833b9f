"""One writer per shard: a lease object in the store, taken and renewed by compare-and-swap.

A shard run holds `leases/<stage>/shard=NNNNN.json` while it works. Another run, on this host or any other,
that finds the lease alive refuses at once naming the holder (or waits for it, if asked to); an expired
lease is taken over, and so is one whose holder ran on this host and whose process is gone (a killed run:
its rerun here need not wait for the lease to expire). Each take increments a fencing token, and every
renewal is conditional on the object being exactly as this holder last wrote it: a writer paused past its
expiry (a stopped process, a long GC, a partitioned node) finds on its next renewal that someone else took
over, and stops before it publishes.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Self

import orjson

from dagster_project.processes import live_process, this_process
from dagster_project.store.dataclass_json import from_json
from dagster_project.store.storage import PreconditionFailed, Store, StoreError

DEFAULT_TTL_S = 300.0
DEFAULT_POLL_S = 5.0


class LeaseHeld(StoreError):
    """Another live run holds the shard."""


class LeaseLost(StoreError):
    """This run's lease expired and another run took the shard: it must not publish."""


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    token: int  # fencing token: grows by one with every take-over
    acquired_at: float
    expires_at: float
    # The holder's process (`processes.this_process`); records written without it are judged by their expiry alone.
    host: str = ""
    pid: int = 0
    process_start: str = ""

    def describe(self) -> str:
        expires = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.expires_at))
        return f"{self.holder} (lease #{self.token}, expires {expires} unless renewed)"

    def holder_died_here(self) -> bool:
        """The holder ran on this host and its process is gone: it was killed without releasing the lease."""
        return (
            bool(self.pid) and self.host == socket.gethostname() and live_process(self.pid, self.process_start) is None
        )


def default_holder(run_id: str | None = None) -> str:
    """Who holds a lease: host and process, and the Dagster run when there is one."""
    holder = f"{socket.gethostname()} pid {os.getpid()}"
    return f"{holder} run {run_id}" if run_id else holder


@dataclass(frozen=True)
class LeaseOptions:
    """How a shard run holds its shard's lease (the config of the assets that take one)."""

    lease_wait_s: float = field(
        default=0.0,
        metadata={
            "help": "When another live run holds the shard: 0 refuses at once naming it; more waits up to this "
            "many seconds for it to finish or die."
        },
    )
    lease_ttl_s: float = field(
        default=DEFAULT_TTL_S,
        metadata={
            "help": "A run that stops renewing its lease (killed, paused, cut off) loses the shard after this "
            "long; another run may then take it over."
        },
    )

    def __post_init__(self) -> None:
        if self.lease_wait_s < 0 or self.lease_ttl_s <= 0:
            raise ValueError(f"invalid lease options {self}")


class Lease:
    """The lease on one key; use as a context manager, and call `renew` more often than `ttl_s`."""

    def __init__(
        self,
        store: Store,
        key: str,
        holder: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.time,
    ):
        self.store, self.key, self.holder, self.ttl_s, self.clock = store, key, holder, ttl_s, clock
        self.record: LeaseRecord | None = None
        self._version: str | None = None

    def acquire(self, wait_s: float = 0.0, poll_s: float = DEFAULT_POLL_S) -> Self:
        """Take the lease, or raise `LeaseHeld` naming the holder (after waiting up to `wait_s` for it)."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self._try_acquire()
            except LeaseHeld:
                if time.monotonic() + poll_s > deadline:
                    raise
            time.sleep(poll_s)  # waiting for another process's lease to end: there is nothing to await

    def _try_acquire(self) -> Self:
        current = self.store.get_versioned(self.key)
        now = self.clock()
        token = 1
        if current is not None:
            held = from_json(LeaseRecord, current[0])
            if held.expires_at > now and held.holder != self.holder and not held.holder_died_here():
                raise LeaseHeld(
                    f"{self.store.url(self.key)} is held by {held.describe()}: another run is working on this "
                    "shard. Let it finish (or ask to wait for it: lease_wait_s); a run that died without releasing "
                    "it loses it when it expires"
                )
            token = held.token + 1
        record = LeaseRecord(self.holder, token, now, now + self.ttl_s, *this_process())
        try:
            self._version = self.store.put_if(self.key, orjson.dumps(asdict(record)), current[1] if current else None)
        except PreconditionFailed:
            return self._try_acquire()  # someone else wrote it between our read and our write: look again
        self.record = record
        return self

    def renew(self) -> None:
        """Extend the lease; `LeaseLost` if it is no longer ours (expired and taken over)."""
        if self.record is None:
            raise LeaseLost(f"{self.store.url(self.key)}: not acquired")
        now = self.clock()
        record = replace(self.record, expires_at=now + self.ttl_s)
        try:
            self._version = self.store.put_if(self.key, orjson.dumps(asdict(record)), self._version)
        except PreconditionFailed as exc:
            current = self.store.get_versioned(self.key)
            now_held = from_json(LeaseRecord, current[0]).describe() if current else "nobody"
            raise LeaseLost(
                f"lost {self.store.url(self.key)} (lease #{self.record.token} of {self.holder}): it is now held by "
                f"{now_held}; this run stops without publishing"
            ) from exc
        self.record = record

    def release(self) -> None:
        """Give the lease up (expire it now) if it is still ours; a lost lease is left to its new holder."""
        if self.record is None:
            return
        record = replace(self.record, expires_at=self.clock())
        try:
            self.store.put_if(self.key, orjson.dumps(asdict(record)), self._version)
        except PreconditionFailed:
            pass
        self.record = None

    @property
    def renew_every_s(self) -> float:
        """How often a holder renews: four chances before the lease would expire."""
        return self.ttl_s / 4

    def __enter__(self) -> Self:
        return self.acquire() if self.record is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def take_lease(store: Store, key: str, *, run_id: str | None = None, options: LeaseOptions = LeaseOptions()) -> Lease:
    """The lease on `key` for this process (and Dagster run), acquired: `LeaseHeld` naming the holder when
    another live run has it and `options.lease_wait_s` ran out. Release it (or use it as a context manager)."""
    lease = Lease(store, key, default_holder(run_id), ttl_s=options.lease_ttl_s)
    return lease.acquire(options.lease_wait_s, min(DEFAULT_POLL_S, max(options.lease_wait_s / 10, 0.05)))
