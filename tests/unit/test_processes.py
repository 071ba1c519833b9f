"""A process is told from a later one given its pid by a start mark that a wall-clock step does not move."""

import os
import subprocess
import sys
from pathlib import Path

import orjson
import psutil
import pytest

from dagster_project.generation.heartbeat import run_is_alive
from dagster_project.processes import live_process, process_start, this_process
from dagster_project.store.lease import LeaseRecord
from tests.support.heartbeats import heartbeat

linux_only = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="the start mark in ticks is Linux's")


@linux_only
def test_a_clock_step_leaves_a_live_run_alive_and_its_lease_held(monkeypatch):
    host, pid, start = this_process()
    beat = heartbeat(0, host=host, pid=pid, process_start=start, heartbeat_interval_s=5.0)
    lease = LeaseRecord("me", 1, 0.0, 1e12, host, pid, start)
    before = psutil.Process(pid).create_time()

    # What NTP stepping the clock 5 s does to the boot time the kernel reports (wall clock minus uptime).
    stepped = psutil._pslinux.boot_time() + 5.0
    monkeypatch.setattr(psutil._pslinux, "boot_time", lambda: stepped)
    assert psutil.Process(pid).create_time() == pytest.approx(before + 5.0)  # psutil's start time moved with it

    assert process_start(pid) == start
    assert run_is_alive(beat, now=0.0)
    assert not lease.holder_died_here()


@linux_only
def test_the_start_mark_is_read_past_a_command_name_with_spaces_and_parentheses():
    child = subprocess.Popen(
        [sys.executable, "-c", "open('/proc/self/comm', 'w').write('a) b (c'); print(flush=True); input()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        child.stdout.readline()  # the name is set
        assert psutil.Process(child.pid).name() == "a) b (c"
        ticks = int(process_start(child.pid).rsplit(" ", 1)[1])
        since_boot = psutil.Process(child.pid).create_time() - psutil.boot_time()
        assert ticks / os.sysconf("SC_CLK_TCK") == pytest.approx(since_boot, abs=0.02)
        assert live_process(child.pid, process_start(child.pid)).pid == child.pid
    finally:
        child.kill()
        child.wait()
    assert live_process(child.pid, "") is None
    with pytest.raises(psutil.NoSuchProcess):
        process_start(child.pid)


def test_a_forked_child_names_itself_not_its_parent():
    parent = this_process()
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # the child: report what it calls itself, then leave without running the parent's cleanup
        os.write(writer, orjson.dumps(this_process()))
        os._exit(0)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        host, pid, start = orjson.loads(pipe.read())
    os.waitpid(child, 0)
    assert (host, pid) == (parent[0], child) and start != parent[2]
