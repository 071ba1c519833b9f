"""`dflash tune`'s plain logic: steady-state rates, percentiles, the knee and its bisection, the recommendation,
and the report (JSON, markdown, SVG) — on request records made up here, no server involved."""

from __future__ import annotations

import heapq

import pytest

from dagster_project.ops import knee, tune, tune_point, tune_render
from dagster_project.ops.knee import KneeEstimate
from dagster_project.ops.tune import TuneReport
from dagster_project.ops.tune_point import RequestRecord, TunePoint
from dagster_project.store.dataclass_json import from_json, to_json
from dagster_project.tokenizer import load_tokenizer
from tests.support.model_families import DEEPSEEK, MISTRAL, QWEN3_6, family_tokenizer


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
    rate, requests, window = tune_point.steady_rate(served(4, 8, 16), 4)
    assert (rate, requests) == pytest.approx((400, 4)) and window == pytest.approx(2.0)
    # Eight sent to a server that runs four: the queue time is not service time; the rate is the cap's.
    rate, requests, _ = tune_point.steady_rate(served(8, 4, 40), 8)
    assert (rate, requests) == pytest.approx((400, 4))
    # Uneven lengths: requests spread their tokens over their service, so the window gets its share.
    mixed = served(4, 8, 40, service_s=lambda i: (0.5, 1.5)[i % 2])
    assert tune_point.steady_rate(mixed, 4)[0] == pytest.approx(400, rel=0.05)
    # Too few requests for a window: the whole run.
    assert tune_point.steady_rate(served(4, 8, 6), 4)[0] == pytest.approx(600 / 2)
    assert tune_point.steady_rate([], 4) == (0.0, 0.0, 0.0)


def test_a_point_summarizes_rates_accept_length_ttft_and_latency():
    records = served(4, 8, 16) + [RequestRecord("http://s", 0.0, 0.5, 50, error="timeout")]
    summary = tune_point.summarize(records, server_setting="x", concurrency=4, cap=8)
    assert summary.output_tok_per_s == pytest.approx(400) and summary.errors == 1 and summary.requests == 17
    assert summary.accept_length == 2.0 and summary.ttft_p50_s == 0.01
    assert summary.latency_p50_s == summary.latency_p99_s == pytest.approx(1.0)
    # Two servers add up.
    two = served(4, 8, 16) + [
        RequestRecord("http://t", r.started, r.ended, r.prompt_tokens, r.output_tokens, r.verify_passes, r.ttft_s)
        for r in served(4, 8, 16)
    ]
    assert tune_point.summarize(two, server_setting="x", concurrency=4, cap=8).output_tok_per_s == pytest.approx(800)
    assert tune_point.percentile([1, 2, 3, 4], 0.5) == 2.5 and tune_point.percentile([], 0.5) is None


def test_the_sweep_measures_the_fitted_knee_then_repeats_until_it_is_precise():
    # A saturating curve, 400 tokens/s per request alone, half-saturated at 4 running, cap 64, no noise.
    def measure(concurrency: int) -> TunePoint:
        batch = min(concurrency, 64)
        return point(concurrency, 400 * batch / (1 + (batch - 1) / 4), cap=64)

    points = tune.sweep_points("as running", 64, tune.TuneOptions(), measure)
    assert [p.concurrency for p in points] == [1, 2, 4, 8, 16, 30, 32, 64, 80]  # coarse and the knee: exact
    estimate, estimates = tune.choose_knee(points, 0.95)
    assert estimate.concurrency == 30 and (estimate.low, estimate.high) == (30, 30) and estimates == [estimate]
    assert tune.knee_point(points, estimate).concurrency == 30 and estimate.residual == pytest.approx(0, abs=1e-9)
    assert tune.coarse_concurrencies(69) == [1, 2, 4, 8, 16, 32, 64, 69, 87]
    assert tune.coarse_concurrencies(None)[-1] == 80 and tune.coarse_concurrencies(69, [8, 4, 8]) == [4, 8]
    assert tune.choose_knee([point(1, 0.0)], 0.95) == (None, [])


def test_of_two_settings_the_knee_is_the_least_among_those_near_the_best():
    small = [point(c, 100 * min(c, 2), setting="cap 2", cap=2) for c in (1, 2, 3)]
    large = [point(c, 100 * min(c, 8), setting="cap 8", cap=8) for c in (1, 2, 4, 8, 10)]
    estimate, estimates = tune.choose_knee(small + large, 0.95)
    assert [e.server_setting for e in estimates] == ["cap 2", "cap 8"]
    assert estimate.server_setting == "cap 8" and estimate.concurrency == 8  # two at once cannot reach 95% of eight


