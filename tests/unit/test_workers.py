"""The worker processes the stages share, and the collector pause around their loops over rows."""

from __future__ import annotations

import gc

import psutil
import pytest

from dagster_project.workers import cycle_collector_paused, worker_processes


def test_the_stages_of_one_process_share_one_pool_of_workers() -> None:
    with worker_processes() as first:
        assert first.submit(_divide, 4).result() == 0.25
    started = _children()
    with worker_processes() as second:
        assert second is first
        assert second.submit(_divide, 8).result() == 0.125
    assert _children() == started, "the second stage starts no process"


def test_a_stage_that_fails_leaves_no_pool_behind_for_the_next() -> None:
    with pytest.raises(ZeroDivisionError), worker_processes() as failed:
        failed.submit(_divide, 0).result()
    with worker_processes() as after:
        assert after is not failed
        assert after.submit(_divide, 2).result() == 0.5
    with pytest.raises(RuntimeError):  # shut down: it takes no more work
        failed.submit(_divide, 1)


def test_the_collector_is_paused_inside_and_as_it_was_after() -> None:
    assert gc.isenabled()
    with cycle_collector_paused():
        assert not gc.isenabled()
        with cycle_collector_paused():  # a pause inside a pause leaves it paused
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(KeyError), cycle_collector_paused():
        raise KeyError("a loop that fails")
    assert gc.isenabled()


def _children() -> set[int]:
    return {child.pid for child in psutil.Process().children()}


def _divide(by: int) -> float:
    return 1 / by
