"""`dflash tune`'s plain logic: steady-state rates, percentiles, the knee and its bisection, the recommendation,
and the report (JSON, markdown, SVG) — on request records made up here, no server involved."""

from __future__ import annotations

import heapq

import pytest

from dagster_project.ops import tune
from dagster_project.ops.tune import RequestRecord, TunePoint, TuneReport
from dagster_project.store.dataclass_json import from_json, to_json


def served(concurrency: int, cap: int, requests: int, service_s=lambda i: 1.0, tokens: int = 100) -> list:
    """What a client keeping `concurrency` requests in flight sees from a server that runs `cap` at once, FIFO."""
    records, free_at = [], [0.0] * cap
    heapq.heapify(free_at)
    sends = [0.0] * concurrency  # when each client slot sends its next request
    for i in range(requests):
        slot = min(range(concurrency), key=sends.__getitem__)
        sent = sends[slot]
        begins = max(sent, heapq.heappop(free_at))
        ends = begins + service_s(i)
        heapq.heappush(free_at, ends)
        records.append(RequestRecord("http://s", sent, ends, 50, tokens, tokens // 2, 0.01, begins - sent))
        sends[slot] = ends
    return records


def point(concurrency: int, rate: float, setting: str = "as running", cap: int | None = 64, accept=None) -> TunePoint:
    return TunePoint(setting, concurrency, cap, 1, 10, 0, rate, rate / 100, accept, None, None, 1.0, 2.0, 50, 100, 10)


def test_the_steady_rate_is_the_servers_own_in_waves_and_behind_a_queue():
    # Four in flight, one second each, 100 tokens: 400 tokens/s, 4 requests/s.
    rate, requests, window = tune.steady_rate(served(4, 8, 16), 4)
    assert (rate, requests) == pytest.approx((400, 4)) and window == pytest.approx(2.0)
    # Eight sent to a server that runs four: the queue time is not service time; the rate is the cap's.
    rate, requests, _ = tune.steady_rate(served(8, 4, 40), 8)
    assert (rate, requests) == pytest.approx((400, 4))
    # Uneven lengths: requests spread their tokens over their service, so the window gets its share.
    mixed = served(4, 8, 40, service_s=lambda i: (0.5, 1.5)[i % 2])
    assert tune.steady_rate(mixed, 4)[0] == pytest.approx(400, rel=0.05)
    # Too few requests for a window: the whole run.
    assert tune.steady_rate(served(4, 8, 6), 4)[0] == pytest.approx(600 / 2)
    assert tune.steady_rate([], 4) == (0.0, 0.0, 0.0)


def test_a_point_summarizes_rates_accept_length_ttft_and_latency():
    records = served(4, 8, 16) + [RequestRecord("http://s", 0.0, 0.5, 50, error="timeout")]
    summary = tune.summarize(records, server_setting="x", concurrency=4, cap=8)
    assert summary.output_tok_per_s == pytest.approx(400) and summary.errors == 1 and summary.requests == 17
    assert summary.accept_length == 2.0 and summary.ttft_p50_s == 0.01
    assert summary.latency_p50_s == summary.latency_p99_s == pytest.approx(1.0)
    # Two servers add up.
    two = served(4, 8, 16) + [
        RequestRecord("http://t", r.started, r.ended, r.prompt_tokens, r.output_tokens, r.verify_passes, r.ttft_s)
        for r in served(4, 8, 16)
    ]
    assert tune.summarize(two, server_setting="x", concurrency=4, cap=8).output_tok_per_s == pytest.approx(800)
    assert tune.percentile([1, 2, 3, 4], 0.5) == 2.5 and tune.percentile([], 0.5) is None


def test_the_knee_and_the_bisection_that_narrows_it():
    curve = {1: 100, 2: 200, 4: 400, 8: 700, 16: 900, 32: 980, 64: 1000, 80: 1000}
    points = [point(c, r) for c, r in curve.items()]
    assert tune.find_knee(points, 0.95).concurrency == 32  # 980 >= 950
    assert tune.next_probe(points, 0.95) == 24  # halfway between 16 and 32
    points.append(point(24, 960))
    assert tune.find_knee(points, 0.95).concurrency == 24 and tune.next_probe(points, 0.95) == 20
    points += [point(20, 940), point(22, 955), point(21, 949)]
    assert tune.find_knee(points, 0.95).concurrency == 22 and tune.next_probe(points, 0.95) is None
    assert tune.find_knee([point(1, 0.0)], 0.95) is None
    assert tune.coarse_concurrencies(69) == [1, 2, 4, 8, 16, 32, 64, 69, 87]
    assert tune.coarse_concurrencies(None)[-1] == 80 and tune.coarse_concurrencies(69, [8, 4, 8]) == [4, 8]


def test_the_recommendation_caps_the_server_at_the_knee_or_says_the_cap_binds():
    points = [point(c, r) for c, r in {16: 900, 32: 980, 64: 1000, 80: 1000}.items()]
    flags, text = tune.recommend(tune.find_knee(points, 0.95), points, [], 1000)
    assert flags == ["--disable-radix-cache", "--max-running-requests", "32"]
    assert "knee at 32 requests per server" in text and "98% of the best" in text
    # Reached only at the cap: the cap binds.
    capped = [point(c, r, cap=22) for c, r in {8: 400, 16: 800, 22: 1000, 28: 1000}.items()]
    flags, text = tune.recommend(tune.find_knee(capped, 0.95), capped, [], 1000)
    assert flags[-1] == "22" and "the cap binds" in text
    # Still rising at the last point measured, below the cap.
    rising = [point(c, r) for c, r in {8: 400, 16: 800}.items()]
    assert "still rising" in tune.recommend(tune.find_knee(rising, 0.95), rising, [], 800)[1]
    # A launch-mode setting keeps its own flags.
    setting = ["--mamba-ssm-dtype", "bfloat16", "--max-running-requests", "116"]
    flags, _ = tune.recommend(tune.find_knee(points, 0.95), points, setting, 1000)
    assert flags == ["--disable-radix-cache", "--mamba-ssm-dtype", "bfloat16", "--max-running-requests", "32"]
    assert tune.recommend(None, [], [], 0.0)[0] == []


def report(points: list[TunePoint]) -> TuneReport:
    knee = tune.find_knee(points, 0.95)
    flags, text = tune.recommend(knee, points, [], max(p.output_tok_per_s for p in points))
    return TuneReport(1.0, ["http://s"], "synthetic", 8, 0.95, points, knee, 1000, flags, text, {"as running": "cap"})


def test_the_report_round_trips_and_renders():
    points = [point(c, r, accept=a) for c, r, a in [(8, 500, 3.1), (22, 800, 3.0), (69, 1000, 2.7), (87, 1000, 2.7)]]
    made = report(points)
    assert from_json(TuneReport, to_json(made)) == made
    markdown = tune.render_markdown(made)
    assert "| as running | 69 **(knee)** | 64 | 1,000 |" in markdown and "throughput.svg" in markdown
    svg = tune.render_svg(made)
    assert svg.startswith("<svg") and svg.count("<circle") == 4 and "knee 69" in svg and "stroke-dasharray" in svg
    # What status quotes: tok/s interpolated between points, and the accept lengths at both ends.
    assert made.throughput_at(45.5) == pytest.approx((900, 2.85))
    ratio, before, after, reached = tune.gain(made, 22, 96)
    assert (ratio, before, after, reached) == pytest.approx((1.25, 3.0, 2.7, 87))
    with pytest.raises(LookupError):
        made.throughput_at(4)


def test_launch_settings_grid_crosses_the_swept_values():
    grid = tune.launch_settings_grid(
        {"max_running_requests": [48, 69], "mamba_ssm_dtype": ["float32", "bfloat16"]},
        lambda name, value: [f"--{name.replace('_', '-')}", str(value)],
    )
    assert [s.label for s in grid][:2] == [
        "max_running_requests=48, mamba_ssm_dtype=float32",
        "max_running_requests=48, mamba_ssm_dtype=bfloat16",
    ]
    assert grid[3].options == {"max_running_requests": 69, "mamba_ssm_dtype": "bfloat16"}
    assert grid[3].flags == ["--max-running-requests", "69", "--mamba-ssm-dtype", "bfloat16"]
    assert tune.launch_settings_grid({}, lambda name, value: [])[0].label == tune.AS_LAUNCHED


def test_options_and_request_parameters():
    from dagster_project.generation_settings import GenerationSettings

    options = tune.TuneOptions(max_new_tokens=256, ignore_eos=True)
    params = tune.request_params(GenerationSettings(), options)
    assert params["max_new_tokens"] == 256 and params["ignore_eos"] is True and params["top_k"] == 20
    assert tune.request_params(GenerationSettings(), tune.TuneOptions())["max_new_tokens"] == 32768
    assert options.requests_per_server(1) == 8 and options.requests_per_server(10) == 40
    with pytest.raises(ValueError):
        tune.TuneOptions(knee_fraction=1.5)
    prompts = tune.synthetic_prompts(3, 5, seed=1)
    assert len(prompts) == 3 and {len(p) for p in prompts} == {5} and prompts == tune.synthetic_prompts(3, 5, seed=1)
