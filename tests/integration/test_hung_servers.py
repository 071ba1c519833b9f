"""Acceptance on simulator processes: a hung server holds no other, and a server back from a hang runs each request
once.

* One of two servers answers `/health` while its `/generate` hangs from the start (the `hang_generate` fault): the
  healthy server answers while the hung one's served-model probe still waits, the hung one is set aside at that
  probe's timeout, and the shard ends with every request once.
* A lone server hangs mid-run (the `hang` fault: its `/health` fails) and comes back: the requests it held are
  re-sent to it once it answers again, their originals aborted by their rids first (its abort log), and what
  they wrote is counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, AsyncIterator, Iterable

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, DispatchStats, GenRequest, Outcome
from dagster_project.generation.served_model import ExpectedModel
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.client import TIMEOUT
from tests.support.sglang_fixtures import SimFleet

PARAMS = proto.sampling_params(max_new_tokens=1024)


def request(index: int) -> GenRequest:
    ids = [248045, 846, 198, 5000 + index, 248046, 198, 248045, 74455, 198, 248068, 198]
    return GenRequest(f"conv{index}#turn0", ids, PARAMS)


def requests(count: int) -> list[GenRequest]:
    return [request(i) for i in range(count)]


def shard_requests(fleet: SimFleet, index: int, count: int) -> list[dict]:
    """The server's request log less the dispatcher's probes: the shard's requests it received."""
    prompts = {proto.input_hash(request.input_ids) for request in requests(count)}
    return [entry for entry in fleet.requests(index) if entry["input_hash"] in prompts]


class Shard:
    """A shard's requests through a dispatcher, each outcome checked to end once, with when it came (wall clock, as the
    dispatcher's `set_aside_at`)."""

    def __init__(self, dispatcher: Dispatcher):
        self.dispatcher = dispatcher
        self.answered_at: dict[str, float] = {}
        self.started_at = 0.0

    def on_outcome(self, outcome: Outcome) -> None:
        key = outcome.request.key
        assert key not in self.answered_at, f"{key} ended twice"
        assert outcome.ok, outcome.error
        self.answered_at[key] = time.time()

    def run(self, batch: Iterable[GenRequest] | AsyncIterable[GenRequest], during=None) -> DispatchStats:
        sent: list[str] = []

        async def noted():
            if isinstance(batch, AsyncIterable):
                async for one in batch:
                    sent.append(one.key)
                    yield one
            else:
                for one in batch:
                    sent.append(one.key)
                    yield one

        async def run() -> DispatchStats:
            side = asyncio.ensure_future(during()) if during is not None else None
            try:
                return await self.dispatcher.run(noted(), self.on_outcome)
            finally:
                if side is not None:
                    side.cancel()

        self.started_at = time.time()
        stats = asyncio.run(run())
        assert sorted(self.answered_at) == sorted(sent)  # every request ended, each once
        return stats


HEALTHY, HUNG = 0, 1
PROBE_TIMEOUT_S = 10.0  # the served-model probe's (canary_timeout_s): tens of the healthy server's first answers


def test_a_server_whose_generate_hangs_from_the_start_holds_no_other(sim_fleet):
    fleet = sim_fleet(2, max_running_requests=4, decode_step_s=0.005, output_len="uniform:100:300")
    fleet.set_faults(HUNG, hang_generate=True)
    options = DispatchOptions(canary_timeout_s=PROBE_TIMEOUT_S)
    dispatcher = Dispatcher(fleet.urls, options, expected_model=ExpectedModel().identity())
    shard = Shard(dispatcher)

    async def until_set_aside() -> AsyncIterator[GenRequest]:
        """The shard lasts until the hung server's probe has timed out (and a few requests more)."""
        index = 0
        while dispatcher.snapshot()["servers"][fleet.url(HUNG)]["state"] == "unprobed" and index < 10_000:
            yield request(index)
            index += 1
        for more in range(index, index + 5):
            yield request(more)

    shard.run(until_set_aside())
    hung = dispatcher.snapshot()["servers"][fleet.url(HUNG)]
    # Set aside by its probe's timeout (its reason), and not before that timeout could have passed.
    assert hung["state"] == "quarantined" and hung["reason"].startswith(TIMEOUT), hung
    assert hung["set_aside_at"] - shard.started_at >= PROBE_TIMEOUT_S
    # Before: nothing answered until the hung server's probe had timed out (the trial: 150 s with the default 120 s).
    # Now the healthy server answers while that probe still waits.
    answered_first = sum(at < hung["set_aside_at"] for at in shard.answered_at.values())
    assert answered_first >= 1, shard.answered_at
    assert shard_requests(fleet, HUNG, len(shard.answered_at)) == []  # only its probes went to it
    print(
        f"hung /generate beside a healthy server: {answered_first} of {len(shard.answered_at)} answered before the "
        f"hung one was set aside (probe timeout {PROBE_TIMEOUT_S:.0f} s)"
    )


def test_a_server_back_from_a_hang_runs_each_request_once(sim_fleet):
    # Answers of 1-3 s; a health check that fails 0.5 s into a hang; the watchdog a minute away.
    fleet = sim_fleet(
        1, max_running_requests=4, decode_step_s=0.01, output_len="uniform:300:900", health_check_timeout_s=0.5
    )
    options = DispatchOptions(probe_interval_s=0.2, canary_timeout_s=2.0, max_probe_backoff_s=0.5, watchdog_s=60.0)
    dispatcher = Dispatcher(fleet.urls, options)
    shard = Shard(dispatcher)
    back: list[float] = []

    async def hang_then_resume() -> None:
        while len(shard.answered_at) < 5:  # mid-run: its second window is running
            await asyncio.sleep(0.05)
        await asyncio.to_thread(fleet.set_faults, 0, hang=True)
        while dispatcher.snapshot()["servers"][fleet.url(0)]["state"] != "quarantined":
            await asyncio.sleep(0.05)
        back.append(time.time())
        await asyncio.to_thread(fleet.set_faults, 0, hang=False)

    stats = shard.run(requests(20), during=hang_then_resume)
    assert back and stats.hedges == 5, stats  # its window was set aside, to be re-sent
    sent: dict[str, list[dict]] = {}
    for entry in shard_requests(fleet, 0, 20):
        sent.setdefault(entry["input_hash"], []).append(entry)
    # Each prompt answered once: one "stop" each, and every other request of it aborted.
    assert all([e["outcome"] for e in entries].count("stop") == 1 for entries in sent.values()), sent
    aborts = {abort["rid"]: abort for abort in fleet.aborts(0)}
    resent = [entries for entries in sent.values() if len(entries) > 1]
    for original, again in resent:
        # The original was aborted by its rid once the server was back, while it still held it, and before its
        # re-send arrived: never two of one prompt running at once.
        abort = aborts[original["rid"]]  # KeyError: an original never aborted
        assert abort["ended"] == 1 and back[0] <= abort["at"] <= again["received_at"], (abort, again, back)
        assert original["outcome"] == "abort" and again["outcome"] == "stop"
    # An original that finished in the moment between the resume and its abort won: its re-send was never sent.
    assert 1 <= len(resent) <= 5 and all(len(entries) <= 2 for entries in sent.values())
    assert fleet.state(0)["running"] == 0
    assert stats.resent_original_tokens > 0  # what the aborted originals wrote before the hang: counted as waste
    print(f"back from a hang: {len(resent)} originals aborted by rid before their re-sends, "
          f"{stats.resent_original_tokens} tokens they wrote counted")  # fmt: skip
