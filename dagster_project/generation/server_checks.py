"""Each server's state in the dispatcher (`ServerState`), and how the dispatcher checks its servers: the first
probe (window from `/server_info`, the served model), through which each server joins on its own (a probe that
hangs holds no other server: that server alone is set aside at the probe's timeout), periodic health checks,
re-probes of set-aside servers, reads of their load from `/metrics`, and the verdict of each server's
`ServerWatch` on whether it is working on our requests.

A mixin of `Dispatcher`, which owns the state these methods read and write (declared below).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from dagster_project.generation.dispatch_types import DispatchOptions, FleetRefusesKey
from dagster_project.generation.ledger import FleetLedger
from dagster_project.generation.served_model import (
    ServedModelMismatch,
    mismatch_reason,
    refuse_fleet,
    served_model_problems,
)
from dagster_project.generation.server_watch import TRICKLING, ServerWatch, WatchLimits, next_foreign_load
from dagster_project.generation.unrecorded import PROBES, Unrecorded
from dagster_project.sglang import protocol as proto
from dagster_project.sglang.answer_contract import Served
from dagster_project.sglang.client import NOT_FOUND, SERVER_UNAVAILABLE, UNAUTHORIZED, SGLangClient, SGLangError
from dagster_project.sglang.model_identity import ModelIdentity

logger = logging.getLogger(__name__)

HEALTHY = "healthy"
QUARANTINED = "quarantined"
UNPROBED = "unprobed"
_CANARY_PARAMS = {"max_new_tokens": 1, "temperature": 0.0}


@dataclass(eq=False)
class ServerState:
    """What the dispatcher knows of one server: its state, window and cap, its requests in flight, its counts, and
    when it is next probed, health-checked or read."""

    url: str
    state: str = UNPROBED
    reason: str | None = None
    window: int = 0
    cap: int | None = None
    in_flight: dict = field(default_factory=dict)  # rid -> _Attempt
    done: int = 0
    errors: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    watch: ServerWatch = field(default_factory=ServerWatch)  # its signs of progress on our requests
    cooldown_until: float = 0.0
    consecutive_503: int = 0
    consecutive_faults: int = 0
    budget: int = 0  # slots granted by the ledger for this fill and not used yet
    foreign_load: int = 0  # requests at the server that are not this node's: see `next_foreign_load`
    previous_foreign: int = 0  # the estimate of the previous read
    load_urls: list = field(default_factory=list)  # whose /metrics report this endpoint's load
    load_clients: list = field(default_factory=list)
    load_unreported: str | None = None  # why the server's load is not read (no /metrics): only the node counts
    next_load_read: float = 0.0
    reading_load: bool = False
    next_health: float = 0.0
    next_probe: float = 0.0
    probe_failures: int = 0
    probing: bool = False
    client: SGLangClient | None = None
    set_aside_at: float | None = None  # wall clock, for the operator: when `_quarantine` set it aside
    served: Served = Served()  # the served vocabulary and end id, once checked: requests and answers are held to it
    foreign_answer: str | None = None  # why an answer of it was not the served model's: out for the run
    unaborted: set = field(default_factory=set)  # rids of superseded attempts whose abort it did not take (`resend`)
    unrecorded: Unrecorded = field(default_factory=Unrecorded)  # what it generated that is in no record, by cause
    # Times this run set it aside for slowness, by reason (`server_watch.SLOWNESS`), and the answers it caught
    # trickling: kept when it rejoins, so that the run's last heartbeat still says it was slow.
    slow: Counter = field(default_factory=Counter)
    answers_trickled: int = 0


class _AnotherModel(Exception):
    """A re-probed server answers, but not as the job's model: it stays set aside."""


