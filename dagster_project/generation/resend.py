"""Setting a server aside and re-sending its requests, so that each request is in flight once.

When a server is set aside (a hang, silence, failed health checks), its requests are sent again elsewhere at once
(or to it, once it is back, when it is the only server) while the originals keep their chance: the first answer
wins. A hung server still holds the originals, and a SIGSTOPped SGLang server that is SIGCONTed runs them all
again beside their re-sends (on the real server on CPU: 40 in flight became 66 running + 14 queued, KV at 100%).
So an original whose request was re-sent is *superseded*: it gives up its slot and is aborted by its exact rid,
at once when its request was answered elsewhere, and in any case as soon as its server answers again (a re-probe
passes), before anything more is sent there. An abort the server did not take (it was hung) is kept and sent
again then. The tokens a superseded original wrote, as its aborted answer reports them, are counted
(`ServerState.unrecorded`): output paid for and in no row, the waste ledger's `resent_original`.

A mixin of `Dispatcher`, which owns the requests and the attempts these methods read and write (declared below).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from dagster_project.generation.dispatch_types import DispatchOptions, DispatchStats
from dagster_project.generation.ledger import FleetLedger
from dagster_project.generation.server_checks import QUARANTINED, ServerState
from dagster_project.generation.server_watch import SLOWNESS
from dagster_project.generation.unrecorded import (
    ERRORS_AND_RETRIES,
    LOST_HEDGES,
    REFUSED,
    RESENT_ORIGINAL,
    STOPPED_IN_FLIGHT,
)
from dagster_project.sglang.answer_contract import MALFORMED_ANSWER_KINDS
from dagster_project.sglang.client import ABORTED, GenerateResult, SGLangError

logger = logging.getLogger(__name__)

_ABORT_TIMEOUT_S = 5.0  # an abort is one small POST: a server that cannot take it in this long is hung
# A server that held an aborted request answers it at once; one that never got it (lost on the way) never answers.
_ABORTED_ANSWER_WAIT_S = 5.0
# When the run stops, a server gets this long to take the aborts of what is still there (a hung one never does).
_ABORT_AT_STOP_TIMEOUT_S = 2.0


def unrecorded_cause(error: SGLangError) -> str:
    """Where a failed attempt's output goes in the waste ledger: a refused answer, or a failed one."""
    return REFUSED if error.kind in MALFORMED_ANSWER_KINDS else ERRORS_AND_RETRIES


