"""Shard runs as an operator runs them: `dagster asset materialize` processes against a simulator fleet.

* SIGKILL of the run mid-shard: `dflash status` shows the shard dead at once and marks the Dagster run failed;
  then a rerun: every event exactly once, nothing journaled sent again;
* `dflash status` read while a shard runs answers all six questions with plausible values;
* MTP switched off mid-shard: the next report refresh the sensor asks for raises the MTP alert;
* two shard runs sharing one fleet at the same time;
* the same shard started twice at once (a backfill and a manual run): one run refuses naming the other, no
  request is sent twice, and the shard is published once, exactly.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import dagster as dg
import orjson
import psutil
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.run_report import run_report, run_report_refresh
from dagster_project.conversations.shards import read_conversations
from dagster_project.generation.shards import iter_completion_batches, shard_coverage
from dagster_project.generation.stage import journal_path
from dagster_project.generation_settings import GenerationSettings
from dagster_project.ops.plan import Plan, write_plan
from dagster_project.ops.status import collect_status
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet
from dagster_project.sglang.protocol import input_hash
from dagster_project.store.storage import LocalStore
from tests.support.dagster_helpers import (
    DAGSTER,
    DEFS_MODULE,
    FAST_ANSWERS,
    dagster_home,
    evaluations_by_check,
    pipeline_env,
    publish_conversations,
)
from tests.support.journal_files import journal_records
from tests.support.pilots import pass_pilot_of_env
from tests.support.sglang_fixtures import slow_until_cleared, wait_until

NUM_SHARDS = 4  # the demo data over 4 shards: ~65 events per shard, some multi-turn
# Slow enough that a shard takes several seconds: ~0.5 s per answer, 2 running per server.
SLOW_FLEET = {"output_len": "uniform:44:84", "decode_step_s": 0.02, "max_running_requests": 2, "enable_metrics": True}
# A test needs its shard slow only while it acts mid-shard (a kill, a status read, a refresh, a refusal);
# its fleet runs at `slow_until_cleared` options, and the test's `clear_faults` after that moment lets the rest of
# the shard finish at full speed.
FINGERPRINT = GenerationSettings().fingerprint()


@pytest.fixture(scope="module")
def published(tmp_path_factory) -> Path:
    """Conversations of the demo data published once for the module, and their pilot passed (on a fleet of its own): a
    local store and the instance that recorded them (its SQLite storage initialised here, before CLI runs use it
    concurrently)."""
    root = tmp_path_factory.mktemp("published")
    home = dagster_home(root / "dagster_home")
    env = pipeline_env(home=home, store=root / "store", work_dir=root / "work", num_shards=NUM_SHARDS)
    publish_conversations(home, root / "store", env)
    pass_pilot_of_env(home, env, own_fleet=root / "pilot_fleet")
    return root


@pytest.fixture
def pipeline(published, tmp_path):
    """A copy of the published store and instance for this test alone, and the environment a CLI run needs."""
    for part in ("store", "dagster_home"):
        shutil.copytree(published / part, tmp_path / part)
    store = LocalStore(tmp_path / "store")
    env = pipeline_env(
        home=tmp_path / "dagster_home", store=store.uri, work_dir=tmp_path / "work", num_shards=NUM_SHARDS
    )
    return store, env


def materialize_shard(env: dict, shard: int, fleet_urls: list[str], config: dict | None = None) -> subprocess.Popen:
    command = [
        DAGSTER,
        "asset",
        "materialize",
        "-m",
        DEFS_MODULE,
        "--select",
        "completions",
        "--partition",
        f"shard-{shard:05d}",
    ]
    if config:  # the completions op config
        command += ["--config-json", json.dumps({"ops": {"completions": {"config": config}}})]
    # Its own session: a SIGKILL of the group takes the run worker and everything it started.
    return subprocess.Popen(
        command,
        env={**env, "DFLASH_SGLANG_ENDPOINTS": ",".join(fleet_urls)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finished(process: subprocess.Popen, timeout_s: float = 180) -> str:
    output, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, output[-4000:]
    return output


def journaled(env: dict, shard: int) -> dict[str, dict]:
    return journal_records(journal_path(Path(env["DFLASH_WORK_DIR"]), shard, FINGERPRINT))


def all_requests(fleet, since: list[int] | None = None) -> list[dict]:
    """Every server's log of the job's requests (not the dispatcher's one-token probes), from `since[i]` on for
    server i."""
    since = since or [0] * len(fleet.urls)
    return [entry for index in range(len(fleet.urls)) for entry in fleet.job_requests(index, since=since[index])]


def test_sigkill_mid_shard_then_rerun_gives_every_event_exactly_once(pipeline, sim_fleet):
    store, env = pipeline
    fleet = sim_fleet(2, **slow_until_cleared(SLOW_FLEET))
    run = materialize_shard(env, 1, fleet.urls)
    wait_until(lambda: len(journaled(env, 1)) >= 12, timeout_s=120, interval_s=0.05, what="a dozen journaled events")
    for index in range(2):  # freeze the fleet so the kill lands mid-shard, with requests in flight
        fleet.set_faults(index, hang=True)
    family = [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    wait_until(
        lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family), what="the run to die"
    )
    # Status sees the killed run's process gone: the shard is dead, not running, and its Dagster run is failed.
    killed = heartbeat(store, 1)
    assert killed["state"] == "running" and killed["pid"] == run.pid and killed["run_id"]
    status = dflash_status(env, fleet.urls)
    assert status["progress"]["shards_running"] == [] and status["progress"]["shards_dead"] == [1]
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        assert instance.get_run_by_id(killed["run_id"]).status == dg.DagsterRunStatus.FAILURE
        # ... and its slot of the fleet's pool is free again: later shard runs do not queue behind a dead one.
        assert killed["run_id"] not in instance.event_log_storage.get_concurrency_run_ids()
    for index in range(2):
        fleet.clear_faults(index)

    before = journaled(env, 1)
    planned = sum(c.num_turns for c in read_conversations(store, 1))
    assert 12 <= len(before) < planned
    logged_before = [len(fleet.requests(index)) for index in range(len(fleet.urls))]

    finished(materialize_shard(env, 1, fleet.urls))
    coverage = shard_coverage(store, 1)
    assert coverage.exact and coverage.expected == planned
    rerun_hashes = {entry["input_hash"] for entry in all_requests(fleet, since=logged_before)}
    assert rerun_hashes, "the rerun sent nothing"
    assert not rerun_hashes & {input_hash(r["prompt_ids"]) for r in before.values()}, "a journaled request was re-sent"
    published = {
        event: output
        for batch in iter_completion_batches(store, 1, ["event_id", "output_ids"])
        for event, output in zip(batch.column("event_id").to_pylist(), batch.column("output_ids").to_pylist())
    }
    assert all(published[e] == r["output_ids"] for e, r in before.items())


def test_a_run_killed_while_starting_gives_back_its_pool_slot(pipeline, sim_fleet):
    """Killed before it wrote any heartbeat (here: waiting on a server that accepts and never answers), a run
    still holds its slot of the fleet's pool; `dflash status` sees its processes gone, fails it, frees the slot."""
    store, env = pipeline
    with socket.create_server(("127.0.0.1", 0)) as silent:
        run = materialize_shard(env, 3, [f"http://127.0.0.1:{silent.getsockname()[1]}"])
        with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
            # Every 0.1 s, as the other waits here: each asks the instance's database.
            wait_until(
                lambda: instance.event_log_storage.get_concurrency_run_ids(),
                timeout_s=120,
                interval_s=0.1,
                what="a pool slot",
            )
            (run_id,) = instance.event_log_storage.get_concurrency_run_ids()
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    assert heartbeat(store, 3) == {}
    dflash_status(env, sim_fleet(1).urls)
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        assert instance.get_run_by_id(run_id).status == dg.DagsterRunStatus.FAILURE
        assert instance.event_log_storage.get_concurrency_run_ids() == set()


def heartbeat(store, shard: int) -> dict:
    key = f"progress/shard={shard:05d}.json"
    return orjson.loads(store.get_bytes(key)) if store.exists(key) else {}


def dflash_status(env: dict, fleet_urls: list[str]) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "dagster_project.cli", "status", "--json", "--dagster"],
        env={**env, "DFLASH_SGLANG_ENDPOINTS": ",".join(fleet_urls)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout)


