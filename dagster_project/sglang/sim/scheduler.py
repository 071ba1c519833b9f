"""The simulated GPU scheduler: running cap, KV-budget admission, FIFO queue, latency model, progress and aborts.

At most `running_cap` requests run at once (SGLang's effective max_running_requests), the rest wait in a
FIFO queue, optionally bounded (`QueueFull`, which SGLang answers with 503). A running request takes
`ttft_s + prompt_tokens * prefill_s_per_token` of prefill, then one decode step per speculative verify pass
(per token without speculative decoding); a step takes `decode_step_s` for a batch of one and
`decode_step_growth` more per additional running request. All of it runs at the speed the faults allow:
`slow` stretches the work, `hang` stops it. No request sleeps for its whole duration: each waits on a future
that a timer, an abort or a change of speed resolves, so that aborts, fault changes and batch-size changes
take effect at once.

With the memory model on (`gpu_memory_gb`), the KV pool also gates admission as in SGLang 0.5.23's
`PrefillAdder` (managers/schedule_policy.py:1395-1430, mem_cache/prefill_budget.py:62-112): a request is
admitted when its prompt and `min(max_new_tokens, 4096)` fit in the pool less the tokens the running requests
hold and `new_token_ratio` times the tokens they may still write. The ratio starts at 0.7 and decays per
decode step to 0.098 (managers/scheduler_components/new_token_ratio_tracker.py), so early batches sit below
the cap. When the running requests outgrow the pool, the newest are retracted to the front of the queue and
resume from where they were (managers/schedule_batch.py:3451-3540); `num_retractions` counts it.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable

from dagster_project.sglang.sim import rates
from dagster_project.sglang.sim.config import SimConfig
from dagster_project.sglang.sim.faults import Faults
from dagster_project.sglang.sim.outputs import Answer

CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: admission counts at most this many new tokens
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS: decode headroom a retraction leaves each request


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
        "max_new_tokens",
        "prefill_s",
        "prompt_tokens",
        "received",
        "resumed",
        "retractions",
        "rid",
        "speed",
        "started",
        "wake",
        "work",
        "work_done",
    )

    def __init__(
        self, rid: str, answer: Answer, prompt_tokens: int, max_new_tokens: int, received: float, config: SimConfig
    ):
        self.rid = rid
        self.answer = answer
        self.prompt_tokens = prompt_tokens
        self.max_new_tokens = max_new_tokens
        self.received = received
        self.prefill_s = config.ttft_s + prompt_tokens * config.prefill_s_per_token
        self.decode_s = answer.decode_steps * config.decode_step_s  # at batch size one
        self.work = self.prefill_s + self.decode_s  # seconds at normal speed
        self.started = 0.0  # perf_counter time it first began running; 0: not (yet) admitted
        self.work_done = 0.0  # seconds of work at normal speed, as of `resumed`
        self.resumed: float | None = None  # loop time the current stretch of progress began
        self.speed = 0.0
        self.wake: asyncio.Future | None = None
        self.admitted: asyncio.Future | None = None  # set while the job waits in the queue
        self.aborted = False
        self.retractions = 0

    def done_s(self, now: float) -> float:
        """Seconds of its work (at normal speed) done by loop time `now`."""
        return self.work_done + ((now - self.resumed) * self.speed if self.resumed is not None else 0.0)

    def decoded(self, now: float) -> int:
        """Output tokens written by loop time `now`."""
        decoded_s = self.done_s(now) - self.prefill_s
        if decoded_s < 0:
            return 0
        total = len(self.answer.output_ids)
        return total if self.decode_s <= 0 else min(total, int(total * decoded_s / self.decode_s))

    def kv_tokens(self, now: float) -> int:
        """KV tokens it holds: its prompt and the output so far."""
        return self.prompt_tokens + self.decoded(now)

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


class _NewTokenRatio:
    """SGLang's guess of the share of their remaining max_new_tokens running requests will still write.

    0.7 when the server starts or idles, then `(0.7 - 0.098) / 600` less per decode step down to 0.098
    (SGLANG_INIT_NEW_TOKEN_RATIO, SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR, SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS);
    a retraction sets it to the running requests' written share. A server without step time never decays.
    """

    INIT = 0.7
    MIN = INIT * 0.14
    DECAY = (INIT - MIN) / 600

    def __init__(self, step_s: float, now: float):
        self.step_s = step_s
        self.base = self.INIT
        self.steps = 0.0  # decode steps since `base` was set, as of `last`
        self.last = now
        self.running = 0

    def advance(self, now: float, running: int, step_s: float) -> None:
        """Count the decode steps since the last change of the batch, which now has `running` requests."""
        self.steps = self._steps(now)
        self.last, self.running, self.step_s = now, running, step_s

    def set(self, value: float, now: float) -> None:
        self.base, self.steps, self.last = value, 0.0, now

    def value(self, now: float) -> float:
        return max(self.MIN, self.base - self.DECAY * self._steps(now))

    def _steps(self, now: float) -> float:
        if not self.running or self.step_s <= 0:
            return self.steps
        return self.steps + (now - self.last) / self.step_s


class Scheduler:
    def __init__(self, config: SimConfig, faults: Faults, now: float):
        self.config = config
        self.faults = faults
        self.loop = asyncio.get_running_loop()
        self.cap = config.running_cap
        self.pool_tokens = config.pools.max_total_num_tokens
        self.kv_admission = config.memory_model
        # KV tokens one decode step may allocate per request: the draft tokens' reserve, or one token.
        self.tokens_per_step = max(1, config.reserved_prompt_tokens)
        self.jobs: dict[str, Job] = {}  # every request between validation and response, queued or running
        self.active: set[Job] = set()  # the running requests
        self.waiting: deque[Job] = deque()
        self.occupancy = _Occupancy(self.cap, now)
        self.ratio = _NewTokenRatio(config.decode_step_s, self.loop.time())
        self.retracted = 0  # requests retracted since start
        self.peaks = {"running": 0, "queued": 0}  # since start or the last occupancy reset
        self._watcher: asyncio.Task | None = None

    @property
    def running(self) -> int:
        return len(self.active)

    def add(self, rid: str, answer: Answer, prompt_tokens: int, max_new_tokens: int, received: float) -> Job:
        job = self.jobs[rid] = Job(rid, answer, prompt_tokens, max_new_tokens, received, self.config)
        return job

    def forget(self, jobs: Iterable[Job]) -> None:
        for job in jobs:
            self.jobs.pop(job.rid, None)

    def expected_batch(self) -> int:
        """The batch a request arriving now will decode in: everyone ahead of it, up to the cap."""
        return min(self.running + len(self.waiting) + 1, self.cap)

    async def run(self, job: Job, checkpoint: Callable[[Job], Awaitable[None]] | None = None) -> None:
        """Admit `job` (or queue it), then let it make progress until done or aborted.

        With `checkpoint` (streaming), progress pauses after prefill and at each quarter of the decode
        to let it report the output so far.
        """
        try:
            if not self.waiting and self._admissible(job):
                self._start(job)
            else:
                limit = self.config.max_queued_requests
                if limit is not None and len(self.waiting) >= limit:
                    raise QueueFull
                self._enqueue(job)
                self.peaks["queued"] = max(self.peaks["queued"], len(self.waiting))
                await self._queued(job)
                if job not in self.active:  # aborted while queued: it never ran
                    return
            if checkpoint is not None:
                for target in (job.prefill_s, *(job.prefill_s + job.decode_s * q / 4 for q in (1, 2, 3))):
                    await self._progress(job, target)
                    if job.aborted:
                        return
                    await checkpoint(job)
            # Zero work at normal speed needs no timer (the zero-latency hot path); a hang still blocks it.
            if job.work > 0 or self.faults.speed != 1.0:
                await self._progress(job, job.prefill_s)  # prefill and decode run at different speeds
                await self._progress(job, job.work)
        finally:
            self._leave(job)

    def abort(self, rid: str, abort_all: bool = False) -> int:
        """End the in-flight request `rid` (or all of them); how many it ended. Only an exact rid aborts: 0.5.23's
        tokenizer manager drops an rid it does not hold before the scheduler sees it (its prefix match never runs)."""
        ended = 0
        for job in list(self.jobs.values()):
            if abort_all or job.rid == rid:
                job.aborted = True
                job.interrupt()
                ended += 1
        return ended

    def wake_all(self) -> None:
        """Let running jobs pick up a new speed (hang, slow or the batch size changed)."""
        for job in self.jobs.values():
            if job.wake is not None:
                _resolve(job.wake)

    def reset_occupancy(self, now: float) -> None:
        self.occupancy.reset(now, self.running)
        self.peaks = {"running": self.running, "queued": len(self.waiting)}

    def new_token_ratio(self) -> float:
        return self.ratio.value(self.loop.time())

    def gen_throughput(self) -> float:
        """Tokens per second of the running requests at the current speed (a decode-window estimate)."""
        rate = sum(len(job.answer.output_ids) / job.decode_s for job in self.active if job.decode_s > 0)
        return rate * self.faults.speed * self._decode_pace()

    def used_tokens(self) -> int:
        """KV tokens held by running requests: the prompt plus the output decoded so far."""
        now = self.loop.time()
        return sum(job.kv_tokens(now) for job in self.active if not job.aborted)

    def _decode_pace(self) -> float:
        """Decode speed at the current batch size relative to a batch of one."""
        return rates.decode_pace(self.config, self.running)

    def _admissible(self, job: Job) -> bool:
        """Whether `job` may start now: below the cap and, with the memory model, within the KV budget."""
        if self.running >= self.cap:
            return False
        if not self.kv_admission or not self.active:  # an idle server always takes the head of its queue
            return True
        now = self.loop.time()
        ratio = self.ratio.value(now)
        reserved = sum(
            job_.kv_tokens(now) + min(max(job_.max_new_tokens - job_.decoded(now), 0), CLIP_MAX_NEW_TOKENS) * ratio
            for job_ in self.active
        )
        remaining = min(max(job.max_new_tokens - job.decoded(now), 0), CLIP_MAX_NEW_TOKENS)
        return job.kv_tokens(now) + remaining + 1 < self.pool_tokens - reserved

    def _enqueue(self, job: Job, front: bool = False) -> None:
        job.admitted = self.loop.create_future()
        if front:
            self.waiting.appendleft(job)
        else:
            self.waiting.append(job)

    async def _queued(self, job: Job) -> None:
        """Wait in the queue until admitted (then it is active) or interrupted by an abort."""
        assert job.admitted is not None
        try:
            await job.admitted
        finally:
            job.admitted = None

    def _start(self, job: Job) -> None:
        self.active.add(job)
        if not job.started:
            job.started = time.perf_counter()
        self._batch_changed()
        if self.kv_admission and self.config.decode_step_s > 0 and self._watcher is None:
            self._watcher = self.loop.create_task(self._watch_memory())

    def _leave(self, job: Job) -> None:
        if job in self.active:
            self.active.discard(job)
            self._batch_changed()
            self._admit()
        elif job in self.waiting:
            self.waiting.remove(job)

    def _admit(self) -> None:
        while self.waiting and self.running < self.cap:
            job = self.waiting[0]
            if job.admitted is None or job.admitted.done():  # its handler is being cancelled
                self.waiting.popleft()
                continue
            if not self._admissible(job):  # first come, first served: the head waits for room
                return
            self.waiting.popleft()
            self._start(job)
            job.admitted.set_result(None)

    def _batch_changed(self) -> None:
        now = self.loop.time()
        running = self.running
        self.peaks["running"] = max(self.peaks["running"], running)
        self.occupancy.change(time.perf_counter(), running)
        step_s = self.config.decode_step_s / self._decode_pace()
        self.ratio.advance(now, running, step_s)
        if not running and not self.waiting:
            self.ratio.set(_NewTokenRatio.INIT, now)  # an idle server starts over
        if self.config.decode_step_growth:
            self.wake_all()  # every decoding request now steps at the new batch's pace

    async def _watch_memory(self) -> None:
        """While requests run, every few decode steps: retract some if the next steps would not fit in the KV
        pool, else admit what the decayed `new_token_ratio` now lets in."""
        try:
            while self.active:
                await asyncio.sleep(max(0.005, 4 * self.config.decode_step_s))
                self._retract_if_full()
                self._admit()
        finally:
            self._watcher = None

    def _retract_if_full(self) -> None:
        now = self.loop.time()
        need = self.used_tokens() + self.running * self.tokens_per_step
        if need <= self.pool_tokens or self.running <= 1:
            return
        # Keep the requests with the most output, then the shortest prompt; retract from the other end.
        keep = sorted(self.active, key=lambda job: (job.decoded(now), -job.prompt_tokens), reverse=True)
        while need > self.pool_tokens and len(keep) > 1:
            job = keep.pop()
            need -= job.kv_tokens(now) + self.tokens_per_step
            self.active.discard(job)
            job.retractions += 1
            self.retracted += 1
            self._enqueue(job, front=True)
            if job.wake is not None:
                _resolve(job.wake)  # it notices it left the batch and waits in the queue
        written = sum(job.decoded(now) for job in keep)
        budget = sum(job.max_new_tokens for job in keep)
        self.ratio.set(min(1.0, (written + RETRACT_DECODE_STEPS * len(keep)) / (budget + 1)), now)
        self._batch_changed()

    async def _progress(self, job: Job, target: float) -> None:
        """Advance `job` until `target` seconds of its work are done, at the speed the faults and the batch
        allow; a retracted job waits in the queue until it is admitted again."""
        while not job.aborted:
            if job not in self.active:
                await self._queued(job)
                continue
            speed = self.faults.speed * (self._decode_pace() if target > job.prefill_s else 1.0)
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
