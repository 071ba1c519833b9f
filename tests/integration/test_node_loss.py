"""Losing a node loses nothing: two "nodes" on this machine (separate work directories, simulators on 127.0.0.2
and 127.0.0.3, one S3 store on a moto server, one Postgres-backed Dagster instance), both registered in the
store's fleet registry.

Node A generates shard 0 with every registered server; its journal checkpoints go to the store as segments.
Mid-shard every server is frozen, node A's run is SIGKILLed and its servers are killed: the node is gone, and
its work directory with it as far as anyone else can tell. Node B then materializes shard 0 from its own work
directory: it restores the journal from the segments, leaves A's dead servers aside, and finishes on its own
servers; then it runs shard 1. Every planned event is published exactly once, no checkpointed event is
requested again, and the requests sent again are at most what was in flight at the kill plus what A journaled
after its last checkpoint; the figures are reported (`record_property`, and printed).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import dagster as dg
import psutil

from dagster_project.generation.fleet_registry import fleet_servers, register_node
from dagster_project.generation.heartbeat import journal_segments_prefix, restore_journal
from dagster_project.generation.shards import shard_coverage
from dagster_project.generation.stage import journal_path
from dagster_project.generation_settings import GenerationSettings
from dagster_project.sglang.protocol import input_hash
from dagster_project.store.storage import RetryPolicy, S3Store, bounded_client
from tests.support.dagster_helpers import DAGSTER, DEFS_MODULE, materialize, pipeline_env
from tests.support.journal_files import journal_records
from tests.support.paths import PROJECT_ROOT
from tests.support.sglang_fixtures import wait_until

NUM_SHARDS = 2
FINGERPRINT = GenerationSettings().fingerprint()
# ~1.5 s per answer and one running per server: shard 0 (~130 events) takes most of a minute, so the kill
# lands mid-shard.
SLOW = {"output_len": "fixed:48", "decode_step_s": 0.03, "max_running_requests": 1}
# Report often, checkpoint every 2 s: the window of journaled-but-not-checkpointed events stays small.
FAST_REPORTS = {"ops": {"completions": {"config": {"heartbeat_interval_s": 0.5, "checkpoint_interval_s": 2.0}}}}
NODES = {"node-a": "127.0.0.2", "node-b": "127.0.0.3"}


def _start_shard(env: dict[str, str], shard: int, cwd: Path) -> subprocess.Popen:
    command = [DAGSTER, "asset", "materialize", "-m", DEFS_MODULE, "--select", "completions"]
    command += ["--partition", f"shard-{shard:05d}", "--config-json", json.dumps(FAST_REPORTS)]
    # Its own session: a SIGKILL of the group takes the run and everything it started, as losing the node would.
    return subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )


def test_a_node_lost_mid_shard_costs_at_most_its_in_flight_requests_and_one_checkpoint_interval(
    postgres_server, s3_server, s3_bucket, sim_fleet, tmp_path, record_property, monkeypatch
):
    policy = RetryPolicy(attempts=3, backoff_s=0.05)
    store_uri = f"s3://{s3_bucket}/run"
    store = S3Store(store_uri, bounded_client(policy, endpoint_url=s3_server.endpoint), policy)
    fleets = {node: sim_fleet(2, host=host, **SLOW) for node, host in NODES.items()}
    for node, host in NODES.items():  # what `dflash fleet up` on each node writes
        register_node(store, node, "simulator", fleet_servers(fleets[node].fleet, host, {}))

    connection = {**postgres_server.env, "DAGSTER_PG_PASSWORD": "unused-with-trust-auth"}
    for name, value in connection.items():  # this process reads the instance at the end
        monkeypatch.setenv(name, value)
    envs = {}
    for node in NODES:
        home = tmp_path / node / "dagster_home"
        home.mkdir(parents=True)
        shutil.copyfile(PROJECT_ROOT / "deploy" / "dagster-postgres.yaml", home / "dagster.yaml")
        envs[node] = pipeline_env(
            home=home,
            store=store_uri,
            work_dir=tmp_path / node / "work",
            num_shards=NUM_SHARDS,
            extra={**connection, **s3_server.env},
        )
    a, b = envs["node-a"], envs["node-b"]
    materialize(b, tmp_path, "raw_prompts,conversations", timeout_s=600)

    # Node A generates shard 0 until a few checkpoints are in the store.
    run = _start_shard(a, 0, tmp_path)
    journal_a = journal_path(Path(a["DFLASH_WORK_DIR"]), 0, FINGERPRINT)
    segments_prefix = journal_segments_prefix(0, FINGERPRINT)
    wait_until(
        lambda: len(journal_records(journal_a)) >= 10 and len(list(store.list(segments_prefix))) >= 2,
        timeout_s=240,
        interval_s=0.1,
        what="node A to journal and checkpoint part of shard 0",
    )
    # Node A is lost: freeze every server so nothing more completes, note what each received, kill the run
    # and node A's servers.
    for fleet in fleets.values():
        for index in range(2):
            fleet.set_faults(index, hang=True)
    sent_before = {
        entry["input_hash"]: entry for fleet in fleets.values() for index in range(2) for entry in fleet.requests(index)
    }
    logged_before = {node: [len(fleet.requests(i)) for i in range(2)] for node, fleet in fleets.items()}
    family = [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family), what="death")
    for index in range(2):
        fleets["node-a"].kill(index)
    journaled_a = journal_records(journal_a)
    checkpointed_copy = tmp_path / "checkpointed.jsonl"
    restore_journal(store, 0, FINGERPRINT, checkpointed_copy)
    checkpointed = journal_records(checkpointed_copy)
    for index in range(2):
        fleets["node-b"].clear_faults(index)

    # Node B: shard 0 from the checkpoint segments, on its own servers; then shard 1.
    resumed = materialize(b, tmp_path, "completions", "shard-00000", run_config=FAST_REPORTS)
    assert "journal restored from the store's checkpoint" in resumed.stdout + resumed.stderr
    sent_after = [
        entry for index in range(2) for entry in fleets["node-b"].requests(index, since=logged_before["node-b"][index])
    ]
    materialize(b, tmp_path, "completions", "shard-00001", run_config=FAST_REPORTS)

    checkpointed_hashes = {input_hash(record["prompt_ids"]) for record in checkpointed.values()}
    journaled_hashes = {input_hash(record["prompt_ids"]) for record in journaled_a.values()}
    in_flight = set(sent_before) - journaled_hashes
    journaled_not_checkpointed = journaled_hashes - checkpointed_hashes
    resent = {entry["input_hash"] for entry in sent_after} & set(sent_before)
    figures = {
        "checkpointed_events": len(checkpointed),
        "journaled_events_on_lost_node": len(journaled_a),
        "in_flight_at_kill": len(in_flight),
        "journaled_after_last_checkpoint": len(journaled_not_checkpointed),
        "resent_requests": len(resent),
        "requests_after_kill": len(sent_after),
    }
    for name, value in figures.items():
        record_property(name, value)
    print(f"node loss: {figures}")

    planned = shard_coverage(store, 0).expected
    assert checkpointed and set(checkpointed) <= set(journaled_a)
    assert len(journaled_a) < planned and sent_after, "the kill did not land mid-shard"
    assert not resent & checkpointed_hashes, "an event in the store's checkpoint was requested again"
    assert resent <= in_flight | journaled_not_checkpointed
    assert len(resent) <= len(in_flight) + len(journaled_not_checkpointed)
    for shard in range(NUM_SHARDS):
        coverage = shard_coverage(store, shard)
        assert coverage.exact and coverage.expected > 0, (shard, coverage)
    with dg.DagsterInstance.from_config(b["DAGSTER_HOME"]) as instance:  # both nodes wrote into one Postgres
        materialized = instance.get_materialized_partitions(dg.AssetKey("completions"))
        assert materialized == {"shard-00000", "shard-00001"}
