"""The knee of a throughput curve, from noisy measurements: a fitted saturating model and its uncertainty.

**The knee** of a server's curve of steady-state output tok/s r(c) over client concurrency c (requests in flight
per server) is the least c in the swept range [lowest concurrency measured, highest] with r(c) >= f x max r over
that range, f the knee fraction (95%): past it, more requests in flight buy under 5% more throughput and only
add latency. Applied to the noise-free curve, this is what `benchmarks/bench_tune.py` computes as the true knee
from the simulator's own formula (`sglang.sim.rates`).

Measured points carry a few percent of noise, and the knee sits where the curve is nearly flat: on a steep
curve (throughput 95% saturated at 27 of 64) a 3% error in the best point moves "95% of the measured best" by a
third of the knee. So the knee is taken from a model fitted to every point rather than from the largest
measurement. The model is the one a decode step gives: a step of a batch of b costs a fixed part shared by the
batch plus a part per request, so the time per output token is

    1 / r(b) = alpha / b + beta + gamma x b,      b = min(c, cap) requests running,

where `gamma` (>= 0, usually 0) lets the curve bend down when acceptance or the KV reads degrade with the batch,
and past the cap requests only queue (the curve is flat there). The fit weighs relative errors (the noise is a
share of the rate) and keeps every coefficient non-negative. The uncertainty is a residual bootstrap: the
fitted curve times resampled relative residuals (inflated for the parameters fitted), refitted; its 10th and
90th percentile knees are the interval printed.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

BOOTSTRAP_REPLICATES = 200
INTERVAL = (0.1, 0.9)  # the percentiles of the bootstrap knees printed as the interval
MIN_POINTS_FOR_INTERVAL = 3  # fewer points leave no residual to resample beside the fitted terms


@dataclass(frozen=True)
class SaturationFit:
    """1 / r(b) = alpha / b + beta + gamma x b seconds per output token, b = min(c, cap)."""

    alpha: float
    beta: float
    gamma: float
    cap: int | None

    def rate(self, concurrency: float) -> float:
        batch = min(concurrency, self.cap) if self.cap else concurrency
        if batch <= 0:  # nothing running writes nothing (a fit of the bend alone turns at zero)
            return 0.0
        inverse = self.alpha / batch + self.beta + self.gamma * batch
        return 1.0 / inverse if inverse > 0 else 0.0


@dataclass(frozen=True)
class KneeEstimate:
    """The knee of one server setting's curve, from the fit, with its bootstrap interval."""

    server_setting: str
    concurrency: int
    low: int  # the interval: 10th and 90th percentile of the bootstrap knees
    high: int
    rate: float  # fitted output tok/s at the knee
    peak: float  # the fitted curve's best over the swept range
    peak_at: int
    fraction: float
    lowest: int  # the swept range
    highest: int
    residual: float  # RMS relative residual of the fit: the measurements' noise as the fit sees it
    points: int
    fit: SaturationFit

    @property
    def relative_width(self) -> float:
        return (self.high - self.low) / self.concurrency

    @property
    def uncertainty(self) -> str:
        """The interval, or why there is none (too few points to tell the noise from the curve)."""
        if self.points < MIN_POINTS_FOR_INTERVAL:
            return f"no interval: {self.points} point(s) measured"
        return f"80% interval {self.low}-{self.high}"

    def describe(self) -> str:
        return (
            f"knee {self.concurrency} ({self.uncertainty}; fitted to {self.points} points "
            f"within ±{self.residual:.1%} RMS)"
        )


