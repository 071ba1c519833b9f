"""deploy/grafana/dflash-dashboard.json queries only metrics that exist: the pipeline's own as `dflash metrics`
renders them from a status with every figure known, SGLang's as the project's simulator serves them at /metrics
(SGLang's names, labels and types), with MTP on as the fleet runs it."""

from __future__ import annotations

import asyncio
import json
import re
import time

from prometheus_client.parser import text_string_to_metric_families

from dagster_project.ops.metrics import render_metrics
from dagster_project.sglang.sim.config import SimConfig
from dagster_project.sglang.sim.faults import Faults
from dagster_project.sglang.sim.ops import SimMetrics, Stats
from dagster_project.sglang.sim.scheduler import Scheduler
from tests.support.full_status import full_status
from tests.support.paths import PROJECT_ROOT

DASHBOARD = json.loads((PROJECT_ROOT / "deploy" / "grafana" / "dflash-dashboard.json").read_text())
# A metric name in PromQL: ours (dflash_*) or SGLang's (sglang:*), as written in a selector or a function's argument.
METRIC = re.compile(r"\b(?:dflash_[a-z0-9_]+|sglang:[a-z0-9_:]+)")


def sample_names(text: str) -> set[str]:
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def simulator_exposition() -> str:
    async def scrape() -> str:
        config = SimConfig(enable_metrics=True, speculative=True)
        scheduler, stats = Scheduler(config, Faults(), time.perf_counter()), Stats()
        # The abort and retraction counters have a sample only after their first event, as SGLang's.
        scheduler.retracted = stats.counters["aborted"] = 1
        return SimMetrics(config, scheduler, stats).exposition()

    return asyncio.run(scrape())


def queried() -> dict[str, set[str]]:
    """Panel title → the metrics its queries name."""
    return {
        panel["title"]: {name for target in panel["targets"] for name in METRIC.findall(target["expr"])}
        for panel in DASHBOARD["panels"]
        if panel["type"] != "row"
    }


def test_every_metric_the_dashboard_queries_exists(tmp_path):
    panels = queried()
    assert all(panels.values()), [title for title, names in panels.items() if not names]  # each panel queries one
    names = set().union(*panels.values())
    ours = sample_names(render_metrics(full_status(tmp_path)))
    sglang = sample_names(simulator_exposition())
    assert {name for name in names if name.startswith("dflash_")} - ours == set()
    assert {name for name in names if name.startswith("sglang:")} - sglang == set()
    # The pipeline's figures the operator watches are all on it, beside the servers' own.
    assert {
        "dflash_events_done", "dflash_events_planned", "dflash_eta_seconds", "dflash_accept_length_window",
        "dflash_server_client_window", "dflash_server_in_flight", "dflash_server_cap", "dflash_shards",
        "dflash_cost_spent_dollars", "sglang:num_running_reqs", "sglang:spec_accept_length",
    } <= names  # fmt: skip


def test_the_dashboard_imports_into_any_prometheus_datasource():
    """Panels name the datasource through the dashboard's variable, and no two panels share an id."""
    assert [v["name"] for v in DASHBOARD["templating"]["list"] if v["type"] == "datasource"] == ["datasource"]
    panels = [panel for panel in DASHBOARD["panels"] if panel["type"] != "row"]
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in panels)
    ids = [panel["id"] for panel in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
