"""A `Status` with every figure known, answered by the real answer functions from made-up readings: 3 shards (one
published, one running with a settled ETA and a dispatcher's window on a server, one not started), a probed server
with MTP on, a plan the run falls behind (an alert) and a price."""

from __future__ import annotations

import time
from pathlib import Path

from dagster_project.generation.line_stop import WatchFigure, WatchReport
from dagster_project.generation.progress import Rates, SpecDecodingStats
from dagster_project.generation.shards import CompletionsShardManifest, GenerationSummary
from dagster_project.ops.alerts import DEFAULT_THRESHOLDS
from dagster_project.ops.answers.cost import NO_PRICE, FleetCost
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.plan import Plan
from dagster_project.ops.status import Status, answer_all
from dagster_project.processes import this_process
from dagster_project.sglang import capacity
from dagster_project.sglang.capacity import LaunchSettings
from dagster_project.store.storage import LocalStore
from tests.support.heartbeats import heartbeat
from tests.support.server_info import server_info_for

SERVER = "http://127.0.0.1:30000"
HOST, PID, STARTED = this_process()


def full_readings(now: float) -> Readings:
    info = server_info_for(LaunchSettings())
    probe = {
        "url": SERVER,
        "healthy": True,
        "speculative_algorithm": "EAGLE",
        "avg_spec_accept_length": 2.9,
        "max_running_requests_flag": info["max_running_requests"],
        "max_running_requests": info["internal_states"][0]["effective_max_running_requests_per_dp"],
        "server_info": capacity.capacity_fields(info),
        "running": 20.0,
        "queued": 3.0,
        "kv_usage": 0.41,
        "mamba_usage": 0.87,
    }
    running = heartbeat(1, done=4, updated_at=now, host=HOST, pid=PID, process_start=STARTED, heartbeat_interval_s=10.0)
    rates = Rates(seconds=600.0, req_per_s=0.05, output_tok_per_s=20.0)
    running = running.__class__(
        **{
            **running.__dict__,
            "output_tokens": 1600,
            "prompt_tokens": 800,
            "lifetime": rates,
            "window": rates,
            "eta_rates": rates,
            "eta_s": 120.0,
            "spec": SpecDecodingStats(window_spec_tokens=310, window_verify_passes=100),
            "servers": {SERVER: {"window": 24, "in_flight": 22}},
        }
    )
    published = CompletionsShardManifest(
        shard=0, rows=10, ok=9, errors=1, output_tokens=3600, prompt_tokens=2000, ids_digest="c0",
        published_at=now - 60,
        generation=GenerationSummary(lifetime=rates, spec=SpecDecodingStats(accept_length_lifetime=3.1)),
    )  # fmt: skip
    # Planned twice as fast as measured: the ETA slips, which raises an alert.
    plan = Plan(source="test", req_per_s=0.1, avg_output_tokens=400.0, output_tok_per_s=40.0)
    # The running shard's quality watch: every watched gate passing so far, the accept length beside them.
    figures = [
        WatchFigure("short_answers", 0.02, 0.1, 4, True, "ok: 2% short"),
        WatchFigure("accept_length", 3.1, 1.5, 4, True, "accept length 3.10", blocking=False),
    ]
    watch = WatchReport(1, "fp", now - 60, now, 5.0, answers=4, figures=figures, fleet_figures=figures, fleet_answers=4,
                        fleet_runs=1)  # fmt: skip
    return Readings(now, 3, None, None, 30, {0: published}, [running], {SERVER: probe}, plan, None, watch=[watch])


def full_status(tmp_path: Path, *, priced: bool = True) -> Status:
    return answer_all(
        LocalStore(str(tmp_path / "store")),
        full_readings(time.time()),
        current_fingerprint=None,
        materialized=None,
        cost=FleetCost(cost_per_gpu_hour=3.5) if priced else NO_PRICE,
        thresholds=DEFAULT_THRESHOLDS,
        endpoints_known=True,
    )
