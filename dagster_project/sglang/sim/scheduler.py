"""The simulated GPU scheduler: running cap, FIFO queue, latency model, progress and aborts.

At most `running_cap` requests run at once (SGLang's effective max_running_requests), the rest wait in a
FIFO queue, optionally bounded (`QueueFull`, which SGLang answers with 503). A running request takes
`ttft_s + prompt_tokens * prefill_s_per_token` of prefill, then `decode_step_s` per decode step (one per
speculative verify pass), all at the speed the faults allow: `slow` stretches the work, `hang` stops it.
No request sleeps for its whole duration: each waits on a future that a timer, an abort or a change of
speed resolves, so that aborts and fault changes take effect at once.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

from dagster_project.sglang.sim.config import SimConfig
from dagster_project.sglang.sim.faults import Faults
from dagster_project.sglang.sim.outputs import Answer


class QueueFull(Exception):
    """The waiting queue is at `--max-queued-requests`."""


class Job:
    """One request inside the simulated scheduler."""

    # Slots: a busy simulator holds thousands of these.
    __slots__ = (
        "aborted",
        "admitted",
        "answer",
        "decode_s",
        "prefill_s",
        "prompt_tokens",
        "received",
        "resumed",
        "rid",
        "speed",
        "started",
        "wake",
        "work",
        "work_done",
    )

    def __init__(self, rid: str, answer: Answer, prompt_tokens: int, received: float, config: SimConfig):
        self.rid = rid
        self.answer = answer
        self.prompt_tokens = prompt_tokens
        self.received = received
        self.prefill_s = config.ttft_s + prompt_tokens * config.prefill_s_per_token
        self.decode_s = answer.decode_steps * config.decode_step_s
        self.work = self.prefill_s + self.decode_s  # seconds at normal speed
        self.started = 0.0  # perf_counter time it began running; 0: not (yet) admitted
        self.work_done = 0.0  # seconds of work at normal speed, as of `resumed`
        self.resumed: float | None = None  # loop time the current stretch of progress began
        self.speed = 0.0
        self.wake: asyncio.Future | None = None
        self.admitted: asyncio.Future | None = None
        self.aborted = False

    def progress(self, now: float) -> float:
        """Fraction of its work done by loop time `now`."""
        if self.work <= 0:
            return 1.0 if self.started else 0.0
        done = self.work_done + ((now - self.resumed) * self.speed if self.resumed is not None else 0.0)
        return min(1.0, done / self.work)

    def partial(self) -> tuple[list[int], int, list[int]]:
        """Output ids, verify passes and histogram of the decode steps completed so far."""
        decoded_s = self.work_done - self.prefill_s
        if decoded_s < 0:
            return self.answer.prefix(None)
        total = self.answer.decode_steps
        steps = total if self.decode_s <= 0 else min(total, int(total * decoded_s / self.decode_s))
        return self.answer.prefix(steps)

    def interrupt(self) -> None:
        """Wake the job wherever it waits (queue or progress), so that it notices `aborted`."""
        for future in (self.wake, self.admitted):
            if future is not None:
                _resolve(future)


class _Occupancy:
    """Time-weighted scheduler occupancy since the last reset (for the saturation benchmark)."""

    def __init__(self, cap: int, now: float):
        self.cap = cap
        self.reset(now, 0)

    def reset(self, now: float, running: int) -> None:
        self.since = self.last = now
        self.running = running
        self.at_cap_s = self.running_s = 0.0

    def change(self, now: float, running: int) -> None:
        elapsed = now - self.last
        if self.running >= self.cap:
            self.at_cap_s += elapsed
        self.running_s += self.running * elapsed
        self.last, self.running = now, running

    def report(self, now: float) -> dict:
        self.change(now, self.running)
        window = max(now - self.since, 1e-9)
        return {
            "window_s": now - self.since,
            "at_cap_s": self.at_cap_s,
            "at_cap_fraction": self.at_cap_s / window,
            "mean_running": self.running_s / window,
        }


class Scheduler:
    def __init__(self, config: SimConfig, faults: Faults, now: float):
        self.config = config
        self.faults = faults
        self.loop = asyncio.get_running_loop()
        self.cap = config.running_cap
        self.jobs: dict[str, Job] = {}  # every request between validation and response, queued or running
        self.running = 0
        self.waiting: deque[Job] = deque()
        self.occupancy = _Occupancy(self.cap, now)
        self.peaks = {"running": 0, "queued": 0}  # since start or the last occupancy reset

    def add(self, rid: str, answer: Answer, prompt_tokens: int, received: float) -> Job:
        job = self.jobs[rid] = Job(rid, answer, prompt_tokens, received, self.config)
        return job

    def forget(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            self.jobs.pop(job.rid, None)

    async def run(self, job: Job, checkpoint: Callable[[Job], Awaitable[None]] | None = None) -> None:
        """Admit `job` (or queue it), then let it make progress until done or aborted.

        With `checkpoint` (streaming), progress pauses after prefill and at each quarter of the decode
        to let it report the output so far.
        """
        if self.running < self.cap and not self.waiting:
            self._set_running(self.running + 1)
            job.started = time.perf_counter()
        else:
            limit = self.config.max_queued_requests
            if limit is not None and len(self.waiting) >= limit:
                raise QueueFull
            job.admitted = self.loop.create_future()
            self.waiting.append(job)
            self.peaks["queued"] = max(self.peaks["queued"], len(self.waiting))
            try:
                await job.admitted
            except asyncio.CancelledError:
                self._leave(job)
                raise
            finally:
                job.admitted = None
            if not job.started:  # aborted while queued: it never ran
                self._leave(job)
                return
        try:
            if checkpoint is not None:
                for target in (job.prefill_s, *(job.prefill_s + job.decode_s * q / 4 for q in (1, 2, 3))):
                    await self._progress(job, target)
                    if job.aborted:
                        return
                    await checkpoint(job)
            # Zero work at normal speed needs no timer (the zero-latency hot path); a hang still blocks it.
            if job.work > 0 or self.faults.speed != 1.0:
                await self._progress(job, job.work)
        finally:
            self._leave(job)

    def abort(self, prefix: str, abort_all: bool = False) -> None:
        for job in list(self.jobs.values()):
            if abort_all or job.rid.startswith(prefix):  # SGLang matches abort rids by prefix
                job.aborted = True
                job.interrupt()

    def wake_all(self) -> None:
        """Let running jobs pick up a new speed (hang or slow changed)."""
        for job in self.jobs.values():
            if job.wake is not None:
                _resolve(job.wake)

    def reset_occupancy(self, now: float) -> None:
        self.occupancy.reset(now, self.running)
        self.peaks = {"running": self.running, "queued": len(self.waiting)}

    def gen_throughput(self) -> float:
        """Tokens per second of the running requests at the current speed (a decode-window estimate)."""
        return (
            sum(
                len(job.answer.output_ids) / job.decode_s
                for job in self.jobs.values()
                if job.started and job.decode_s > 0
            )
            * self.faults.speed
        )

    def used_tokens(self) -> int:
        """KV tokens held by running requests: the prompt plus the share of the output decoded so far."""
        now = self.loop.time()
        return sum(
            job.prompt_tokens + int(len(job.answer.output_ids) * job.progress(now))
            for job in self.jobs.values()
            if job.started and not job.aborted
        )

    def _set_running(self, running: int) -> None:
        self.running = running
        self.peaks["running"] = max(self.peaks["running"], running)
        self.occupancy.change(time.perf_counter(), running)

    def _leave(self, job: Job) -> None:
        if job.started:
            self._set_running(self.running - 1)
            self._admit()
        elif job in self.waiting:
            self.waiting.remove(job)

    def _admit(self) -> None:
        while self.waiting and self.running < self.cap:
            job = self.waiting.popleft()
            if job.admitted is None or job.admitted.done():  # its handler is being cancelled
                continue
            self._set_running(self.running + 1)
            job.started = time.perf_counter()
            job.admitted.set_result(None)

    async def _progress(self, job: Job, target: float) -> None:
        """Advance `job` until `target` seconds of its work are done, at the speed the faults allow."""
        while not job.aborted:
            speed = self.faults.speed
            remaining = target - job.work_done
            if remaining <= 0 and speed > 0:
                return
            job.wake = self.loop.create_future()
            timer = self.loop.call_later(remaining / speed, _resolve, job.wake) if speed > 0 else None
            job.resumed, job.speed = self.loop.time(), speed
            try:
                await job.wake
            finally:
                if timer is not None:
                    timer.cancel()
                job.work_done += (self.loop.time() - job.resumed) * speed
                job.wake, job.resumed = None, None


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)
