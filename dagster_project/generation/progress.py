"""Live progress of one shard: counts, token totals, lifetime and windowed rates, spec-decoding figures.

The shard driver feeds every finished event into a `ShardProgress`; its `snapshot()` is the `Heartbeat`
written to `<store>/progress/shard=NNNNN.json` every few seconds and read by `status`.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from dagster_project.records import STATUS_EXCLUDED

DEFAULT_WINDOW_S = 120.0
# The ETA's window. Answers end in waves (a batch started together ends over about one request lifetime, long
# answers last), so a rate over less than a few lifetimes swings with each wave: over 120 s, an ETA fell from
# 576 min to 35 min within two minutes of a 52-min shard. The window holds at least this long and this many
# request lifetimes, and it is "settling" until the run has measured that long and seen ETA_MIN_REQUESTS answers end
# in it (a rate over fewer swings by more than ±15%); meanwhile the ETA comes from the run's lifetime rate, marked so.
ETA_MIN_WINDOW_S = 300.0
ETA_WINDOW_LIFETIMES = 4
ETA_MIN_REQUESTS = 50
# What an ETA comes from: the run's lifetime rate (all it has measured, from its first finished answers, while the
# window settles), or the window once it is stable.
ETA_FROM_LIFETIME = "lifetime"
ETA_FROM_WINDOW = "window"


@dataclass(frozen=True)
class Rates:
    seconds: float = 0.0
    req_per_s: float = 0.0
    output_tok_per_s: float = 0.0


@dataclass(frozen=True)
class SpecDecodingStats:
    """Accept length = completion tokens / verify passes, over requests that reported spec-decoding stats."""

    accept_length_lifetime: float | None = None
    accept_length_window: float | None = None
    window_spec_tokens: int = 0
    window_verify_passes: int = 0
    requests_without_spec_stats: int = 0


@dataclass(frozen=True, kw_only=True)
class Heartbeat:
    """A running shard's progress, as `status` reads it from the store."""

    shard: int
    state: str
    settings_fingerprint: str
    started_at: float
    updated_at: float
    total_events: int
    resumed_events: int
    done_events: int
    remaining_events: int
    ok_events: int
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    finish_reasons: dict[str, int] = field(default_factory=dict)
    excluded_by_reason: dict[str, int] = field(default_factory=dict)  # events not sent, by design (`excluded`)
    prompt_tokens: int = 0
    output_tokens: int = 0
    avg_output_tokens: float | None = None
    lifetime: Rates = field(default_factory=Rates)
    window: Rates = field(default_factory=Rates)
    spec: SpecDecodingStats = field(default_factory=SpecDecodingStats)
    eta_s: float | None = None  # None until an answer finished
    eta_basis: str = ""  # ETA_FROM_LIFETIME while the window is settling, then ETA_FROM_WINDOW; "" without an ETA
    # The rates the ETA comes from: over the ETA's window, or all this run has measured while it is shorter.
    eta_rates: Rates = field(default_factory=Rates)
    eta_window_s: float = ETA_MIN_WINDOW_S  # the window the ETA needs before it is given
    eta_settling: bool = False
    # The dispatcher's own view of each server (`Dispatcher.snapshot()`), keyed by URL.
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    upload_failures: int = 0
    # The store calls this run made and those it retried, by cause (`StoreCalls`: S3 throttling, timeouts).
    store_calls: int = 0
    store_retries: dict[str, int] = field(default_factory=dict)
    # Who writes it, so `status` can tell a live run from a dead one (`heartbeat.run_is_alive`): the process
    # (host, pid and its start mark, which tells it from a later process given the same pid: `processes`), the
    # Dagster run, and how often it beats.
    host: str = ""
    pid: int = 0
    process_start: str = ""
    run_id: str | None = None
    heartbeat_interval_s: float | None = None


@dataclass
class _Finished:
    at: float
    output_tokens: int
    verify_passes: int
    latency_s: float


