"""A shard's ETA, on a simulated steady fleet whose true finishing time is known: from its first finished answers at
the lifetime rate (marked as such) while its window settles, then from the window once it is long enough to be
stable, never swinging with the waves in which answers end."""

from __future__ import annotations

import heapq
import random

import pytest

from dagster_project.generation.progress import ETA_FROM_LIFETIME, ETA_FROM_WINDOW, Heartbeat, ShardProgress

SLOTS = 32  # requests the fleet runs at once
TOKENS_PER_S = 5.0  # per request, while it decodes
TTFT_S = 10.0  # queueing and prefill before the first token
SNAPSHOT_EVERY_S = 30


def steady_fleet(events: int = 1153, seed: int = 7) -> list[tuple[float, int, float]]:
    """(finished at, output tokens, latency) of each answer: SLOTS at once, a new request as one ends, lengths
    lognormal around ~380 tokens (a request lives ~90 s on average, long ones several minutes)."""
    rng = random.Random(seed)
    lengths = [max(8, int(rng.lognormvariate(5.7, 0.7))) for _ in range(events)]
    running = [(TTFT_S + lengths[i] / TOKENS_PER_S, i) for i in range(SLOTS)]
    heapq.heapify(running)
    finished, started = [], SLOTS
    while running:
        at, i = heapq.heappop(running)
        finished.append((at, lengths[i], TTFT_S + lengths[i] / TOKENS_PER_S))
        if started < events:
            heapq.heappush(running, (at + TTFT_S + lengths[started] / TOKENS_PER_S, started))
            started += 1
    return finished


def heartbeats_every_30_s(finished: list[tuple[float, int, float]]) -> list[tuple[float, Heartbeat]]:
    progress = ShardProgress(shard=0, total_events=len(finished), settings_fingerprint="f", started_at=0.0)
    beats, recorded = [], 0
    for now in range(SNAPSHOT_EVERY_S, int(finished[-1][0]), SNAPSHOT_EVERY_S):
        while recorded < len(finished) and finished[recorded][0] <= now:
            at, tokens, latency = finished[recorded]
            row = {"status": "ok", "finish_reason": "stop", "completion_tokens": tokens, "client_latency_s": latency}
            progress.record(row, now=at)
            recorded += 1
        beats.append((now, progress.snapshot(now=now)))
    return beats


def test_a_shard_eta_from_its_window_is_within_a_quarter_of_the_truth_and_never_swings():
    finished = steady_fleet()
    end = finished[-1][0]
    beats = heartbeats_every_30_s(finished)
    given = [(now, beat.eta_s) for now, beat in beats if beat.eta_basis == ETA_FROM_WINDOW]
    assert given, "an ETA from the window once it is long enough"
    # Until the last few waves (whose longest answers set the end), the ETA is the time left to within 25%.
    for now, eta in given:
        if len(finished) - sum(at <= now for at, _, _ in finished) > 4 * SLOTS:
            assert abs(eta / (end - now) - 1) <= 0.25, (
                f"ETA {eta / 60:.1f} min at {now} s, truth {(end - now) / 60:.1f}"
            )
    # Thirty seconds later, the ETA is thirty seconds less, give or take 15%: not 576 min, then 35.
    for (then, before), (now, after) in zip(given, given[1:]):
        expected = before - (now - then)
        assert abs(after - expected) <= 0.15 * before + 60, f"ETA {before / 60:.1f} → {after / 60:.1f} min in 30 s"


def test_before_its_window_is_long_enough_the_eta_comes_from_the_lifetime_rate_and_says_so():
    finished = steady_fleet()
    beats = heartbeats_every_30_s(finished)
    first_minutes = [beat for now, beat in beats if now <= 4 * 60]
    assert all(beat.eta_settling for beat in first_minutes)
    # Past the first request lifetime (~90 s here) it is the time left to within a quarter.
    for now, beat in beats:
        if 90 <= now <= 4 * 60:
            assert abs(beat.eta_s / (finished[-1][0] - now) - 1) <= 0.25, (now, beat.eta_s)
    # From the first finished answers on, an ETA: never none while events remain and answers end.
    answered = [beat for beat in first_minutes if beat.done_events]
    assert answered and all(beat.eta_basis == ETA_FROM_LIFETIME and beat.eta_s > 0 for beat in answered)
    assert all(beat.eta_s is None for beat in first_minutes if not beat.done_events)
    for beat in answered:  # the lifetime rate: remaining events at the events ended per second so far
        assert beat.eta_s == pytest.approx(beat.remaining_events / beat.lifetime.req_per_s)
    settled = [beat for _, beat in beats if not beat.eta_settling]
    assert settled and all(beat.eta_s is not None and beat.eta_basis == ETA_FROM_WINDOW for beat in settled)
    # It says how long the ETA has been measured, of how long it needs: a request lives ~90 s here, so the
    # window holds four lifetimes.
    assert first_minutes[-1].eta_rates.seconds == 240 and 300 <= first_minutes[-1].eta_window_s <= 420


def test_when_the_rate_changes_mid_shard_the_eta_follows_the_window_not_the_lifetime_rate():
    """An hour at one answer every 2 s, then the fleet doubles (one a second): the ETA is the remaining events at
    the new rate once the window has only new answers in it, not at the slower rate of the shard's lifetime."""
    progress = ShardProgress(shard=0, total_events=10_000, settings_fingerprint="f", started_at=0.0)
    row = {"status": "ok", "finish_reason": "stop", "completion_tokens": 100, "client_latency_s": 30.0}
    finished = [2.0 * (i + 1) for i in range(1800)]  # 0-3600 s: 0.5 answers/s
    finished += [3600.0 + i + 1 for i in range(1200)]  # 3600-4800 s: 1 answer/s
    for at in finished:
        progress.record(row, now=at)
    beat = progress.snapshot(now=4800.5)  # the window (300 s here) holds the answers of 4501-4800 s
    remaining = 10_000 - 3000
    assert beat.remaining_events == remaining and not beat.eta_settling
    assert beat.eta_window_s == 300 and beat.lifetime.req_per_s == 3000 / 4800.5  # a lifetime ETA: ~11,200 s
    assert beat.eta_rates.req_per_s == 1.0 and beat.eta_s == remaining / 1.0
