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


def test_the_slot_is_busy_while_any_of_the_shards_generating_at_once_has_a_request_in_flight():
    """A range run generates two shards at once: the one ending reaching 0 in flight does not idle the slot
    while the next one's requests are out."""
    clock = Clock()
    use = SlotUse(clock)
    use.in_flight(5, source="shard 1")
    clock.now += 2.0
    use.in_flight(3, source="shard 2")  # the next shard starts beside the first one's tail
    clock.now += 1.0
    use.in_flight(0, source="shard 1")  # the first shard's last answer: published now
    clock.now += 4.0
    use.in_flight(0, source="shard 2")
    clock.now += 0.5
    used = use.take()
    assert (used.held_s, used.idle_s) == pytest.approx((7.5, 0.5))
