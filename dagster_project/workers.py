"""The worker processes of the CPU-bound stages: started once per process, shared by the stages it runs.

The ingest stage reads its sources in them; the conversations stage drafts its rows and publishes its shards in
them. Starting a worker is a new interpreter importing the stage's modules (about 0.15 s of a core each, and the
stage waiting for it), so a run that materializes both stages (the in-process executor runs them in one process)
starts them once, and the second stage's work begins at once. The workers stay until the process ends.

They are spawned, not forked: a Dagster run process has threads, and a forked child could inherit a held lock.
"""

from __future__ import annotations

import gc
import multiprocessing
import threading
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager

# Two: the machines this runs on have a few cores, and each stage keeps its own process busy as well.
WORKERS = 2

_shared: ProcessPoolExecutor | None = None
_lock = threading.Lock()


@contextmanager
def worker_processes() -> Iterator[ProcessPoolExecutor]:
    """The process's pool of `WORKERS` worker processes, started on first use.

    When the block raises (a stage that failed, or a worker that died: `BrokenProcessPool`), the pool is shut down
    with its queued work cancelled, and the next use starts a new one: nothing of a failed stage reaches the next."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn"))
        pool = _shared
    try:
        yield pool
    except BaseException:
        with _lock:
            if _shared is pool:
                _shared = None
        pool.shutdown(wait=True, cancel_futures=True)
        raise


@contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """The cyclic garbage collector switched off for a loop over rows, and back on after it.

    Reading, normalizing, drafting and deciding rows makes many short-lived objects and almost no reference cycles
    (reference counting frees each object as soon as it is dropped; the futures a batch travels in leave about three
    per batch), so the collector's passes over them are pure cost: 8% of the conversations stage's own process, 2%
    of a worker's. What cycles there are wait for the end of the loop."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
