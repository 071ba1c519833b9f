"""One writer per shard in `generate_shard`: the lease is taken before the journal is opened, renewed while the
shard runs and once more before publishing, and a run that lost it stops without publishing.

The dispatcher here is a stand-in that ends every request at once (as an error, which is a final record), so
these tests exercise the shard driver alone; tests/integration/test_shard_operations.py runs two real shard
runs of one shard against simulator processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import pytest

from dagster_project.generation.dispatch import Outcome
from dagster_project.generation.heartbeat import ReportIntervals
from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.shards import read_completions_manifest
from dagster_project.generation.stage import generate_shard, journal_path
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops.status import collect_status
from dagster_project.sglang.client import SGLangError
from dagster_project.store.dataclass_json import read_record
from dagster_project.store.layout import COMPLETIONS, lease_key, progress_key
from dagster_project.store.lease import Lease, LeaseHeld, LeaseLost, LeaseOptions
from dagster_project.store.storage import LocalStore, StoreError
from tests.support.ingest_helpers import run_stages

SETTINGS = GenerationSettings()
KEY = lease_key(COMPLETIONS, 0)


class InstantDispatcher:
    """Ends every request at once with an error; `then` runs when all have ended, `hang` keeps it running."""

    endpoints: list[str] = []  # no server to check before dispatching
    api_key = None

    def __init__(self, then=lambda: None, hang: bool = False):
        self.then, self.hang, self.requests = then, hang, 0

    async def run(self, requests, on_outcome, remaining=None) -> None:
        pending = list(requests)
        while pending:
            request = pending.pop()
            self.requests += 1
            error = SGLangError("bad_request", "refused by the stand-in")
            pending += on_outcome(Outcome(request, None, error, "stand-in", 1, 0.0)) or []
        self.then()
        if self.hang:
            await asyncio.sleep(30)
            raise AssertionError("generation was not stopped")

    def snapshot(self) -> dict:
        return {"servers": {}}


@pytest.fixture
def store(tmp_path):
    source = tmp_path / "prompts.jsonl"
    with open(source, "w") as handle:
        for i in range(5):
            handle.write(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": f"Question {i}?"}]}))
            handle.write("\n")
    return run_stages(tmp_path, [str(source)], num_shards=1).store


def generate(store, tmp_path, tokenizer, dispatcher, **options):
    return generate_shard(
        store, 0, tokenizer=tokenizer, settings=SETTINGS, dispatcher=dispatcher, work_dir=tmp_path / "work", **options
    )


def take_over(store) -> Lease:
    """Another node, whose clock says the lease has expired, takes it over."""
    return Lease(store, KEY, "node-b pid 2 run other", clock=lambda: time.time() + 10_000).acquire()


def test_a_held_shard_refuses_at_once_naming_the_holder_before_its_journal_is_opened(store, tmp_path, tokenizer):
    dispatcher = InstantDispatcher()
    with Lease(store, KEY, "node-a pid 1 run first"):
        with pytest.raises(LeaseHeld, match="held by node-a pid 1 run first .*lease_wait_s"):
            generate(store, tmp_path, tokenizer, dispatcher)
    assert dispatcher.requests == 0 and read_completions_manifest(store, 0) is None
    assert not journal_path(tmp_path / "work", 0, SETTINGS.fingerprint()).exists()

    # Released: the shard runs, its heartbeat naming the process and run, and the lease is given back.
    manifest = generate(store, tmp_path, tokenizer, dispatcher, run_id="run-2")
    assert manifest.rows == 5 and read_completions_manifest(store, 0) == manifest
    beat = read_record(store, progress_key(0), Heartbeat)
    assert (beat.pid, beat.run_id, beat.heartbeat_interval_s) == (os.getpid(), "run-2", 5.0) and beat.host
    Lease(store, KEY, "node-c pid 3").acquire()  # free again


class HolderFinishesOnFirstRefusal(LocalStore):
    """The store as the waiting run sees it: the holder finishes (releases the lease) once the waiting run has read
    the lease and been refused, whatever the clock says, so the wait is for an event, not for a timer."""

    def __init__(self, root, holder: Lease):
        super().__init__(root)
        self.holder, self.lease_reads = holder, 0

    def get_versioned(self, key):
        current = super().get_versioned(key)
        if key == KEY:
            self.lease_reads += 1
            if self.lease_reads == 2:  # the first read refused the waiter; the holder finishes before its second
                self.holder.release()
                current = super().get_versioned(key)
        return current


def test_a_run_may_wait_for_the_holder_to_finish(store, tmp_path, tokenizer):
    holder = Lease(store, KEY, "node-a pid 1 run first").acquire()
    waiting = HolderFinishesOnFirstRefusal(store.root, holder)
    manifest = generate(waiting, tmp_path, tokenizer, InstantDispatcher(), lease=LeaseOptions(lease_wait_s=5))
    assert read_completions_manifest(store, 0) == manifest and waiting.lease_reads >= 2


def test_a_run_whose_lease_was_taken_over_does_not_publish(store, tmp_path, tokenizer):
    dispatcher = InstantDispatcher(then=lambda: take_over(store))
    with pytest.raises(LeaseLost, match="now held by node-b pid 2 run other.*without publishing"):
        generate(store, tmp_path, tokenizer, dispatcher)
    assert dispatcher.requests == 5 and read_completions_manifest(store, 0) is None


def test_a_lease_lost_while_generating_stops_the_run_at_once(store, tmp_path, tokenizer):
    dispatcher = InstantDispatcher(then=lambda: take_over(store), hang=True)  # hangs 30 s unless stopped
    with pytest.raises(LeaseLost, match="now held by node-b"):
        generate(
            store,
            tmp_path,
            tokenizer,
            dispatcher,
            # Renewed at every checkpoint (0.02 s) of a lease that cannot expire during the test (the default 300 s):
            # the run loses it only by the take-over, never by a busy machine delaying a renewal past a short TTL.
            intervals=ReportIntervals(heartbeat_interval_s=0.02, checkpoint_interval_s=0.02),
        )
    assert read_completions_manifest(store, 0) is None
    # The fenced run wrote nothing more for the shard: the last heartbeat is still one of a running shard.
    assert read_record(store, progress_key(0), Heartbeat).state == "running"


class FullDiskStore(LocalStore):
    """A store whose data uploads fail as a full disk fails them (`LocalStore` names the path and the errno)."""

    def put_file(self, key, path, *, synced=True):
        if key.endswith(".parquet"):
            raise StoreError(f"writing {self._path(key)} failed: [Errno 28] No space left on device")
        return super().put_file(key, path, synced=synced)


def test_a_run_that_fails_cleanly_after_generating_is_shown_failed_not_dead(store, tmp_path, tokenizer):
    full = FullDiskStore(store.root)
    with pytest.raises(StoreError, match="No space left on device"):
        generate(full, tmp_path, tokenizer, InstantDispatcher(), run_id="run-full")
    beat = read_record(store, progress_key(0), Heartbeat)
    assert (beat.state, beat.run_id, beat.pid) == ("failed", "run-full", os.getpid())
    status = collect_status(store, [])
    assert status.progress.shards_failed == [0] and status.progress.shards_dead == []
    assert status.shards.completions == {"failed": 1}
    shard_alerts = [alert.message for alert in status.alerts if alert.kind == "shards"]
    assert shard_alerts == ["shard runs failed and unpublished: [0]"]  # not "shard runs killed, not running"