class Resends:
    """Set-asides, re-sends and the aborts of superseded originals."""

    options: DispatchOptions
    ledger: FleetLedger | None
    stats: DispatchStats
    _servers: list[ServerState]
    _clock: Callable[[], float]
    _aborts: set[asyncio.Task]
    _superseded: dict  # rid -> attempt superseded and not settled yet: its answer (aborted, or late) still counts

    def _requeue(self, work) -> None:
        raise NotImplementedError

    def _forget(self, attempt) -> None:
        raise NotImplementedError

    def _spawn(self, coroutine: Awaitable, tasks: set[asyncio.Task] | None = None) -> None:
        raise NotImplementedError

    def _server_failed(self, server: ServerState, error: SGLangError, now: float) -> None:
        raise NotImplementedError

    def _unrecorded(self, server: ServerState, cause: str, tokens: int) -> None:
        """The server generated an answer of `tokens` output tokens that no record holds (the waste ledger's)."""
        server.unrecorded.add(cause, tokens)
        self.stats.unrecorded.add(cause, tokens)

    def _quarantine(self, server: ServerState, reason: str, now: float, *, share: bool = True) -> None:
        """Set the server aside (for every run on the node, unless the verdict came from one of them) and send
        its in-flight requests elsewhere at once."""
        if server.state == QUARANTINED:
            return
        server.state, server.reason, server.set_aside_at = QUARANTINED, reason, time.time()
        if reason in SLOWNESS:
            server.slow[reason] += 1
        server.next_probe = now  # first re-probe right away; later ones back off
        logger.warning("server %s set aside (%s): it gets no new requests until a re-probe passes", server.url, reason)
        if share and self.ledger is not None:
            self.ledger.set_aside(server.url, reason)
        self._hedge(server)

    def _hedge(self, server: ServerState) -> None:
        """Send the requests stuck on a silent server elsewhere; the originals keep running until their server
        answers again (`_abort_superseded`) or another attempt wins."""
        for attempt in list(server.in_flight.values()):
            attempt.abandoned = True
            work = attempt.work
            if work.done or work.queued or any(not a.abandoned for a in work.live):
                continue
            if work.charged < self.options.max_attempts:
                self.stats.hedges += 1
                self._requeue(work)

    def _supersede(self, attempt) -> None:
        """Another attempt of its request won or was sent: this one frees its slot and is aborted by its rid. Its
        task keeps waiting for the aborted answer, which reports the tokens it wrote."""
        self._give_up(attempt)
        self._abort_later(attempt.server, attempt.rid)

    def _give_up(self, attempt) -> None:
        attempt.superseded = True
        attempt.work.live.remove(attempt)
        self._forget(attempt)
        self._superseded[attempt.rid] = attempt
        attempt.task.add_done_callback(lambda _: self._superseded.pop(attempt.rid, None))

    async def _abort_superseded(self, server: ServerState) -> None:
        """The server answers again: abort its originals whose requests were re-sent, and the aborts it did not
        take while it was hung, before it gets any new request (each request in flight once)."""
        for attempt in list(server.in_flight.values()):
            work = attempt.work
            if attempt.abandoned and (work.queued or any(a is not attempt for a in work.live)):
                self._give_up(attempt)
                server.unaborted.add(attempt.rid)
        rids, server.unaborted = server.unaborted, set()
        await asyncio.gather(*(self._abort(server, rid) for rid in rids))

    def _settle_superseded(self, attempt, result: GenerateResult | None, error: SGLangError | None) -> None:
        """A superseded attempt ended: a late answer (lost to another attempt) or the answer to our abort, whose
        tokens were generated for nothing and say nothing against the server; or an answer that broke the contract as
        no healthy server does (`MALFORMED_ANSWER_KINDS`), a fault of its server even though nobody waits for it any
        more. No other failure is counted against it here: a timeout or a dropped connection of a request given up
        says nothing of it, and the other breaches' tokens are counted (`errors_and_retries`), not the breaches."""
        server, now = attempt.server, self._clock()
        if result is not None:
            server.watch.answered(now)
            server.done += 1
            server.completion_tokens += result.completion_tokens
            self.stats.late_results += 1
            self._unrecorded(server, STOPPED_IN_FLIGHT if attempt.stopped else LOST_HEDGES, result.completion_tokens)
        elif error.kind == ABORTED:
            server.watch.answered(now)
            cause = STOPPED_IN_FLIGHT if attempt.stopped else RESENT_ORIGINAL
            self._unrecorded(server, cause, error.partial.completion_tokens if error.partial else 0)
        else:
            if error.kind in MALFORMED_ANSWER_KINDS:
                # Named on its server like any breach (the ledger counts it `refused` below). It also counts toward
                # setting the server aside: that rule reads these same counts, so many in all and not only in a
                # row, and left out here a server past the bound would stay in until some later breach.
                server.errors[error.kind] += 1
                self._server_failed(server, error, now)
            if error.partial is not None:  # what it wrote is in no record
                self._unrecorded(server, unrecorded_cause(error), error.partial.completion_tokens)

    def _abort_later(self, server: ServerState, rid: str) -> None:
        """Free the slot on the server now rather than when it notices the disconnect."""
        self._spawn(self._abort(server, rid), self._aborts)

    async def _abort(self, server: ServerState, rid: str) -> None:
        try:
            await server.client.abort(rid, timeout=min(_ABORT_TIMEOUT_S, self.options.probe_timeout_s))
        except SGLangError:
            server.unaborted.add(rid)  # sent again when the server answers again (a dead one never does)
            return
        if (attempt := self._superseded.get(rid)) is not None:  # its aborted answer is due: stop waiting soon
            asyncio.get_running_loop().call_later(_ABORTED_ANSWER_WAIT_S, attempt.task.cancel)

    async def _settle_at_stop(self) -> None:
        """The run stops: every attempt still in flight (a run that failed, or a hold's drain that ran out) is given
        up, and it and every superseded attempt not settled yet is aborted by its rid and its aborted answer read for
        the tokens it wrote (`stopped_in_flight`, or the superseded one's cause). Cancelled unread instead, what they
        wrote would be in the server's count (`sglang:generation_tokens_total`) and in none of ours wherever the abort
        reached them first (a proxy in front of the server that does not pass a disconnect on). An attempt whose abort
        its server does not take in `_ABORT_AT_STOP_TIMEOUT_S` (hung, dead), or whose answer does not come in
        `_ABORTED_ANSWER_WAIT_S`, is cancelled unread."""
        for server in self._servers:
            for attempt in list(server.in_flight.values()):
                attempt.stopped = True
                self._give_up(attempt)
        settling = [asyncio.ensure_future(self._abort_and_read(a)) for a in list(self._superseded.values())]
        try:
            await asyncio.gather(*settling)
        finally:  # (the run cancelled again meanwhile: what is left is cancelled unread)
            for attempt in list(self._superseded.values()):
                attempt.task.cancel()

    async def _abort_and_read(self, attempt) -> None:
        try:
            await attempt.server.client.abort(attempt.rid, timeout=_ABORT_AT_STOP_TIMEOUT_S)
        except SGLangError:
            attempt.task.cancel()
        else:
            await asyncio.wait([attempt.task], timeout=_ABORTED_ANSWER_WAIT_S)
            attempt.task.cancel()
        await asyncio.gather(attempt.task, return_exceptions=True)
