"""`dagster dev` shows the pipeline, and a backfill over every shard works from the UI with the daemon.

`dagster dev -w workspace.yaml` (webserver, daemon, code server; the repository's workspace.yaml, as `make dev`
runs it, so the location it names is the one loaded) runs as its own process group on a temp DAGSTER_HOME
holding the project's dagster.yaml, with the `sglang_fleet` pool set to 1 through
`dagster instance concurrency set` (OPERATIONS §4.3). Through its GraphQL endpoint — what the UI's pages
and buttons call — the test reads the assets, their checks and the shard partitions, then launches a
partition backfill of `completions,training_set,specforge_export` over all shards (`launchPartitionBackfill`,
the Materialize dialog's "launch backfill"), and waits for the daemon to run it.

It checks: one run per shard (`DFLASH_SHARDS_PER_RUN=1`; the backfill policy tags each with a range of one
shard) and with the backfill's tag; every shard
materialized; every check evaluated on every shard and attributed to it (as the UI's check pages show it);
and the pool: the two shards' `completions` steps never overlap in time.

Kept lean: two shards, short answers, conversations published in-process beforehand.
"""

from __future__ import annotations

import dagster as dg

from tests.support.dagster_helpers import (
    BACKFILL_RUNS,
    DAGSTER,
    EXPECTED_ASSETS,
    EXPECTED_CHECKS,
    FAST_ANSWERS,
    FINISHED,
    LAUNCH_BACKFILL,
    SHARD_ASSETS,
    DagsterDev,
    check_evaluations,
    dagster_home,
    materialized_partitions,
    pipeline_env,
    publish_conversations,
    run_cli,
    shard_of_run,
    step_windows,
)
from tests.support.sglang_fixtures import wait_until

NUM_SHARDS = 2
SHARDS = [f"shard-{i:05d}" for i in range(NUM_SHARDS)]
POOL = "sglang_fleet"

ASSET_NODES = """
{
  assetNodes {
    assetKey { path }
    groupName
    isPartitioned
    partitionKeys
    pools
    assetChecksOrError { __typename ... on AssetChecks { checks { name blocking } } }
  }
}
"""

SHARD_STATUS = """
query Status($keys: [AssetKeyInput!]) {
  assetNodes(assetKeys: $keys) {
    assetKey { path }
    assetPartitionStatuses { ... on DefaultPartitionStatuses { materializedPartitions failedPartitions } }
    assetChecksOrError {
      ... on AssetChecks {
        checks {
          name
          partitionStatuses { ... on AssetCheckDefaultPartitionStatuses { succeededPartitions failedPartitions } }
        }
      }
    }
  }
}
"""


def _key(path: list[str]) -> str:
    return "/".join(path)


def test_dagster_dev_shows_the_pipeline_and_a_backfill_runs_every_shard_under_the_pool(sim_fleet, tmp_path):
    fleet = sim_fleet(2, **FAST_ANSWERS)
    home = dagster_home(tmp_path / "dagster_home")
    store = tmp_path / "store"
    env = pipeline_env(
        home=home,
        store=store,
        work_dir=tmp_path / "work",
        num_shards=NUM_SHARDS,
        endpoints=fleet.urls,
        extra={"DFLASH_SHARDS_PER_RUN": "1"},  # two runs, to see the pool make them take turns
    )
    run_cli([DAGSTER, "instance", "concurrency", "set", POOL, "1"], env=env, cwd=tmp_path)
    publish_conversations(home, store, env)

    with DagsterDev.running(env, tmp_path) as dev:
        # What the asset graph and asset pages show: the assets, their groups, checks, pools and shards.
        nodes = {_key(n["assetKey"]["path"]): n for n in dev.query(ASSET_NODES)["assetNodes"]}
        assert set(nodes) == set(EXPECTED_ASSETS)
        for name, (group, partitioned, _) in EXPECTED_ASSETS.items():
            node = nodes[name]
            assert node["groupName"] == group and node["isPartitioned"] == partitioned, name
            assert node["partitionKeys"] == (SHARDS if partitioned else []), name
            checks = {c["name"]: c["blocking"] for c in node["assetChecksOrError"].get("checks", [])}
            assert checks == EXPECTED_CHECKS.get(name, {}), name
        assert nodes["completions"]["pools"] == [POOL]

        # The Materialize dialog: all partitions of the three shard assets, "launch backfill".
        params = {
            "partitionNames": nodes["completions"]["partitionKeys"],
            "assetSelection": [{"path": [asset]} for asset in SHARD_ASSETS],
            "title": "all shards",
        }
        launched = dev.query(LAUNCH_BACKFILL, {"params": params})["launchPartitionBackfill"]
        assert launched["__typename"] == "LaunchBackfillSuccess", launched
        backfill_id = launched["backfillId"]

        def finished_runs() -> list[dict] | None:
            runs = dev.query(BACKFILL_RUNS, {"backfill": backfill_id})["runsOrError"]["results"]
            done = len(runs) >= NUM_SHARDS and all(run["status"] in FINISHED for run in runs)
            return runs if done else None

        runs = wait_until(finished_runs, timeout_s=300, interval_s=1.0, what="the daemon to run the backfill")
        tags = [{t["key"]: t["value"] for t in run["tags"]} for run in runs]
        assert len(runs) == NUM_SHARDS, tags
        assert [run["status"] for run in runs] == ["SUCCESS"] * NUM_SHARDS, dev.log()[-5000:]
        assert sorted(shard_of_run(t) for t in tags) == SHARDS
        partition_of_run = {run["runId"]: shard_of_run(t) for run, t in zip(runs, tags)}

        # What the asset and check pages show per shard.
        status = dev.query(SHARD_STATUS, {"keys": [{"path": [a]} for a in SHARD_ASSETS]})["assetNodes"]
        for node in status:
            name = _key(node["assetKey"]["path"])
            assert sorted(node["assetPartitionStatuses"]["materializedPartitions"]) == SHARDS, name
            for check in node["assetChecksOrError"].get("checks", []):
                statuses = check["partitionStatuses"]
                assert sorted(statuses["succeededPartitions"]) == SHARDS, (name, check["name"], statuses)

    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert materialized_partitions(instance, SHARD_ASSETS) == {asset: set(SHARDS) for asset in SHARD_ASSETS}
        for asset in ("completions", "training_set"):
            evaluations = check_evaluations(instance, asset)
            assert set(evaluations) == {(name, shard) for name in EXPECTED_CHECKS[asset] for shard in SHARDS}, asset
            for (name, shard), records in evaluations.items():
                assert [partition_of_run[r.run_id] for r in records] == [shard], (asset, name)

        # The pool: one slot, and the shards' completions steps took turns.
        assert instance.event_log_storage.get_concurrency_info(POOL).slot_count == 1
        windows = sorted(step_windows(instance, run_id, "completions") for run_id in partition_of_run)
        for (_, first_end), (second_start, _) in zip(windows, windows[1:]):
            assert second_start >= first_end, f"completions steps overlapped under a pool of 1: {windows}"
    finally:
        instance.dispose()
