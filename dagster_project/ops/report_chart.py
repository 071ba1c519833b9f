"""The operator page's charts of the run so far: events done against the plan, and MTP's accept length.

`run_history` gathers the points: each earlier report's figures (Dagster's record of them), each published
shard (its events added at its publish time, its own accept length) and the first shard run's start. A job run
without any refresh in between (`make demo`, one report at the end) still draws its course from its shards.

`inline_charts` draws them as small SVG images inside Markdown values, which Dagster's asset page shows in place
only while a value is shorter than `INLINE_MARKDOWN_CHARS`: a chart with its axes, tick labels and units in under
a thousand characters. `progress_chart` draws the same as a PNG for the store.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from urllib.parse import quote

from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.ops.report import INLINE_MARKDOWN_CHARS, as_of
from dagster_project.ops.status import Status

CHART_KEY = "report/progress.png"


@dataclass(frozen=True)
class ReportPoint:
    """The run at one moment: events done then (at least), and the accept length measured then (None: unknown)."""

    at: float
    events_done: int
    accept_length: float | None


def run_history(
    reports: Iterable[ReportPoint],
    published: Iterable[CompletionsShardManifest],
    runs_started_at: Iterable[float],
) -> list[ReportPoint]:
    """The points to draw, in time order. A report counts running shards' events too, a published shard only the
    shards published by then: both are true lower bounds of the events done at their moment, so the curve is
    their running maximum (events done never go down)."""
    manifests = sorted(published, key=lambda manifest: manifest.published_at)
    published_by = list(accumulate(manifest.rows for manifest in manifests))
    points = [*reports]
    points += [
        ReportPoint(manifest.published_at, done, manifest.generation.spec.accept_length_lifetime)
        for manifest, done in zip(manifests, published_by)
    ]
    first_start = min(runs_started_at, default=None)
    if first_start is not None:
        before = sum(manifest.rows for manifest in manifests if manifest.published_at <= first_start)
        points.append(ReportPoint(first_start, before, None))
    points.sort(key=lambda point: point.at)
    highest = list(accumulate((point.events_done for point in points), max))
    return [ReportPoint(point.at, done, point.accept_length) for point, done in zip(points, highest)]


# ---- scales ------------------------------------------------------------------------------------------------------


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^k at or above `value` (an axis' top)."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 2.5, 5, 10) if step * power >= value * (1 - 1e-9))


def short_number(value: float) -> str:
    """A tick label: 950, 1.2K, 914K, 1.5M."""
    for size, suffix in ((1e6, "M"), (1e3, "K")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}"


@dataclass(frozen=True)
class TimeAxis:
    """Elapsed time from the first point, in minutes for a run shorter than two hours, else in hours."""

    start: float
    end: float

    @property
    def unit(self) -> str:
        return "min" if self.end - self.start < 7200 else "h"

    def elapsed(self, at: float) -> float:
        return (at - self.start) / (60 if self.unit == "min" else 3600)

    @property
    def span(self) -> float:
        return self.elapsed(self.end)


def plan_line(points: Sequence[ReportPoint], status: Status) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """The plan's course from the first point, (at, events) at both ends, cut where it reaches the events planned
    or the last point's time, whichever comes first: inside the chart's frame. None without a planned rate."""
    plan = status.progress.plan
    if not plan or not plan.req_per_s or not points:
        return None
    first, last = points[0], points[-1]
    planned = status.progress.events_planned
    reaches_planned = first.at + max(planned - first.events_done, 0) / plan.req_per_s
    end = min(last.at, reaches_planned)
    return (first.at, first.events_done), (end, first.events_done + plan.req_per_s * (end - first.at))


def events_axis_top(points: Sequence[ReportPoint], status: Status) -> float:
    """The events axis ends at the events planned once the run is a quarter of the way, else at a round number
    above both lines (a run at 1% of 914K events would draw flat along the bottom otherwise)."""
    planned = status.progress.events_planned
    plan = plan_line(points, status)
    highest = max([points[-1].events_done, plan[1][1] if plan else 0, 1])
    if planned and highest >= planned / 4:
        return float(planned)
    return min(nice_ceiling(highest), float(planned)) if planned else nice_ceiling(highest)


# ---- the PNG for the store ----------------------------------------------------------------------------------


def progress_chart(points: Sequence[ReportPoint], status: Status) -> bytes:
    """PNG: events done over time against the plan's line, and the accept length."""
    import matplotlib

    matplotlib.use("Agg")  # headless: no display on a run worker
    from matplotlib import pyplot as plt

    points = sorted(points, key=lambda point: point.at)
    axis = TimeAxis(points[0].at if points else status.collected_at, points[-1].at if points else status.collected_at)
    figure, (progress, accept) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    try:
        progress.plot(
            [axis.elapsed(p.at) for p in points], [p.events_done for p in points], marker="o", label="events done"
        )
        plan = plan_line(points, status)
        if plan:
            (start, first), (end, last) = plan
            label = f"plan ({status.progress.plan.req_per_s:g} req/s)"
            progress.plot([axis.elapsed(start), axis.elapsed(end)], [first, last], "--", label=label)
        progress.set_ylim(0, events_axis_top(points, status) if points else 1)
        progress.set_ylabel(f"events (of {status.progress.events_planned:,} planned)")
        progress.set_title(f"Run progress as of {as_of(status.collected_at)}")
        progress.legend(loc="lower right")
        known = [(axis.elapsed(p.at), p.accept_length) for p in points if p.accept_length is not None]
        if known:
            accept.plot([m for m, _ in known], [a for _, a in known], marker="o", color="tab:green")
        accept.set_ylabel("accept length (tokens / step)")
        accept.set_xlabel(f"{axis.unit} since the first point")
        buffer = io.BytesIO()
        figure.tight_layout()
        figure.savefig(buffer, format="png", dpi=80)
        return buffer.getvalue()
    finally:
        plt.close(figure)


