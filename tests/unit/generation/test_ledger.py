"""The node's shared ledger: one in-flight budget per server across runs, the nearest-to-done run first,
dead runs' slots reclaimed, and one verdict per server for every run."""

import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor

import orjson

from dagster_project.generation.ledger import WANT_TTL_S, FleetLedger, split_followed
from dagster_project.processes import process_start

SERVER = "http://127.0.0.1:30000"


def test_runs_share_one_budget_per_server(tmp_path):
    a, b = FleetLedger(tmp_path, "a"), FleetLedger(tmp_path, "b")
    assert a.acquire(SERVER, 8, limit=10) == 8
    assert b.acquire(SERVER, 5, limit=10) == 2
    assert a.acquire("http://other:1", 10, limit=10) == 10  # another server has its own budget
    a.release(SERVER, 3)
    assert b.acquire(SERVER, 3, limit=10) == 3
    assert a.in_flight(SERVER) == 10


def test_the_run_closest_to_its_end_gets_freed_slots_first(tmp_path):
    long_run, short_run = FleetLedger(tmp_path, "long"), FleetLedger(tmp_path, "short")
    long_run.remaining, short_run.remaining = 1000, 5
    assert long_run.acquire(SERVER, 10, limit=10) == 10
    assert short_run.acquire(SERVER, 4, limit=10) == 0  # full: its wish is recorded
    long_run.release(SERVER, 2)
    assert long_run.acquire(SERVER, 2, limit=10) == 0  # the short run is ahead
    assert short_run.acquire(SERVER, 4, limit=10) == 2


def test_a_wish_not_renewed_stops_holding_others_back(tmp_path, monkeypatch):
    long_run, short_run = FleetLedger(tmp_path, "long"), FleetLedger(tmp_path, "short")
    long_run.remaining, short_run.remaining = 1000, 5
    assert long_run.acquire(SERVER, 10, limit=10) == 10
    assert short_run.acquire(SERVER, 1, limit=10) == 0
    long_run.release(SERVER, 1)
    clock = time.monotonic() + WANT_TTL_S + 1
    monkeypatch.setattr("dagster_project.generation.ledger.time.monotonic", lambda: clock)
    assert long_run.acquire(SERVER, 1, limit=10) == 1


def test_slots_of_a_dead_run_are_reclaimed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    ledger = FleetLedger(tmp_path, "alive")
    assert ledger.acquire(SERVER, 1, limit=10) == 1
    path = ledger._path(SERVER)
    record = orjson.loads(path.read_bytes())
    record["members"]["killed"] = {"pid": dead_pid, "in_flight": 9, "remaining": 1, "wants": 5, "wants_at": 0.0}
    path.write_bytes(orjson.dumps(record))
    assert ledger.acquire(SERVER, 9, limit=10) == 9


def test_slots_of_a_dead_run_whose_pid_went_to_a_later_process_are_reclaimed(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_start = process_start(dead.pid)
    dead.wait()
    with subprocess.Popen([sys.executable, "-c", "input()"], stdin=subprocess.PIPE) as later:
        ledger = FleetLedger(tmp_path, "alive")
        assert ledger.acquire(SERVER, 1, limit=10) == 1
        path = ledger._path(SERVER)
        record = orjson.loads(path.read_bytes())
        member = {"in_flight": 4, "remaining": 1, "wants": 0, "wants_at": 0.0}
        record["members"]["running"] = {**member, "pid": later.pid, "start": process_start(later.pid)}
        record["members"]["killed"] = {**member, "pid": later.pid, "start": dead_start}  # its pid, reused
        path.write_bytes(orjson.dumps(record))
        assert ledger.acquire(SERVER, 9, limit=10) == 5  # the killed run's 4 are free, the running one's are not
        later.communicate(b"\n")


def test_leaving_returns_the_slots(tmp_path):
    a, b = FleetLedger(tmp_path, "a"), FleetLedger(tmp_path, "b")
    assert a.acquire(SERVER, 10, limit=10) == 10
    a.leave([SERVER])
    assert b.acquire(SERVER, 10, limit=10) == 10


def test_a_server_set_aside_by_one_run_is_set_aside_for_all(tmp_path):
    a, b = FleetLedger(tmp_path, "a"), FleetLedger(tmp_path, "b")
    assert b.verdict(SERVER) is None
    a.set_aside(SERVER, "bad_response")
    verdict = b.verdict(SERVER)
    assert verdict is not None and verdict.reason == "bad_response" and verdict.by == "a"
    b.clear(SERVER)
    assert a.verdict(SERVER) is None


def test_the_reason_a_following_run_gives_reads_back_as_the_verdicts_reason_and_who_set_it_aside(tmp_path):
    """`status` says the reason once, then who set the server aside (not "bad_response; bad_response (set aside by
    a)" for two runs, one its finder, one following it)."""
    a, b = FleetLedger(tmp_path, "24214-7f3a"), FleetLedger(tmp_path, "b")
    a.set_aside(SERVER, "bad_response")
    verdict = b.verdict(SERVER)
    assert verdict is not None and split_followed(verdict.followed()) == ("bad_response", "24214-7f3a")
    # A run's own reason, a re-probe's note included, is its own.
    for own in ("bad_response", "answers_trickling (re-probe: timeout)"):
        assert split_followed(own) == (own, "")


def _grab(directory: str, member: str) -> int:
    return FleetLedger(directory, member).acquire(SERVER, 10, limit=10)


def test_processes_racing_for_slots_never_exceed_the_budget(tmp_path):
    with ProcessPoolExecutor(4) as pool:
        grants = list(pool.map(_grab, [str(tmp_path)] * 4, ["p0", "p1", "p2", "p3"]))
    assert sum(grants) == 10


def test_a_run_with_nothing_in_flight_gets_a_freed_slot_before_others_get_more(tmp_path):
    """A new run (it holds a pool slot) must not wait, idle, until the run nearer its end stops wanting more."""
    near_end, new = FleetLedger(tmp_path, "near_end"), FleetLedger(tmp_path, "new")
    near_end.remaining, new.remaining = 50, 1000
    assert near_end.acquire(SERVER, 20, limit=10) == 10  # full, and wanting more
    assert new.acquire(SERVER, 10, limit=10) == 0
    near_end.release(SERVER, 2)
    assert near_end.acquire(SERVER, 12, limit=10) == 1  # the new run's first slot comes first
    assert new.acquire(SERVER, 10, limit=10) == 1  # it generates
    near_end.release(SERVER, 1)
    assert new.acquire(SERVER, 9, limit=10) == 0  # beyond its first slot, the nearest to its end goes first
    assert near_end.acquire(SERVER, 12, limit=10) == 1
