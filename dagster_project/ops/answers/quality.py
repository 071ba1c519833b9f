"""Is the answers' quality holding while shards run? The quality watch's figures (each blocking answer gate over
the answers so far, with its threshold and sample size: `generation.line_stop`), fleet-wide and per running shard,
and the hold of the line if one stands (`generation.line_hold`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from dagster_project.generation.line_hold import Hold
from dagster_project.generation.line_stop import WatchFigure, WatchReport
from dagster_project.ops.answers.text import ago


@dataclass(frozen=True)
class QualityAnswer:
    hold: Hold | None = None
    fleet: list[WatchFigure] = field(default_factory=list)  # over every running shard's answers, summed
    fleet_answers: int = 0
    fleet_runs: int = 0
    as_of: float | None = None  # when the figures were taken (the latest report's poll)
    shards: dict[int, list[WatchFigure]] = field(default_factory=dict)  # each running shard's own figures

    @property
    def drifting(self) -> list[WatchFigure]:
        """Blocking figures failing their gate without a hold (too few answers yet, or overridden)."""
        return [f for f in self.fleet if f.blocking and not f.passed]


def answer_quality(hold: Hold | None, reports: list[WatchReport], now: float) -> QualityAnswer:
    """The watch's latest figures, of the shard runs alive now; while the line is held, the hold alone (its figure
    and threshold are the verdict: the runs' last figures, from before they stopped, would be stale). Once no run is
    alive there are none: an ended run's last figures are no answers arriving (after a release, the held runs' last
    figures raised "quality drifting" alerts over answers about to be dropped), and its shard's gates judge them."""
    if hold is not None:
        return QualityAnswer(hold=hold)
    running = [report for report in reports if report.running and report.is_current(now)]
    latest = max(running, key=lambda report: report.updated_at, default=None)
    if latest is None:
        return QualityAnswer(hold=hold)
    return QualityAnswer(
        hold=hold,
        fleet=latest.fleet_figures,
        fleet_answers=latest.fleet_answers,
        fleet_runs=latest.fleet_runs,
        as_of=latest.updated_at,
        shards={report.shard: report.figures for report in running},
    )


def figure_reading(figure: WatchFigure) -> str:
    """ "2.0% (threshold 10.0%, n=400)": the figure with its threshold and sample size (status and the page)."""
    if figure.blocking:
        return f"{figure.figure:.1%} (threshold {figure.threshold:.1%}, n={figure.sample_size:,})"
    return f"{figure.figure:.2f} (floor {figure.threshold:.2f}, n={figure.sample_size:,})"


def figure_verdict(figure: WatchFigure) -> str:
    """ "ok" only for a figure judged (its n at the watch's minimum) and within its threshold: a figure of 9
    answers is not judged yet, whatever it reads; one judged above its threshold without the evidence that blocks
    (the gate's rule) is said to be so."""
    if not figure.blocking:
        return "warning only"  # below its floor it alerts, never holds
    if not figure.judged:
        return f"not judged yet (n={figure.sample_size:,} of {figure.min_sample:,})"
    if not figure.passed:
        return "FAILED"
    return "ok" if figure.figure <= figure.threshold else "above its threshold, not yet evidence of it"


def describe_figure(figure: WatchFigure) -> str:
    return f"{figure.label} {figure_reading(figure)} {figure_verdict(figure)}"


def render_quality(answer: QualityAnswer, now: float) -> list[str]:
    lines = []
    if answer.fleet:
        blocking = [figure for figure in answer.fleet if figure.blocking]
        if blocking and not any(figure.judged for figure in blocking):  # said once, not after every figure
            needed = max(figure.min_sample for figure in blocking)
            scope, figures = (
                f"; none judged yet: the watch judges from n={needed:,}",
                [
                    f"{figure.label} {figure_reading(figure)}" if figure.blocking else describe_figure(figure)
                    for figure in answer.fleet
                ],
            )
        else:
            scope, figures = "", [describe_figure(figure) for figure in answer.fleet]
        lines.append(
            f"Quality watch (fleet: {answer.fleet_answers} answers of {answer.fleet_runs} shard runs, "
            f"{ago(answer.as_of, now)}{scope}): " + "; ".join(figures)
        )
        lines += [f"   shard {shard}: {_shard_verdict(figures)}" for shard, figures in sorted(answer.shards.items())]
    return lines


def _shard_verdict(figures: list[WatchFigure]) -> str:
    """A running shard's figures in a few words: those not "ok", or that every one is."""
    not_ok = [figure for figure in figures if figure.blocking and figure_verdict(figure) != "ok"]
    if not_ok and all(not figure.judged and figure.passed for figure in not_ok):
        return figure_verdict(min(not_ok, key=lambda figure: figure.sample_size))  # "not judged yet (n=9 of 100)"
    return "; ".join(describe_figure(figure) for figure in not_ok) or "every watched gate ok"