def fit_saturation(samples: Sequence[tuple[int, float]], cap: int | None) -> SaturationFit | None:
    """The least-squares fit (relative errors, coefficients >= 0) of (concurrency, output tok/s) samples; None
    without a positive rate."""
    usable = [(min(c, cap) if cap else c, r) for c, r in samples if r > 0 and c > 0]
    if not usable:
        return None
    rows = [(r / b, r, r * b) for b, r in usable]  # r x (1/b, 1, b): the model times r should be 1
    rising = _nonnegative_fit(rows, (0, 1))
    bending = _nonnegative_fit(rows, (0, 1, 2))
    if rising is None or bending is None:
        return None if rising is None and bending is None else SaturationFit(*(rising or bending)[1], cap)
    # The bend (gamma) only where the points ask for it, so that noise on a flat top does not turn it into a peak
    # (which would pull the knee down): the Bayesian information criterion must prefer it, and the fall from its
    # peak to the last point must stand out of the noise (twice the fit's RMS residual).
    fitted = SaturationFit(*bending[1], cap)
    highest = max(b for b, _ in usable)
    peak = fitted.rate(min(math.sqrt(fitted.alpha / fitted.gamma), highest)) if fitted.gamma > 0 else 0.0
    noise = math.sqrt(bending[0] / len(rows))
    if _bic(bending, len(rows)) < _bic(rising, len(rows)) and peak > fitted.rate(highest) * (1 + 2 * noise):
        return fitted
    return SaturationFit(*rising[1], cap)


def _nonnegative_fit(
    rows: list[tuple[float, float, float]], terms: tuple[int, ...]
) -> tuple[float, list[float]] | None:
    """(squared error, coefficients) of the least squares over these terms with no coefficient negative: every
    subset of them solved, the best kept."""
    best: tuple[float, list[float]] | None = None
    for size in range(1, len(terms) + 1):
        for subset in itertools.combinations(terms, size):
            coefficients = _least_squares([[row[i] for i in subset] for row in rows])
            if coefficients is None or min(coefficients) < 0:
                continue
            full = [0.0, 0.0, 0.0]
            for i, value in zip(subset, coefficients):
                full[i] = value
            error = sum((sum(x * w for x, w in zip(row, full)) - 1) ** 2 for row in rows)
            if best is None or error < best[0] - 1e-15:
                best = (error, full)
    return best


def _bic(fit: tuple[float, list[float]], n: int) -> float:
    error, coefficients = fit
    return n * math.log(max(error, 1e-300) / n) + sum(1 for c in coefficients if c > 0) * math.log(n)


def _least_squares(matrix: list[list[float]]) -> list[float] | None:
    """The x minimizing |A x - 1|^2 by the normal equations (at most three unknowns); None if singular.

    The columns are scaled to unit length first, so that "singular" means the same for every curve: a cap that
    folds several concurrencies onto one makes the (1/b, 1, b) columns dependent up to rounding noise, and that
    noise must not pass for a pivot."""
    n = len(matrix[0])
    if len(matrix) < n:
        return None
    norms = [math.sqrt(sum(row[i] * row[i] for row in matrix)) for i in range(n)]
    if min(norms) == 0 or not all(math.isfinite(x) for x in norms):
        return None
    scaled = [[row[i] / norms[i] for i in range(n)] for row in matrix]
    normal = [
        [sum(row[i] * row[j] for row in scaled) for j in range(n)] + [sum(row[i] for row in scaled)] for i in range(n)
    ]
    for column in range(n):
        pivot = max(range(column, n), key=lambda r: abs(normal[r][column]))
        if abs(normal[pivot][column]) < 1e-9:  # unit diagonal: this is a condition number past 1e9
            return None
        normal[column], normal[pivot] = normal[pivot], normal[column]
        for r in range(n):
            if r != column:
                factor = normal[r][column] / normal[column][column]
                normal[r] = [a - factor * b for a, b in zip(normal[r], normal[column])]
    solution = [normal[i][n] / normal[i][i] / norms[i] for i in range(n)]
    return solution if all(math.isfinite(x) for x in solution) else None


