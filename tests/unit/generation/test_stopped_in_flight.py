"""A run stopped with requests in flight (a hold whose drain ran out, a failure) aborts each by its rid and reads its
aborted answer: what they wrote is counted (the waste ledger's `stopped_in_flight`), as the server counts it; a
server that cannot take the abort (stopped) holds the run's end up for the abort's timeout only (on a virtual clock
with in-process servers)."""

from __future__ import annotations

import asyncio

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, GenRequest
from dagster_project.generation.resend import _ABORT_AT_STOP_TIMEOUT_S
from dagster_project.generation.unrecorded import STOPPED_IN_FLIGHT
from tests.support.virtual_fleet import StoppableServer, VirtualClockLoop, now, run_virtual

STOP_AT_S = 5.0  # into 20 s answers: each request in flight has written about 50 tokens


def _requests(count: int) -> list[GenRequest]:
    return [GenRequest(f"e{i}", [7, 8, 9, i], {"max_new_tokens": 1024}) for i in range(count)]


def _stopped_run(server: StoppableServer, *, hang_first: bool = False) -> tuple[Dispatcher, float]:
    """Dispatch to `server` and cancel the run at `STOP_AT_S` (the server stopped just before, with `hang_first`);
    returns the dispatcher and how long the run took to end once cancelled (virtual seconds)."""
    loop = VirtualClockLoop()
    dispatcher = Dispatcher([server.base_url], DispatchOptions(), clock=loop.time, connect=lambda url: server)

    async def run() -> float:
        generating = asyncio.ensure_future(dispatcher.run(_requests(20), lambda outcome: None))
        if hang_first:
            asyncio.get_running_loop().call_later(STOP_AT_S - 0.5, server.stop)
        await asyncio.sleep(STOP_AT_S)
        assert server.working, "nothing in flight at the stop: the test proves nothing"
        generating.cancel()
        await asyncio.gather(generating, return_exceptions=True)
        return now() - STOP_AT_S

    return dispatcher, run_virtual(run(), loop)


def test_requests_in_flight_at_a_stop_are_aborted_and_what_they_wrote_is_counted():
    server = StoppableServer("http://server", answer_s=20.0)
    dispatcher, _ = _stopped_run(server)
    stopped = dispatcher.stats.unrecorded
    in_flight = 5  # its window: cap 4 x 1.25
    assert len({rid for _, rid in server.aborted}) == len(server.aborted) == in_flight  # each once, by its rid
    assert server.working == 0  # nothing of the run's left running there
    assert stopped.answers[STOPPED_IN_FLIGHT] == in_flight
    assert in_flight * 40 <= stopped.tokens[STOPPED_IN_FLIGHT] <= in_flight * 60
    # Every token the server generated is in the run's counts.
    assert dispatcher.stats.completion_tokens + sum(stopped.tokens.values()) == server.generated


def test_a_server_that_cannot_take_the_aborts_holds_the_stop_up_for_their_timeout_only():
    server = StoppableServer("http://server", answer_s=20.0)
    dispatcher, ended_after_s = _stopped_run(server, hang_first=True)
    assert ended_after_s <= _ABORT_AT_STOP_TIMEOUT_S + 1.0
    assert not server.aborted and dispatcher.stats.unrecorded.answers[STOPPED_IN_FLIGHT] == 0
