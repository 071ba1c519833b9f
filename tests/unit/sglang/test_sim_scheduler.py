"""The simulator's scheduler spends the time its latency model prices, on a virtual clock (no process, no waiting, the
same figures on a loaded machine): a decode step of a bigger batch takes longer, and the `slow` fault stretches a
request's work, also the rest of one already running."""

from __future__ import annotations

import asyncio
import time

import pytest

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.sim.config import SimConfig
from dagster_project.sglang.sim.faults import Faults
from dagster_project.sglang.sim.outputs import Answer
from dagster_project.sglang.sim.scheduler import Scheduler
from tests.support.virtual_fleet import now, run_virtual

EOS = 248046
TOKENS = 100  # one prefill, then 99 decode steps without MTP


def answer() -> Answer:
    return Answer([7] * (TOKENS - 1) + [EOS], "", proto.finish_stop(EOS), spec=None)


async def run_at_once(scheduler: Scheduler, count: int) -> list[float]:
    """`count` requests arriving together; how long each took, in virtual seconds."""
    started = now()

    async def one(index: int) -> float:
        await scheduler.run(scheduler.add(f"r{index}", answer(), 2, 4096, started))
        return now() - started

    return list(await asyncio.gather(*(one(index) for index in range(count))))


def latencies(config: SimConfig, count: int, faults: Faults | None = None) -> list[float]:
    async def scenario() -> list[float]:
        return await run_at_once(Scheduler(config, faults or Faults(), time.perf_counter()), count)

    return run_virtual(scenario())


def test_decode_steps_slow_down_as_the_batch_grows():
    config = SimConfig(speculative=False, decode_step_s=0.005, decode_step_growth=0.1, max_running_requests=9)
    (alone,) = latencies(config, 1)
    batch = latencies(config, 9)
    # Without MTP a step is priced from the 3/1/4 one (`sim.speculation.step_factor`): 0.775 of it alone, 99 steps of
    # 3.9 ms; a batch of nine steps at 1.121 of it, 1.447 times slower than alone.
    assert alone == pytest.approx(99 * 0.005 * 0.775, rel=1e-3)
    assert batch == pytest.approx([1.447 * alone] * 9, rel=1e-3)


def test_the_slow_fault_multiplies_a_requests_time_and_applies_to_one_already_running():
    config = SimConfig(decode_step_s=0.005, speculative=False)
    (normal,) = latencies(config, 1)
    (slowed,) = latencies(config, 1, Faults(slow=5))
    assert slowed == pytest.approx(5 * normal)

    async def slowed_halfway() -> float:
        faults = Faults()
        scheduler = Scheduler(config, faults, time.perf_counter())
        running = asyncio.ensure_future(run_at_once(scheduler, 1))
        await asyncio.sleep(normal / 2)
        faults.update({"slow": 5}, time.perf_counter())
        scheduler.wake_all()  # as the simulator's fault route does
        (took,) = await running
        return took

    assert run_virtual(slowed_halfway()) == pytest.approx(normal / 2 + 5 * normal / 2)