# ---- the inline SVG charts ---------------------------------------------------------------------------------------

# The drawing's own units (its viewBox), shown 1.5 times as large (450 px wide: it fits the asset page's value
# column at 1,440 px); small integers keep the SVG short.
VIEW_W, VIEW_H, SCALE = 300, 116, 1.5
# The plot area: room above for the axis' title, on the left for the tick labels, below for the time axis.
LEFT, RIGHT, TOP, BOTTOM = 32, 292, 14, 100
FONT = 9  # 13.5 px on the page
# Each line through at most this many points, fewer when the chart would not fit in place.
CHART_POINTS = (32, 24, 16, 12, 8, 2)
ACCEPT_LENGTH_SCALE_TOP = 4.0
# Left as they are in the data: URI (in a <...> Markdown destination spaces may stay); "<", ">" and "#" (a colour,
# else read as the URI's fragment) are percent-encoded, so colours are named.
SVG_URI_SAFE = " ,'=/:.-"


def _spread(points: Sequence[ReportPoint], most: int) -> list[ReportPoint]:
    """At most `most` points, evenly spaced over the run, the first and the last kept."""
    if len(points) <= most:
        return list(points)
    step = (len(points) - 1) / (most - 1)
    return [points[round(i * step)] for i in range(most)]


def ticks(low: float, high: float) -> list[float]:
    """Round values from `low` to `high`, two to four of them (0, 500, 1000 for 0 to 1,153)."""
    step = nice_ceiling((high - low) / 3)
    first = math.ceil(low / step) * step
    return [first + n * step for n in range(int((high - first) / step + 1e-9) + 1)]


@dataclass(frozen=True)
class _Frame:
    """Maps (time, value) into the plot area."""

    axis: TimeAxis
    low: float
    high: float

    def x(self, at: float) -> int:
        span = self.axis.end - self.axis.start
        return round(LEFT + (at - self.axis.start) / span * (RIGHT - LEFT)) if span else LEFT

    def y(self, value: float) -> int:
        return round(BOTTOM - (value - self.low) / ((self.high - self.low) or 1) * (BOTTOM - TOP))


def _polyline(xy: Sequence[tuple[int, int]], colour: str, dashed: bool = False) -> str:
    dash = " stroke-dasharray='5'" if dashed else ""
    return f"<polyline points='{' '.join(f'{x},{y}' for x, y in xy)}' stroke='{colour}'{dash}/>"


