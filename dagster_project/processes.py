"""Which process is which, on this host: a pid plus a start mark that no later process given the same pid has.

The start mark must not move while the process lives. psutil's `create_time()` does not qualify: on Linux it is
the process's start in ticks since boot plus the boot time *as the wall clock tells it now*, so after the clock
is stepped (NTP correcting a drifted clock, a virtual machine resumed from a snapshot) a live process no longer
matches its own record and looks dead: a status page would call a running shard dead, and a lease would be
taken from a live writer. On Linux the mark is the boot the process runs in and its start in ticks since that
boot, read from `/proc`; elsewhere it is the start time the kernel recorded when the process began.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

import psutil

PROC = Path("/proc")


@functools.cache
def _boot_id() -> str:
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # a /proc without it: the ticks alone still tell this boot's processes apart
        return ""


def process_start(pid: int) -> str:
    """The start mark of process `pid`; `psutil.NoSuchProcess` when there is none."""
    if not (PROC / "self/stat").exists():
        return f"{psutil.Process(pid).create_time():.6f}"
    try:
        stat = (PROC / str(pid) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        raise psutil.NoSuchProcess(pid) from None
    # Fields after the command name (which may itself hold spaces and parentheses) start at field 3, the state;
    # field 22 is the start time in clock ticks since boot.
    start_ticks = stat.rsplit(b")", 1)[1].split()[19]
    return f"boot {_boot_id()} tick {int(start_ticks)}"


def this_process() -> tuple[str, int, str]:
    """(host, pid, start mark) of this process (a forked child is a process of its own)."""
    return _this_process(os.getpid())


@functools.cache
def _this_process(pid: int) -> tuple[str, int, str]:
    return socket.gethostname(), pid, process_start(pid)


def live_process(pid: int, start: str) -> psutil.Process | None:
    """Process `pid` of this host if it still runs and is the one that had start mark `start` (any process with
    that pid when `start` is empty: a record written without one); None if it ended (a zombie has) or the pid
    now belongs to a later process."""
    try:
        if start and process_start(pid) != start:
            return None
        process = psutil.Process(pid)
        return None if process.status() == psutil.STATUS_ZOMBIE else process
    except psutil.Error:  # no such process, or it ended while we looked
        return None
