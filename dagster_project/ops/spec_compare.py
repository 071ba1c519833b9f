"""Does MTP pay at the recommended concurrency, and with which speculative setting: measured, not assumed.

After the concurrency sweep, launch mode relaunches the knee's server setting once per speculative setting of
a small grid (MTP off; chains of other lengths; optionally trees), with `--max-running-requests` at the
recommended concurrency, and measures one point each at that concurrency. MTP buys accept-length tokens per
decode step, but its draft passes and the verify pass's extra tokens make each step cost more, the more so
the larger the batch: at saturation it can stop paying, which only a measurement at the concurrency the fleet
will run tells. Connect mode measures a fleet whose flags cannot change, so it says so instead of guessing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from dagster_project.sglang import speculative

NOISE_MULTIPLE = 2.0  # a difference under this many RMS residuals of the knee fit is not told apart from noise
# The least noise assumed: a sweep of one or two points leaves no residual, and one point per setting carries a
# few percent (the knee benchmarks inject ±3%).
NOISE_FLOOR = 0.02


@dataclass(frozen=True)
class SpecTrial:
    """One speculative setting measured at the comparison's concurrency."""

    setting: str  # `off`, or steps/topk/draft tokens
    output_tok_per_s: float
    accept_length: float | None  # None without MTP: the server reports no spec stats
    errors: int = 0
    running: int | None = None  # requests it ran at once, where its cap held it below the comparison's concurrency
    baseline: bool = False  # the setting the concurrency sweep ran

    @property
    def mtp_on(self) -> bool:
        return self.setting != speculative.OFF

    @property
    def ran(self) -> bool:
        return self.output_tok_per_s > 0


@dataclass(frozen=True)
class SpecComparison:
    """The speculative settings at one concurrency, and what they say about question 2 ("MTP on?")."""

    concurrency: int  # requests in flight per server (and the servers' --max-running-requests)
    measured: bool  # False in connect mode: the fleet's flags cannot change
    trials: list[SpecTrial] = field(default_factory=list)  # the baseline first
    noise: float = 0.0  # the knee fit's RMS relative residual
    verdict: str = ""
    best: str | None = None  # the fastest setting measured
    launched: str = ""  # the setting the concurrency sweep ran (as its servers report it)

    def ratio(self, trial: SpecTrial) -> float | None:
        """Output tok/s of `trial` over the baseline's."""
        base = next((t for t in self.trials if t.baseline), None)
        return trial.output_tok_per_s / base.output_tok_per_s if base and base.ran else None


def compare(concurrency: int, trials: Sequence[SpecTrial], noise: float) -> SpecComparison:
    """The verdict on measured `trials` (one of them the baseline): MTP on vs off, and the best setting."""
    noise = max(noise, NOISE_FLOOR)
    ran = [t for t in trials if t.ran]
    launched = next((t.setting for t in trials if t.baseline), "")
    if not ran:
        return SpecComparison(
            concurrency, True, list(trials), noise, "no speculative setting produced output", launched=launched
        )
    best = max(ran, key=lambda t: t.output_tok_per_s)
    off = next((t for t in ran if not t.mtp_on), None)
    on = max((t for t in ran if t.mtp_on), key=lambda t: t.output_tok_per_s, default=None)
    if on is None:
        verdict = f"only MTP off ran at {concurrency} requests per server: nothing to compare it with"
    elif off is None:
        verdict = f"MTP off not measured at {concurrency} requests per server (add `off` to --spec-settings)"
    elif on.output_tok_per_s >= off.output_tok_per_s:
        gain = on.output_tok_per_s / off.output_tok_per_s - 1
        verdict = (
            f"MTP on: +{gain:.0%} output tok/s at this concurrency ({concurrency} per server, {on.setting}, "
            f"accept length {on.accept_length or 0:.2f})"
        )
    else:
        cost = 1 - on.output_tok_per_s / off.output_tok_per_s
        verdict = (
            f"MTP costs {cost:.0%} here ({concurrency} per server: the best setting {on.setting}, accept length "
            f"{on.accept_length or 0:.2f}, against MTP off): launch without it (`dflash fleet up --speculative off`, "
            "no `--speculative-algorithm` flag)"
        )
    if on is not None and off is not None:
        gap = abs(on.output_tok_per_s / off.output_tok_per_s - 1)
        if gap < NOISE_MULTIPLE * noise:
            verdict += f"; within the measurement noise (±{noise:.1%} RMS): measure again before changing"
    base = next((t for t in ran if t.baseline), None)
    if on is not None and base is not None and base.mtp_on and on is not base:
        over = on.output_tok_per_s / base.output_tok_per_s - 1
        verdict += f"; the best speculative setting is {on.setting}, {over:+.0%} over {base.setting} as launched" + (
            " (within the noise)" if over < NOISE_MULTIPLE * noise else f" (`--speculative {on.setting}`)"
        )
    capped = [f"{t.setting} ran {t.running}" for t in trials if t.running is not None and t.running < concurrency]
    if capped:
        verdict += f"; the servers' cap held some below {concurrency} at once: {', '.join(capped)}"
    failed = [t.setting for t in trials if not t.ran]
    if failed:
        verdict += f"; no output under {', '.join(failed)} (see the errors)"
    return SpecComparison(concurrency, True, list(trials), noise, verdict, best.setting, launched)


def not_measured(concurrency: int, running: str, accept_length: float | None) -> SpecComparison:
    """Connect mode: the servers run as they were launched, so MTP on vs off is not measured, and said so."""
    accept = f", accept length {accept_length:.2f}" if accept_length else ""
    verdict = (
        f"MTP on vs off not measured: the fleet runs as launched (speculative {running}{accept} at {concurrency} "
        "per server) and its flags cannot change from here; launch mode (`dflash tune --simulate N` or `--gpus`) "
        "relaunches the servers per speculative setting and measures it"
    )
    return SpecComparison(concurrency, False, [], 0.0, verdict, launched=running)


def markdown(comparison: SpecComparison) -> list[str]:
    """The comparison as report lines: the verdict and, when measured, a table of the settings."""
    lines = [f"## Speculative decoding at {comparison.concurrency} requests per server", "", comparison.verdict, ""]
    if not comparison.trials:
        return lines
    lines += [
        "| speculative setting | output tok/s | vs as launched | accept length | errors |",
        "|---|---:|---:|---:|---:|",
    ]
    for trial in comparison.trials:
        ratio = comparison.ratio(trial)
        name = f"{trial.setting} (as launched)" if trial.baseline else trial.setting
        accept = f"{trial.accept_length:.2f}" if trial.accept_length else "—"
        shown = f"{ratio - 1:+.1%}" if ratio is not None and not trial.baseline else "—"
        lines.append(f"| {name} | {trial.output_tok_per_s:,.0f} | {shown} | {accept} | {trial.errors} |")
    return lines + [""]
