"""Servers in process on a virtual clock, for unit tests of the dispatcher: no sockets, no waiting.

`run_virtual(coroutine)` runs it on an event loop whose clock jumps to the next timer whenever every task
waits, so an hour of timeouts and probe periods passes in milliseconds and in the same order as for real.
`FakeServer` stands where an `SGLangClient` would (the dispatcher's `connect=` seam) and plays one server:
answering after a delay, or losing `/generate` requests behind a `/health` that answers 200 (what a router or
load balancer in front of a broken server looks like), with or without `/metrics`. `StoppableServer` is one that
can be SIGSTOPped and SIGCONTed, and aborts a request by its rid.
"""

from __future__ import annotations

import asyncio
import math
import selectors
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from dagster_project.sglang import protocol as proto
from dagster_project.sglang.answer_contract import UNKNOWN, Served
from dagster_project.sglang.client import (
    ABORTED,
    NOT_FOUND,
    SERVER_ERROR,
    TIMEOUT,
    GenerateResult,
    SGLangClient,
    SGLangError,
)

T = TypeVar("T")
EOS = 248046


class _InstantSelector(selectors.DefaultSelector):
    """Never blocks: where the loop would wait `timeout` seconds for I/O, the virtual clock moves on instead."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list:
        events = super().select(0)
        if events or timeout == 0:
            return events
        if timeout is None:
            raise RuntimeError("every task waits for something no timer will bring: the test deadlocked")
        self.now += timeout
        return events


class VirtualClockLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self._selector_clock = _InstantSelector()
        super().__init__(self._selector_clock)

    def time(self) -> float:
        return self._selector_clock.now


def run_virtual(coroutine: Coroutine[Any, Any, T], loop: VirtualClockLoop | None = None) -> T:
    """Run `coroutine` to its end on `loop` (a new one by default), then close the loop; its clock stays readable."""
    loop = loop or VirtualClockLoop()
    try:
        return loop.run_until_complete(coroutine)
    finally:
        loop.close()


def now() -> float:
    return asyncio.get_running_loop().time()


class FakeServer(SGLangClient):
    """One server as the dispatcher sees it through its client.

    `answer_s`: seconds each request takes; `lost`: `/generate` requests are accepted and never answered (the
    client's timeout ends them); `failing`: every request gets a 500; `metrics`: serves `/metrics`, reporting
    the requests it is working on (none when they are lost, nor while their answers arrive); `body_s`: seconds each
    answer's body takes to arrive after its status and headers (a body that trickles in). `/health` answers 200
    throughout.
    """

    def __init__(
        self,
        url: str,
        *,
        cap: int = 4,
        answer_s: float = 1.0,
        lost: bool = False,
        failing: bool = False,
        metrics: bool = True,
        body_s: float = 0.0,
    ):
        super().__init__(url)
        self.cap, self.answer_s, self.lost, self.failing, self.metrics_enabled = cap, answer_s, lost, failing, metrics
        self.body_s = body_s
        self.working = 0  # requests it is running or queueing
        self.received: list[tuple[float, tuple[int, ...]]] = []  # (virtual time, input ids) of each /generate

    async def server_info(self, timeout: float | None = None) -> dict:
        return {"internal_states": [{"effective_max_running_requests_per_dp": self.cap}]}

    async def health(self, timeout: float | None = None) -> bool:
        return True

    async def metrics(self, timeout: float | None = None) -> str:
        if not self.metrics_enabled:
            raise SGLangError(NOT_FOUND, "Not Found", status=404, url=self.base_url)
        running, queued = min(self.working, self.cap), max(0, self.working - self.cap)
        return (
            f'# TYPE {proto.RUNNING_REQS} gauge\n{proto.RUNNING_REQS}{{tp_rank="0"}} {running}.0\n'
            f'# TYPE {proto.QUEUED_REQS} gauge\n{proto.QUEUED_REQS}{{tp_rank="0"}} {queued}.0\n'
        )

    async def abort(self, rid: str, timeout: float | None = None) -> None:
        return None

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: dict,
        rid: str | None = None,
        timeout: float | None = None,
        *,
        require_reasoning: bool = True,
        served: Served = UNKNOWN,
        on_answer_begun: Callable[[], None] | None = None,
    ) -> GenerateResult:
        self.received.append((now(), tuple(input_ids)))
        if self.lost:
            await asyncio.sleep(math.inf if timeout is None else timeout)
            raise SGLangError(TIMEOUT, f"no complete answer within {timeout}s", url=self.base_url, rid=rid)
        if self.failing:
            raise SGLangError(SERVER_ERROR, "Internal Server Error", status=500, url=self.base_url, rid=rid)
        self.working += 1
        try:
            if timeout is not None and timeout < self.answer_s:
                await asyncio.sleep(timeout)
                raise SGLangError(TIMEOUT, f"no complete answer within {timeout}s", url=self.base_url, rid=rid)
            await asyncio.sleep(self.answer_s)
        finally:
            self.working -= 1
        if on_answer_begun is not None:
            on_answer_begun()
        await asyncio.sleep(self.body_s)
        output_ids = [1000 + len(input_ids), EOS]
        finish = {"type": "stop", "matched": EOS}
        meta = {"id": rid, "finish_reason": finish, "prompt_tokens": len(input_ids), "completion_tokens": 2}
        return GenerateResult(rid or "", "answer", output_ids, finish, meta, len(input_ids), 2)

    def first_received(self, input_ids: Sequence[int]) -> float | None:
        return next((at for at, ids in self.received if ids == tuple(input_ids)), None)


class StoppableServer(FakeServer):
    """A server that can be stopped and resumed (SIGSTOP, SIGCONT) and aborts requests by rid.

    It writes one output token per `TOKEN_S` of running, `answer_s` worth for an answer (or `max_new_tokens`, if
    fewer). While stopped its requests make no progress and nothing it is asked answers: a call waits for the
    resume, or for its timeout. An abort by rid ends that request with finish_reason abort, reporting the tokens it
    wrote. `aborted` lists (time, rid) of the aborts it took; `running` counts each prompt's requests in flight,
    `peak_per_prompt` is the most requests of one prompt it ran at once (one-token canaries aside); `generated` the
    output tokens of every request that ended with an answer, aborted ones included (`sglang:generation_tokens_total`).
    """

    TOKEN_S = 0.1

    def __init__(self, url: str, **options: Any):
        super().__init__(url, **options)
        self.stopped = False
        self._resumed = asyncio.Event()
        self.aborted: list[tuple[float, str]] = []
        self.running: Counter = Counter()
        self.peak_per_prompt = 0
        self.rids: dict[str, tuple[int, ...]] = {}  # the prompt of every rid it was sent
        self.generated = 0
        self._aborts: dict[str, asyncio.Event] = {}

    def stop(self) -> None:
        self.stopped = True
        self._resumed.clear()

    def resume(self) -> None:
        self.stopped = False
        self._resumed.set()

    async def _answers(self, timeout: float | None) -> bool:
        """Whether it answers within `timeout`: at once when running, at the resume when stopped."""
        if not self.stopped:
            return True
        try:
            await asyncio.wait_for(self._resumed.wait(), timeout)
        except TimeoutError:
            return False
        return True

    async def _answer_or_time_out(self, timeout: float | None) -> None:
        if not await self._answers(timeout):
            raise SGLangError(TIMEOUT, f"no complete answer within {timeout}s", url=self.base_url)

    async def health(self, timeout: float | None = None) -> bool:
        return await self._answers(timeout)

    async def server_info(self, timeout: float | None = None) -> dict:
        await self._answer_or_time_out(timeout)
        return await super().server_info(timeout)

    async def metrics(self, timeout: float | None = None) -> str:
        await self._answer_or_time_out(timeout)
        return await super().metrics(timeout)

    async def abort(self, rid: str, timeout: float | None = None) -> None:
        await self._answer_or_time_out(timeout)
        self.aborted.append((now(), rid))
        if rid in self._aborts:
            self._aborts[rid].set()

    async def generate(
        self,
        input_ids: Sequence[int],
        sampling_params: dict,
        rid: str | None = None,
        timeout: float | None = None,
        **options: Any,
    ) -> GenerateResult:
        prompt, rid = tuple(input_ids), rid or ""
        self.received.append((now(), prompt))
        self.rids[rid] = prompt
        abort = self._aborts[rid] = asyncio.Event()
        needed = min(sampling_params.get("max_new_tokens", 128), max(1, round(self.answer_s / self.TOKEN_S)))
        deadline = now() + (math.inf if timeout is None else timeout)
        self.running[prompt] += 1
        self.working += 1
        if len(prompt) > 1:
            self.peak_per_prompt = max(self.peak_per_prompt, self.running[prompt])
        written = 0
        try:
            while written < needed:
                if now() >= deadline:
                    raise SGLangError(TIMEOUT, f"no complete answer within {timeout}s", url=self.base_url, rid=rid)
                try:
                    await asyncio.wait_for(abort.wait(), self.TOKEN_S)
                except TimeoutError:
                    written += 0 if self.stopped else 1
                    continue
                partial = GenerateResult(rid, "", [1000] * written, {"type": "abort"}, {}, len(prompt), written)
                self.generated += written
                raise SGLangError(ABORTED, "Aborted", url=self.base_url, rid=rid, partial=partial)
        finally:
            self.running[prompt] -= 1
            self.working -= 1
            del self._aborts[rid]
        self.generated += written
        output_ids = [1000] * (written - 1) + [EOS]
        finish = {"type": "stop", "matched": EOS}
        meta = {"id": rid, "finish_reason": finish, "prompt_tokens": len(prompt), "completion_tokens": written}
        return GenerateResult(rid, "answer", output_ids, finish, meta, len(prompt), written)
