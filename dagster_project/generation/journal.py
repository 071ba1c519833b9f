"""Per-shard journal of finished generation events: the resume point of a killed run.

One JSON object per line, appended and flushed as each event finishes, so a SIGKILL loses at most the
line being written. On open, a torn last line (no newline, or not valid JSON) is cut off; damage
anywhere else is an error, because silently skipping a line could lose or repeat a generation.

The journal is keyed by event id. A result is final. An error is final unless it is retryable, in which
case a later run may try that event again and a later record for it supersedes the error.

One process at a time: opening takes an exclusive lock (`<journal>.lock`, which names its holder), so a
second run of the same shard on this host refuses instead of appending its own lines in between.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from dagster_project.records import STATUS_OK


class JournalCorrupt(RuntimeError):
    pass


class JournalBusy(RuntimeError):
    """Another live process has the journal open."""


class JournalWriteFailed(OSError):
    """Writing the journal failed (a full disk, a quota): the message names the journal and its disk's free space."""


def _write_failed(path: Path, doing: str, exc: OSError) -> JournalWriteFailed:
    try:
        usage = shutil.disk_usage(path.parent)
        room = f"{_size(usage.free)} free of {_size(usage.total)} on its file system"
    except OSError:
        room = "its file system's free space unknown"
    # One argument: OSError's own text would be "[Errno N] ...: 'path'", without the free space (the cause
    # keeps its errno).
    return JournalWriteFailed(
        f"{doing} the journal {path} failed: [Errno {exc.errno}] {exc.strerror or exc}; {room}. The journal keeps "
        "every answer written before this one (a rerun resumes from it): free space in the work directory "
        "(DFLASH_WORK_DIR) or point it at a larger disk, then rerun the shard"
    )