def test_status_while_a_shard_runs_answers_the_six_questions(pipeline, sim_fleet):
    store, env = pipeline
    write_plan(store, Plan(source="test", req_per_s=5.0, avg_output_tokens=64, output_tok_per_s=320))
    fleet = sim_fleet(2, **slow_until_cleared(SLOW_FLEET))
    run = materialize_shard(env, 2, fleet.urls)
    try:
        wait_until(
            lambda: heartbeat(store, 2).get("done_events", 0) >= 8, timeout_s=120, interval_s=0.1, what="8 events done"
        )
        for index in range(2):  # nearly freeze the fleet mid-shard: the run stays running while status is read,
            fleet.set_faults(index, slow=1e6)  # and the servers stay healthy (a hang would fail their health checks)
        status = dflash_status(env, fleet.urls)
    finally:
        for index in range(2):
            fleet.clear_faults(index)
        finished(run)
    progress, mtp, storage, coverage, multi_turn = (
        status[k] for k in ("progress", "mtp", "storage", "coverage", "multi_turn")
    )
    # 1. progress vs the plan
    assert progress["shards_running"] == [2]
    assert 0 < progress["events_done"] < progress["events_planned"]
    assert progress["window_req_per_s"] > 0 and progress["window_output_tok_per_s"] > 0
    assert 44 <= progress["avg_output_tokens"] <= 84  # the answers' own, of SLOW_FLEET's lengths
    assert progress["plan"]["req_per_s"] == 5.0 and progress["plan_eta_hours"] > 0
    # Seconds into the run, its window is not stable yet: the ETA is the lifetime rate's, and says so.
    assert progress["eta_settling"] and progress["eta_basis"] == "lifetime" and progress["eta_hours"] > 0
    # 2. MTP: EAGLE on every server, accept length measured on our requests within the simulator's range
    assert set(mtp["speculative_algorithm"].values()) == {"EAGLE"} and mtp["mtp_on"]
    assert 1.0 < mtp["accept_length_window"] <= 4.0
    # 3. concurrency: the dispatcher's window over the servers' cap of 2, requests running there
    servers = status["concurrency"]["servers"].values()
    for server in servers:
        assert server["effective_cap"] == 2 and server["client_window"] >= 2
        assert server["running"] is not None and server["limited_by"]
    assert sum(s["in_flight"] for s in servers) > 0
    # 4. storage: conversations are published, completions not yet
    assert storage["shards_total"] == NUM_SHARDS and storage["shards_published"] == 0 and storage["failed_uploads"] == 0
    # 5. coverage: every input row accounted for
    assert coverage["input_rows"] == coverage["normalized"] + coverage["quarantined"] and coverage["quarantined"] > 0
    # 6. multi-turn: the policy and what it implies
    assert multi_turn["policy"] == "all_turns" and multi_turn["multi_turn_conversations"] > 0
    assert multi_turn["generated_turns_planned"] > multi_turn["conversations"]
    assert multi_turn["generated_turns_done"] == progress["events_done"]