def _axes(frame: _Frame, title: str) -> str:
    """The left and bottom axes, their ticks at round values with labels (the time's with its unit), and the
    title of the values above them."""
    axis = frame.axis
    y_ticks = ticks(frame.low, frame.high)
    x_ticks = [axis.start + t * (axis.end - axis.start) / axis.span for t in ticks(0, axis.span)] if axis.span else []
    marks = "".join(f"M{LEFT - 3} {frame.y(v)}h3" for v in y_ticks) + "".join(
        f"M{frame.x(at)} {BOTTOM}v3" for at in x_ticks
    )
    y_labels = "".join(f"<text x='{LEFT - 5}' y='{frame.y(v) + 3}'>{short_number(v)}</text>" for v in y_ticks)
    x_labels = "".join(
        f"<text x='{frame.x(at)}' y='{BOTTOM + 12}'>{short_number(axis.elapsed(at))} {axis.unit}</text>"
        for at in x_ticks
    )
    return (
        f"<path d='M{LEFT} {TOP}V{BOTTOM}H{RIGHT}{marks}' stroke='gray' stroke-width='1'/>"
        f"<g fill='dimgray'><text x='2' y='{FONT}'>{title}</text>"
        f"<g text-anchor='end'>{y_labels}</g><g text-anchor='middle'>{x_labels}</g></g>"
    )


def _svg(body: str) -> str:
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{VIEW_W * SCALE:.0f}' height='{VIEW_H * SCALE:.0f}' "
        f"viewBox='0 0 {VIEW_W} {VIEW_H}' font-family='sans-serif' font-size='{FONT}' fill='none' "
        f"stroke-width='2'>{body}</svg>"
    )


def _markdown(svg: str, title: str, caption: str) -> str:
    return f"![{title}](<data:image/svg+xml,{quote(svg, safe=SVG_URI_SAFE)}>)\n\n{caption}"


def _time_axis(points: Sequence[ReportPoint]) -> TimeAxis:
    return TimeAxis(points[0].at, max(points[-1].at, points[0].at + 60))


def _events_chart(points: Sequence[ReportPoint], status: Status, most: int) -> str:
    frame = _Frame(_time_axis(points), 0.0, events_axis_top(points, status))
    shapes = []
    plan = plan_line(points, status)
    if plan:
        shapes.append(_polyline([(frame.x(at), frame.y(done)) for at, done in plan], "gray", dashed=True))
    shapes.append(_polyline([(frame.x(p.at), frame.y(p.events_done)) for p in _spread(points, most)], "royalblue"))
    rate = status.progress.plan.req_per_s if plan else None
    caption = (
        f"Events done (blue): {points[0].events_done:,} → {points[-1].events_done:,} of "
        f"{status.progress.events_planned:,} planned" + (f"; dashed: the plan, {rate:g} req/s" if rate else "")
    )
    return _markdown(_svg(_axes(frame, "events done") + "".join(shapes)), "events done over time", caption)


def _accept_chart(points: Sequence[ReportPoint], most: int) -> str | None:
    known = [p for p in points if p.accept_length is not None]
    if len(known) < 2:
        return None
    low, high = min(p.accept_length for p in known), max(p.accept_length for p in known)
    # From 1 (no draft token accepted), so a steady accept length draws flat rather than magnified noise.
    frame = _Frame(_time_axis(points), 1.0, max(high, ACCEPT_LENGTH_SCALE_TOP))
    line = _polyline([(frame.x(p.at), frame.y(p.accept_length)) for p in _spread(known, most)], "seagreen")
    caption = f"MTP accept length (green, tokens per decode step): {low:.2f}–{high:.2f}"
    return _markdown(_svg(_axes(frame, "accept length") + line), "accept length over time", caption)


def _fitting(draw: Callable[[int], str | None]) -> str | None:
    """The chart through as many points as fit in place (at its fewest, Dagster shows it behind a dialog)."""
    markdown = None
    for most in CHART_POINTS:
        markdown = draw(most)
        if markdown is None or len(markdown) < INLINE_MARKDOWN_CHARS:
            break
    return markdown


def inline_charts(points: Sequence[ReportPoint], status: Status) -> dict[str, str]:
    """The page's charts as Markdown values by label, each shown in place: events done against the plan, and the
    accept length once two are known. None before there are two points to draw a line between."""
    points = sorted(points, key=lambda point: point.at)
    if len(points) < 2:
        return {}
    charts = {"run so far": _fitting(lambda most: _events_chart(points, status, most))}
    accept = _fitting(lambda most: _accept_chart(points, most))
    if accept is not None:
        charts["accept length so far"] = accept
    return charts