def _size(count: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:,.0f} {unit}" if unit == "B" else f"{count:,.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class JournalEntry:
    """What resuming needs to know about one finished event, without its token arrays."""

    line: int
    status: str
    retryable: bool
    finish_reason: str | None
    # Its prompt's and answer's tokens: with the settings, whether fit cut it (`GenerationSettings.cut_by_fit`).
    prompt_tokens: int
    completion_tokens: int
    # The visible answer (and reasoning) of a turn that later turns of its conversation build on.
    history_message: dict[str, str] | None

    @property
    def final(self) -> bool:
        return self.status == STATUS_OK or not self.retryable


class Journal:
    def __init__(self, path: Path, *, fsync_every: int = 64):
        self.path = path
        self.fsync_every = fsync_every
        self.entries: dict[str, JournalEntry] = {}
        self.torn_bytes_dropped = 0
        self._lines = 0
        self._unsynced = 0
        self._failed_before = False  # a write failed and was raised (`close` does not raise it again)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = _lock_exclusively(path.with_name(path.name + ".lock"))
        try:
            self._recover()
            self._handle = open(path, "ab")
        except BaseException:
            self._lock.close()
            raise

    def _recover(self) -> None:
        if not self.path.exists():
            return
        good_end = 0
        with open(self.path, "rb") as handle:
            for number, raw in enumerate(handle):
                try:
                    if not raw.endswith(b"\n"):
                        raise ValueError("unterminated line")
                    record = orjson.loads(raw)
                except ValueError:
                    rest = handle.read()
                    if rest.strip():
                        raise JournalCorrupt(
                            f"{self.path}: line {number + 1} is damaged and is not the last line; "
                            "refusing to guess which generations it held"
                        ) from None
                    self.torn_bytes_dropped = len(raw) + len(rest)
                    break
                self._index(number, record)
                good_end += len(raw)
                self._lines = number + 1
        if self.torn_bytes_dropped:
            with open(self.path, "r+b") as handle:
                handle.truncate(good_end)

    def _index(self, line: int, record: dict[str, Any]) -> None:
        event_id = record["event_id"]
        previous = self.entries.get(event_id)
        if previous is not None and previous.final:
            return  # first final record wins; a later duplicate can only be a late answer
        self.entries[event_id] = JournalEntry(
            line=line,
            status=record["status"],
            retryable=bool(record.get("retryable")),
            finish_reason=record.get("finish_reason"),
            prompt_tokens=int(record.get("prompt_tokens") or 0),
            completion_tokens=int(record.get("completion_tokens") or 0),
            history_message=record.get("history_message"),
        )

    def is_final(self, event_id: str) -> bool:
        entry = self.entries.get(event_id)
        return entry is not None and entry.final

    def append(self, record: dict[str, Any]) -> bool:
        """Record a finished event; returns False (and writes nothing) if it already has a final record."""
        if self.is_final(record["event_id"]):
            return False
        try:
            self._handle.write(orjson.dumps(record) + b"\n")
            self._handle.flush()  # in the kernel now: survives a SIGKILL of this process
        except OSError as exc:
            raise self._failure("appending to", exc) from exc
        self._unsynced += 1
        if self._unsynced >= self.fsync_every:
            self.sync()
        self._index(self._lines, record)
        self._lines += 1
        return True

    def sync(self) -> None:
        """fsync: also survive a crash of the machine."""
        if self._unsynced:
            try:
                os.fsync(self._handle.fileno())
            except OSError as exc:
                raise self._failure("syncing", exc) from exc
            self._unsynced = 0

    def _failure(self, doing: str, exc: OSError) -> JournalWriteFailed:
        self._failed_before = True
        return _write_failed(self.path, doing, exc)

    def close(self) -> None:
        failed_before = self._failed_before
        try:
            self.sync()
            try:
                self._handle.close()  # flushes what is buffered
            except OSError as exc:
                raise self._failure("closing", exc) from exc
        except JournalWriteFailed:
            if not failed_before:
                raise  # after a failure raised already, its leftover bytes fail again: not raised twice
        finally:
            with contextlib.suppress(OSError):
                self._handle.close()  # closed already, unless a failure left bytes it cannot write: dropped
            self._lock.close()  # closing the descriptor releases the lock

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def final_records(self) -> Iterator[dict[str, Any]]:
        """The record that stands for each event, streamed from disk in journal order."""
        wanted = {entry.line for entry in self.entries.values()}
        self.sync()
        with open(self.path, "rb") as handle:
            for number, raw in enumerate(handle):
                if number in wanted:
                    yield orjson.loads(raw)


@dataclass(frozen=True)
class DroppedRecords:
    """Records a release condemned: how many, and the output tokens their answers had cost."""

    records: int = 0
    output_tokens: int = 0


def drop_records_between(path: Path, since: float, until: float) -> DroppedRecords:
    """Rewrite the journal at `path` (not open) without the records that finished in [since, until): answers a hold
    condemned (`line_stop.condemned_answers`), generated again by the next run. A torn last line goes too. Returns
    what was dropped. The window is a span of time, so a conversation loses a suffix of its turns: every later turn
    kept was written before the window, on the turns before it."""
    if not path.exists():
        return DroppedRecords()
    kept, dropped, tokens = bytearray(), 0, 0
    with open(path, "rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                continue  # a torn last line: dropped as opening the journal would
            try:
                record = orjson.loads(raw)
            except ValueError:
                record = {}
            finished = record.get("finished_at")
            if finished is not None and since <= finished < until:
                dropped += 1
                tokens += int(record.get("completion_tokens") or 0) if record.get("status") == STATUS_OK else 0
                continue
            kept += raw
    if dropped:
        staging = path.with_name(f".{path.name}.dropping")
        staging.write_bytes(bytes(kept))
        os.replace(staging, path)
    return DroppedRecords(dropped, tokens)


def _lock_exclusively(lock_path: Path):
    """An open lock file holding an exclusive lock, with this process's pid in it; `JournalBusy` if taken."""
    handle = open(lock_path, "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "another process"
        handle.close()
        raise JournalBusy(
            f"{lock_path.with_suffix('')} is in use by {holder}: that shard is already running here"
        ) from None
    handle.truncate(0)
    handle.write(f"pid {os.getpid()}\n")
    handle.flush()
    return handle
