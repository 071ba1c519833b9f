"""The definitions as processes load them: the shard count of a fresh interpreter, `dagster definitions
validate` as CI runs it, and shard runs that refuse a store sharded otherwise."""

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
from dagster_project.partitions import NUM_SHARDS
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from tests.support.dagster_helpers import (
    DAGSTER,
    DEFS_MODULE,
    EXPECTED_CHECKS,
    SHARD_ASSETS,
    dagster_home,
    pipeline_env,
)
from tests.support.ingest_helpers import run_stages


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
checks = {
    f"{key.asset_key.to_user_string()}/{key.name}": graph.get_check_spec(key).partitions_def
    for key in graph.asset_check_keys
}
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
@pytest.mark.without_pilot(reason="the refusal of a store sharded otherwise is under test, not the pilot's first")
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


@pytest.mark.without_pilot(reason="the stage's refusal is under test; without conversations there is no pilot either")
def test_completions_before_conversations_fail_in_one_line_naming_the_fix(tmp_path):
    """Every stage's refusal (`partitions.REFUSALS`) ends its step the same way; completions stand for them."""
    resources = {
        "store": DatasetStore(root=str(tmp_path / "store"), work_dir=str(tmp_path / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "generation": GenerationConfig(),
        # A configured fleet (never reached: the run stops before its first request).
        "fleet": SGLangFleet(endpoints=["http://127.0.0.1:9"]),
    }
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [completions], partition_key="shard-00000", resources=resources, instance=instance, raise_on_error=False
        )
    error = result.failure_data_for_node(completions.op.name).error
    # A `dg.Failure` with the stage's line as its description: no chained traceback through the stage's code.
    assert error.cls_name == "Failure" and error.cause is None, error.to_string()
    assert "conversations shard 0 is not published: materialize `conversations` first" in error.message
