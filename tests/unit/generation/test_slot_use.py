"""Slot-seconds a run holds with no request in flight, on a virtual clock."""

import pytest

from dagster_project.generation.slot_use import SlotUse


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_idle_seconds_are_the_held_seconds_with_nothing_in_flight():
    clock = Clock()
    use = SlotUse(clock)
    clock.now += 3.0  # the slot is held; the first request not sent yet
    use.in_flight(1)
    clock.now += 5.0
    use.in_flight(4)  # more in flight: still busy, counted once
    clock.now += 2.0
    use.in_flight(0)  # the shard is published, the next one read
    clock.now += 1.5
    first = use.take()
    assert (first.held_s, first.idle_s) == pytest.approx((11.5, 4.5))
    use.in_flight(2)
    clock.now += 4.0
    second = use.take()  # read mid-flight: all busy since the last reading
    assert (second.held_s, second.idle_s) == pytest.approx((4.0, 0.0))
    clock.now += 1.0
    use.in_flight(0)
    clock.now += 2.0
    assert use.take().idle_s == pytest.approx(2.0)
