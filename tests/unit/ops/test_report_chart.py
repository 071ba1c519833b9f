"""The page's charts of the run so far, from made-up points and manifests (no server, no Dagster)."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from dataclasses import replace
from urllib.parse import unquote

from dagster_project.generation.progress import SpecDecodingStats
from dagster_project.generation.shards import CompletionsShardManifest, GenerationSummary
from dagster_project.ops.report import INLINE_MARKDOWN_CHARS
from dagster_project.ops.report_chart import (
    BOTTOM,
    LEFT,
    RIGHT,
    TOP,
    ReportPoint,
    inline_charts,
    nice_ceiling,
    progress_chart,
    run_history,
    short_number,
    ticks,
)
from tests.unit.ops.test_report import HEALTHY, beat, status_of

SVG = "{http://www.w3.org/2000/svg}"


def _svg_of(markdown: str) -> ET.Element:
    uri = markdown.split("](<", 1)[1].split(">)", 1)[0]
    assert uri.startswith("data:image/svg+xml,") and "#" not in uri and "<" not in uri
    return ET.fromstring(unquote(uri.removeprefix("data:image/svg+xml,")))


def _coords(polyline: ET.Element) -> list[tuple[int, int]]:
    return [tuple(map(int, pair.split(","))) for pair in polyline.get("points").split()]


def _texts(svg: ET.Element) -> list[str]:
    return [text.text for text in svg.iter(f"{SVG}text")]


def test_the_events_chart_has_axes_with_units_and_the_plan_line_stays_in_its_frame(tmp_path):
    status = status_of([beat()], HEALTHY, tmp_path=tmp_path)  # 100 events planned at 2 req/s
    now = time.time()
    # Slower than the plan: at its 2 req/s, the 100 events would be done 50 s in, long before the last point.
    points = [ReportPoint(now - 3600 + 60 * n, n, None) for n in range(61)]
    charts = inline_charts(points, status)
    assert list(charts) == ["run so far"]  # no accept length known: no second chart
    markdown = charts["run so far"]
    assert len(markdown) < INLINE_MARKDOWN_CHARS  # shown in place on the asset page
    svg = _svg_of(markdown)
    assert int(svg.get("width")) >= 450  # large enough to read
    texts = _texts(svg)
    assert texts[0] == "events done"  # the values' title
    assert {"0", "50", "100"} <= set(texts)  # the events axis, up to the events planned
    assert {"0 min", "20 min", "40 min", "60 min"} <= set(texts)  # the time axis, with its unit
    plan, done = svg.findall(f"{SVG}polyline")
    for x, y in _coords(plan) + _coords(done):
        assert LEFT <= x <= RIGHT and TOP <= y <= BOTTOM, (x, y)
    assert _coords(plan)[-1][1] == TOP  # it reaches the events planned, at the top, and stops there
    assert "Events done (blue): 0 → 60 of 100 planned; dashed: the plan, 2 req/s" in markdown


def test_a_long_run_draws_hours_and_accept_length_in_a_chart_of_its_own_each_in_place(tmp_path):
    status = status_of([beat()], HEALTHY, tmp_path=tmp_path)
    status = replace(status, progress=replace(status.progress, events_planned=914_000))
    now = time.time()
    day = [ReportPoint(now - 180 * (500 - n), 1800 * n, None if n % 3 else 2.5 + n / 1000) for n in range(500)]
    charts = inline_charts(day, status)
    assert list(charts) == ["run so far", "accept length so far"]
    for markdown in charts.values():
        assert len(markdown) < INLINE_MARKDOWN_CHARS
    events = _texts(_svg_of(charts["run so far"]))
    assert "0 h" in events and "20 h" in events and "914K" not in events  # ticks at round values, in hours
    accept = _svg_of(charts["accept length so far"])
    assert {"1", "2", "3", "4"} <= set(_texts(accept))  # from 1 (no draft accepted) up
    (line,) = accept.findall(f"{SVG}polyline")
    assert all(TOP <= y <= BOTTOM for _, y in _coords(line))
    assert "2.50–3.00" in charts["accept length so far"]
    assert inline_charts(day[:1], status) == {}  # one point: no line to draw


def test_the_history_adds_each_published_shard_and_the_first_start_and_never_goes_down():
    def shard(index: int, at: float, rows: int, accept: float) -> CompletionsShardManifest:
        spec = SpecDecodingStats(accept_length_lifetime=accept)
        return CompletionsShardManifest(
            shard=index, rows=rows, published_at=at, generation=GenerationSummary(spec=spec)
        )

    report = ReportPoint(1000.0, 150, 2.7)  # the only report, at the end (as after `make demo`)
    history = run_history([report], [shard(1, 600.0, 60, 2.9), shard(0, 400.0, 50, 2.8)], [100.0, 350.0])
    assert history == [
        ReportPoint(100.0, 0, None),  # the first shard run starts
        ReportPoint(400.0, 50, 2.8),
        ReportPoint(600.0, 110, 2.9),
        ReportPoint(1000.0, 150, 2.7),
    ]
    # A report counting running shards' events can be above the shards published just after it: no dip.
    mid = ReportPoint(500.0, 90, None)
    assert [p.events_done for p in run_history([mid], [shard(0, 400.0, 50, 2.8), shard(1, 600.0, 30, 2.9)], [])] == [
        50,
        90,
        90,
    ]


def test_scales_are_round():
    assert [nice_ceiling(v) for v in (0.74, 3, 384, 1153, 0)] == [1, 5, 500, 2000, 1]
    assert ticks(0, 1153) == [0, 500, 1000] and ticks(1, 4) == [1, 2, 3, 4]
    assert [short_number(v) for v in (0, 2.5, 950, 1500, 914_000, 1_500_000)] == [
        "0",
        "2.5",
        "950",
        "1.5K",
        "914K",
        "1.5M",
    ]


def test_the_stored_chart_is_a_png(tmp_path):
    status = status_of([beat()], HEALTHY, tmp_path=tmp_path)
    now = time.time()
    points = [ReportPoint(now - 600, 10, 2.9), ReportPoint(now - 300, 25, None), ReportPoint(now, 40, 2.8)]
    png = progress_chart(points, status)
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
