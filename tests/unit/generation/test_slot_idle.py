"""A run that joins a server the node's other runs fill does not hold its pool slot idle until their tails.

Two dispatchers of one node share the ledger, on a virtual clock with an in-process server: the first run fills
the server's window and has fewer requests left (so it goes first for freed slots); the second starts later.
The second's first request must go out at the first slot freed (one answer's time), not once the first run no
longer wants more; its pool slot's idle seconds (`SlotUse`) stay within about that.
"""

from __future__ import annotations

import asyncio

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, GenRequest
from dagster_project.generation.ledger import FleetLedger
from dagster_project.generation.slot_use import SlotSeconds, SlotUse
from tests.support.virtual_fleet import FakeServer, VirtualClockLoop, now, run_virtual

ANSWER_S = 1.0


def requests(run: str, count: int) -> list[GenRequest]:
    return [GenRequest(f"{run}{i}", [7, 8, len(run), i], {"max_new_tokens": 64}) for i in range(count)]


def test_a_run_joining_a_full_server_sends_at_the_first_freed_slot(tmp_path):
    server = FakeServer("http://one", cap=4, answer_s=ANSWER_S)
    loop = VirtualClockLoop()

    def dispatcher(slot_use: SlotUse | None = None) -> Dispatcher:
        return Dispatcher(
            [server.base_url],
            DispatchOptions(),
            clock=loop.time,
            connect=lambda url: server,
            ledger=FleetLedger(tmp_path / "ledger"),
            slot_use=slot_use,
        )

    async def two_runs() -> tuple[float, SlotSeconds]:
        near_end = asyncio.create_task(dispatcher().run(requests("a", 60), lambda outcome: None))
        await asyncio.sleep(3.5)  # the first run fills the server's window and keeps wanting more
        joined_at, slot = now(), SlotUse(loop.time)  # the second run's step starts: it holds a pool slot
        await dispatcher(slot).run(requests("b", 120), lambda outcome: None)
        used = slot.take()  # the second run's step ends
        await near_end
        return joined_at, used

    joined_at, used = run_virtual(two_runs(), loop)

    first_sent = min(at for at, ids in server.received if ids[2] == 1)  # the second run's requests
    assert first_sent - joined_at <= ANSWER_S + 0.5
    assert used.idle_s <= ANSWER_S + 0.5, used
