"""Status question 3: each server's cap, what binds it, the headroom, the flags and the expected gain, from the
probed /server_info fields and the observed request lengths (no server involved: the probes are made up)."""

from __future__ import annotations

import time

from dagster_project.ops import tune
from dagster_project.ops.answers.concurrency import (
    EXPECTED_LENGTHS,
    answer_concurrency,
    lengths_note,
    render_concurrency,
)
from dagster_project.ops.answers.readings import Readings
from dagster_project.sglang import capacity
from dagster_project.sglang.capacity import LaunchSettings
from tests.support.server_info import server_info_for

URL = "http://gpu0:30000"


def point(concurrency: int, rate: float, accept: float) -> tune.TunePoint:
    return tune.TunePoint("as running", concurrency, 22, 1, 10, 0, rate, rate / 400, accept, *[None] * 4, 600, 400, 9)


def probe(settings: LaunchSettings, running: float, queued: float) -> dict:
    """What `launch.probe_endpoints` keeps of a server launched with `settings` on an H200."""
    info = server_info_for(settings)
    return {
        "url": URL,
        "healthy": True,
        "speculative_algorithm": "EAGLE",
        "max_running_requests_flag": info["max_running_requests"],
        "max_running_requests": info["internal_states"][0]["effective_max_running_requests_per_dp"],
        "server_info": capacity.capacity_fields(info),
        "running": running,
        "queued": queued,
    }


def readings(fleet: dict, tuning: tune.TuneReport | None = None) -> Readings:
    return Readings(time.time(), 0, None, None, 0, {}, [], fleet, None, None, tuning)


def test_a_server_at_sglangs_defaults_is_bound_by_its_state_slots_and_says_how_to_go_higher():
    answer = answer_concurrency(readings({URL: probe(LaunchSettings(), running=22, queued=6)}))
    row = answer.servers[URL]
    assert row.effective_cap == 22 and row.capacity is not None
    assert row.capacity.bound == "mamba state slots" and row.capacity.cap == 22
    assert row.capacity.flags == ["--disable-radix-cache", "--max-running-requests", "69"]
    assert round(row.capacity.headroom, 1) == 3.1 and row.capacity.allowed_by["KV tokens at the observed lengths"] > 69
    assert row.capacity.explanation == (
        "cap 22 per server, bound by mamba state slots (5 per request, radix cache on); KV pool allows 196 at the "
        "expected 2.6K tokens/request; `--disable-radix-cache --max-running-requests 69` → est. ×3.1 output tok/s"
    )
    # The limit reason names the flags in place (no pointer to notes elsewhere).
    assert "to go higher: `--disable-radix-cache --max-running-requests 69` (est. ×3.1 output tok/s" in row.limited_by
    assert "expected lengths (no completions yet)" in answer.lengths
    text = "\n".join(render_concurrency(answer))
    assert "      capacity: cap 22 per server" in text and "(capacity at 600 prompt + 2,000 output" in text


def test_a_tuning_sweep_turns_the_estimate_into_a_measurement():
    points = [point(c, r, a) for c, r, a in [(8, 2000, 3.2), (22, 4700, 3.1), (64, 7900, 2.7), (87, 8000, 2.7)]]
    knee = points[2]  # the first within 95% of the best
    report = tune.TuneReport(1.0, [URL], "synthetic", 8, 0.95, points, knee, 8000, [], "", {})
    row = answer_concurrency(readings({URL: probe(LaunchSettings(), 22, 6)}, report)).servers[URL]
    assert row.capacity.explanation.endswith(
        "→ est. ×3.1 output tok/s (dflash tune measured ×1.7; accept length falls from 3.1 to 2.7)"
    )
    assert "dflash tune measured ×1.7" in row.capacity.expected_gain


def test_a_server_at_the_ceiling_has_no_headroom_left_and_a_router_no_capacity_answer():
    ceiling = LaunchSettings(disable_radix_cache=True, max_running_requests=69)
    row = answer_concurrency(readings({URL: probe(ceiling, 69, 3)})).servers[URL]
    assert row.capacity.bound == "the configured maximum" and row.capacity.headroom == 1.0
    assert "→ est." not in row.capacity.explanation
    router = {"url": "http://router:30000", "healthy": True, "error": "not_found HTTP 404: /server_info"}
    row = answer_concurrency(readings({"http://router:30000": router})).servers["http://router:30000"]
    assert row.capacity is None and "not_found" in row.capacity_error


def test_capacity_at_observed_lengths_says_why_fleet_up_printed_other_figures():
    assert lengths_note(EXPECTED_LENGTHS) == ""  # the same lengths fleet up used: nothing to explain
    note = lengths_note("47 prompt + 352 output tokens per request, observed over 270 answers")
    assert "`fleet up` printed its figures at the lengths it sizes servers for (by default 600 prompt + 2,000" in note