class ServerChecks:
    """Probes, health checks, load reads and progress verdicts of the dispatcher's servers."""

    options: DispatchOptions
    expected_model: ModelIdentity | None
    windows: dict[str, int]
    ledger: FleetLedger | None
    _servers: list[ServerState]
    _clock: Callable[[], float]
    _limits: WatchLimits
    _wake: asyncio.Event
    _fatal: BaseException | None

    def _quarantine(self, server: ServerState, reason: str, now: float, *, share: bool = True) -> None:
        """Set the server aside and send its requests elsewhere: the dispatcher's, which owns the requests."""
        raise NotImplementedError

    def _unrecorded(self, server: ServerState, cause: str, tokens: int) -> None:
        """Count an answer in no record: the dispatcher's (`resend`)."""
        raise NotImplementedError

    async def _abort_superseded(self, server: ServerState) -> None:
        """Abort the server's originals whose requests were re-sent: the dispatcher's (`resend`)."""
        raise NotImplementedError

    def _spawn(self, coroutine: Awaitable, tasks: set[asyncio.Task] | None = None) -> None:
        raise NotImplementedError

    async def _window(self, server: ServerState) -> int:
        if server.url in self.windows:
            return self.windows[server.url]
        try:
            info = await server.client.server_info()
        except SGLangError as error:
            if error.kind != NOT_FOUND:  # sglang-router has no /server_info at all
                raise
            info = {}
        caps = [state.get("effective_max_running_requests_per_dp") for state in info.get("internal_states") or []]
        if caps and all(isinstance(cap, int) and cap > 0 for cap in caps):
            server.cap = sum(caps)  # one entry per DP rank
            return max(1, math.ceil(server.cap * self.options.oversubscription))
        if self.options.default_window is not None:
            return self.options.default_window
        raise ValueError(
            f"cannot size the window of {server.url}: it reports no "
            "internal_states[].effective_max_running_requests_per_dp (a router?); pass windows= or a default_window"
        )

    async def _other_model(self, server: ServerState) -> str | None:
        """Why the server is not serving the job's model (None: it is, or no model is expected); an answer of
        another vocabulary it gave this run keeps it out. Sets the vocabulary its requests are checked against."""
        if self.expected_model is None:
            return None
        if server.foreign_answer is not None:
            return server.foreign_answer
        workers = [client for client in server.load_clients if client is not server.client]
        expected, timeout = self.expected_model, self.options.canary_timeout_s
        problems = await served_model_problems(
            server.client, expected, timeout, workers, lambda tokens: self._unrecorded(server, PROBES, tokens)
        )
        if problems:
            return mismatch_reason(problems, expected)
        if problems is None and server.served.vocab_size is None:
            logger.warning(
                "%s serves no /server_info or /model_info (a router) and names no workers: its model is not checked "
                "(set the fleet resource's router_workers); requests are checked against %s's vocabulary",
                server.url,
                expected.model,
            )
        server.served = expected.served()
        return None

    def _refuse_other_models(self) -> None:
        """Stop the run when every server, all probed, serves another model (`ServedModelMismatch`): none of them
        was sent a request."""
        if self.expected_model is None or any(s.state == UNPROBED for s in self._servers):
            return
        # Only this run's own verdicts count: a verdict another run left in the ledger was not checked here.
        reasons = {s.url: s.reason if s.state == QUARANTINED and s.set_aside_at else None for s in self._servers}
        try:
            refuse_fleet(reasons, self.expected_model)
        except ServedModelMismatch as exc:
            self._fatal = self._fatal or exc

    def _join(self, server: ServerState) -> None:
        """The server joins the run when its own first probe passes; until then it gets no request (and no
        re-probe), and the other servers do not wait for it."""
        server.probing = True
        self._spawn(self._first_probe(server))

    async def _first_probe(self, server: ServerState) -> None:
        try:
            await self._probe_first(server)
        finally:
            server.probing = False
            self._refuse_other_models()
            self._wake.set()

    async def _probe_first(self, server: ServerState) -> None:
        now = self._clock()
        # A run joining a busy fleet must not fill a whole window first: its load is read before the first fill,
        # alongside /server_info.
        reading = asyncio.ensure_future(self._reported_load(server)) if self.options.load_read_interval_s else None
        try:
            server.window = await self._window(server)
            other_model = await self._other_model(server)  # before its first request
        except SGLangError as error:
            if reading is not None:
                reading.cancel()
            if error.kind == UNAUTHORIZED:
                self._fatal = FleetRefusesKey(
                    f"{server.url} refused the API key (HTTP 401): set SGLANG_API_KEY to the key the servers were "
                    "started with (--api-key)"
                )
            # Its verdict alone (not shared: a first probe that failed says less than a set-aside while serving).
            self._quarantine(server, error.kind, self._clock(), share=False)
            return
        if other_model is not None:
            if reading is not None:
                reading.cancel()
            self._quarantine(server, other_model, now)
            return
        verdict = self.ledger.verdict(server.url) if self.ledger is not None else None
        if verdict is not None:  # another run set it aside: it rejoins only through a passing re-probe
            server.state, server.reason, server.next_probe = (
                QUARANTINED,
                verdict.followed(),
                now,
            )
            if reading is not None:
                reading.cancel()
            return
        server.state, server.reason = HEALTHY, None
        server.next_health = now + self.options.probe_interval_s
        if reading is not None and (read := await reading) is not None:
            reported, node = read
            # On a node with nothing at the server yet, the foreign load starts as the whole window.
            start = server.window if node == 0 else 0
            server.foreign_load, server.previous_foreign = next_foreign_load(start, 0, reported, node)
            server.next_load_read = self._clock() + self.options.load_read_interval_s

    async def _readmit(self, server: ServerState) -> None:
        """Rejoin only when the server answers health, reports its cap, and really generates a token."""
        server.probing = True
        try:
            # /health, not /health_generate: on SGLang both generate a token, but sglang-router has only /health.
            if not await server.client.health(timeout=self.options.probe_timeout_s):
                raise SGLangError(SERVER_UNAVAILABLE, "/health failed", url=server.url)
            window = await self._window(server)
            canary = await server.client.generate(
                [0], _CANARY_PARAMS, timeout=self.options.canary_timeout_s, require_reasoning=False
            )
            self._unrecorded(server, PROBES, canary.completion_tokens)
            other_model = await self._other_model(server)  # on every reconnect: a restart may bring another model
            if other_model is not None:
                raise _AnotherModel(other_model)
            await self._abort_superseded(server)  # it answers again: its re-sent originals go before anything new
        except ValueError as exc:  # the server came back unable to report its cap: a configuration error
            self._fatal = exc
        except (SGLangError, _AnotherModel) as error:
            server.probe_failures += 1
            if isinstance(error, _AnotherModel):
                server.reason = str(error)
            else:
                kept = server.reason.split(" (")[0] if server.reason else None
                server.reason = f"{kept} (re-probe: {error.kind})" if kept else error.kind
            backoff = min(
                self.options.max_probe_backoff_s,
                self.options.probe_interval_s * 2 ** min(server.probe_failures - 1, 10),
            )
            server.next_probe = self._clock() + backoff
        else:
            now = self._clock()
            server.state, server.reason, server.window = HEALTHY, None, window
            server.probe_failures = server.consecutive_503 = server.consecutive_faults = 0
            if self.ledger is not None:
                self.ledger.clear(server.url)
            server.watch.became_busy(now)
            server.next_health, server.cooldown_until = now + self.options.probe_interval_s, 0.0
        finally:
            server.probing = False
            self._wake.set()

    async def _health(self, server: ServerState) -> None:
        """Follow the node's verdict on the server, then check it. A failing health check sets the server aside
        (SGLang's `/health` answers 503 when its scheduler produced nothing for 20 s); a passing one is no sign
        of progress on our requests: a router or load balancer in front may answer it while they are lost."""
        server.probing = True
        try:
            verdict = self.ledger.verdict(server.url) if self.ledger is not None else None
            if verdict is not None and server.state == HEALTHY:
                self._quarantine(server, verdict.followed(), self._clock(), share=False)
                return
            healthy = await server.client.health(timeout=self.options.probe_timeout_s)
            if not healthy and server.state == HEALTHY:
                self._quarantine(server, "health_failed", self._clock())
        finally:
            server.probing = False
            server.next_health = self._clock() + self.options.probe_interval_s
            self._wake.set()

    def _node_in_flight(self, server: ServerState) -> int:
        return self.ledger.in_flight(server.url) if self.ledger is not None else len(server.in_flight)

    async def _read_load(self, server: ServerState) -> None:
        """Re-estimate the server's foreign load, and tell its watch whether our requests show there."""
        server.reading_load = True
        started = self._clock()
        try:
            read = await self._reported_load(server)
            if read is not None:
                server.foreign_load, server.previous_foreign = next_foreign_load(
                    server.foreign_load, server.previous_foreign, *read
                )
                server.watch.load_read(started, read[0], self._ours(server, sent_before=started))
        finally:
            server.reading_load = False
            server.next_load_read = self._clock() + self.options.load_read_interval_s
            self._wake.set()

    async def _reported_load(self, server: ServerState) -> tuple[int, int] | None:
        """(running + queued that the server's `/metrics` report, or its workers' behind a router; this node's
        in-flight there just before the read), or None when there is no reading."""
        node = self._node_in_flight(server)
        try:
            texts = await asyncio.gather(
                *(client.metrics(timeout=self.options.probe_timeout_s) for client in server.load_clients)
            )
            loads = [proto.reported_load(proto.parse_metrics(text)) for text in texts]
            if None in loads:
                raise ValueError("its /metrics has no sglang:num_running_reqs and sglang:num_queue_reqs")
        except SGLangError as error:
            if error.kind == NOT_FOUND:  # launched without --enable-metrics
                self._unreported(server, "/metrics not found (server without --enable-metrics)")
            return None  # otherwise the health checks judge the server; the last estimate stands
        except ValueError as exc:
            self._unreported(server, f"/metrics unreadable: {exc}")
            return None
        return sum(loads), node

    @staticmethod
    def _unreported(server: ServerState, reason: str) -> None:
        """Only this node's runs count against the window of a server whose load cannot be read; stop asking."""
        server.load_unreported, server.next_load_read = reason, math.inf
        server.foreign_load = server.previous_foreign = 0

    @staticmethod
    def _ours(server: ServerState, sent_before: float = math.inf) -> int:
        """This run's requests at the server that were not written off (sent before `sent_before`) and that it still
        works on: one whose answer has begun arriving is done there (its `/metrics` no longer count it)."""
        return sum(
            not a.abandoned and a.started < sent_before and a.answer_begun is None for a in server.in_flight.values()
        )

    def _slowness(self, server: ServerState) -> dict:
        """The server's set-asides for slowness in this run, with the limits they were judged by, and the answers it
        caught trickling (empty: none): what `status` says of it after the run as well as during it."""
        if not server.slow:
            return {}
        return {
            "set_aside": dict(server.slow),
            "limits_s": {reason: self._limits.of(reason) for reason in server.slow},
            "answers_trickled": server.answers_trickled,
        }

    def _watch(self, server: ServerState, now: float) -> None:
        """Set aside a server whose answers trickle in, or that has our requests and, by its answers and reads, is not
        working on them."""
        if server.state != HEALTHY:
            return
        begun = [a.answer_begun for a in server.in_flight.values() if not a.abandoned and a.answer_begun is not None]
        trickling = sum(now - at >= self._limits.trickle_after_s for at in begun)
        if trickling:
            server.answers_trickled += trickling
            self._quarantine(server, TRICKLING, now)
            return
        if not self._ours(server):
            return
        others_last_answer = max((s.watch.last_answer for s in self._servers if s is not server), default=-math.inf)
        reason = server.watch.verdict(now, self._limits, others_last_answer)
        if reason is not None:
            self._quarantine(server, reason, now)
