"""A slow server stays in view after the run (#45 item 9): simulator processes, one of two sending every answer's body
at 1 byte a second after its status and headers (the `trickle_bytes_per_s` fault, a throttled link or a proxy that
trickles), a shard run to its end, then `status` (plain, JSON, the page) names the server, counts what it trickled and
raises a slow-server alert. The same run on a healthy fleet raises none."""

from __future__ import annotations

import dataclasses
import json

from dagster_project.generation.dispatch import Dispatcher, DispatchOptions
from dagster_project.generation.server_watch import TRICKLING
from dagster_project.generation.stage import generate_shard
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops.report import render_markdown
from dagster_project.ops.status import collect_status, render_text
from dagster_project.tokenizer import load_tokenizer
from tests.integration.test_generation_resume import write_multi_turn_prompts
from tests.support.ingest_helpers import run_stages

SIM = {"output_len": "uniform:16:48", "max_running_requests": 4}
# A trickle caught after 3 s (15 s by default); the set-aside server's one-token canary trickles too, and its re-probe
# fails at the canary's timeout.
OPTIONS = {"trickle_after_s": 3.0, "canary_timeout_s": 5.0, "probe_interval_s": 0.2, "max_probe_backoff_s": 0.5}


def run_shard(tmp_path, fleet):
    source = tmp_path / "prompts.jsonl"
    write_multi_turn_prompts(source, conversations=12, turns=2)
    store = run_stages(tmp_path, [str(source)], num_shards=1).store
    dispatcher = Dispatcher(fleet.urls, DispatchOptions(**OPTIONS))
    manifest = generate_shard(
        store, 0, tokenizer=load_tokenizer(), settings=GenerationSettings(max_new_tokens=64),
        dispatcher=dispatcher, work_dir=tmp_path,
    )  # fmt: skip
    assert manifest.ok == manifest.rows == 24
    return store, dispatcher


def test_a_server_whose_answers_trickle_is_alerted_on_after_the_run(tmp_path, sim_fleet):
    fleet = sim_fleet(2, **SIM)
    healthy, trickling = fleet.urls
    fleet.set_faults(1, trickle_bytes_per_s=1)
    store, dispatcher = run_shard(tmp_path, fleet)
    view = dispatcher.snapshot()["servers"][trickling]
    assert view["reason"] == TRICKLING and view["slow"]["set_aside"] == {TRICKLING: 1}, view
    trickled = view["slow"]["answers_trickled"]
    assert 1 <= trickled <= 5  # of its first window (cap 4 x 1.25): those whose answers began 3 s before the check
    answers = "1 answer" if trickled == 1 else f"{trickled} answers"
    assert fleet.job_requests(1), "the trickling server was sent none of the shard's requests"

    status = collect_status(store, fleet.urls)  # the run has ended: only its last heartbeat tells
    said = (
        f"{trickling}: {answers} trickled in; set aside for slowness by the runs of shards 0: "
        "answers_trickling 1× (answers begun and not complete within 3 s). Their requests were re-sent to other servers"
    )
    look = "Look at the path to it (a proxy, a load balancer, a congested link) and its log"
    assert [alert.message for alert in status.alerts if alert.kind == "slow_server"] == [f"{said}. {look}"]
    text = render_text(status)
    assert f"ALERT [slow_server]: {said}" in text and f"   SLOW: {trickling}: {answers} trickled in" in text
    assert healthy not in text.split("Alerts")[-1]
    (slow,) = json.loads(json.dumps(dataclasses.asdict(status)))["concurrency"]["slow_servers"]
    assert slow["url"] == trickling and slow["answers_trickled"] == trickled and slow["limits_s"] == {TRICKLING: 3.0}
    assert f"| {trickling.split('://')[1]} | {answers} trickled in;" in render_markdown(status)


def test_a_healthy_fleet_raises_no_slow_server_alert(tmp_path, sim_fleet):
    fleet = sim_fleet(2, **SIM)
    store, dispatcher = run_shard(tmp_path, fleet)
    assert all(view["slow"] == {} for view in dispatcher.snapshot()["servers"].values())
    status = collect_status(store, fleet.urls)
    assert status.concurrency.slow_servers == [] and status.alerts == [], status.alerts
