"""The account of one server's progress on our requests, with the times given by hand."""

from __future__ import annotations

import math

from dagster_project.generation.server_watch import NO_PROGRESS, NOT_RUNNING, SILENT, ServerWatch, WatchLimits

LIMITS = WatchLimits(unserved_after_s=15.0, silence_s=45.0, watchdog_s=120.0, trickle_after_s=30.0)
NEVER = -math.inf


def busy_at(t: float) -> ServerWatch:
    watch = ServerWatch()
    watch.became_busy(t)
    return watch


def test_reads_showing_nothing_running_while_ours_are_there_set_it_aside_after_the_limit():
    watch = busy_at(100.0)
    watch.load_read(started=101.0, reported=0, ours=5)
    watch.load_read(started=110.0, reported=0, ours=5)
    assert watch.verdict(115.9, LIMITS, NEVER) is None
    assert watch.verdict(116.0, LIMITS, NEVER) == NOT_RUNNING


def test_a_read_showing_requests_there_or_none_of_ours_in_flight_restarts_the_count():
    watch = busy_at(100.0)
    watch.load_read(started=101.0, reported=0, ours=5)
    watch.load_read(started=108.0, reported=3, ours=5)  # some there: not lost (too few to count as progress)
    watch.load_read(started=109.0, reported=0, ours=5)
    assert watch.verdict(123.0, LIMITS, NEVER) is None
    assert watch.verdict(124.0, LIMITS, NEVER) == NOT_RUNNING
    watch.load_read(started=124.5, reported=0, ours=0)  # ours all answered or written off meanwhile
    assert watch.verdict(125.0, LIMITS, NEVER) is None


def test_an_answer_clears_the_unserved_count():
    watch = busy_at(100.0)
    watch.load_read(started=101.0, reported=0, ours=5)
    watch.answered(110.0)
    assert watch.verdict(120.0, LIMITS, NEVER) is None


def test_silence_counts_only_while_another_server_answers():
    watch = busy_at(100.0)
    assert watch.verdict(146.0, LIMITS, others_last_answer=NEVER) is None
    assert watch.verdict(146.0, LIMITS, others_last_answer=100.5) is None  # the other one went quiet too
    assert watch.verdict(146.0, LIMITS, others_last_answer=140.0) == SILENT
    watch.answered(146.0)
    assert watch.verdict(190.0, LIMITS, others_last_answer=189.0) is None


def test_the_watchdog_counts_answers_and_reads_showing_our_requests_there():
    watch = busy_at(0.0)
    assert watch.verdict(119.0, LIMITS, NEVER) is None
    assert watch.verdict(120.0, LIMITS, NEVER) == NO_PROGRESS
    watch.load_read(started=110.0, reported=6, ours=5)  # all of ours can be there (and one of another client)
    assert watch.verdict(229.0, LIMITS, NEVER) is None
    assert watch.verdict(230.0, LIMITS, NEVER) == NO_PROGRESS
    watch.load_read(started=200.0, reported=4, ours=5)  # fewer than ours: no sign of progress
    assert watch.verdict(230.0, LIMITS, NEVER) == NO_PROGRESS
    watch.answered(225.0)
    assert watch.verdict(344.0, LIMITS, NEVER) is None


def test_a_read_showing_ours_running_there_is_no_silence():
    watch = busy_at(100.0)
    watch.load_read(started=130.0, reported=5, ours=5)  # working on all of ours: long answers, not lost
    assert watch.verdict(160.0, LIMITS, others_last_answer=159.0) is None
    assert watch.verdict(175.0, LIMITS, others_last_answer=174.0) == SILENT  # 45 s since that read
