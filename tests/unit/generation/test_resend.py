"""Each request in flight once: a server stopped mid-run (a SIGSTOP) and resumed gets its re-sent requests' originals
aborted by their rids as soon as it answers again, never runs a prompt twice at once, and what the aborted originals
wrote is counted, and a broken answer to one is named on its server (on a virtual clock with in-process servers)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions, DispatchStats, GenRequest, Outcome
from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.shards import GenerationSummary, RowCounts
from dagster_project.generation.unrecorded import REFUSED
from dagster_project.sglang import answer_contract as contract
from dagster_project.sglang.client import GenerateResult, SGLangError
from tests.support.virtual_fleet import FakeServer, StoppableServer, VirtualClockLoop, now, run_virtual


def _requests(count: int) -> list[GenRequest]:
    return [GenRequest(f"e{i}", [7, 8, 9, i], {"max_new_tokens": 1024}) for i in range(count)]


def _run(
    servers: list[FakeServer], count: int, stopped: StoppableServer, stop_at: float, resume_at: float
) -> tuple[Dispatcher, DispatchStats, dict[str, Outcome]]:
    """Dispatch `count` requests over `servers`, stopping `stopped` at `stop_at` and resuming it at `resume_at`."""
    loop, by_url = VirtualClockLoop(), {server.base_url: server for server in servers}
    dispatcher = Dispatcher(list(by_url), DispatchOptions(), clock=loop.time, connect=by_url.__getitem__)
    outcomes: dict[str, Outcome] = {}

    def on_outcome(outcome: Outcome) -> None:
        assert outcome.request.key not in outcomes, f"{outcome.request.key} ended twice"
        outcomes[outcome.request.key] = outcome

    async def run() -> DispatchStats:
        asyncio.get_running_loop().call_later(stop_at, stopped.stop)
        asyncio.get_running_loop().call_later(resume_at, stopped.resume)
        stats = await dispatcher.run(_requests(count), on_outcome)
        assert now() > resume_at, "the run ended before the server came back: the test proves nothing"
        return stats

    stats = run_virtual(run(), loop)
    assert sorted(outcomes) == sorted(r.key for r in _requests(count))  # none lost
    assert all(o.ok for o in outcomes.values())
    return dispatcher, stats, outcomes


class BreaksWhatItHeldThroughAStop(StoppableServer):
    """Resumed after a stop, it answers each request it held through the stop with the end-of-turn id mid-answer (a
    breach of the contract, raised as the client raises one), and it takes aborts without acting on them (as a proxy
    that does not pass them on): the originals it held end with their broken answers after being superseded."""

    def __init__(self, url: str, **options: Any):
        super().__init__(url, **options)
        self.stops = 0
        self.broke: list[str] = []  # the rids it answered with a broken answer

    def stop(self) -> None:
        self.stops += 1
        super().stop()

    async def abort(self, rid: str, timeout: float | None = None) -> None:
        await self._answer_or_time_out(timeout)
        self.aborted.append((now(), rid))

    async def generate(self, *request: Any, **options: Any) -> GenerateResult:
        stops = self.stops
        result = await super().generate(*request, **options)
        if self.stops == stops:
            return result
        self.broke.append(result.rid)
        detail = contract.BREACHES[contract.END_MID_ANSWER]
        raise SGLangError(contract.END_MID_ANSWER, detail, url=self.base_url, rid=result.rid, partial=result)


def _originals_aborted_after(server: StoppableServer, at: float) -> list[str]:
    """The rids it aborted, each once, all after `at`, each one a request it was sent."""
    rids = [rid for _, rid in server.aborted]
    assert len(rids) == len(set(rids)), "an rid aborted twice"
    assert all(when >= at for when, _ in server.aborted), server.aborted
    assert set(rids) <= set(server.rids)  # by exact rid, one it holds
    return rids


def _run_summary(dispatcher: Dispatcher, done: int) -> GenerationSummary:
    """The completions manifest's run summary of a shard this dispatcher generated (from its heartbeat)."""
    beat = Heartbeat(
        shard=0, state="done", settings_fingerprint="f", started_at=0.0, updated_at=time.time(), total_events=done,
        resumed_events=0, done_events=done, remaining_events=0, ok_events=done,
        servers=dispatcher.snapshot()["servers"],
    )  # fmt: skip
    return GenerationSummary.of(beat, RowCounts())


