"""A killed shard run is shown dead, not running, within one heartbeat interval after its process is gone.

On the host that ran it, `status` looks for the process its heartbeat names (pid and start time); elsewhere
it counts missed heartbeats (two intervals, as recorded in the heartbeat).
"""

from __future__ import annotations

import subprocess
import sys
import time

from dagster_project.generation.heartbeat import MISSED_BEATS, run_is_alive
from dagster_project.ops.status import collect_status, render_text
from dagster_project.processes import process_start, this_process
from dagster_project.store.dataclass_json import to_json
from dagster_project.store.layout import progress_key
from dagster_project.store.storage import LocalStore
from tests.support.heartbeats import heartbeat as run_heartbeat

HOST, PID, STARTED = this_process()
INTERVAL_S = 5.0


def heartbeat(shard: int, *, host: str, pid: int, start: str, updated_at: float, state="running"):
    return run_heartbeat(
        shard,
        state=state,
        updated_at=updated_at,
        host=host,
        pid=pid,
        process_start=start,
        run_id=f"run-{shard}",
        heartbeat_interval_s=INTERVAL_S,
    )


def gone_process() -> tuple[int, str]:
    """The pid and start mark of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    started = process_start(child.pid)
    child.wait()
    return child.pid, started


def test_on_this_host_a_run_is_dead_as_soon_as_its_process_is_gone():
    now = time.time()
    pid, started = gone_process()
    assert run_is_alive(heartbeat(0, host=HOST, pid=PID, start=STARTED, updated_at=now), now)
    assert not run_is_alive(heartbeat(0, host=HOST, pid=pid, start=started, updated_at=now), now)
    # The pid handed to a later process (here: this one) does not bring the run back to life.
    assert not run_is_alive(heartbeat(0, host=HOST, pid=PID, start=started, updated_at=now), now)


def test_elsewhere_a_run_is_dead_after_two_missed_heartbeats():
    now = time.time()
    limit = MISSED_BEATS * INTERVAL_S
    beat = heartbeat(0, host="another-node", pid=1, start="", updated_at=now - limit + 1)
    assert run_is_alive(beat, now)
    assert not run_is_alive(heartbeat(0, host="another-node", pid=1, start="", updated_at=now - limit - 1), now)
    assert not run_is_alive(heartbeat(0, host=HOST, pid=PID, start=STARTED, updated_at=now, state="failed"), now)


def test_status_shows_killed_runs_dead_and_live_ones_running(tmp_path):
    store = LocalStore(tmp_path / "store")
    now = time.time()
    pid, started = gone_process()
    beats = [
        heartbeat(0, host=HOST, pid=PID, start=STARTED, updated_at=now),  # this process: alive
        heartbeat(1, host=HOST, pid=pid, start=started, updated_at=now),  # killed a moment ago
        heartbeat(2, host="another-node", pid=7, start="", updated_at=now - 3 * INTERVAL_S),
    ]
    for beat in beats:
        store.put_bytes(progress_key(beat.shard), to_json(beat))

    status = collect_status(store, [], now=now)
    assert status.progress.shards_running == [0]
    assert status.progress.shards_dead == [1, 2]
    assert [(d.run_id, d.process_checked) for d in status.progress.dead_runs] == [("run-1", True), ("run-2", False)]
    assert status.progress.events_done == 4  # only the live run's events count as in progress
    text = render_text(status)
    assert f"DEAD: shard 1 (run run-1, {HOST} pid {pid}): its process is gone" in text
    assert "DEAD: shard 2 (run run-2, another-node pid 7): no heartbeat for 15 s" in text
