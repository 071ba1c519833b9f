"""What one server's answers and `/metrics` say about it: its load from other clients, and whether it is
making progress on this run's requests or has them stuck.

Plain bookkeeping, no I/O and no clock of its own: the dispatcher feeds in what it saw and when, and asks
for a verdict. A passing `/health` is deliberately no input here. It proves that something at the endpoint
answers, not that our requests are being worked on: a router or a load balancer in front of a server (or a
server whose HTTP layer is fine while its `/generate` path is lost) answers `/health` with 200 while our
requests never come back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# Why a server with this run's requests stuck on it is set aside (its `reason` in the dispatcher's snapshot).
NOT_RUNNING = "requests_not_running"  # its /metrics report nothing running or queued while ours are there
# No answer and no load read showing ours there for `silence_s`, while other servers answered.
SILENT = "silent_while_others_answer"
NO_PROGRESS = "no_progress"  # no sign of progress at all for `watchdog_s`
# Answers begun (status and headers in) and not complete after `trickle_after_s`: the server finished them, and their
# bodies trickle in (a throttled link, a proxy that trickles).
TRICKLING = "answers_trickling"
# The set-asides for slowness (no progress on our requests, or answers arriving too slowly): each reason's limit (a
# `WatchLimits` field, the fleet resource's option of that name) and what it means for the operator, worded after it.
# `status` counts them per server after the run as well as during it.
SLOWNESS = {
    TRICKLING: ("trickle_after_s", "answers begun and not complete within {:g} s"),
    NOT_RUNNING: ("unserved_after_s", "none of ours running or queued by its /metrics for {:g} s"),
    SILENT: ("silence_s", "no answer for {:g} s while other servers answered"),
    NO_PROGRESS: ("watchdog_s", "no sign of progress for {:g} s"),
}


@dataclass(frozen=True)
class WatchLimits:
    unserved_after_s: float  # reads reporting nothing running or queued for this long, ours in flight
    silence_s: float  # no answer for this long while another server answered
    watchdog_s: float  # no sign of progress for this long
    trickle_after_s: float  # an answer begun and not complete for this long

    def of(self, reason: str) -> float:
        """The limit a set-aside for slowness (a key of `SLOWNESS`) was judged by."""
        return getattr(self, SLOWNESS[reason][0])


@dataclass
class ServerWatch:
    """One server's signs of progress on this run's requests, with times from the dispatcher's clock.

    Signs of progress: an answer to one of our requests, and a load read whose running + queued count is at
    least the number of our requests that were at the server before the read began (they can all be there;
    a server busy with long answers keeps showing them, so it is never written off for being slow).
    """

    quiet_since: float = 0.0  # the last answer, or when the server last became busy with our requests
    last_answer: float = -math.inf
    last_progress: float = 0.0  # the last sign of progress (answer or load read that shows ours there)
    unserved_since: float | None = None  # start of the first of consecutive reads showing nothing there

    def became_busy(self, now: float) -> None:
        """Our first request went to an idle server (or it rejoined): silence is measured from now."""
        self.quiet_since = self.last_progress = now
        self.unserved_since = None

    def answered(self, now: float) -> None:
        """The server answered one of our requests (a result, or an error it sent back)."""
        self.quiet_since = self.last_answer = self.last_progress = now
        self.unserved_since = None

    def load_read(self, started: float, reported: int, ours: int) -> None:
        """A `/metrics` read begun at `started` reported `reported` requests running + queued, when `ours` of
        this run's requests had been at the server since before the read began (and still are)."""
        if ours == 0:
            self.unserved_since = None
        elif reported == 0:
            if self.unserved_since is None:
                self.unserved_since = started
        else:
            self.unserved_since = None
            if reported >= ours:
                self.last_progress = max(self.last_progress, started)

    def verdict(self, now: float, limits: WatchLimits, others_last_answer: float) -> str | None:
        """Why a server with our requests in flight must be set aside now, or None.

        `others_last_answer` is when another server last answered one of our requests (-inf: never)."""
        if self.unserved_since is not None and now - self.unserved_since >= limits.unserved_after_s:
            return NOT_RUNNING
        # Silence is no answer while others answer and no read showing ours running there: a server whose /metrics
        # show them is working on long answers (a shard's tail), not silent; one without /metrics has only answers.
        silent = now - max(self.quiet_since, self.last_progress) >= limits.silence_s
        if silent and others_last_answer > now - limits.silence_s:
            return SILENT
        if now - self.last_progress >= limits.watchdog_s:
            return NO_PROGRESS
        return None


def next_foreign_load(current: int, previous_estimate: int, reported: int, node_in_flight: int) -> tuple[int, int]:
    """The load at a server that is not this node's, after one read of its `/metrics`: (foreign load, estimate).

    The server reports `reported` = running + queued, counting every client's requests that have reached it,
    this node's included; at the moment of the read this node had `node_in_flight` (the ledger's total, or the
    run's own without a ledger). The estimate is their difference. Between reads the node's own changes are
    known exactly, so its load is taken as its in-flight now + the foreign load: never in-flight + reported,
    which would count its requests twice. The node admits while that is under the window.

    Room that appears is taken in halves. A slot freed elsewhere shows as room until its owner refills it, and
    every node reading then would take it: an estimate only counts as low as the previous one (`previous_estimate`:
    a gap must show in two reads), and the foreign load then falls by half the difference per read. Nodes that
    start together on an idle server (where `current` starts at the whole window), or see another node's tail
    at the same read, take half each instead of all each; a node alone reaches the whole window in a few reads.
    A rise counts at once.

    What stays uncounted is the "small constant" over the window: other clients' requests sent since the
    read; on SGLang, what changed since the scheduler last refreshed these gauges (every 40 decode steps);
    and this node's requests still on the wire at the read (in `node_in_flight`, not yet in `reported`).
    """
    estimate = max(0, reported - node_in_flight)
    seen = max(estimate, previous_estimate)
    if seen < current:
        seen = current - math.ceil((current - seen) / 2)
    return seen, estimate