def test_a_lone_server_back_from_a_hang_runs_each_request_once():
    # The trial: one server SIGSTOPped for a minute then SIGCONTed. Its window is re-sent to it once it is back;
    # the originals it still held must be aborted first, not run beside their re-sends.
    server = StoppableServer("http://stopped", answer_s=20.0)
    dispatcher, stats, outcomes = _run([server], 40, server, stop_at=30.0, resume_at=90.0)
    assert stats.hedges == 5  # its whole window (cap 4 x 1.25) was set aside and re-sent
    aborted = _originals_aborted_after(server, 90.0)
    assert len(aborted) == stats.hedges
    assert server.peak_per_prompt == 1  # never two requests of one prompt running at once
    assert sum(server.running.values()) == 0
    # What the aborted originals wrote before the stop (about 10 s of 20 s answers): counted, not lost.
    assert 5 * 50 <= stats.resent_original_tokens <= 5 * 200
    view = dispatcher.snapshot()["servers"][server.base_url]["unrecorded"]
    # (and the one-token canary it answered to rejoin)
    assert view == {
        "answers": {"resent_original": 5, "probes": 1},
        "tokens": {"resent_original": stats.resent_original_tokens, "probes": 1},
    }
    # The completions manifest's run summary carries them, answers beside tokens (the ledger's `resent_original`).
    summary = _run_summary(dispatcher, 40)
    assert summary.unrecorded_output_tokens == view["tokens"] and summary.unrecorded_answers == view["answers"]


def test_originals_of_requests_answered_elsewhere_are_aborted_once_their_server_is_back():
    # The re-sends finish on the other server while this one is stopped: the aborts it cannot take then are sent
    # again when it answers again, so it does not run them to their end after the resume.
    stopped = StoppableServer("http://stopped", answer_s=20.0)
    healthy = FakeServer("http://healthy", answer_s=2.0)
    dispatcher, stats, outcomes = _run([stopped, healthy], 300, stopped, stop_at=10.0, resume_at=70.0)
    assert stats.hedges == 5
    hedged = {key for key, o in outcomes.items() if o.attempts > 1}
    assert len(hedged) == 5 and all(outcomes[key].server == healthy.base_url for key in hedged)
    aborted = _originals_aborted_after(stopped, 70.0)
    assert sorted(stopped.rids[rid] for rid in aborted) == sorted(
        tuple(r.input_ids) for r in _requests(300) if r.key in hedged
    )
    assert sum(stopped.running.values()) == 0  # nothing of ours left running there
    assert stats.resent_original_tokens > 0 and stats.late_results == 0


def test_a_superseded_original_that_breaks_the_contract_is_named_on_its_server(caplog):
    # Stopped 2 s before its five 20 s answers end, it is set aside and their re-sends are answered by the other
    # server; resumed, it ends the originals (superseded: nobody waits for them) with broken answers. Each is a
    # fault of the server: named on it, as many as the ledger counts refused, and they set it aside.
    stopped = BreaksWhatItHeldThroughAStop("http://stopped", answer_s=20.0)
    healthy = FakeServer("http://healthy", answer_s=2.0)
    with caplog.at_level(logging.WARNING):
        dispatcher, stats, _ = _run([stopped, healthy], 300, stopped, stop_at=18.0, resume_at=80.0)  # all answered
    # Each broken answer was to an original given up and aborted (superseded), not to an attempt waited for.
    assert len(stopped.broke) == 5 and set(stopped.broke) <= set(_originals_aborted_after(stopped, 80.0))
    view = dispatcher.snapshot()["servers"][stopped.base_url]
    named = contract.breaches_of(view["errors"], contract.MALFORMED_ANSWER_KINDS)
    assert named == {contract.END_MID_ANSWER: 5}, view
    assert view["unrecorded"]["answers"][REFUSED] == sum(named.values())
    assert view["unrecorded"]["tokens"][REFUSED] == 5 * 200  # each wrote its whole answer
    assert stats.unrecorded.answers[REFUSED] == sum(named.values())
    set_aside = f"server {stopped.base_url} set aside (3 answers broke the contract: end-of-turn mid-answer 3)"
    assert any(set_aside in record.getMessage() for record in caplog.records), caplog.text
