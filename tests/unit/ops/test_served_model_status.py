"""Which model each server serves, and the verdict on it, in status's answer and alerts, `dflash fleet status` and the
page: from made-up probes and heartbeats (no server runs)."""

from __future__ import annotations

import time

from dagster_project.generation.progress import Heartbeat
from dagster_project.generation.served_model import ExpectedModel, mismatch_reason
from dagster_project.ops.answers.concurrency import QUARANTINED, answer_concurrency, render_concurrency
from dagster_project.ops.answers.readings import Readings
from dagster_project.ops.report import render_markdown
from dagster_project.ops.status import Status
from dagster_project.ops.terminal import fleet_table
from dagster_project.processes import this_process
from dagster_project.sglang.model_identity import QWEN3_6_27B
from tests.unit.ops.test_figures import status_of

HOST, PID, STARTED = this_process()
GOOD, OTHER = "http://gpu0:30000", "http://gpu1:30000"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
# What the dispatcher set the other server aside with (`served_model.mismatch_reason`).
REASON = mismatch_reason(
    ["its vocabulary has 128,256 ids, not 248,320"], ExpectedModel(served_model=QWEN3_6_27B.model).identity()
)
STOP_IT = "no shard sends it work — stop it or point it at the right model"


def probe(model: str | None, running: float = 0) -> dict:
    """What `launch.probe_endpoints` keeps of a server of `model` (None: /server_info did not answer)."""
    names = {"model_path": f"/models/{model}", "served_model_name": model} if model else {}
    return {"healthy": True, "max_running_requests": 8, "running": running, "queued": 0, **names}


def run_beat(state: str, servers: dict[str, dict], *, remaining: int, ago: float = 0.0) -> Heartbeat:
    """Shard 0's run (this process: alive while `state` is running) with the dispatcher's view of each server."""
    now = time.time()
    return Heartbeat(
        shard=0, state=state, settings_fingerprint="f", started_at=now - 600, updated_at=now - ago, total_events=100,
        resumed_events=0, done_events=100 - remaining, remaining_events=remaining, ok_events=100 - remaining,
        servers=servers, host=HOST, pid=PID, process_start=STARTED, heartbeat_interval_s=5.0,
    )  # fmt: skip


def set_aside_view() -> dict:
    return {"state": QUARANTINED, "reason": REASON, "window": 4, "in_flight": 0, "set_aside_at": time.time() - 300}


def server_alerts(status: Status) -> list[str]:
    return [alert.message for alert in status.alerts if alert.kind == "server"]


def test_a_server_naming_another_model_is_shown_with_it_and_alerted_not_called_idle(tmp_path):
    """During a run: the server of another model idles because the run set it aside, which its alert says; the
    "idle while shards have work waiting" alert would send the operator after the dispatcher."""
    running = run_beat("running", {GOOD: {"window": 4, "in_flight": 4}, OTHER: set_aside_view()}, remaining=60)
    status = status_of(tmp_path, [running], {GOOD: probe(QWEN3_6_27B.model, running=4), OTHER: probe(LLAMA)})

    good, other = status.concurrency.servers[GOOD], status.concurrency.servers[OTHER]
    assert (good.model, good.other_model) == (QWEN3_6_27B.model, None)
    assert (other.model, other.other_model) == (LLAMA, f"serves {LLAMA}, not the job's {QWEN3_6_27B.model}")
    text = "\n".join(render_concurrency(status.concurrency))
    assert f"      model: {QWEN3_6_27B.model}, the job's" in text
    assert f"      model: {LLAMA} — OTHER MODEL: serves {LLAMA}, not the job's {QWEN3_6_27B.model}" in text
    # One alert names the cause (not the set-aside alert beside it, nor the idle one).
    assert server_alerts(status) == [f"{OTHER}: serves {LLAMA}, not the job's {QWEN3_6_27B.model}; {STOP_IT}"]


def test_after_the_run_the_runs_verdict_stays_while_the_server_is_in_the_fleet(tmp_path):
    """The run ended: no live heartbeat sets the server aside, and its name alone passes (a checkpoint of another
    vocabulary under the job's name); the finished run's last heartbeat still says what it found."""
    finished = run_beat("published", {GOOD: {"state": "healthy"}, OTHER: set_aside_view()}, remaining=0)
    fleet = {GOOD: probe(QWEN3_6_27B.model), OTHER: probe(QWEN3_6_27B.model)}
    status = status_of(tmp_path, [finished], fleet)

    other = status.concurrency.servers[OTHER]
    assert other.other_model == f"the run of shard 0 set it aside: {REASON}"
    assert server_alerts(status) == [f"{OTHER}: the run of shard 0 set it aside: {REASON}; {STOP_IT}"]
    assert status.concurrency.servers[GOOD].other_model is None
    # Out of the fleet, it is not alerted on.
    assert server_alerts(status_of(tmp_path, [finished], {GOOD: probe(QWEN3_6_27B.model)})) == []


def test_a_later_run_that_found_the_jobs_model_clears_the_verdict(tmp_path):
    earlier = run_beat("published", {OTHER: set_aside_view()}, remaining=0, ago=3600)
    later = run_beat("published", {OTHER: {"state": "healthy", "reason": None}}, remaining=0)
    status = status_of(tmp_path, [earlier, later], {OTHER: probe(QWEN3_6_27B.model)})
    assert status.concurrency.servers[OTHER].other_model is None and server_alerts(status) == []


def test_the_page_and_the_fleet_table_show_each_servers_model_and_the_verdict(tmp_path):
    fleet = {GOOD: {"url": GOOD, **probe(QWEN3_6_27B.model)}, OTHER: {"url": OTHER, **probe(LLAMA)}}
    page = render_markdown(status_of(tmp_path, [], fleet))
    assert "| server | busy/cap | queued | KV/mamba | limit |" in page
    assert f"| gpu0:30000 | Model: {QWEN3_6_27B.model}, the job's. Now:" in page
    assert f"| gpu1:30000 | Model: {LLAMA} — OTHER MODEL: serves {LLAMA}, not the job's" in page

    lines = fleet_table(list(fleet.values()), {}, "head", served_model=QWEN3_6_27B.model).splitlines()
    assert lines[0].split() == ["pid", "address", "health", "model", "cap", "running", "queued"]
    assert lines[1].split() == ["—", "gpu0:30000", "healthy", QWEN3_6_27B.model, "8", "0", "0"]
    assert lines[2].split() == ["—", "gpu1:30000", "healthy", LLAMA, "(OTHER", "MODEL)", "8", "0", "0"]
    # With the check off (no served model configured), no server is another model's.
    unchecked = fleet_table(list(fleet.values()), {}, "head", served_model="")
    assert "OTHER MODEL" not in unchecked and LLAMA in unchecked


def test_a_probe_that_names_no_model_is_not_judged(tmp_path):
    """A router (no /server_info) or a server that did not answer: its model is unknown, not another."""
    status = status_of(tmp_path, [], {GOOD: probe(None)})
    row = status.concurrency.servers[GOOD]
    assert (row.model, row.other_model) == (None, None) and server_alerts(status) == []
    assert "      model: — (its /server_info names none)" in "\n".join(render_concurrency(status.concurrency))
    assert answer_concurrency(Readings(time.time(), 0, None, None, 0, {}, [], {}, None, None)).servers == {}
