"""How a run uses its `sglang_fleet` pool slot: seconds held, and of them seconds with no request in flight.

A shard run's generation step holds one slot of the pool from its start to its end (Dagster's op-granularity
pool). The slot is meant for generating: time in it with nothing in flight (the first request not sent yet,
a shard being published, the next one being read, no room in the node's ledger) is a slot another run could
have used. The dispatchers of the step's shards report their in-flight count here, each as its own `source`
(a range run generates two shards at once, from two threads): the slot is busy while any of them has a request
in flight. The step reads, per shard, what the slot cost since the last reading.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class SlotSeconds:
    held_s: float
    idle_s: float  # held with no request in flight


class SlotUse:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._mark = clock()  # the slot is held from here (the step's start)
        self._busy_s = 0.0
        self._busy_since: float | None = None
        self._counts: dict[Hashable, int] = {}  # requests in flight, per dispatcher

    def in_flight(self, count: int, source: Hashable = None) -> None:
        """`source`'s (one dispatcher's) requests in flight now."""
        with self._lock:
            now = self._clock()
            if count:
                self._counts[source] = count
            else:
                self._counts.pop(source, None)
            busy = any(self._counts.values())
            if busy and self._busy_since is None:
                self._busy_since = now
            elif not busy and self._busy_since is not None:
                self._busy_s += now - self._busy_since
                self._busy_since = None

    def take(self) -> SlotSeconds:
        """Seconds held, and idle, since the last `take` (or the start)."""
        with self._lock:
            now = self._clock()
            busy = self._busy_s + (now - self._busy_since if self._busy_since is not None else 0.0)
            held = now - self._mark
            self._mark, self._busy_s = now, 0.0
            if self._busy_since is not None:
                self._busy_since = now
            return SlotSeconds(held_s=held, idle_s=max(0.0, held - busy))
