"""One writer per shard: leases taken, refused, expired, fenced and raced, on a local store (on S3: test_lease_s3)."""

import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict

import orjson
import pytest

from dagster_project.processes import process_start
from dagster_project.store.lease import Lease, LeaseHeld, LeaseLost, LeaseRecord
from dagster_project.store.storage import LocalStore

KEY = "leases/completions/shard=00003.json"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


# The same tests run on S3 (the moto server) in tests/integration/test_lease_s3.py.
@pytest.fixture
def store(tmp_path):
    return LocalStore(tmp_path / "store")


def test_a_live_lease_refuses_a_second_writer_naming_the_holder(store):
    clock = Clock()
    with Lease(store, KEY, "node-a pid 1", clock=clock):
        with pytest.raises(LeaseHeld, match="held by node-a pid 1 \\(lease #1"):
            Lease(store, KEY, "node-b pid 2", clock=clock).acquire()
    # Released: the next writer takes it at once, with the next fencing token.
    assert Lease(store, KEY, "node-b pid 2", clock=clock).acquire().record.token == 2


def test_an_expired_lease_is_taken_over_and_the_paused_writer_is_fenced_off(store):
    clock = Clock()
    old = Lease(store, KEY, "node-a pid 1", ttl_s=60, clock=clock).acquire()
    old.renew()
    clock.now += 61  # node-a paused past its expiry
    new = Lease(store, KEY, "node-b pid 2", ttl_s=60, clock=clock).acquire()
    assert new.record.token == 2
    with pytest.raises(LeaseLost, match="now held by node-b pid 2"):
        old.renew()
    old.release()  # a lost lease is left alone
    new.renew()
    with pytest.raises(LeaseHeld, match="node-b"):
        Lease(store, KEY, "node-c pid 3", clock=clock).acquire()


def test_racing_writers_get_exactly_one_lease(store):
    start = threading.Barrier(8)

    def contend(index: int) -> bool:
        start.wait()
        try:
            Lease(store, KEY, f"node-{index}").acquire()
        except LeaseHeld:
            return False
        return True

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(contend, range(8))) == 1


def test_a_waiting_writer_takes_the_lease_when_the_holder_releases_it(store):
    holder = Lease(store, KEY, "node-a").acquire()
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(Lease(store, KEY, "node-b").acquire, 30.0, 0.05)
        holder.release()
        assert waiting.result(timeout=30).record.holder == "node-b"


def test_a_lease_whose_holder_died_on_this_host_is_taken_over_at_once(store):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_start(child.pid)
    child.wait()  # killed, say: it never released its lease

    def held_by(host: str) -> None:
        now = time.time()
        record = LeaseRecord(f"{host} pid {child.pid}", 4, now, now + 300, host, child.pid, started)
        store.put_bytes(KEY, orjson.dumps(asdict(record)))

    held_by("another-node")  # its process cannot be looked for from here: the lease stands until it expires
    with pytest.raises(LeaseHeld, match="held by another-node"):
        Lease(store, KEY, "node-b pid 2").acquire()
    held_by(socket.gethostname())
    assert Lease(store, KEY, "node-b pid 2").acquire().record.token == 5