def test_mtp_switched_off_mid_shard_raises_the_mtp_alert_within_one_refresh(pipeline, sim_fleet):
    """The fault an operator must hear about: the servers stop accepting drafts while a shard runs. The next
    refresh the sensor asks for, the report's `operator_alerts` check warns, naming the accept length."""
    store, env = pipeline
    # ~1 answer/s per running request, every answer one length: the count of answers below outweighs the start only
    # if each weighs the same in the accept length's window. The quality watch would hold such a fleet on
    # loss_sum_concentration (what it is for): this run, about MTP, is not watched.
    one_length = {**SLOW_FLEET, "output_len": "fixed:64", "decode_step_s": 0.05}
    fleet = sim_fleet(2, **slow_until_cleared(one_length))
    resources = {
        "store": DatasetStore(root=store.uri, work_dir=env["DFLASH_WORK_DIR"], s3=S3Resource()),
        "fleet": SGLangFleet(endpoints=fleet.urls),
        "generation": GenerationConfig(),
    }
    run = materialize_shard(env, 3, fleet.urls, config={"heartbeat_interval_s": 0.5, "quality_watch": False})
    try:
        wait_until(
            lambda: heartbeat(store, 3).get("done_events", 0) >= 2, timeout_s=120, interval_s=0.1, what="2 events done"
        )
        before = collect_status(store, fleet.urls)
        assert before.mtp.accept_length_window > 2.0 and not [a for a in before.alerts if a.kind == "mtp"]
        at_fault = heartbeat(store, 3)["done_events"]
        for index in range(2):
            fleet.set_faults(index, mtp_off=True)
        # Answers after the fault (accept length 1) at least as many as those before it and in flight (2 per
        # server) at the fault: the heartbeat's window then averages below 2 for the simulator's ~2.8.
        enough = 2 * at_fault + 8
        assert enough < heartbeat(store, 3)["total_events"], "the shard is too small to outweigh the start"
        wait_until(
            lambda: heartbeat(store, 3).get("done_events", 0) >= enough,
            timeout_s=120,
            interval_s=0.1,
            what="answers generated with MTP off",
        )
        for index in range(2):  # hold the run mid-shard while the report is refreshed, servers healthy
            fleet.set_faults(index, slow=1e6)
        with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
            with dg.build_sensor_context(instance=instance, resources=resources) as context:
                tick = run_report_refresh(context)
            assert len(tick.run_requests) == 1  # a shard runs: the sensor asks for a refresh
            refresh = tick.run_requests[0]  # the run it asks for: its config and tags
            result = dg.materialize(
                [run_report], resources=resources, instance=instance, run_config=refresh.run_config, tags=refresh.tags
            )
    finally:
        for index in range(2):
            fleet.clear_faults(index)
        finished(run)
    alert = evaluations_by_check(result, "run_report")["operator_alerts"]
    assert not alert.passed and alert.severity == dg.AssetCheckSeverity.WARN
    assert "[mtp] accept length" in alert.description and "below 2.0" in alert.description
    figures = result.asset_materializations_for_node("run_report")[0].metadata
    assert figures["accept_length"].value < 2.0 and figures["alerts"].value >= 1
    alerts = [record.data for record in figures["Alerts"].records]  # the table the asset page shows in place
    assert any(row["alert"] == "mtp" and row["what needs the operator"].startswith("accept length") for row in alerts)