def estimate_at(concurrency: int, cap: int | None = 64, peak_at: int = 64, highest: int = 80) -> KneeEstimate:
    fit = knee.SaturationFit(0.001, 0.0001, 0.0, cap)
    return KneeEstimate("as running", concurrency, concurrency - 2, concurrency + 3, 950, 1000, peak_at, 0.95, 1,
                        highest, 0.012, 11, fit)  # fmt: skip


def test_the_recommendation_caps_the_server_at_the_knee_or_says_the_cap_binds():
    flags, text = tune.recommend(estimate_at(32), [])
    assert flags == ["--disable-radix-cache", "--max-running-requests", "32"]
    assert "knee at 32 requests per server (80% interval 30-35)" in text and "95% of the fitted best" in text
    assert "11 points, fit within ±1.2% RMS" in text
    # Reached only at the cap: the cap binds.
    flags, text = tune.recommend(estimate_at(22, cap=22, peak_at=22, highest=28), [])
    assert flags[-1] == "22" and "the cap binds" in text
    # Still rising at the last point measured, below the cap.
    assert "still rising" in tune.recommend(estimate_at(15, cap=None, peak_at=16, highest=16), [])[1]
    # A launch-mode setting keeps its own flags.
    setting = ["--mamba-ssm-dtype", "bfloat16", "--max-running-requests", "116"]
    flags, _ = tune.recommend(estimate_at(32), setting)
    assert flags == ["--disable-radix-cache", "--mamba-ssm-dtype", "bfloat16", "--max-running-requests", "32"]
    assert tune.recommend(None, [])[0] == []


def report(points: list[TunePoint]) -> TuneReport:
    estimate, estimates = tune.choose_knee(points, 0.95)
    flags, text = tune.recommend(estimate, [])
    knee_point = tune.knee_point(points, estimate)
    best = max(p.output_tok_per_s for p in points)
    return TuneReport(1.0, ["http://s"], "synthetic", 8, 0.95, points, knee_point, best, flags, text,
                      {"as running": "cap"}, {}, estimate, estimates)  # fmt: skip


def test_the_report_round_trips_and_renders():
    measured = [(8, 500, 3.1), (22, 800, 3.0), (47, 960, 2.8), (69, 1000, 2.7), (87, 1000, 2.7)]
    made = report([point(c, r, accept=a) for c, r, a in measured])
    assert made.knee_estimate.concurrency == 47 and made.knee.concurrency == 47
    assert from_json(TuneReport, to_json(made)) == made
    markdown = tune_render.render_markdown(made)
    assert "| as running | 47 **(knee)** | 64 | 960 |" in markdown and "throughput.svg" in markdown
    assert "* fit [as running]: knee 47 (80% interval " in markdown
    svg = tune_render.render_svg(made)
    assert svg.startswith("<svg") and svg.count("<circle") == 5 and "knee 47 (" in svg and "stroke-dasharray" in svg
    # What status quotes: tok/s interpolated between points, and the accept lengths at both ends.
    assert made.throughput_at(78) == pytest.approx((1000, 2.7))
    assert made.throughput_at(34.5) == pytest.approx((880, 2.9))
    ratio, before, after, reached = tune.gain(made, 22, 96)
    assert (ratio, before, after, reached) == pytest.approx((1.25, 3.0, 2.7, 87))
    with pytest.raises(LookupError):
        made.throughput_at(4)
    # Repeats of a point are averaged where status reads the curve.
    repeated = report([point(8, 500, accept=3.0), point(16, 700, accept=2.8), point(16, 900, accept=3.0)])
    assert repeated.throughput_at(16) == pytest.approx((800, 2.9))


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


@pytest.mark.parametrize("family", [QWEN3_6, DEEPSEEK, MISTRAL])
def test_synthetic_prompts_are_ordinary_ids_of_the_models_vocabulary(family: str) -> None:
    """Below the model's added tokens, which DeepSeek's vocabulary starts at 128,000 (and a simulator of it refuses
    an id past its 129,280), and past Mistral's control tokens (its first thousand ids)."""
    tok = load_tokenizer(family_tokenizer(family))
    prompts = tune.synthetic_prompts(tok, 3, 400, seed=1)
    assert (
        len(prompts) == 3
        and {len(p) for p in prompts} == {400}
        and prompts == tune.synthetic_prompts(tok, 3, 400, seed=1)
    )
    ids = {token_id for prompt in prompts for token_id in prompt}
    assert not ids & set(tok.added_tokens_decoder) and min(ids) >= 1000
    assert max(ids) < min([len(tok), 150_000, *(i for i in tok.added_tokens_decoder if i >= 1000)])
    assert max(ids) > 100_000  # the whole range is drawn from
