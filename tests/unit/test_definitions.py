"""The Dagster definitions: what loads, and the shape the pipeline promises (README, ARCHITECTURE, OPERATIONS §4).

The expected assets, groups and checks are written out (tests/support/dagster_helpers.py) on purpose: a check that
is renamed, dropped or stops blocking fails this test instead of silently weakening a gate.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import dagster as dg
from dagster._core.op_concurrency_limits_counter import GlobalOpConcurrencyLimitsCounter
from dagster._core.storage.dagster_run import RunOpConcurrency

from dagster_project import settings
from dagster_project.definitions import defs
from dagster_project.partitions import shard_partitions, unknown_partition_message
from dagster_project.store.layout import partition_keys
from tests.support.dagster_helpers import (
    EXPECTED_ASSETS,
    EXPECTED_CHECKS,
    SHARD_ASSETS,
    dagster_home,
)
from tests.support.heartbeats import heartbeat

# Every process that loads the definitions (each run, the daemon, the webserver) pays for what they import. These
# are imported inside the steps that use them; the tokenizer's transformers by the resource, at run setup. (Not
# pandas: pyarrow imports it when a run builds its first table, so deferring it would only move it into the
# `completions` step, inside its pool slot.)
NOT_IMPORTED_WITH_THE_DEFINITIONS = (
    "great_expectations",
    "duckdb",
    "pyarrow.dataset",
    "matplotlib",
    "transformers",
)


def test_definitions_load_and_validate():
    dg.Definitions.validate_loadable(defs)
    assert {key.to_user_string() for key in defs.resolve_all_asset_keys()} == set(EXPECTED_ASSETS)
    assert defs.resolve_implicit_global_asset_job_def() is not None
    assert set(defs.resources) == {"s3", "store", "tokenizer", "generation", "fleet", "eval_sets"}


def test_loading_the_definitions_imports_no_library_that_only_some_steps_need():
    probe = "import sys, dagster_project.definitions; print(*sorted(set(sys.argv[1:]) & set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe, *NOT_IMPORTED_WITH_THE_DEFINITIONS],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.split() == []


def test_assets_groups_dependencies_and_shard_partitions():
    graph = defs.resolve_asset_graph()
    expected_keys = partition_keys(settings.num_shards())
    assert expected_keys[:2] == ["shard-00000", "shard-00001"]
    for name, (group, partitioned, upstream) in EXPECTED_ASSETS.items():
        node = graph.get(dg.AssetKey(name))
        assert node.group_name == group, name
        assert {key.to_user_string() for key in node.parent_keys} == upstream, name
        if partitioned:
            assert node.partitions_def == shard_partitions, name
            assert node.partitions_def.get_partition_keys() == expected_keys, name
            # One policy on every shard asset: a backfill of the shard job makes one run per
            # DFLASH_SHARDS_PER_RUN shards (the job's policy is its assets' smallest).
            assert node.backfill_policy == dg.BackfillPolicy.multi_run(settings.shards_per_run()), name
        else:
            assert node.partitions_def is None, name
    # The pool that caps how many runs use the fleet at once (OPERATIONS §4.3): the shards' completions, their
    # pilot, and the tuning sweep, which would disturb them.
    pools = {name: graph.get(dg.AssetKey(name)).pools for name in EXPECTED_ASSETS}
    assert {name: pool for name, pool in pools.items() if pool} == {
        "pilot": {"sglang_fleet"},
        "completions": {"sglang_fleet"},
        "fleet_tuning": {"sglang_fleet"},
    }


def test_checks_per_asset_and_blocking_ones_block():
    graph = defs.resolve_asset_graph()
    declared: dict[str, dict[str, bool]] = {}
    for key in graph.asset_check_keys:
        spec = graph.get_check_spec(key)
        declared.setdefault(key.asset_key.to_user_string(), {})[key.name] = spec.blocking
        asset_partitions = graph.get(key.asset_key).partitions_def
        # Checks of a shard asset are partitioned like it: their results are per shard.
        assert spec.partitions_def == asset_partitions, key
    assert declared == EXPECTED_CHECKS


def test_shard_job_generates_assembles_and_exports_one_shard_with_its_gates():
    job = defs.resolve_job_def("shard_job")
    assert job.partitions_def == shard_partitions
    assert {key.to_user_string() for key in job.asset_layer.selected_asset_keys} == set(SHARD_ASSETS)
    job_checks = {(k.asset_key.to_user_string(), k.name) for k in job.asset_layer.asset_graph.asset_check_keys}
    assert job_checks == {(asset, name) for asset in ("completions", "training_set") for name in EXPECTED_CHECKS[asset]}


def test_project_dagster_yaml_loads_as_an_instance(tmp_path):
    """The instance `make dev` and the demo use: the sglang_fleet default, run retries, monitoring."""
    instance = dg.DagsterInstance.from_config(str(dagster_home(tmp_path / "home")))
    try:
        pools = instance.get_concurrency_config().pool_config
        assert pools.default_pool_limit == 4 and pools.pool_granularity.value == "op"
        # The queue launches runs ahead of free pool slots, so a run's process start and tokenizer load overlap
        # the generation of the runs holding the slots.
        runs = instance.get_concurrency_config().run_queue_config
        assert runs.max_concurrent_runs == pools.default_pool_limit + runs.op_concurrency_slot_buffer
        assert runs.op_concurrency_slot_buffer == pools.default_pool_limit
        assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
        assert instance.run_monitoring_enabled
    finally:
        instance.dispose()


def test_the_queue_launches_shard_runs_ahead_of_a_full_pool_up_to_its_buffer(tmp_path):
    """The daemon's decision, with dagster.yaml's settings: every `sglang_fleet` slot held, queued shard runs are
    still launched (to start their process and wait for a slot), as many as the buffer and no more. Dagster's
    default buffer (0) would hold them all until a slot is free."""
    instance = dg.DagsterInstance.from_config(str(dagster_home(tmp_path / "home")))
    try:
        config = instance.get_concurrency_config()
        limit, buffer = config.pool_config.default_pool_limit, config.run_queue_config.op_concurrency_slot_buffer
        (pool,) = defs.resolve_asset_graph().get(dg.AssetKey("completions")).pools
        storage = instance.event_log_storage
        storage.initialize_concurrency_limit_to_default(pool)
        for holder in range(limit):
            assert storage.claim_concurrency_slot(pool, f"generating-{holder}", "completions").is_claimed
        shard_run = RunOpConcurrency(root_key_counts={pool: 1}, has_unconstrained_root_nodes=False, all_pools={pool})
        queued = [
            dg.DagsterRun(job_name="__ASSET_JOB", run_id=f"queued-{i}", run_op_concurrency=shard_run)
            for i in range(buffer + 2)
        ]
        counter = GlobalOpConcurrencyLimitsCounter(
            instance,
            queued,
            [],
            concurrency_keys=storage.get_concurrency_keys(),
            pool_limits=storage.get_pool_limits(),
            slot_count_offset=buffer,
            pool_granularity=config.pool_config.pool_granularity,
        )
        launched = []
        for run in queued:
            if not counter.is_blocked(run):
                counter.update_counters_with_launched_item(run)
                launched.append(run.run_id)
        assert buffer > 0 and launched == [f"queued-{i}" for i in range(buffer)]
    finally:
        instance.dispose()


def test_a_shard_regenerated_alone_is_assembled_and_exported_by_the_automation_sensor():
    graph = defs.resolve_asset_graph()
    for name in ("training_set", "specforge_export"):
        condition = graph.get(dg.AssetKey(name)).automation_condition
        assert condition is not None and "all_deps_blocking_checks_passed" in str(condition), name
    assert graph.get(dg.AssetKey("completions")).automation_condition is None  # generation costs GPU: never automatic
    sensor = defs.resolve_sensor_def("shard_followups")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING


def test_the_report_refresh_follows_running_shards_and_rests_when_nothing_runs_or_ended(tmp_path):
    from dagster_aws.s3 import S3Resource

    from dagster_project.processes import this_process
    from dagster_project.resources import DatasetStore
    from dagster_project.store.dataclass_json import to_json
    from dagster_project.store.layout import progress_key
    from dagster_project.store.storage import LocalStore

    sensor = defs.resolve_sensor_def("run_report_refresh")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING and sensor.job_name == "refresh_run_report"
    store = LocalStore(tmp_path / "store")
    resources = {"store": DatasetStore(root=store.uri, work_dir=str(tmp_path / "work"), s3=S3Resource())}
    with dg.instance_for_test() as instance:
        with dg.build_sensor_context(instance=instance, resources=resources) as context:
            idle = sensor(context)
        assert not idle.run_requests and "no shard run" in idle.skip_reason.skip_message
        assert idle.cursor  # kept from tick to tick: what the refreshes asked for so far covered

        host, pid, started = this_process()
        running = heartbeat(3, host=host, pid=pid, process_start=started, heartbeat_interval_s=5.0)
        store.put_bytes(progress_key(3), to_json(running))
        with dg.build_sensor_context(instance=instance, resources=resources, cursor=idle.cursor) as context:
            busy = sensor(context)
        assert (
            len(busy.run_requests) == 1 and busy.run_requests[0].tags["dflash/refresh_reason"] == "shards [3] started"
        )
        # While shards run, the refreshes leave the recount of coverage by id (every shard's ids) for later.
        assert busy.run_requests[0].run_config == {"ops": {"run_report": {"config": {"recompute_coverage": False}}}}
        with dg.build_sensor_context(instance=instance, resources=resources, cursor=busy.cursor) as context:
            assert not sensor(context).run_requests  # the next tick: not yet due again


def test_dagster_asking_for_a_shard_there_is_not_gets_one_line_naming_the_range() -> None:
    keys = partition_keys(4)
    message = unknown_partition_message(
        ["/venv/bin/dagster", "asset", "materialize", "--select", "completions", "--partition", "shard-99999"],
        keys,
    )
    assert message is not None and "'shard-99999' is not a shard partition" in message
    assert "4 shards, shard-00000 … shard-00003 (DFLASH_NUM_SHARDS=4 when they loaded)" in message
    ranged = ["dagster", "asset", "materialize", "--partition-range=shard-00001...shard-00009"]
    assert "'shard-00009' is not a shard partition" in unknown_partition_message(ranged, keys)
    # A shard there is, another command, another program: nothing to say.
    assert unknown_partition_message(["dagster", "asset", "materialize", "--partition", "shard-00003"], keys) is None
    assert unknown_partition_message(["dagster", "dev", "--partition", "shard-99999"], keys) is None
    assert unknown_partition_message(["pytest", "asset", "materialize", "--partition", "shard-99999"], keys) is None
