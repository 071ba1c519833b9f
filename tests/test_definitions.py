"""The Dagster definitions: what loads, and the shape the pipeline promises (README, ARCHITECTURE, OPERATIONS §4).

The expected assets, groups and checks are written out (tests/dagster_helpers.py) on purpose: a check that is
renamed, dropped or stops blocking fails this test instead of silently weakening a gate.
"""

from __future__ import annotations

import json
import subprocess
import sys

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project import settings
from dagster_project.assets.completions import completions
from dagster_project.assets.training_set import training_set
from dagster_project.definitions import defs
from dagster_project.partitions import NUM_SHARDS, shard_partitions
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.store.layout import partition_keys
from tests.dagster_helpers import (
    DAGSTER,
    DEFS_MODULE,
    EXPECTED_ASSETS,
    EXPECTED_CHECKS,
    SHARD_ASSETS,
    dagster_home,
    pipeline_env,
)
from tests.ingest_helpers import run_stages


def test_definitions_load_and_validate():
    dg.Definitions.validate_loadable(defs)
    assert {key.to_user_string() for key in defs.resolve_all_asset_keys()} == set(EXPECTED_ASSETS)
    assert defs.resolve_implicit_global_asset_job_def() is not None
    assert set(defs.resources) == {"s3", "store", "tokenizer", "generation", "fleet"}


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
            # No BackfillPolicy: a backfill makes one run per shard, tagged dagster/partition, which is what
            # attributes every check evaluation to its shard (reference §2d, §3c).
            assert node.backfill_policy is None, name
        else:
            assert node.partitions_def is None, name
    # The pool that caps how many shards use the fleet at once (OPERATIONS §4.3) is on completions alone.
    pools = {name: graph.get(dg.AssetKey(name)).pools for name in EXPECTED_ASSETS}
    assert {name: pool for name, pool in pools.items() if pool} == {"completions": {"sglang_fleet"}}


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
        assert instance.run_retries_enabled and instance.run_retries_max_retries == 2
        assert instance.run_monitoring_enabled
    finally:
        instance.dispose()


def _env(tmp_path, num_shards: int) -> dict[str, str]:
    home = dagster_home(tmp_path / "home")
    return pipeline_env(home=home, store=tmp_path / "store", work_dir=tmp_path / "work", num_shards=num_shards)


# Run in a fresh interpreter: partitions are fixed when the definitions module is imported.
PARTITIONS_PROBE = """
import json
import dagster as dg
from dagster_project.definitions import defs

graph = defs.resolve_asset_graph()
assets = {key.to_user_string(): graph.get(key).partitions_def for key in graph.get_all_asset_keys()}
checks = {f"{key.asset_key.to_user_string()}/{key.name}": graph.get_check_spec(key).partitions_def for key in graph.asset_check_keys}
print(json.dumps({name: p.get_partition_keys() if p else None for name, p in {**assets, **checks}.items()}))
"""


def test_shard_count_comes_from_dflash_num_shards(tmp_path):
    """The partitions of every shard asset and of its checks follow DFLASH_NUM_SHARDS of the loading process."""
    result = subprocess.run(
        [sys.executable, "-c", PARTITIONS_PROBE], env=_env(tmp_path, 3), cwd=tmp_path, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    partitions = json.loads(result.stdout.splitlines()[-1])
    keys = ["shard-00000", "shard-00001", "shard-00002"]
    shard_checks = {f"{asset}/{name}" for asset in ("completions", "training_set") for name in EXPECTED_CHECKS[asset]}
    assert {name for name, value in partitions.items() if value is not None} == set(SHARD_ASSETS) | shard_checks
    assert all(partitions[name] == keys for name in set(SHARD_ASSETS) | shard_checks)


def test_dagster_definitions_validate_cli(tmp_path):
    command = [DAGSTER, "definitions", "validate", "-m", DEFS_MODULE]
    ok = subprocess.run(command, env=_env(tmp_path, 2), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    # The same command fails on a setting the definitions cannot load with: it is a real gate for CI.
    bad = subprocess.run(command, env=_env(tmp_path, 0), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    assert "DFLASH_NUM_SHARDS must be >= 1" in bad.stdout + bad.stderr


@pytest.mark.parametrize("asset", [completions, training_set], ids=lambda asset: asset.key.to_user_string())
def test_a_shard_run_refuses_conversations_sharded_otherwise_than_its_partitions(tmp_path, asset):
    """The partitions are fixed when the definitions load; the store's conversations may have been built with
    another DFLASH_NUM_SHARDS. A shard run then fails saying so, before it generates or assembles anything."""
    published = NUM_SHARDS + 3
    store = run_stages(tmp_path, [str(settings.DEMO_DATA_DIR)], num_shards=published).store
    resources = {
        "store": DatasetStore(root=store.uri, work_dir=str(tmp_path / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "generation": GenerationConfig(),
        "fleet": SGLangFleet(),
    }
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [asset], partition_key="shard-00000", resources=resources, instance=instance, raise_on_error=False
        )
    assert not result.success
    message = result.failure_data_for_node(asset.op.name).error.message
    assert f"have {published} shards" in message and f"DFLASH_NUM_SHARDS={published}" in message
