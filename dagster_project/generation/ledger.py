"""What the shard runs on one node share about each server: its in-flight budget and its health verdict.

Every run on the node keeps its own dispatcher, but they all draw from one budget per server: at most
`limit` (the server's running cap x oversubscription) requests in flight across all of them, so N runs hold
about what one run would, and a run in its tail leaves slots that the others take at once. Among runs that
want more, the one with the fewest requests left goes first: runs finish one after another instead of all
reaching their tails together; but a run with nothing in flight on a server gets its first slot there before
anyone gets more, so a run that holds a pool slot generates at the next slot freed instead of waiting, idle,
for the others' tails. Runs on other nodes do not share this file: each dispatcher lowers `limit` by
the load the server itself reports beyond this node's requests (see `Dispatcher`).

A server that one run sets aside (garbage answers, a hang) is set aside for every run: the verdict, its
reason and when to look again are in the same file, and the run that re-probes it and sees it healthy
clears it for all.

One small JSON file per server under the fleet's directory, read and written under an exclusive lock.
Entries of processes that died are ignored and dropped, so a killed run never holds slots.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import orjson

from dagster_project.processes import live_process, this_process

WANT_TTL_S = 2.0  # a run that stopped asking is no longer ahead of the others after this long


@dataclass
class _Member:
    pid: int
    in_flight: int = 0
    # The process's start mark (`processes`): a killed run whose pid went to a later process still lets go.
    start: str = ""
    remaining: int = 0  # requests this run still has to finish: the fewest goes first
    wants: int = 0  # slots it asked for and did not get
    wants_at: float = 0.0


@dataclass
class _ServerRecord:
    members: dict[str, _Member] = field(default_factory=dict)
    set_aside_reason: str | None = None
    set_aside_by: str | None = None


# How a run that follows another's verdict states its reason: the verdict's reason, then the ledger member that set the
# server aside ("answers_trickling (set aside by 24214-7f3a…)").
_SET_ASIDE_BY = " (set aside by "


@dataclass(frozen=True)
class Verdict:
    """A server set aside by some run on this node, and why."""

    reason: str
    by: str

    def followed(self) -> str:
        """The reason a run that follows this verdict gives (`split_followed` reads it back)."""
        return f"{self.reason}{_SET_ASIDE_BY}{self.by})"


def split_followed(reason: str) -> tuple[str, str]:
    """A set-aside reason → the reason itself and who set the server aside, "" for a run's own verdict."""
    head, found, tail = reason.partition(_SET_ASIDE_BY)
    return (head, tail.removesuffix(")")) if found and tail.endswith(")") else (reason, "")


class FleetLedger:
    """One dispatcher's handle on the node's shared ledger (`directory`, one file per server)."""

    def __init__(self, directory: Path, member: str | None = None):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.member = member or f"{os.getpid()}-{id(self):x}"
        self.remaining = 0

    def acquire(self, server: str, want: int, limit: int) -> int:
        """Take up to `want` in-flight slots on `server` within `limit` for the whole node; how many were granted."""
        with self._record(server) as record:
            me = self._me(record)
            now = time.monotonic()
            room = limit - sum(m.in_flight for m in record.members.values())
            claims = [
                claim
                for name, member in record.members.items()
                if name == self.member or now - member.wants_at < WANT_TTL_S
                for claim in _claims(name, member, want if name == self.member else member.wants)
            ]
            granted = 0
            for _, name, count in sorted(claims):
                served = max(0, min(count, room))
                room -= served
                if name == self.member:
                    granted += served
            me.in_flight += granted
            me.wants, me.wants_at = want - granted, now
            return granted

    def release(self, server: str, count: int = 1) -> None:
        with self._record(server) as record:
            me = self._me(record)
            me.in_flight = max(0, me.in_flight - count)

    def set_aside(self, server: str, reason: str) -> None:
        with self._record(server) as record:
            record.set_aside_reason, record.set_aside_by = reason, self.member

    def clear(self, server: str) -> None:
        with self._record(server) as record:
            record.set_aside_reason = record.set_aside_by = None

    def verdict(self, server: str) -> Verdict | None:
        with self._record(server) as record:
            if record.set_aside_reason is None:
                return None
            return Verdict(record.set_aside_reason, record.set_aside_by or "")

    def leave(self, servers: list[str]) -> None:
        """This dispatcher is done: its slots and wishes go back to the others."""
        for server in servers:
            with self._record(server) as record:
                record.members.pop(self.member, None)

    def in_flight(self, server: str) -> int:
        """Requests in flight on `server` from every live run on this node."""
        with self._record(server) as record:
            return sum(m.in_flight for m in record.members.values())

    # ---- the file ----------------------------------------------------------------------------------

    def _me(self, record: _ServerRecord) -> _Member:
        _, pid, start = this_process()
        me = record.members.setdefault(self.member, _Member(pid=pid, start=start))
        me.remaining = self.remaining
        return me

    def _path(self, server: str) -> Path:
        return self.directory / f"{hashlib.sha256(server.encode()).hexdigest()[:16]}.json"

    @contextmanager
    def _record(self, server: str) -> Iterator[_ServerRecord]:
        fd = os.open(self._path(server), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 1 << 20, 0)
            record = _load(raw)
            yield record
            data = orjson.dumps(asdict(record))
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
        finally:
            os.close(fd)  # releases the lock


def _claims(name: str, member: _Member, wants: int) -> list[tuple[tuple[int, int], str, int]]:
    """A member's wish as claims in serving order. A run with nothing in flight on the server claims one slot
    before anyone's further wish: it holds a pool slot to generate, and must not wait, idle, for the runs ahead
    of it to reach their tails. The rest is served fewest-remaining first (runs finish one after another)."""
    first = 1 if member.in_flight == 0 and wants > 0 else 0
    return [((0, member.remaining), name, first), ((1, member.remaining), name, wants - first)]


def _load(raw: bytes) -> _ServerRecord:
    if not raw:
        return _ServerRecord()
    stored = orjson.loads(raw)
    members = {
        name: _Member(**member)
        for name, member in stored.get("members", {}).items()
        if _alive(member["pid"], member.get("start", ""))
    }
    return _ServerRecord(members, stored.get("set_aside_reason"), stored.get("set_aside_by"))


_liveness: dict[tuple[int, str], tuple[bool, float]] = {}
_LIVENESS_TTL_S = 1.0  # looking a process up costs more than the rest of an admission: once a second is enough


def _alive(pid: int, start: str) -> bool:
    _, my_pid, my_start = this_process()
    if pid == my_pid and start in ("", my_start):
        return True
    now = time.monotonic()
    known = _liveness.get((pid, start))
    if known is None or now - known[1] > _LIVENESS_TTL_S:
        known = _liveness[(pid, start)] = (live_process(pid, start) is not None, now)
    return known[0]
