"""What a running shard tells the outside world while it generates.

* every few seconds, its `Heartbeat` to `<store>/progress/shard=NNNNN.json` (read by `status`);
* every minute or so, a copy of its journal to `<store>/progress/journal/...`, so a run resumed on another
  node loses at most that minute of work;
* at a slower pace, a progress line for Dagster's logs (each one is a database write).

A store hiccup never stops generation: it is counted (`upload_failures`) and shown by `status`.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dagster_project.generation.journal import Journal
from dagster_project.generation.progress import Heartbeat
from dagster_project.store.dataclass_json import from_json, to_json
from dagster_project.store.layout import PROGRESS, SHARD_DIGITS, progress_key
from dagster_project.store.storage import Store, StoreError

HEARTBEATS_PREFIX = PROGRESS + "/shard="


def journal_checkpoint_key(shard: int, fingerprint: str) -> str:
    return f"{PROGRESS}/journal/shard={shard:0{SHARD_DIGITS}d}/{fingerprint}.jsonl"


def read_heartbeats(store: Store) -> list[Heartbeat]:
    """The last heartbeat of every shard run that reported, running or not."""
    return [
        from_json(Heartbeat, store.get_bytes(info.key))
        for info in store.list(HEARTBEATS_PREFIX)
        if info.key.endswith(".json")
    ]


def restore_journal(store: Store, shard: int, fingerprint: str, local_path: Path) -> bool:
    """Seed a missing local journal from the store's checkpoint (a resume on another node)."""
    key = journal_checkpoint_key(shard, fingerprint)
    if local_path.exists() or not store.exists(key):
        return False
    store.download(key, local_path)
    return True


@dataclass(frozen=True)
class ReportIntervals:
    """How often a running shard reports (the `completions` op config)."""

    heartbeat_interval_s: float = field(
        default=5.0, metadata={"help": "Progress snapshot to the store (read by `dflash status`)."}
    )
    checkpoint_interval_s: float = field(
        default=60.0, metadata={"help": "Journal copy to the store: a resume on another node loses at most this."}
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
    upload_failures: int = field(default=0, init=False)
    _checkpointed_size: int = field(default=-1, init=False)

    def report(self) -> Heartbeat:
        return replace(self.snapshot(), upload_failures=self.upload_failures)

    def _put_heartbeat(self, heartbeat: Heartbeat) -> None:
        self.store.put_bytes(progress_key(self.shard), to_json(heartbeat))

    def _checkpoint(self, copy: Path) -> None:
        self.store.put_file(journal_checkpoint_key(self.shard, self.fingerprint), copy)

    async def _guarded(self, what: str, call: Callable[..., None], *args: Any) -> None:
        # Store writes are blocking I/O: keep them off the event loop that feeds the fleet.
        try:
            await asyncio.to_thread(call, *args)
        except (StoreError, OSError) as exc:
            self.upload_failures += 1
            self.log(f"{what} of shard {self.shard} failed (generation goes on): {exc}")

    async def checkpoint_journal(self) -> None:
        self.journal.sync()
        size = self.journal.path.stat().st_size
        if size == self._checkpointed_size:
            return
        with tempfile.TemporaryDirectory(prefix="dflash-journal-") as tmp:
            # A frozen copy: the journal keeps growing while the upload runs, and the upload is verified.
            copy = Path(tmp) / self.journal.path.name
            shutil.copyfile(self.journal.path, copy)
            await self._guarded("journal checkpoint", self._checkpoint, copy)
        self._checkpointed_size = size

    async def beat(self) -> None:
        await self._guarded("heartbeat", self._put_heartbeat, self.report())

    async def run(self) -> None:
        """Until cancelled: heartbeats, journal checkpoints and progress logs, each at its own pace."""
        last_checkpoint = last_log = time.monotonic()
        while True:
            await self.beat()
            now = time.monotonic()
            if now - last_checkpoint >= self.intervals.checkpoint_interval_s:
                await self.checkpoint_journal()
                last_checkpoint = now
            if self.on_progress is not None and now - last_log >= self.intervals.log_interval_s:
                self.on_progress(self.report())
                last_log = now
            await asyncio.sleep(self.intervals.heartbeat_interval_s)