@dataclass
class ShardProgress:
    shard: int
    total_events: int
    settings_fingerprint: str
    resumed_events: int = 0
    window_s: float = DEFAULT_WINDOW_S
    started_at: float = field(default_factory=time.time)
    done_events: int = 0
    ok_events: int = 0
    errors_by_kind: Counter = field(default_factory=Counter)
    finish_reasons: Counter = field(default_factory=Counter)
    excluded_by_reason: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    output_tokens: int = 0
    spec_tokens: int = 0  # completion tokens of requests that reported spec stats
    spec_verify_passes: int = 0
    requests_without_spec_stats: int = 0
    latency_s: float = 0.0  # over the answers that reported one (`latency_counted`)
    latency_counted: int = 0
    state: str = "running"
    _recent: deque = field(default_factory=deque)

    def record(self, row: dict[str, Any], now: float | None = None) -> None:
        now = time.time() if now is None else now
        self.done_events += 1
        if row["status"] == STATUS_EXCLUDED:
            self.excluded_by_reason[row.get("error_kind") or "unknown"] += 1
            return
        if row["status"] != "ok":
            self.errors_by_kind[row.get("error_kind") or "unknown"] += 1
            return
        self.ok_events += 1
        self.finish_reasons[row.get("finish_reason") or "unknown"] += 1
        output = int(row.get("completion_tokens") or 0)
        verify = int(row.get("spec_verify_ct") or 0)
        self.prompt_tokens += int(row.get("prompt_tokens") or 0)
        self.output_tokens += output
        if verify:
            self.spec_tokens += output
            self.spec_verify_passes += verify
        else:
            self.requests_without_spec_stats += 1
        latency = row.get("client_latency_s") or row.get("e2e_latency_s")
        if latency:
            self.latency_s += float(latency)
            self.latency_counted += 1
        self._recent.append(_Finished(now, output, verify, float(latency or 0.0)))
        self._trim(now)

    def remaining_events(self) -> int:
        return max(self.total_events - self.resumed_events - self.done_events, 0)

    def eta_window_s(self) -> float:
        """At least ETA_MIN_WINDOW_S and ETA_WINDOW_LIFETIMES mean request lifetimes."""
        lifetime = self.latency_s / self.latency_counted if self.latency_counted else 0.0
        return max(ETA_MIN_WINDOW_S, ETA_WINDOW_LIFETIMES * lifetime, self.window_s)

    def _trim(self, now: float) -> None:
        kept = max(self.window_s, self.eta_window_s())
        while self._recent and self._recent[0].at < now - kept:
            self._recent.popleft()

    def snapshot(self, now: float | None = None, servers: dict[str, dict[str, Any]] | None = None) -> Heartbeat:
        now = time.time() if now is None else now
        self._trim(now)
        elapsed = max(now - self.started_at, 1e-9)
        window = [f for f in self._recent if f.at >= now - self.window_s]
        window_span = min(self.window_s, elapsed)
        window_tokens = sum(f.output_tokens for f in window)
        window_spec_tokens = sum(f.output_tokens for f in window if f.verify_passes)
        window_verify = sum(f.verify_passes for f in window)
        generated_here = self.done_events
        answered_here = generated_here - sum(self.excluded_by_reason.values())  # what was sent: the rate's
        remaining = self.remaining_events()
        avg_output = self.output_tokens / self.ok_events if self.ok_events else None
        window_tok_s = window_tokens / window_span if window else 0.0
        eta_window = self.eta_window_s()
        eta_span = min(eta_window, elapsed)
        eta_finished = [f for f in self._recent if f.at >= now - eta_window]
        eta_tok_s = sum(f.output_tokens for f in eta_finished) / eta_span
        settling = remaining > 0 and (elapsed < eta_window or len(eta_finished) < ETA_MIN_REQUESTS)
        eta_s, eta_basis = None, ""
        if not settling and eta_finished:
            eta_s, eta_basis = remaining * eta_span / len(eta_finished), ETA_FROM_WINDOW
        elif generated_here:  # from the first finished answers: the lifetime rate, marked as such
            eta_s, eta_basis = remaining * elapsed / generated_here, ETA_FROM_LIFETIME
        return Heartbeat(
            shard=self.shard,
            state=self.state,
            settings_fingerprint=self.settings_fingerprint,
            started_at=self.started_at,
            updated_at=now,
            total_events=self.total_events,
            resumed_events=self.resumed_events,
            done_events=self.resumed_events + generated_here,
            remaining_events=remaining,
            ok_events=self.ok_events,
            errors_by_kind=dict(self.errors_by_kind),
            finish_reasons=dict(self.finish_reasons),
            excluded_by_reason=dict(self.excluded_by_reason),
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            avg_output_tokens=avg_output,
            lifetime=Rates(
                seconds=elapsed, req_per_s=answered_here / elapsed, output_tok_per_s=self.output_tokens / elapsed
            ),
            window=Rates(
                seconds=window_span,
                req_per_s=len(window) / window_span if window_span else 0.0,
                output_tok_per_s=window_tok_s,
            ),
            spec=SpecDecodingStats(
                accept_length_lifetime=self.spec_tokens / self.spec_verify_passes if self.spec_verify_passes else None,
                accept_length_window=window_spec_tokens / window_verify if window_verify else None,
                window_spec_tokens=window_spec_tokens,
                window_verify_passes=window_verify,
                requests_without_spec_stats=self.requests_without_spec_stats,
            ),
            eta_s=eta_s,
            eta_basis=eta_basis,
            eta_rates=Rates(seconds=eta_span, req_per_s=len(eta_finished) / eta_span, output_tok_per_s=eta_tok_s),
            eta_window_s=eta_window,
            eta_settling=settling,
            servers=servers or {},
        )
