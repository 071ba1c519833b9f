"""One writer per shard: a lease object in the store, taken and renewed by compare-and-swap.

A shard run holds `leases/<stage>/shard=NNNNN.json` while it works. Another run, on this host or any other,
that finds the lease alive refuses at once naming the holder (or waits for it, if asked to); an expired
lease is taken over. Each take increments a fencing token, and every renewal is conditional on the object
being exactly as this holder last wrote it: a writer paused past its expiry (a stopped process, a long GC,
a partitioned node) finds on its next renewal that someone else took over, and stops before it publishes.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Self

import orjson

from dagster_project.store.storage import PreconditionFailed, Store, StoreError

DEFAULT_TTL_S = 300.0


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

    def describe(self) -> str:
        expires = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.expires_at))
        return f"{self.holder} (lease #{self.token}, expires {expires} unless renewed)"


def default_holder(run_id: str | None = None) -> str:
    """Who holds a lease: host and process, and the Dagster run when there is one."""
    holder = f"{socket.gethostname()} pid {os.getpid()}"
    return f"{holder} run {run_id}" if run_id else holder


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

    def acquire(self, wait_s: float = 0.0, poll_s: float = 5.0) -> Self:
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
            held = LeaseRecord(**orjson.loads(current[0]))
            if held.expires_at > now and held.holder != self.holder:
                raise LeaseHeld(f"{self.store.url(self.key)} is held by {held.describe()}")
            token = held.token + 1
        record = LeaseRecord(self.holder, token, now, now + self.ttl_s)
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
        record = LeaseRecord(self.holder, self.record.token, self.record.acquired_at, now + self.ttl_s)
        try:
            self._version = self.store.put_if(self.key, orjson.dumps(asdict(record)), self._version)
        except PreconditionFailed as exc:
            current = self.store.get_versioned(self.key)
            now_held = LeaseRecord(**orjson.loads(current[0])).describe() if current else "nobody"
            raise LeaseLost(
                f"lost {self.store.url(self.key)} (lease #{self.record.token} of {self.holder}): it is now held by "
                f"{now_held}; this run stops without publishing"
            ) from exc
        self.record = record

    def release(self) -> None:
        """Give the lease up (expire it now) if it is still ours; a lost lease is left to its new holder."""
        if self.record is None:
            return
        record = LeaseRecord(self.holder, self.record.token, self.record.acquired_at, self.clock())
        try:
            self.store.put_if(self.key, orjson.dumps(asdict(record)), self._version)
        except PreconditionFailed:
            pass
        self.record = None

    def __enter__(self) -> Self:
        return self.acquire() if self.record is None else self

    def __exit__(self, *exc_info: object) -> None:
        self.release()
