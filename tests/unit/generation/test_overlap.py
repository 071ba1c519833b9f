"""A range run's shards, a few at once (`generation.overlap`): the next one starts while the current one still
works, never more than `at_once` work together, and a failure stops new starts without losing finished work."""

from __future__ import annotations

import threading

import pytest

from dagster_project.generation.overlap import overlapped

WAIT_S = 10.0  # an Event that is never set fails the test after this long instead of hanging it


class Shards:
    """Work on shards that records how many work at once; `gates` hold a shard until its event is set."""

    def __init__(self, gates: dict[int, threading.Event] | None = None, fail: int | None = None):
        self.gates = gates or {}
        self.fail = fail
        self.started = {shard: threading.Event() for shard in range(10)}
        self.lock = threading.Lock()
        self.working = self.most_at_once = 0
        self.threads: set[str] = set()

    def __call__(self, shard: int) -> str:
        with self.lock:
            self.working += 1
            self.most_at_once = max(self.most_at_once, self.working)
            self.threads.add(threading.current_thread().name)
        self.started[shard].set()
        try:
            if shard in self.gates and not self.gates[shard].wait(WAIT_S):
                raise TimeoutError(f"shard {shard} was held and never let go")
            if shard == self.fail:
                raise RuntimeError(f"shard {shard} failed")
            return f"published {shard}"
        finally:
            with self.lock:
                self.working -= 1


def test_the_next_shard_starts_while_the_current_one_is_still_working():
    # Shard 0 ends only once shard 1 has started: one after another, shard 0 would wait in vain.
    shards = Shards()
    shards.gates[0] = shards.started[1]
    done, error = overlapped([0, 1, 2, 3], shards, at_once=2)
    assert error is None
    assert done == [(shard, f"published {shard}") for shard in range(4)]  # in the range's order
    assert shards.most_at_once == 2


def test_no_more_than_at_once_shards_work_together():
    shards = Shards()
    release = threading.Event()
    shards.gates = {0: release, 1: release}
    worker = threading.Thread(target=lambda: overlapped(list(range(5)), shards, at_once=2))
    worker.start()
    assert shards.started[0].wait(WAIT_S) and shards.started[1].wait(WAIT_S)
    assert not shards.started[2].is_set()  # two are held: the third waits for one of them
    release.set()
    worker.join(WAIT_S)
    assert not worker.is_alive()
    assert shards.most_at_once == 2


def test_a_failed_shard_stops_new_starts_and_the_shard_beside_it_still_counts():
    # Shard 1 works beside shard 0 and is let go once shard 0's thread has ended (its failure handed over
    # first): shard 1 is published and returned; 2 and 3 never start.
    shard_0_over = threading.Event()
    shards = Shards(gates={1: shard_0_over}, fail=0)

    def work(shard: int) -> str:
        if shard == 0:
            thread = threading.current_thread()
            threading.Thread(target=lambda: (thread.join(), shard_0_over.set())).start()
        return shards(shard)

    done, error = overlapped([0, 1, 2, 3], work, at_once=2)
    assert isinstance(error, RuntimeError) and "shard 0 failed" in str(error)
    assert done == [(1, "published 1")]
    assert not shards.started[2].is_set() and not shards.started[3].is_set()


def test_one_at_a_time_works_in_the_callers_thread_and_stops_at_the_first_failure():
    shards = Shards(fail=1)
    done, error = overlapped([0, 1, 2], shards, at_once=1)
    assert done == [(0, "published 0")] and isinstance(error, RuntimeError)
    assert shards.threads == {threading.current_thread().name}
    assert not shards.started[2].is_set()


def test_at_once_below_one_is_refused():
    with pytest.raises(ValueError, match="at_once"):
        overlapped([0], Shards(), at_once=0)
