"""Losing a node loses nothing: one backfill over every shard, across two "nodes" of this machine, survives one
node's loss mid-shard.

The nodes: separate work directories, simulators on 127.0.0.2 and 127.0.0.3 registered in the store's fleet
registry (what `dflash fleet up` on each writes), one S3 store on a moto server, one Dagster instance on a real
PostgreSQL server (deploy/dagster-postgres.yaml). `dagster dev` (webserver + daemon) runs one backfill of
`completions` over all shards, launched once through GraphQL.

How runs are placed on nodes: the instance's run launcher is tests/support/node_launcher.py, which starts each
run as `dagster api execute_run` (the K8s launcher's pod command) in a process session of its own, with the
chosen node's environment (its work directory), on the node with the fewest live runs, and tags the run with
its node and pid. A node marked lost gets no more runs, and run monitoring reports its runs' workers dead.

Mid-shard, once node A has checkpointed part of its shard to the store as journal segments: every server is
frozen, what each received is noted, node A is marked lost, every run process of node A is SIGKILLed and its
servers are killed. The daemon's run monitoring fails the dead run and run retries launch it again, placed on
node B, which restores the journal from the segments. The backfill finishes on node B with every planned event
exactly once by id, no checkpointed event requested again, and the requests sent again at most what was in
flight at the kill plus what A journaled after its last checkpoint; the figures are reported
(`record_property`, and printed). Every run, the retry too, went through the run queue (enqueued, then launched
by the daemon), as read back from Postgres.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import dagster as dg
import psutil
import yaml

from dagster_project.generation.fleet_registry import fleet_servers, register_node
from dagster_project.generation.heartbeat import journal_segments_prefix, restore_journal
from dagster_project.generation.shards import iter_completion_batches, shard_coverage
from dagster_project.generation.stage import journal_path
from dagster_project.generation_settings import GenerationSettings
from dagster_project.sglang.protocol import input_hash
from dagster_project.store.storage import RetryPolicy, S3Store, bounded_client
from tests.support.dagster_helpers import (
    BACKFILL_RUNS,
    BIN_DIR,
    FINISHED,
    LAUNCH_BACKFILL,
    DagsterDev,
    pipeline_env,
    publish_conversations,
    shard_of_run,
)
from tests.support.journal_files import journal_records
from tests.support.node_launcher import NODE_TAG, PID_TAG
from tests.support.paths import PROJECT_ROOT
from tests.support.pilots import pass_pilot_of_env
from tests.support.sglang_fixtures import wait_until

NUM_SHARDS = 2
SHARDS = [f"shard-{i:05d}" for i in range(NUM_SHARDS)]
FINGERPRINT = GenerationSettings().fingerprint()
# ~0.5 s per answer, two running per server: a shard takes several seconds of generation, so the kill lands
# mid-shard, and the in-flight window stays small.
SLOW = {"output_len": "uniform:28:68", "decode_step_s": 0.01, "max_running_requests": 2}
# Report often, checkpoint every second: the window of journaled-but-not-checkpointed events stays small.
FAST_REPORTS = {"ops": {"completions": {"config": {"heartbeat_interval_s": 0.5, "checkpoint_interval_s": 1.0}}}}
NODES = {"node-a": "127.0.0.2", "node-b": "127.0.0.3"}
PARENT_RUN_TAG = "dagster/parent_run_id"


def _instance_yaml(tmp_path, work_dirs: dict) -> str:
    """deploy/dagster-postgres.yaml, with runs placed on the nodes and run monitoring polling every second."""
    instance = yaml.safe_load((PROJECT_ROOT / "deploy" / "dagster-postgres.yaml").read_text())
    instance["run_launcher"] = {
        "module": "tests.support.node_launcher",
        "class": "NodeRunLauncher",
        "config": {
            "state_dir": str(tmp_path / "launcher"),
            "nodes": {node: {"DFLASH_WORK_DIR": str(work_dir)} for node, work_dir in work_dirs.items()},
        },
    }
    instance["run_monitoring"]["poll_interval_seconds"] = 1
    return yaml.safe_dump(instance)


def _generating_on_node_a(store: S3Store, work_dir) -> tuple[int, Path] | None:
    """A shard that node A has journaled and checkpointed part of, and its journal there."""
    for shard in range(NUM_SHARDS):
        journal = journal_path(work_dir, shard, FINGERPRINT)
        segments = list(store.list(journal_segments_prefix(shard, FINGERPRINT)))
        if journal.exists() and len(journal_records(journal)) >= 10 and len(segments) >= 2:
            return shard, journal
    return None


def test_a_backfill_survives_a_node_lost_mid_shard_and_resends_at_most_its_in_flight_and_one_checkpoint(
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
    work_dirs = {node: tmp_path / node / "work" for node in NODES}
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(_instance_yaml(tmp_path, work_dirs))
    env = pipeline_env(
        home=home,
        store=store_uri,
        work_dir=tmp_path / "head" / "work",
        num_shards=NUM_SHARDS,
        # The daemon imports the launcher from the checkout's tests/ package; a node runs `dagster` from its PATH.
        extra={
            **connection,
            **s3_server.env,
            "PYTHONPATH": str(PROJECT_ROOT),
            "PATH": f"{BIN_DIR}{os.pathsep}{os.environ['PATH']}",
            "DFLASH_SHARDS_PER_RUN": "1",  # a run per shard: the lost node's run is the lost shard's
        },
    )
    publish_conversations(home, store_uri, env)
    pass_pilot_of_env(home, env)  # on both nodes' servers; what they received of it is not the backfill's
    after_pilot = {node: [len(fleets[node].requests(index)) for index in range(2)] for node in NODES}

    with DagsterDev.running(env, tmp_path) as dev:
        params = {
            "partitionNames": SHARDS,
            "assetSelection": [{"path": ["completions"]}],
            "title": "all shards",
            "runConfigData": FAST_REPORTS,
        }
        launched = dev.query(LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill_id = launched["backfillId"]

        def backfill_runs() -> list[dict]:
            return dev.query(BACKFILL_RUNS, {"backfill": backfill_id})["runsOrError"]["results"]

        def generating_on_node_a() -> tuple[int, Path] | None:
            failed = [run for run in backfill_runs() if run["status"] == "FAILURE"]
            assert not failed, f"a run failed before the node was lost: {failed}"
            return _generating_on_node_a(store, work_dirs["node-a"])

        lost_shard, journal_a = wait_until(
            generating_on_node_a,
            timeout_s=300,
            interval_s=0.1,
            what="node A to journal and checkpoint part of a shard",
        )
        # Node A is lost: freeze every server so nothing more completes, note what each received, mark the node
        # lost, SIGKILL every run process on it, kill its servers.
        for fleet in fleets.values():
            for index in range(2):
                fleet.set_faults(index, hang=True)
        sent_before = {
            entry["input_hash"]
            for node, fleet in fleets.items()
            for index in range(2)
            for entry in fleet.requests(index, since=after_pilot[node][index])
        }
        logged_before = [len(fleets["node-b"].requests(i)) for i in range(2)]
        (tmp_path / "launcher" / "lost").mkdir(parents=True)
        (tmp_path / "launcher" / "lost" / "node-a").touch()
        tags = {run["runId"]: {t["key"]: t["value"] for t in run["tags"]} for run in backfill_runs()}
        on_a = {run_id: int(t[PID_TAG]) for run_id, t in tags.items() if t.get(NODE_TAG) == "node-a"}
        family = [p for pid in on_a.values() for p in (psutil.Process(pid), *psutil.Process(pid).children(True))]
        for pid in on_a.values():
            os.killpg(pid, signal.SIGKILL)
        wait_until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in family), what="death")
        for index in range(2):
            fleets["node-a"].kill(index)
        journaled_a = journal_records(journal_a)
        checkpointed_copy = tmp_path / "checkpointed.jsonl"
        restore_journal(store, lost_shard, FINGERPRINT, checkpointed_copy)
        checkpointed = journal_records(checkpointed_copy)
        for index in range(2):
            fleets["node-b"].clear_faults(index)

        def finished() -> list[dict] | None:
            runs = backfill_runs()
            done = len(runs) > NUM_SHARDS and all(run["status"] in FINISHED for run in runs)
            return runs if done else None

        runs = wait_until(finished, timeout_s=300, interval_s=1.0, what="the backfill and the retry to finish")

    tags = {run["runId"]: {t["key"]: t["value"] for t in run["tags"]} for run in runs}
    statuses = {run["runId"]: run["status"] for run in runs}
    killed = [run_id for run_id in on_a if shard_of_run(tags[run_id]) == SHARDS[lost_shard]]
    assert len(killed) == 1 and statuses[killed[0]] == "FAILURE", (on_a, statuses)
    retries = [run_id for run_id, t in tags.items() if t.get(PARENT_RUN_TAG) in on_a]
    assert retries and all(tags[r][NODE_TAG] == "node-b" and statuses[r] == "SUCCESS" for r in retries), tags
    succeeded = [run_id for run_id, status in statuses.items() if status == "SUCCESS"]
    assert sorted(shard_of_run(tags[run_id]) for run_id in succeeded) == SHARDS, statuses

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert type(instance.run_storage).__name__ == "PooledPostgresRunStorage"
        assert set(instance.get_materialized_partitions(dg.AssetKey("completions"))) == set(SHARDS)
        # The run queue: every run of the backfill, the retry too, was enqueued, then launched by the queued run
        # coordinator's daemon.
        for run_id in tags:
            kinds = [event.dagster_event_type for event in instance.all_logs(run_id) if event.is_dagster_event]
            enqueued, starting = dg.DagsterEventType.RUN_ENQUEUED, dg.DagsterEventType.RUN_STARTING
            assert enqueued in kinds and starting in kinds, (run_id, kinds)
            assert kinds.index(enqueued) < kinds.index(starting), (run_id, kinds)
        retry = next(r for r in retries if shard_of_run(tags[r]) == SHARDS[lost_shard])
        retry_log = "\n".join(event.message or "" for event in instance.all_logs(retry))
        assert "journal restored from the store's checkpoint" in retry_log

    # What node B sent again of the lost shard: its requests after the kill that some server had received before.
    lost_shard_hashes = {
        input_hash(row["prompt_ids"])
        for batch in iter_completion_batches(store, lost_shard, ["prompt_ids"])
        for row in batch.to_pylist()
    }
    sent_after = {
        entry["input_hash"]
        for index in range(2)
        for entry in fleets["node-b"].requests(index, since=logged_before[index])
    }
    checkpointed_hashes = {input_hash(record["prompt_ids"]) for record in checkpointed.values()}
    journaled_hashes = {input_hash(record["prompt_ids"]) for record in journaled_a.values()}
    in_flight = (sent_before & lost_shard_hashes) - journaled_hashes
    journaled_not_checkpointed = journaled_hashes - checkpointed_hashes
    resent = sent_after & sent_before & lost_shard_hashes
    figures = {
        "checkpointed_events": len(checkpointed),
        "journaled_events_on_lost_node": len(journaled_a),
        "in_flight_at_kill": len(in_flight),
        "journaled_after_last_checkpoint": len(journaled_not_checkpointed),
        "resent_requests": len(resent),
    }
    for name, value in figures.items():
        record_property(name, value)
    print(f"node loss: {figures}")

    assert checkpointed and set(checkpointed) <= set(journaled_a)
    assert len(journaled_a) < shard_coverage(store, lost_shard).expected, "the kill did not land mid-shard"
    assert not resent & checkpointed_hashes, "an event in the store's checkpoint was requested again"
    assert resent <= in_flight | journaled_not_checkpointed
    for shard in range(NUM_SHARDS):
        coverage = shard_coverage(store, shard)
        assert coverage.exact and coverage.expected > 0, (shard, coverage)
