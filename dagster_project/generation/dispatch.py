"""Asyncio dispatcher over an SGLang fleet: per-server windows, failover, exactly-once outcomes.

Each server gets an in-flight window sized from its own `/server_info`
(`internal_states[*].effective_max_running_requests_per_dp`) times `DispatchOptions.oversubscription`.
The default 1.25 keeps a small queue at each server, so a finished request's slot is
refilled at once instead of after a round trip: in benchmarks/bench_dispatcher.py a window equal to the
cap leaves each server below its cap 5–10% of the time, 1.25x keeps it there 100% of the time.
Requests are pulled from the caller lazily, only when some window has room, so memory stays bounded
however long the input is. Every request key ends exactly once, through one `on_outcome` call: with the
first result that arrives, or with an error that says why.

With a `FleetLedger`, every run on the node shares one in-flight budget per server (the window) and one
verdict per server: N concurrent runs keep about one window in flight at each server, the run nearest its
end gets freed slots first, and a server one run sets aside is set aside for all of them.

Runs on other nodes, and other clients, do not write to this node's ledger; the server itself counts them.
Every `load_read_interval_s` each dispatcher reads the server's `/metrics` and takes what it reports as
running + queued beyond this node's own requests as *foreign load*; its window then shrinks by that much
(see `next_foreign_load` for the estimate and its error).

Failures, and what happens to the requests caught in them:

* a dropped connection or a refused one: the server is quarantined; its requests fail on their own and
  are retried on other servers;
* a server that keeps failing requests (garbage bodies, 5xx answers, aborts, "NaN happened", answers cut off
  by a length stop short of the request's `max_new_tokens`): quarantined after a few in a row; a failed
  request is retried on a server it has not failed on whenever there is one;
* an answer that breaks the answer contract (`sglang.answer_contract`: more ids than `max_new_tokens`, the end id
  mid-answer, a stop that does not end the ids, a body past its bound) is no answer: retried elsewhere, counted
  on its server by rule, and a few of them set the server aside;
* a hung scheduler: `/health` on SGLang runs a one-token generation and answers 503 when the scheduler
  produces nothing for 20 s; a failed or timed-out health check quarantines the server;
* our requests stuck behind a healthy `/health` (a router or load balancer in front of a server, or a
  server whose `/generate` path is lost): a passing health check is not progress. Progress is an answer
  to one of our requests, or a `/metrics` read showing at least as many requests running + queued as we
  have there, so a server busy with long answers is never written off. A server is set aside when its
  `/metrics` show nothing running or queued for `unserved_after_s` while ours are there, when it shows no sign
  of progress (no answer, no read showing ours there) for `silence_s` while other servers answer, or after
  `watchdog_s` without any sign of progress (`server_watch.ServerWatch` keeps the account);
* whenever a server is quarantined, its in-flight requests are sent again elsewhere at once while the
  originals keep their chance; the first answer wins and the other attempts are aborted by their rids, and an
  original whose request was re-sent is aborted as soon as its server answers again, before it gets anything new
  (`resend`): each request is in flight once, and what the aborted ones wrote is counted as waste;
* 503 queue full: the server cools down (no new work) for a growing pause, and is quarantined if it
  keeps refusing;
* request errors (context overflow, bad request) end the request at once as an error outcome;
* a refused API key (401) stops the run at once: no server will take the work;
* a server of another model (`served_model`: checked before its first request and at every re-probe), or one
  whose answer holds ids outside the served vocabulary, is set aside naming what differs; a request holding
  such an id is never sent (an error outcome at once: it would kill a real server).

Each server joins the run as soon as its own first probe (its window, its served model) passes: a server whose
probe hangs holds no other, and is set aside at the probe's timeout. Quarantined servers are re-probed with
`/health`, `/server_info` and a one-token canary request, and rejoin when all three pass. If no server is usable
for `fleet_down_grace_s`, `run` raises `FleetDownError` instead of turning the remaining work into errors.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import uuid
from collections import deque
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from dataclasses import astuple, dataclass, field
from typing import Any

import aiohttp

from dagster_project.generation.dispatch_types import (
    DispatchOptions,
    DispatchStats,
    FleetDownError,
    FleetRefusesKey,
    GenRequest,
    Outcome,
)
from dagster_project.generation.ledger import FleetLedger
from dagster_project.generation.resend import Resends, unrecorded_cause
from dagster_project.generation.server_checks import HEALTHY, QUARANTINED, ServerChecks, ServerState
from dagster_project.generation.server_watch import WatchLimits
from dagster_project.generation.slot_use import SlotUse
from dagster_project.generation.unrecorded import LOST_HEDGES
from dagster_project.sglang.answer_contract import MALFORMED_ANSWER_KINDS, breaches_of, describe
from dagster_project.sglang.client import (
    ABORTED,
    ANSWER_OUT_OF_VOCAB,
    BAD_RESPONSE,
    CONNECTION_DROPPED,
    CUT_SHORT,
    INPUT_OUT_OF_VOCAB,
    NOT_FOUND,
    QUEUE_FULL,
    SAMPLING_FAILED,
    SERVER_ERROR,
    SERVER_UNAVAILABLE,
    TIMEOUT,
    UNAUTHORIZED,
    GenerateResult,
    SGLangClient,
    SGLangError,
    new_session,
)
from dagster_project.sglang.model_identity import ModelIdentity

logger = logging.getLogger(__name__)

# The endpoint is wrong (bad key, bad URL), not the request: the request waits for a usable server.
_MISCONFIGURED_KINDS = frozenset({UNAUTHORIZED, NOT_FOUND})
# Failures of the path to a server, not of the request: the server is set aside at once.
_SERVER_DOWN_KINDS = frozenset({CONNECTION_DROPPED, SERVER_UNAVAILABLE}) | _MISCONFIGURED_KINDS
# The request never ran (refused, rejected before admission): the attempt is not charged to it.
_UNCHARGED_KINDS = frozenset({SERVER_UNAVAILABLE, QUEUE_FULL}) | _MISCONFIGURED_KINDS
_QUEUE_FULL_QUARANTINE = 8  # consecutive 503s (about 30 s of cooling down) before a server is set aside
# Answers that show the server, not the request, is at fault; this many in a row set the server aside.
_SERVER_FAULT_KINDS = frozenset({SERVER_ERROR, SERVER_UNAVAILABLE, BAD_RESPONSE, SAMPLING_FAILED, CUT_SHORT, ABORTED})
_SERVER_FAULT_QUARANTINE = 5
# Answers that break the answer contract in a way no healthy server of the model does (`answer_contract`): counted
# per server and rule (its `errors`), never rows; this many in all, not only in a row, set the server aside.
_BROKEN_ANSWERS_SET_ASIDE = 3


@dataclass(eq=False)
class _Work:
    request: GenRequest
    attempts: int = 0
    charged: int = 0  # attempts that count against max_attempts
    tried: set = field(default_factory=set)
    live: list = field(default_factory=list)  # attempts in flight
    queued: bool = False
    done: bool = False


@dataclass(eq=False)
class _Attempt:
    work: _Work
    server: ServerState
    rid: str
    started: float
    task: asyncio.Task | None = None
    abandoned: bool = False  # its server was written off; a hedge runs elsewhere
    answer_begun: float | None = None  # when its answer's status and headers arrived: its server is done with it
    superseded: bool = False  # another attempt won or was sent: this one is aborted, its tokens are waste
    stopped: bool = False  # in flight when the run stopped: aborted, its tokens are waste


def _iterate(
    requests: Iterable[GenRequest] | AsyncIterable[GenRequest],
) -> Iterator[GenRequest] | AsyncIterator[GenRequest]:
    return requests.__aiter__() if isinstance(requests, AsyncIterable) else iter(requests)


_DEFAULT_OPTIONS = DispatchOptions()


class Dispatcher(Resends, ServerChecks):
    def __init__(
        self,
        endpoints: list[str],
        options: DispatchOptions = _DEFAULT_OPTIONS,
        *,
        api_key: str | None = None,
        windows: Mapping[str, int] | None = None,
        session: aiohttp.ClientSession | None = None,
        ledger: FleetLedger | None = None,
        discover: Callable[[], list[str]] | None = None,
        load_sources: Mapping[str, Sequence[str]] | None = None,
        clock: Callable[[], float] = time.monotonic,
        connect: Callable[[str], SGLangClient] | None = None,
        slot_use: SlotUse | None = None,
        expected_model: ModelIdentity | None = None,
    ):
        """`windows` fixes the window of given endpoints (a router has no scheduler state of its own);
        `ledger` shares windows and server verdicts with the other runs on this node; `discover` (the fleet
        registry) is called every `discovery_interval_s` while running, and servers it names join the run;
        `load_sources` names, for an endpoint that does not report its own load (sglang-router), the servers
        whose `/metrics` do (its workers): their running + queued requests add up to the endpoint's load.
        `clock` and `connect` (the client of one endpoint; default an `SGLangClient` on the run's session) let
        tests drive the dispatcher on a virtual clock with in-process servers. `slot_use` is told the requests in
        flight as they change (the run's pool slot idles while none is). `expected_model`: the model every server
        must serve (`served_model`); None: servers are not checked."""
        if not endpoints:
            raise ValueError("no endpoints")
        if len(set(endpoints)) != len(endpoints):
            raise ValueError(f"duplicate endpoints in {endpoints}")
        self.endpoints = [url.rstrip("/") for url in endpoints]
        self.options = options
        self.expected_model = expected_model
        self.api_key = api_key
        self.windows = {url.rstrip("/"): n for url, n in (windows or {}).items()}
        self._session = session
        self.ledger = ledger
        self._discover = discover
        self._clock, self._connect, self._slot_use = clock, connect, slot_use
        self._limits = WatchLimits(
            options.unserved_after_s, options.silence_s, options.watchdog_s, options.trickle_after_s
        )
        sources = {url.rstrip("/"): [u.rstrip("/") for u in urls] for url, urls in (load_sources or {}).items()}
        self._servers = [ServerState(url, load_urls=sources.get(url, [url])) for url in self.endpoints]
        self._running = False
        self.stats = DispatchStats()
        self._started = self._clock()
        self._down_since: float | None = None

    # ---- public --------------------------------------------------------------------------------------

    async def run(
        self,
        requests: Iterable[GenRequest] | AsyncIterable[GenRequest],
        on_outcome: Callable[[Outcome], Iterable[GenRequest] | None | Awaitable[Iterable[GenRequest] | None]],
        remaining: Callable[[], int] | None = None,
    ) -> DispatchStats:
        """Dispatch every request (and the follow-ups `on_outcome` returns) until each has ended once.

        `remaining` says how many requests the caller still has to finish; with a ledger, the run with the
        fewest gets freed slots first (without it, only the requests in flight are known)."""
        if self._running:
            raise RuntimeError("Dispatcher.run is already running")
        self._running = True
        self._reset(requests)
        self._remaining = remaining or (lambda: len(self._live))
        session = self._session or new_session()
        self._run_session, self._next_discovery = session, self._clock() + self.options.discovery_interval_s
        for server in self._servers:
            server.client = self._client(server.url)
            server.load_clients = [
                server.client if url == server.url else self._client(url) for url in server.load_urls
            ]
        helpers: list[asyncio.Task] = []
        try:
            for server in self._servers:
                self._join(server)
            helpers = [asyncio.create_task(self._monitor()), asyncio.create_task(self._deliver(on_outcome))]
            while True:
                self._wake.clear()
                if self._fatal is not None:
                    raise self._fatal
                self._fill()
                if self._finished():
                    break
                await self._wake.wait()
        finally:
            self._running = False
            await self._shutdown(helpers, session)
        self.stats.elapsed_s = self._clock() - self._started
        return self.stats

    def _client(self, url: str) -> SGLangClient:
        if self._connect is not None:
            return self._connect(url)
        return SGLangClient(url, self.api_key, self._run_session, probe_timeout_s=self.options.probe_timeout_s)

    def snapshot(self) -> dict:
        """Live state per server and totals (cheap; safe to call from another task at any time)."""
        now = self._clock()
        servers = {}
        for s in self._servers:
            servers[s.url] = {
                "state": "cooling_down" if s.state == HEALTHY and now < s.cooldown_until else s.state,
                "reason": s.reason,
                "window": s.window,
                "max_running_requests": s.cap,
                "in_flight": len(s.in_flight),
                "foreign_load": s.foreign_load,
                "load_unreported": s.load_unreported,
                "done": s.done,
                "errors": dict(s.errors),
                "prompt_tokens": s.prompt_tokens,
                "completion_tokens": s.completion_tokens,
                "unrecorded": s.unrecorded.as_dict(),
                "since_progress_s": round(now - s.watch.last_progress, 3) if s.in_flight else None,
                "set_aside_at": s.set_aside_at if s.state == QUARANTINED else None,
                "slow": self._slowness(s),
            }
        totals = {
            **self.stats.as_dict(),
            "in_flight": sum(len(s.in_flight) for s in self._servers),
            "pending_retries": len(self._retries) if self._running else 0,
            "pending_followups": len(self._followups) if self._running else 0,
            "undelivered": self._undelivered if self._running else 0,
            "healthy_servers": sum(s.state == HEALTHY for s in self._servers),
            "elapsed_s": now - self._started,
        }
        return {"servers": servers, "totals": totals, "running": self._running}

    # ---- the coordinator -----------------------------------------------------------------------------

    def _reset(self, requests: Iterable[GenRequest] | AsyncIterable[GenRequest]) -> None:
        self.stats = DispatchStats()
        self._started = self._clock()
        self._source = _iterate(requests)
        self._source_done = False
        self._pull: asyncio.Task | None = None
        self._retries: deque[_Work] = deque()
        self._followups: deque[_Work] = deque()
        self._live: dict[str, _Work] = {}
        self._outcomes: deque[Outcome] = deque()
        self._undelivered = 0
        self._wake = asyncio.Event()
        self._outcome_ready = asyncio.Event()
        self._fatal: BaseException | None = None
        self._probes: set[asyncio.Task] = set()
        self._aborts: set[asyncio.Task] = set()
        self._superseded: dict[str, _Attempt] = {}
        self._down_since = None
        for server in self._servers:
            server.in_flight.clear()

    def _finished(self) -> bool:
        return self._source_done and self._pull is None and not self._live and self._undelivered == 0

    def _backlog_limit(self) -> int:
        """Outcomes waiting for `on_outcome` hold whole answers: stop pulling when a fleet's worth piles up.

        So at most twice the sum of the windows are pulled and not yet delivered.
        """
        return max(1, sum(s.window for s in self._servers))

    def _fill(self) -> None:
        now = self._clock()
        self._reserve(now)
        waiting: list[_Work] = []  # retries that wait for a server they have not failed on
        try:
            while self._undelivered < self._backlog_limit():
                if not any(self._has_room(s, now) for s in self._servers):
                    return
                work = self._next_work()
                if work is None:
                    return
                server = self._pick(work, now)
                if server is None:
                    waiting.append(work)
                    continue
                self._launch(work, server, now)
        finally:
            for work in reversed(waiting):
                work.queued = True
                self._retries.appendleft(work)
            self._return_unused()

    def _has_work(self) -> bool:
        return bool(self._retries or self._followups) or not self._source_done

    def _reserve(self, now: float) -> None:
        """Slots each server may take in this fill: its window, less the foreign load the server last reported,
        less what is in flight: this run's alone, or with a ledger, the node's, as the shared budget grants."""
        for server in self._servers:
            limit = server.window - server.foreign_load
            room = limit - len(server.in_flight)
            if server.state != HEALTHY or now < server.cooldown_until or room <= 0 or not self._has_work():
                server.budget = 0
            elif self.ledger is None:
                server.budget = room
            else:
                self.ledger.remaining = self._remaining()
                server.budget = self.ledger.acquire(server.url, room, limit=limit)

    def _return_unused(self) -> None:
        for server in self._servers:
            if server.budget and self.ledger is not None:
                self.ledger.release(server.url, server.budget)
            server.budget = 0

    def _forget(self, attempt: _Attempt) -> None:
        """The attempt no longer occupies a slot on its server (and in the node's budget)."""
        if attempt.server.in_flight.pop(attempt.rid, None) is not None and self.ledger is not None:
            self.ledger.release(attempt.server.url)
        self._in_flight_changed()

    def _in_flight_changed(self) -> None:
        if self._slot_use is not None:
            self._slot_use.in_flight(sum(len(server.in_flight) for server in self._servers), source=id(self))

    def _next_work(self) -> _Work | None:
        for queue in (self._retries, self._followups):
            while queue:
                work = queue.popleft()
                work.queued = False
                if not work.done:  # (a re-send whose original answered while it waited is not sent)
                    return work
        if self._source_done:
            return None
        if isinstance(self._source, AsyncIterator):
            return self._next_async()
        try:
            request = next(self._source)
        except StopIteration:
            self._source_done = True
            return None
        return self._admit(request)

    def _next_async(self) -> _Work | None:
        """Take what a background pull fetched, or start one: a slow source never stalls retries."""
        if self._pull is None:
            self._pull = asyncio.ensure_future(self._source.__anext__())
            self._pull.add_done_callback(lambda _: self._wake.set())
            return None
        if not self._pull.done():
            return None
        pull, self._pull = self._pull, None
        try:
            return self._admit(pull.result())
        except StopAsyncIteration:
            self._source_done = True
            return None

    def _admit(self, request: GenRequest) -> _Work:
        if request.key in self._live:
            raise ValueError(f"request key {request.key!r} is already in flight: keys must be unique")
        work = _Work(request)
        self._live[request.key] = work
        return work

    def _has_room(self, server: ServerState, now: float) -> bool:
        return server.state == HEALTHY and server.budget > 0 and now >= server.cooldown_until

    def _pick(self, work: _Work, now: float) -> ServerState | None:
        """The least loaded server (counting what other nodes hold there) with room that this request has not
        failed on. A request goes back to a server it failed on only when every healthy server has failed it:
        otherwise it waits for another."""
        untried_healthy = any(s.state == HEALTHY and s.url not in work.tried for s in self._servers)
        best, best_score = None, None
        for server in self._servers:
            if not self._has_room(server, now) or (untried_healthy and server.url in work.tried):
                continue
            score = (len(server.in_flight) + server.foreign_load) / server.window
            if best_score is None or score < best_score:
                best, best_score = server, score
        return best

    def _launch(self, work: _Work, server: ServerState, now: float) -> None:
        work.attempts += 1
        work.charged += 1
        work.tried.add(server.url)
        self.stats.attempts += 1
        if work.attempts > 1:
            self.stats.retries += 1
        attempt = _Attempt(work, server, uuid.uuid4().hex, now)
        server.budget -= 1
        if not self._ours(server):
            server.watch.became_busy(now)  # the watchdog measures silence while busy, not idle time
        server.in_flight[attempt.rid] = attempt
        self._in_flight_changed()
        work.live.append(attempt)
        attempt.task = asyncio.create_task(self._attempt(attempt))

    async def _attempt(self, attempt: _Attempt) -> None:
        request = attempt.work.request
        try:
            result = await attempt.server.client.generate(
                request.input_ids,
                request.sampling_params,
                rid=attempt.rid,
                timeout=self.options.request_timeout_s,
                require_reasoning=self.options.require_reasoning,
                served=attempt.server.served,
                on_answer_begun=lambda: self._answer_begun(attempt),
            )
        except SGLangError as error:
            self._settle(attempt, None, error)
        except Exception as exc:  # noqa: BLE001 -- a bug here must stop the run, not hide as an error record
            self._fatal = exc
            self._wake.set()
        else:
            self._settle(attempt, result, None)

    def _answer_begun(self, attempt: _Attempt) -> None:
        attempt.answer_begun = self._clock()

    # ---- settling attempts -----------------------------------------------------------------------------

    def _settle(self, attempt: _Attempt, result: GenerateResult | None, error: SGLangError | None) -> None:
        if attempt.superseded:
            self._settle_superseded(attempt, result, error)
            self._wake.set()
            return
        now = self._clock()
        server, work = attempt.server, attempt.work
        self._forget(attempt)
        if attempt in work.live:
            work.live.remove(attempt)
        latency = now - attempt.started
        self._wake.set()
        if result is not None:
            server.watch.answered(now)
            server.done += 1
            server.consecutive_503 = server.consecutive_faults = 0
            server.prompt_tokens += result.prompt_tokens
            server.completion_tokens += result.completion_tokens
            if work.done:
                self.stats.late_results += 1  # first result wins
                self._unrecorded(server, LOST_HEDGES, result.completion_tokens)
            else:
                self._finish(work, result, None, server, latency)
            return
        server.errors[error.kind] += 1
        if error.partial is not None:  # it wrote an answer that is no record: aborted by its server, or refused
            self._unrecorded(server, unrecorded_cause(error), error.partial.completion_tokens)
        if error.kind == UNAUTHORIZED and self._fatal is None:
            self._fatal = FleetRefusesKey(
                f"{server.url} refused the API key (HTTP 401): set SGLANG_API_KEY to the key the servers were "
                "started with (--api-key)"
            )
        self._server_failed(server, error, now)
        if work.done:
            return
        if error.kind == TIMEOUT:
            self._abort_later(server, attempt.rid)
        if not error.retryable and error.kind not in _MISCONFIGURED_KINDS:
            self._finish(work, None, error, server, latency)
            return
        if error.kind in _UNCHARGED_KINDS:
            work.charged -= 1
        if work.live or work.queued:
            return  # another attempt is still running, or one is already queued
        if work.charged >= self.options.max_attempts:
            self._finish(work, None, error, server, latency)
        else:
            self._requeue(work)

    def _server_failed(self, server: ServerState, error: SGLangError, now: float) -> None:
        # A 502/503/504 *answer* comes from something alive (a router whose worker failed): count it like
        # a 5xx instead of writing the endpoint off; unreachable endpoints are written off at once.
        if error.kind in _SERVER_DOWN_KINDS and (error.status is None or error.kind in _MISCONFIGURED_KINDS):
            self._quarantine(server, error.kind, now)
        elif error.kind == QUEUE_FULL:
            server.consecutive_503 += 1
            server.cooldown_until = now + min(30.0, 0.25 * 2 ** (server.consecutive_503 - 1))
            if server.consecutive_503 >= _QUEUE_FULL_QUARANTINE:
                self._quarantine(server, QUEUE_FULL, now)
        elif error.kind in _SERVER_FAULT_KINDS:
            server.consecutive_faults += 1
            if server.consecutive_faults >= _SERVER_FAULT_QUARANTINE:
                self._quarantine(server, error.kind, now)
        elif error.kind in MALFORMED_ANSWER_KINDS:
            broken = breaches_of(server.errors, MALFORMED_ANSWER_KINDS)
            if sum(broken.values()) >= _BROKEN_ANSWERS_SET_ASIDE:
                self._quarantine(server, f"{sum(broken.values())} answers broke the contract: {describe(broken)}", now)
        elif error.kind == ANSWER_OUT_OF_VOCAB:  # not the served model's answer: out until the run ends
            server.foreign_answer = f"{error.kind}: {error.message}"
            self._quarantine(server, server.foreign_answer, now)
        elif error.kind not in (TIMEOUT, INPUT_OUT_OF_VOCAB):  # (a request refused unsent says nothing of it)
            server.watch.answered(now)  # it answered (a request error): alive

    def _requeue(self, work: _Work) -> None:
        work.queued = True
        self._retries.append(work)

    def _finish(
        self, work: _Work, result: GenerateResult | None, error: SGLangError | None, server: ServerState, latency: float
    ) -> None:
        work.done = True
        del self._live[work.request.key]
        for loser in list(work.live):  # hedges that lost: free their slots
            self._supersede(loser)
        self.stats.outcomes += 1
        if result is not None:
            self.stats.results += 1
            self.stats.prompt_tokens += result.prompt_tokens
            self.stats.completion_tokens += result.completion_tokens
        else:
            self.stats.errors[error.kind] += 1
        model = self.expected_model.label if result is not None and self.expected_model is not None else None
        self._outcomes.append(Outcome(work.request, result, error, server.url, work.attempts, latency, model))
        self._undelivered += 1
        self._outcome_ready.set()

    def _spawn(self, coroutine: Awaitable, tasks: set[asyncio.Task] | None = None) -> None:
        tasks = self._probes if tasks is None else tasks
        task = asyncio.ensure_future(coroutine)
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    # ---- health ----------------------------------------------------------------------------------------------

    async def _monitor(self) -> None:
        tick = min(0.25, *(period / 4 for period in (self.options.probe_interval_s, *astuple(self._limits))))
        while True:
            await asyncio.sleep(tick)
            now = self._clock()
            for server in self._servers:
                self._watch(server, now)
                if server.state == HEALTHY and not server.reading_load and now >= server.next_load_read:
                    self._spawn(self._read_load(server))
                if server.probing:
                    continue
                if server.state == HEALTHY and now >= server.next_health:
                    self._spawn(self._health(server))
                elif server.state != HEALTHY and now >= server.next_probe:
                    self._spawn(self._readmit(server))
            if self._discover is not None and now >= self._next_discovery:
                self._next_discovery = now + self.options.discovery_interval_s
                self._spawn(self._join_discovered())
            self._check_fleet(now)
            self._wake.set()  # cooldowns end and probes finish: let the coordinator look again

    async def _join_discovered(self) -> None:
        """Servers the registry names that this run does not know yet join it through the first probe."""
        urls = await asyncio.to_thread(self._discover)
        urls = dict.fromkeys(u.rstrip("/") for u in urls)
        joining = [ServerState(url, load_urls=[url]) for url in urls if url not in self.endpoints]
        if not joining:
            return
        for server in joining:
            server.client = self._client(server.url)
            self.endpoints.append(server.url)
            self._servers.append(server)
            self._join(server)

    def _check_fleet(self, now: float) -> None:
        if any(s.state == HEALTHY for s in self._servers) or self._finished():
            self._down_since = None
            return
        if self._down_since is None:
            self._down_since = now
        elif now - self._down_since > self.options.fleet_down_grace_s and self._fatal is None:
            reasons = ", ".join(f"{s.url}: {s.reason}" for s in self._servers)
            self._fatal = FleetDownError(
                f"no usable server for {now - self._down_since:.0f}s ({reasons}); "
                f"{len(self._live)} requests unfinished, {self.stats.outcomes} ended"
            )

    # ---- delivery and shutdown -----------------------------------------------------------------------------

    async def _deliver(self, on_outcome: Callable[[Outcome], Any]) -> None:
        """Call `on_outcome` in order, one at a time; its follow-ups go ahead of new requests."""
        try:
            while True:
                while not self._outcomes:
                    self._outcome_ready.clear()
                    await self._outcome_ready.wait()
                outcome = self._outcomes.popleft()
                followups = on_outcome(outcome)
                if inspect.isawaitable(followups):
                    followups = await followups
                for request in followups or ():
                    work = self._admit(request)
                    work.queued = True
                    self._followups.append(work)
                self._undelivered -= 1
                self._wake.set()
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                self._fatal = exc
                self._wake.set()
            raise

    async def _shutdown(self, helpers: list[asyncio.Task], session: aiohttp.ClientSession) -> None:
        """Stop helpers; abort what is still in flight (a run that failed or was stopped) and what was superseded,
        reading their aborted answers for the tokens they wrote (`resend.Resends._settle_at_stop`)."""
        for task in helpers:
            task.cancel()
        if self._pull is not None:
            self._pull.cancel()
        await self._settle_at_stop()
        pending = [*helpers, *self._probes]
        if self._aborts:
            # Aborts get a moment to reach live servers; probes and canaries are simply cancelled.
            await asyncio.wait(self._aborts, timeout=2.0)
            pending += list(self._aborts)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for server in self._servers:
            server.in_flight.clear()
            server.probing = server.reading_load = False
        self._in_flight_changed()
        if self.ledger is not None:
            self.ledger.leave(self.endpoints)
        if self._session is None:
            await session.close()
