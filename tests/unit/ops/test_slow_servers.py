"""A server set aside for slowness stays counted and named after the run: status's answer and alerts, its JSON and the
page, from made-up heartbeats holding the dispatcher's view of each server (no server runs)."""

from __future__ import annotations

import dataclasses
import json
import time

from dagster_project.generation.server_watch import NOT_RUNNING, TRICKLING
from dagster_project.ops.answers.concurrency import QUARANTINED
from dagster_project.ops.report import render_markdown
from dagster_project.ops.status import render_text
from tests.unit.ops.test_figures import status_of
from tests.unit.ops.test_served_model_status import GOOD, OTHER, run_beat
from tests.unit.ops.test_served_model_status import probe as model_probe

MODEL = "Qwen/Qwen3.6-27B"
TRICKLED = {"set_aside": {TRICKLING: 1}, "limits_s": {TRICKLING: 30.0}, "answers_trickled": 3}
SAID = (
    "3 answers trickled in; set aside for slowness by the runs of shards 0: answers_trickling 1× (answers begun and "
    "not complete within 30 s)"
)
LOOK = ". Look at the path to it (a proxy, a load balancer, a congested link) and its log"


def probe(model: str, running: float = 0) -> dict:
    """A healthy server of the job's model with MTP on."""
    return {**model_probe(model, running), "speculative_algorithm": "NEXTN"}


def slow_alerts(status) -> list[str]:
    return [alert.message for alert in status.alerts if alert.kind == "slow_server"]


def test_after_the_run_the_slow_server_is_alerted_on_and_shown_in_status_json_and_the_page(tmp_path):
    finished = run_beat("published", {GOOD: {"state": "healthy", "slow": {}}, OTHER: {"slow": TRICKLED}}, remaining=0)
    status = status_of(tmp_path, [finished], {GOOD: probe(MODEL), OTHER: probe(MODEL)})

    assert slow_alerts(status) == [f"{OTHER}: {SAID}. Their requests were re-sent to other servers{LOOK}"]
    assert [alert.kind for alert in status.alerts] == ["slow_server"]  # the healthy server: nothing
    text = render_text(status)
    assert f"   SLOW: {OTHER}: {SAID}" in text and f"ALERT [slow_server]: {OTHER}: {SAID}" in text
    (slow,) = json.loads(json.dumps(dataclasses.asdict(status)))["concurrency"]["slow_servers"]
    assert slow == {
        "url": OTHER, "set_aside": {TRICKLING: 1}, "limits_s": {TRICKLING: 30.0}, "answers_trickled": 3, "shards": [0],
    }  # fmt: skip
    page = render_markdown(status)
    assert "| server | set aside for slowness |" in page and f"| gpu1:30000 | {SAID} |" in page
    assert f"| slow_server | {OTHER}: {SAID}" in page


def test_while_set_aside_one_alert_says_so_and_the_runs_counts_add_up(tmp_path):
    """Shard 1's run still has it set aside: one alert (not a set-aside alert beside it) with both runs' counts."""
    earlier = {"set_aside": {NOT_RUNNING: 2}, "limits_s": {NOT_RUNNING: 15.0}, "answers_trickled": 0}
    finished = run_beat("published", {OTHER: {"slow": earlier}}, remaining=0)
    now = {"state": QUARANTINED, "reason": TRICKLING, "window": 4, "in_flight": 0, "set_aside_at": time.time()}
    running = dataclasses.replace(
        run_beat("running", {GOOD: {"window": 4, "in_flight": 4}, OTHER: {**now, "slow": TRICKLED}}, remaining=50),
        shard=1,
    )
    status = status_of(tmp_path, [finished, running], {GOOD: probe(MODEL, running=4), OTHER: probe(MODEL)})

    (slow,) = status.concurrency.slow_servers
    assert (slow.set_aside, slow.answers_trickled, slow.shards) == ({TRICKLING: 1, NOT_RUNNING: 2}, 3, [0, 1])
    said = (
        "3 answers trickled in; set aside for slowness by the runs of shards 0-1: answers_trickling 1× (answers begun "
        "and not complete within 30 s); requests_not_running 2× (none of ours running or queued by its /metrics for "
        "15 s)"
    )
    set_aside_now = "; it is set aside now (answers_trickling) until a re-probe passes"
    assert slow_alerts(status) == [
        f"{OTHER}: {said}. Their requests were re-sent to other servers{set_aside_now}{LOOK}"
    ]
    assert not any(alert.message.startswith("set aside:") for alert in status.alerts)
    assert not any("idle" in alert.message for alert in status.alerts)


def test_a_healthy_fleet_raises_no_slow_server_alert(tmp_path):
    finished = run_beat("published", {GOOD: {"state": "healthy", "slow": {}}, OTHER: {"state": "healthy"}}, remaining=0)
    status = status_of(tmp_path, [finished], {GOOD: probe(MODEL), OTHER: probe(MODEL)})
    assert status.concurrency.slow_servers == [] and status.alerts == []
    assert "SLOW" not in render_text(status) and "slow" not in render_markdown(status)
