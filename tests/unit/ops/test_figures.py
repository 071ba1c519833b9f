"""Every figure of the operator's answers true, in the terminal (`render_text`) and on the page (`render_markdown`),
from made-up readings (heartbeats, server probes, a coverage record; no server runs). Each test is one figure
that was wrong: turns generated shown as the planned count, two statements of what binds a server's cap, events
to come shown as missing, answer lengths judged "behind plan", and an ETA from a window too short to be stable."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from dagster_project.conversations.shards import SourceTotals
from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.ops.coverage import DatasetCoverage
from dagster_project.ops.plan import Plan
from dagster_project.ops.report import render_markdown
from dagster_project.ops.status import DEFAULT_THRESHOLDS, NO_PRICE, Readings, Status, answer_all, render_text
from dagster_project.processes import this_process
from dagster_project.sglang import capacity
from dagster_project.sglang.capacity import LaunchSettings
from dagster_project.store.dataclass_json import from_dict
from dagster_project.store.storage import LocalStore
from tests.support.server_info import server_info_for

HOST, PID, STARTED = this_process()
URL = "http://gpu0:30000"
PLANNED = 1153


def live_shard(done: int, **figures) -> Heartbeat:
    """A shard run of this process, `done` of PLANNED events in, 373 output tokens per answer."""
    now = time.time()
    return from_dict(
        Heartbeat,
        {
            "shard": 0,
            "state": "running",
            "settings_fingerprint": "f",
            "started_at": now - 1800,
            "updated_at": now,
            "total_events": PLANNED,
            "resumed_events": 0,
            "done_events": done,
            "remaining_events": PLANNED - done,
            "ok_events": done,
            "output_tokens": 373 * done,
            "prompt_tokens": 50 * done,
            "window": {"seconds": 120, "req_per_s": 1.0, "output_tok_per_s": 373.0},
            "host": HOST,
            "pid": PID,
            "process_start": STARTED,
            "heartbeat_interval_s": 5.0,
            **figures,
        },
    )


def status_of(tmp_path, beats=(), fleet=None, coverage=None, plan=None, published=None) -> Status:
    readings = Readings(time.time(), 4, None, None, PLANNED, published or {}, list(beats), fleet or {}, plan, coverage)
    return answer_all(
        LocalStore(tmp_path),
        readings,
        current_fingerprint=None,
        materialized=None,
        cost=NO_PRICE,
        thresholds=DEFAULT_THRESHOLDS,
        endpoints_known=bool(fleet),
    )


def both(status: Status) -> tuple[str, str]:
    return render_text(status), render_markdown(status)


def test_turns_generated_so_far_are_told_apart_from_the_turns_planned(tmp_path):
    for answer in both(status_of(tmp_path, [live_shard(407)])):
        assert "assistant turns generated 407 of 1,153 planned" in answer, answer
        assert "1,153 assistant turns generated" not in answer


def test_what_binds_a_servers_cap_is_one_statement_the_same_in_every_table_and_the_terminal(tmp_path):
    """At its configured maximum (radix cache off, a state slot per request), full and queueing: the cap is bound
    by the configured maximum, not by server memory; the KV pool, whose own usage is low, allows far more."""
    info = server_info_for(LaunchSettings(disable_radix_cache=True, max_running_requests=69))
    probe = {
        "url": URL,
        "healthy": True,
        "speculative_algorithm": "EAGLE",
        "max_running_requests_flag": 69,
        "max_running_requests": info["internal_states"][0]["effective_max_running_requests_per_dp"],
        "server_info": capacity.capacity_fields(info),
        "running": 69,
        "queued": 3,
        "token_usage": 1.0,  # the fuller pool: the mamba state slots, one per running request
        "kv_usage": 0.21,
        "mamba_usage": 1.0,
    }
    text, page = both(status_of(tmp_path, fleet={URL: probe}))
    binding = "cap 69 per server, bound by the configured maximum"
    server = URL.removeprefix("http://")
    # The servers table says what limits it in a few words; the capacity table, in full, the same statement both
    # for what limits it now and for what binds its cap.
    servers_row = next(line for line in page.splitlines() if line.startswith(f"| {server} | 69/69 | 3 |"))
    capacity_row = next(line for line in page.splitlines() if line.startswith(f"| {server} | Model: "))
    assert servers_row.endswith("| the server's cap |") and capacity_row.count(binding) == 2
    assert "| 21%/100% |" in servers_row  # KV use is the KV pool's; the mamba pool is the full one
    limit_line = next(line for line in text.splitlines() if line.startswith(f"   {URL}:"))
    assert binding in limit_line and f"capacity: {binding}" in text
    assert "server memory" not in servers_row + limit_line


def test_mid_run_coverage_tells_events_to_come_from_missing_ones(tmp_path):
    """Three of four shards not published yet: their 746 events are to come, not lost."""
    coverage = from_dict(
        DatasetCoverage,
        {
            "computed_at": time.time(),
            "shards": 4,
            "shards_published": 1,
            "conversations": 1000,
            "conversations_done": 300,
            "conversations_partial": 0,
            "conversations_missing": 0,
            "conversations_with_errors": 0,
            "conversations_in_several_shards": 0,
            "events_planned": PLANNED,
            "events_recorded": 407,
            "events_missing": 0,
            "events_duplicated": 0,
            "events_unexpected": 0,
            "conversations_not_yet_published": 700,
            "events_not_yet_published": 746,
        },
    )
    for answer in both(status_of(tmp_path, [live_shard(407)], coverage=coverage)):
        assert "+ missing 0 + not yet published 700; events missing 0, not yet published 746," in answer, answer


def test_answers_longer_than_planned_are_longer_not_behind_plan(tmp_path):
    plan = Plan(source="test plan", req_per_s=1.0, avg_output_tokens=300, output_tok_per_s=300, gpus=1)
    page = render_markdown(status_of(tmp_path, [live_shard(407)], plan=plan))
    assert "| avg output tokens | 373 | 300 | 1.24 | longer than plan |" in page


def test_the_fleet_eta_comes_from_the_shards_stable_windows_and_from_the_lifetime_rate_while_they_settle(tmp_path):
    # The last two minutes ended a wave of answers at 4 req/s; over its ETA window the shard ends 1 a second.
    wave = {"window": {"seconds": 120, "req_per_s": 4.0, "output_tok_per_s": 1492.0}}
    settled = {"eta_rates": {"seconds": 600, "req_per_s": 1.0, "output_tok_per_s": 373.0}, "eta_settling": False}
    status = status_of(tmp_path, [live_shard(407, **wave, **settled)])
    assert round(status.progress.eta_hours * 3600) == PLANNED - 407  # 746 events at 1 a second
    assert status.progress.eta_basis == "window"
    assert all("(at the lifetime rate" not in answer for answer in both(status))

    # A minute in, the window is not stable: the ETA is the lifetime rate's (2 a second), and says so.
    starting = {
        "eta_rates": {"seconds": 60, "req_per_s": 9.0, "output_tok_per_s": 3357.0},
        "lifetime": {"seconds": 60, "req_per_s": 2.0, "output_tok_per_s": 746.0},
        "eta_settling": True,
    }
    status = status_of(tmp_path, [live_shard(407, **wave, **starting)])
    assert round(status.progress.eta_hours * 3600) == (PLANNED - 407) / 2 and status.progress.eta_basis == "lifetime"
    for answer in both(status):
        assert "h (at the lifetime rate so far: the windowed rate is still settling)" in answer, answer

    # A shard just begun after another has finished nothing: the ETA is every run's lifetime rate so far (407
    # events over the 30 minutes the shard's heartbeats cover), never none while answers flow.
    begun = {"lifetime": {"seconds": 5, "req_per_s": 0.0, "output_tok_per_s": 0.0}, "eta_settling": True}
    status = status_of(tmp_path, [live_shard(407, **begun)])
    assert status.progress.eta_hours * 3600 == pytest.approx((PLANNED - 407) / (407 / 1800))
    assert status.progress.eta_basis == "lifetime"


def test_a_finished_job_reads_done_and_an_idle_one_why_it_has_no_eta_not_an_unknown_number_of_hours(tmp_path):
    """Seen by hand (operator check): "ETA — h" in status and on the page's first screen for a job with no event left,
    and for one with no shard running."""
    rows = {"rows": PLANNED, "ok": PLANNED, "errors": 0, "output_tokens": 373 * PLANNED, "prompt_tokens": 50 * PLANNED}
    finished = from_dict(CompletionsShardManifest, {"shard": 0, "ids_digest": "c0", "published_at": 0.0, **rows})
    text, page = both(status_of(tmp_path, published={0: finished}))
    assert "ETA done" in text and "ETA at the measured rate: **done**;" in page
    assert "— h" not in text + page and "1. 1,153/1,153 events (100.0%); ETA done" in page

    half = from_dict(CompletionsShardManifest, {"shard": 0, "ids_digest": "c0", "published_at": 0.0, **rows})
    text, page = both(status_of(tmp_path, published={0: replace(half, rows=407, ok=407)}))
    assert (
        "ETA none: no shard is running" in text and "ETA at the measured rate: **none: no shard is running**;" in page
    )
    assert "— h" not in text + page and "1. 407/1,153 events (35.3%); ETA none (idle)" in page


def test_conversations_by_source_read_as_names_and_counts_the_largest_first_not_a_python_dict(tmp_path):
    """Seen by hand (operator check): "conversations 232 by source {'sharegpt': {'input_rows': …}, …}"."""
    status = status_of(tmp_path)
    sources = {"ultrachat": 32, "sharegpt": 200, "evil\x1b[2Jsource": 1} | {f"tail{n:02d}": 1 for n in range(12)}
    by_source = {name: SourceTotals(input_rows=n, conversations=n, quarantined=0) for name, n in sources.items()}
    quarantined = {"duplicate": 2, "bad_tool_call": 1, "control_tokens": 14}
    coverage = replace(status.coverage, conversations=246, by_source=by_source, quarantined_by_reason=quarantined)
    text = render_text(replace(status, coverage=coverage))
    said = (
        "   conversations 246 by source (sharegpt 200, ultrachat 32, evil\\x1b[2Jsource 1, tail00 1, tail01 1, "
        "tail02 1, tail03 1, tail04 1, tail05 1, tail06 1, tail07 1, tail08 1 … (+3 more)); events planned 1,153,"
    )
    assert said in text and "{" not in text.split("5. Coverage")[1].split("6. Multi-turn")[0]
    assert "quarantined — (control_tokens 14, duplicate 2, bad_tool_call 1)" in text
