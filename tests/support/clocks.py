"""A clock for code that takes one (`clock=`, `sleep=`): time moves only when the code under test sleeps, so
retries, backoffs and deadlines run in an instant and in the same order on a loaded machine as on a quiet one."""

from __future__ import annotations


class SteppedClock:
    """A monotonic clock that stands still until `sleep` moves it; `slept` lists every pause asked for."""

    def __init__(self, start: float = 1_000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