def test_two_shard_runs_share_one_fleet(pipeline, sim_fleet):
    store, env = pipeline
    fleet = sim_fleet(2, output_len="uniform:32:96", decode_step_s=0.03, max_running_requests=4)
    for index in range(2):
        fleet.reset_occupancy(index)
    runs = {shard: materialize_shard(env, shard, fleet.urls) for shard in (0, 3)}
    for run in runs.values():
        finished(run)
    owner = {
        input_hash(ids): shard
        for shard in runs
        for batch in iter_completion_batches(store, shard, ["prompt_ids"])
        for ids in batch.column("prompt_ids").to_pylist()
    }
    arrivals: dict[int, list[float]] = {shard: [] for shard in runs}
    for entry in all_requests(fleet):
        if entry["input_hash"] in owner:  # not a health canary
            arrivals[owner[entry["input_hash"]]].append(entry["received_at"])
    assert max(min(times) for times in arrivals.values()) < min(max(times) for times in arrivals.values()), (
        "the two runs did not overlap on the fleet"
    )
    # The runs share one window per server (cap 4 x oversubscription 1.25 = 5) through the node's ledger:
    # together they never queued more at a server than one run would, but for one: the one-token probe of the
    # served model a run sends before its first request (outside every window, like SGLang's own /health).
    for index in range(2):
        peaks = fleet.state(index)["peaks"]
        assert peaks["running"] <= 4 and peaks["running"] + peaks["queued"] <= 5 + 1, peaks
    served = {entry["input_hash"] for entry in all_requests(fleet)}
    for shard in runs:
        assert shard_coverage(store, shard).exact
        prompts = {
            input_hash(ids)
            for batch in iter_completion_batches(store, shard, ["prompt_ids"])
            for ids in batch.column("prompt_ids").to_pylist()
        }
        assert prompts <= served  # both shards' requests went to the shared fleet


def test_the_same_shard_started_twice_at_once_runs_once(pipeline, sim_fleet):
    store, env = pipeline
    fleet = sim_fleet(2, **slow_until_cleared(SLOW_FLEET))
    runs = [materialize_shard(env, 2, fleet.urls) for _ in range(2)]
    wait_until(lambda: any(run.poll() is not None for run in runs), timeout_s=120, interval_s=0.1, what="a refusal")
    refused = next(run for run in runs if run.poll() is not None)
    working = next(run for run in runs if run is not refused)
    assert working.poll() is None, "the refusal came only after the other run had finished"
    for index in range(2):  # the refusal is in: the rest of the shard may run at full speed
        fleet.clear_faults(index)
    refusal, _ = refused.communicate(timeout=60)
    assert refused.returncode != 0
    holder = heartbeat(store, 2)["run_id"]
    assert "LeaseHeld" in refusal and f"run {holder}" in refusal and "is held by" in refusal, refusal[-3000:]
    finished(working)

    planned = sum(c.num_turns for c in read_conversations(store, 2))
    sent = [entry["input_hash"] for entry in all_requests(fleet)]
    assert len(sent) == len(set(sent)) == planned  # every prompt generated once
    coverage = shard_coverage(store, 2)
    assert coverage.exact and coverage.expected == planned
    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        materialized = instance.fetch_materializations(dg.AssetKey("completions"), limit=10).records
        assert [record.partition_key for record in materialized] == ["shard-00002"]  # published once


