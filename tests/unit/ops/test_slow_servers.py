"""A server set aside for slowness stays counted and named after the run: status's answer and alerts, its JSON and the
page, from made-up heartbeats holding the dispatcher's view of each server (no server runs)."""

from __future__ import annotations

import dataclasses
import json
import time

from dagster_project.generation.ledger import Verdict
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


def test_one_answer_trickled_in_is_said_in_the_singular_in_status_alerts_and_the_page(tmp_path):
    """Seen by hand (operator check): "1 answers trickled in"."""
    one = {**TRICKLED, "answers_trickled": 1}
    finished = run_beat("published", {OTHER: {"slow": one}}, remaining=0)
    status = status_of(tmp_path, [finished], {OTHER: probe(MODEL)})
    said = "1 answer trickled in; set aside for slowness by the runs of shards 0"
    assert f"   SLOW: {OTHER}: {said}" in render_text(status) and slow_alerts(status)[0].startswith(f"{OTHER}: {said}")
    assert f"| gpu1:30000 | {said}" in render_markdown(status)


def test_a_server_runs_set_aside_on_one_verdict_reads_its_reason_once_and_its_row_says_it_is_set_aside(tmp_path):
    """Seen by hand (operator check): "SET ASIDE: <url> (answers_trickling; answers_trickling (set aside by
    24214-…))", the second run following the first's verdict through the node's ledger; and the server's row said
    "not enough work in flight (…; idle server or the tail of a shard)"."""
    follows = Verdict(TRICKLING, "24214-7f3a").followed()  # what the second run's dispatcher gives as its reason
    assert follows == f"{TRICKLING} (set aside by 24214-7f3a)"
    found = {"state": QUARANTINED, "reason": TRICKLING, "window": 4, "in_flight": 0, "set_aside_at": time.time()}
    runs = [
        dataclasses.replace(
            run_beat("running", {GOOD: {"window": 4, "in_flight": 4}, OTHER: {**found, **extra}}, remaining=50),
            shard=shard,
        )
        for shard, extra in ((0, {"slow": TRICKLED}), (1, {"reason": follows}))
    ]
    status = status_of(tmp_path, runs, {GOOD: probe(MODEL, running=4), OTHER: probe(MODEL)})

    text = render_text(status)
    (set_aside,) = [line for line in text.splitlines() if line.startswith("   SET ASIDE:")]
    assert set_aside.startswith(f"   SET ASIDE: {OTHER} ({TRICKLING}, found by 24214-7f3a) since ")
    assert set_aside.endswith(
        "by the runs of shards [0, 1]: it gets no new requests until a re-probe passes; look at its log"
    )
    limited_by = f"set aside ({TRICKLING}): it gets no new requests until a re-probe passes"
    assert status.concurrency.servers[OTHER].limited_by == limited_by and f"0 / 0 → {limited_by}" in text
    assert "idle server" not in text
    page = render_markdown(status)
    assert "| gpu1:30000 | 0/8 | 0 | —/— | set aside |" in page and f"Now: {limited_by};" in page
    assert "idle server" not in page
