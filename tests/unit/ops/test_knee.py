"""The knee fit (`ops.knee`) on the four curve shapes of `benchmarks/bench_tune.py`, under seeded ±3% noise, and
its pieces on exact curves: plain functions, no server."""

from __future__ import annotations

import pytest

from benchmarks.bench_tune import SHAPES, fitted_knee, true_knee
from dagster_project.ops import knee


@pytest.mark.parametrize("shape", SHAPES, ids=[shape.name for shape in SHAPES])
def test_the_recommended_knee_is_within_ten_percent_on_every_shape_under_noise(shape):
    truth = true_knee(shape.config)[0]
    estimate = fitted_knee(shape.config, seed=0)
    assert abs(estimate.concurrency - truth) <= 0.1 * truth, (estimate.describe(), truth)
    assert estimate.low <= estimate.concurrency <= estimate.high and 0 < estimate.residual < 0.03


def test_an_exact_saturating_curve_is_recovered_and_its_knee_is_the_definitions():
    # 1 / r = 0.002 / b + 0.0005: half-saturated at 4 running, cap 64; points past the cap sit on the plateau.
    def rate(c: int) -> float:
        return 1 / (0.002 / min(c, 64) + 0.0005)

    samples = [(c, rate(c)) for c in (1, 2, 4, 8, 16, 32, 64, 80)]
    fit = knee.fit_saturation(samples, 64)
    assert (fit.alpha, fit.beta, fit.gamma) == pytest.approx((0.002, 0.0005, 0.0), rel=1e-6, abs=1e-12)
    estimate = knee.estimate_knee(samples, 64, 0.95)
    by_definition = min(c for c in range(1, 81) if rate(c) >= 0.95 * max(rate(k) for k in range(1, 81)))
    assert estimate.concurrency == by_definition == 34 and (estimate.low, estimate.high) == (34, 34)
    assert estimate.peak == pytest.approx(rate(64)) and estimate.peak_at == 64
    # The knee is measured next, then nothing more is needed.
    assert knee.next_probe(samples, 64, 0.95) == 34
    assert knee.next_probe([*samples, (34, rate(34))], 64, 0.95) is None


def test_a_curve_that_falls_keeps_its_bend_and_noise_on_a_flat_top_does_not_make_one():
    def falling(c: int) -> float:  # peaks at sqrt(0.002 / 2e-6) ~ 32 and falls by a third by 160
        return 1 / (0.002 / c + 0.0005 + 2e-6 * c)

    samples = [(c, falling(c)) for c in (1, 2, 4, 8, 16, 32, 64, 128, 160)]
    estimate = knee.estimate_knee(samples, None, 0.95)
    assert estimate.fit.gamma == pytest.approx(2e-6) and estimate.peak_at in (31, 32)
    # The exact curve's points times up to ±3%, 32 high and 64 low: a dip at the top that is noise, not a peak.
    flat_top = [(1, 408), (2, 660), (4, 1000), (8, 1347), (16, 1568), (32, 1831), (64, 1826), (80, 1864)]
    assert knee.fit_saturation(flat_top, 64).gamma == 0
    assert knee.estimate_knee([(4, 0.0)], 64, 0.95) is None and knee.fit_saturation([], None) is None


def test_one_point_gives_a_knee_but_no_interval():
    estimate = knee.estimate_knee([(145, 17_000.0)], 116, 0.95)
    assert estimate.concurrency == 145 and estimate.uncertainty == "no interval: 1 point(s) measured"


def test_a_cap_that_folds_the_sweep_onto_two_concurrencies_gives_a_knee_not_a_crash():
    # Swept at 1, 4 and 8 on servers capped at 4: the points sit at two concurrencies, where the bent curve's three
    # terms cannot be told apart. The bootstrap's refits of such points divided by a rounding-noise pivot.
    samples = [(1, 87.5), (1, 91.6), (1, 97.4), (4, 336.6), (4, 334.6), (4, 314.5), (8, 278.6), (8, 292.4), (8, 255.6)]
    for seed in range(10):
        estimate = knee.estimate_knee(samples, 4, 0.9, seed=seed)
        assert estimate is not None and 1 <= estimate.low <= estimate.concurrency <= estimate.high <= 8


def test_a_fit_of_the_bend_alone_gives_a_knee_not_a_crash():
    # A rate falling as 1/concurrency is fitted exactly by the bend term alone, whose turn is at zero running: the
    # fit's best was read at a batch of zero (a bootstrap of the fleet_tuning test's noisy points met it).
    estimate = knee.estimate_knee([(1, 1000.0), (4, 250.0), (8, 125.0)], 8, 0.95)
    assert estimate is not None and estimate.concurrency == 1
    assert knee.SaturationFit(0.0, 0.0, 1e-4, 8).rate(0) == 0.0
