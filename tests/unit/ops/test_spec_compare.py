"""The verdict on MTP at the recommended concurrency, from measured speculative settings, and status question 2
quoting it (no server involved)."""

from __future__ import annotations

import time

from dagster_project.ops.answers.mtp import answer_mtp, render_mtp
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.spec_compare import SpecTrial, compare, markdown, not_measured
from dagster_project.ops.tune import TuneReport


def trials(off: float, *others: tuple[str, float, float]) -> list[SpecTrial]:
    launched = SpecTrial("3/1/4", 1000.0, 2.9, baseline=True)
    return [launched, SpecTrial("off", off, None), *(SpecTrial(name, rate, accept) for name, rate, accept in others)]


def test_mtp_that_pays_is_quantified_with_its_accept_length():
    result = compare(40, trials(800.0), noise=0.02)
    assert result.measured and result.best == "3/1/4"
    assert result.verdict.startswith(
        "MTP on: +25% output tok/s at this concurrency (40 per server, 3/1/4, accept length 2.90)"
    )
    assert "noise" not in result.verdict


def test_mtp_that_costs_says_so_and_to_launch_without_it():
    result = compare(64, trials(1250.0, ("2/1/3", 1100.0, 2.4)), noise=0.02)
    assert result.best == "off"
    assert result.verdict.startswith("MTP costs 12% here (64 per server: the best setting 2/1/3, accept length 2.40")
    assert "launch without it" in result.verdict


def test_a_better_speculative_setting_is_named_and_a_gap_inside_the_noise_is_flagged():
    result = compare(40, trials(980.0, ("5/1/6", 1040.0, 3.4)), noise=0.04)
    assert result.verdict.startswith("MTP on: +6%") and "5/1/6, accept length 3.40" in result.verdict
    assert "within the measurement noise (±4.0% RMS)" in result.verdict
    assert "the best speculative setting is 5/1/6, +4% over 3/1/4 as launched (within the noise)" in result.verdict
    clear = compare(40, trials(700.0, ("5/1/6", 1200.0, 3.4)), noise=0.02)
    assert "the best speculative setting is 5/1/6, +20% over 3/1/4 as launched (`--speculative 5/1/6`)" in clear.verdict
    assert "noise" not in clear.verdict
    # A sweep too short to have a residual still takes a few percent for noise.
    assert (
        "+3% over 3/1/4 as launched (within the noise)"
        in compare(16, trials(500.0, ("4/1/5", 1030.0, 3.5)), 0.0).verdict
    )


def test_a_setting_without_output_is_named_not_counted_and_one_held_below_the_concurrency_is_named():
    result = compare(40, trials(800.0, ("5/1/6", 0.0, None)), noise=0.02)
    assert result.best == "3/1/4" and "no output under 5/1/6" in result.verdict
    capped = compare(40, [*trials(800.0), SpecTrial("4/1/5", 900.0, 3.2, running=31)], noise=0.02)
    assert "the servers' cap held some below 40 at once: 4/1/5 ran 31" in capped.verdict
    table = "\n".join(markdown(result))
    assert "| off | 800 | -20.0% | — | 0 |" in table and "| 3/1/4 (as launched) | 1,000 | — | 2.90 | 0 |" in table


def test_connect_mode_says_it_did_not_measure_rather_than_guess():
    result = not_measured(48, "3/1/4", 3.1)
    assert not result.measured and not result.trials and result.best is None
    assert result.verdict.startswith("MTP on vs off not measured: the fleet runs as launched (speculative 3/1/4")
    assert "accept length 3.10" in result.verdict


def test_status_question_2_quotes_the_last_sweeps_verdict_or_says_there_was_none():
    measured = compare(40, trials(800.0), noise=0.02)
    tuning = TuneReport(1.0, [], "synthetic", 8, 0.95, [], None, 0.0, [], "", speculative=measured)
    lines = render_mtp(answer_mtp(Readings(time.time(), 0, None, None, 0, {}, [], {}, None, None, tuning)))
    assert lines[-1] == f"   does it pay (last dflash tune): {measured.verdict}"
    bare = render_mtp(answer_mtp(Readings(time.time(), 0, None, None, 0, {}, [], {}, None, None, None)))
    assert bare[-1] == "   does it pay (last dflash tune): not measured (no tuning sweep)"
