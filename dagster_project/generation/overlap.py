"""The shards of a range run, generated a few at once so that the fleet does not drain between two shards.

One after another, each shard ends with a drain (its last answers trickle in, fewer and fewer in flight) and a
gap with nothing in flight (publishing it, reading the next one's conversations, its preflight and first
probes): the servers run below their cap and the run's pool slot sits idle. With two at once, the next shard's
requests fill what the current one's tail leaves: both dispatchers draw from the node's ledger, which keeps the
servers' windows whole across them and gives freed slots to the shard with the fewest requests left, so the
shards still finish about in order. Each shard is still its own unit: its lease, journal, manifest and prefix.

Each shard works in a thread of its own (generation is I/O; `generate_shard` runs its own event loop). When one
fails no further shard starts; the ones already working finish (their results are published and count), and the
first error is returned with them.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

K = TypeVar("K")
T = TypeVar("T")


def overlapped(
    items: Sequence[K], work: Callable[[K], T], at_once: int
) -> tuple[list[tuple[K, T]], BaseException | None]:
    """`work` on each item, at most `at_once` at a time, started in order: (each finished item's result, in the
    items' order; the first error, or None). One item, or `at_once` 1, works in this thread as a plain loop."""
    if at_once < 1:
        raise ValueError(f"at_once must be >= 1, not {at_once}")
    if at_once == 1 or len(items) <= 1:
        return _one_after_another(items, work)
    finished: queue.SimpleQueue[tuple[int, T | None, BaseException | None]] = queue.SimpleQueue()

    def run(index: int) -> None:
        try:
            finished.put((index, work(items[index]), None))
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller's thread, which raises it
            finished.put((index, None, exc))

    def start(index: int) -> None:
        # A daemon: a run interrupted (terminated from the UI) exits without waiting for the shard beside it;
        # that shard's lease then expires as a killed run's does.
        threading.Thread(target=run, args=(index,), name=f"shard-{items[index]}", daemon=True).start()

    results: dict[int, T] = {}
    error: BaseException | None = None
    started = min(at_once, len(items))
    for index in range(started):
        start(index)
    running = started
    while running:
        index, result, failure = finished.get()
        running -= 1
        if failure is not None:
            error = error or failure
        else:
            results[index] = result
        if error is None and started < len(items):
            start(started)
            started += 1
            running += 1
    return [(items[index], results[index]) for index in sorted(results)], error


def _one_after_another(items: Sequence[K], work: Callable[[K], T]) -> tuple[list[tuple[K, T]], BaseException | None]:
    done: list[tuple[K, T]] = []
    for item in items:
        try:
            done.append((item, work(item)))
        except BaseException as exc:  # noqa: BLE001 -- an interrupt too: the caller records what is done, then raises
            return done, exc
    return done, None