def backfill_run(env: dict, shard: int, backfill_id: str, fleet_urls: list[str]) -> subprocess.Popen:
    """One run of a backfill of `shard_job`, as the daemon launches it: tagged with its partition and backfill."""
    tags = {"dagster/partition": f"shard-{shard:05d}", "dagster/backfill": backfill_id}
    config = Path(env["DFLASH_WORK_DIR"]).with_name("heartbeat_config.json")  # JSON is YAML, which `-c` reads
    config.write_text(json.dumps({"ops": {"completions": {"config": {"heartbeat_interval_s": 0.5}}}}))
    command = [DAGSTER, "job", "execute", "-m", DEFS_MODULE, "-j", "shard_job", "--tags", json.dumps(tags)]
    return subprocess.Popen(
        [*command, "-c", str(config)],
        env={**env, "DFLASH_SGLANG_ENDPOINTS": ",".join(fleet_urls)} if fleet_urls else env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def progress_text(result: dg.ExecuteInProcessResult) -> str:
    """The page's progress answer, as the asset page shows it."""
    return result.asset_materializations_for_node("run_report")[0].metadata["1. Progress vs plan"].value


def test_the_page_is_refreshed_at_the_first_tick_after_the_last_run_of_a_backfill_ends(pipeline, sim_fleet):
    """A backfill of two shards: one run fails at once (no fleet), the other generates. The page refreshed while the
    second runs says it runs; once it ends, with no heartbeat alive any more, the sensor's next tick asks for a
    refresh (it used to wait for a heartbeat and leave the page saying "shards running: 1 (0)"), and that refresh's
    page says none runs, counted after the run's end."""
    store, env = pipeline
    # Slow enough to refresh the page mid-shard; answers of varied lengths, so the shard passes its training gates.
    fleet = sim_fleet(2, **slow_until_cleared({**SLOW_FLEET, "output_len": FAST_ANSWERS["output_len"]}))
    resources = {
        "store": DatasetStore(root=store.uri, work_dir=env["DFLASH_WORK_DIR"], s3=S3Resource()),
        "fleet": SGLangFleet(endpoints=fleet.urls),
        "generation": GenerationConfig(),
    }
    failing = backfill_run(env, 1, "backfill-1", fleet_urls=[])
    generating = backfill_run(env, 0, "backfill-1", fleet.urls)
    output, _ = failing.communicate(timeout=300)
    assert failing.returncode != 0 and "No SGLang endpoints configured" in output, output[-3000:]

    def tick(instance: dg.DagsterInstance, cursor: str | None) -> dg.SensorResult:
        with dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor) as context:
            return run_report_refresh(context)

    def refresh(instance: dg.DagsterInstance, request: dg.RunRequest) -> dg.ExecuteInProcessResult:
        return dg.materialize(
            [run_report], resources=resources, instance=instance, run_config=request.run_config, tags=request.tags
        )

    with dg.DagsterInstance.from_config(env["DAGSTER_HOME"]) as instance:
        try:
            try:
                wait_until(
                    lambda: heartbeat(store, 0).get("done_events", 0) >= 2,
                    timeout_s=300,
                    interval_s=0.1,
                    what="2 events done",
                )
            except AssertionError as exc:
                os.killpg(generating.pid, signal.SIGKILL)
                exc.add_note(generating.communicate()[0][-4000:])
                raise
            for index in range(2):  # hold the run mid-shard while the page is refreshed, servers healthy
                fleet.set_faults(index, slow=1e6)
            mid = tick(instance, None)
            (request,) = mid.run_requests
            assert "a run ended" in request.tags["dflash/refresh_reason"]  # the failed run
            assert "shards running: 1 (0)" in progress_text(refresh(instance, request))
        finally:
            for index in range(2):
                fleet.clear_faults(index)
        finished(generating)
        runs = instance.get_run_records(dg.RunsFilter(tags={"dagster/backfill": "backfill-1"}))
        last_run = max(runs, key=lambda record: record.end_time)  # the generating one, ended after the failed one
        assert len(runs) == 2 and last_run.dagster_run.tags["dagster/partition"] == "shard-00000"
        assert last_run.dagster_run.status == dg.DagsterRunStatus.SUCCESS
        assert last_run.dagster_run.tags["dflash/purpose"] == "shard"  # what the runs list shows of shard_job's runs

        after = tick(instance, mid.cursor)  # the first tick after the backfill's last run ended
        (request,) = after.run_requests
        assert request.run_config["ops"]["run_report"]["config"]["recompute_coverage"]  # at rest: recounted by id
        page = refresh(instance, request)
        assert "shards running: none" in progress_text(page)
        as_of = page.asset_materializations_for_node("run_report")[0].metadata["as_of"].value
        assert as_of > last_run.end_time
        # The refresh's own end asks for nothing more.
        assert not tick(instance, after.cursor).run_requests