def knee_of(fit: SaturationFit, fraction: float, lowest: int, highest: int) -> tuple[int, float, int]:
    """(knee, best fitted rate, where it is) of the fitted curve over the integer concurrencies lowest..highest.

    In closed form: the curve rises up to sqrt(alpha / gamma) (or the cap) and falls after it, so the best is at
    an integer next to that, and the knee is the least integer past the smaller root of
    gamma b^2 + (beta - T) b + alpha <= 0, T the time per token at the best over the fraction."""
    top = min(highest, fit.cap) if fit.cap else highest
    top = max(top, lowest)
    turn = math.sqrt(fit.alpha / fit.gamma) if fit.gamma > 0 else math.inf
    candidates = {min(max(c, lowest), top) for c in (math.floor(turn), math.ceil(turn))} if turn < top else {top}
    peak_at = max(sorted(candidates), key=fit.rate)
    peak = fit.rate(peak_at)
    if peak <= 0:
        return lowest, 0.0, peak_at
    limit = 1 / (fraction * peak)  # the most seconds per token a point within the fraction may take
    slack = limit - fit.beta
    if fit.gamma > 0:
        discriminant = max(0.0, slack * slack - 4 * fit.alpha * fit.gamma)
        root = (slack - math.sqrt(discriminant)) / (2 * fit.gamma)
    else:
        root = fit.alpha / slack if slack > 0 else peak_at
    knee = min(max(math.ceil(root - 1e-9), lowest), peak_at)
    while knee > lowest and fit.rate(knee - 1) >= fraction * peak:  # rounding: the least integer that reaches
        knee -= 1
    while fit.rate(knee) < fraction * peak and knee < peak_at:
        knee += 1
    return knee, peak, peak_at


def estimate_knee(
    samples: Sequence[tuple[int, float]],
    cap: int | None,
    fraction: float,
    *,
    server_setting: str = "",
    seed: int = 0,
    replicates: int = BOOTSTRAP_REPLICATES,
) -> KneeEstimate | None:
    """The knee of the curve through `samples` (repeats welcome), its interval and the fit; None without a
    positive rate."""
    usable = [(c, r) for c, r in samples if r > 0]
    fit = fit_saturation(usable, cap)
    if fit is None:
        return None
    lowest, highest = min(c for c, _ in usable), max(c for c, _ in usable)
    knee, peak, peak_at = knee_of(fit, fraction, lowest, highest)
    residuals = [r / fit.rate(c) - 1 for c, r in usable]
    fitted_terms = sum(1 for x in (fit.alpha, fit.beta, fit.gamma) if x > 0)
    spare = len(usable) - fitted_terms
    residual = math.sqrt(sum(e * e for e in residuals) / len(residuals))
    knees = [knee]
    if spare > 0:
        inflate = math.sqrt(len(usable) / spare)  # fitted residuals understate the noise by the parameters fitted
        rng = random.Random(seed)
        for _ in range(replicates):
            resampled = [(c, fit.rate(c) * (1 + inflate * rng.choice(residuals))) for c, _ in usable]
            refit = fit_saturation(resampled, cap)
            if refit is not None:
                knees.append(knee_of(refit, fraction, lowest, highest)[0])
    knees.sort()
    return KneeEstimate(
        server_setting=server_setting,
        concurrency=knee,
        low=min(knee, _quantile(knees, INTERVAL[0])),
        high=max(knee, _quantile(knees, INTERVAL[1])),
        rate=fit.rate(knee),
        peak=peak,
        peak_at=peak_at,
        fraction=fraction,
        lowest=lowest,
        highest=highest,
        residual=residual,
        points=len(usable),
        fit=fit,
    )


def _quantile(ordered: Sequence[int], q: float) -> int:
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def next_probe(
    samples: Sequence[tuple[int, float]], cap: int | None, fraction: float, tolerance: float = 0.05
) -> int | None:
    """What to measure next: the estimated knee if it is not measured yet; else, while the interval is wider
    than `tolerance` of the knee, a repeat of the point the knee depends on most per measurement so far (the
    knee's shift when that point's mean moves by the fit's residual, over the square root of its repeats): the
    points where the curve is flat, which set the best, and the first ones, which set how fast it rises."""
    estimate = estimate_knee(samples, cap, fraction)
    if estimate is None:
        return None
    counts: dict[int, int] = {}
    for c, _ in samples:
        counts[c] = counts.get(c, 0) + 1
    if estimate.concurrency not in counts:
        return estimate.concurrency
    if estimate.relative_width <= tolerance:
        return None
    step = max(estimate.residual, 0.01)

    def influence(concurrency: int) -> float:
        moved = [(c, r * (1 + step) if c == concurrency else r) for c, r in samples]
        refit = fit_saturation(moved, cap)
        if refit is None:
            return 0.0
        shifted = knee_of(refit, fraction, estimate.lowest, estimate.highest)[0]
        return abs(shifted - estimate.concurrency) / math.sqrt(counts[concurrency])

    return max(sorted(counts), key=influence)
