"""A run over a range of shards (what a backfill launches under `BackfillPolicy.multi_run`) keeps every shard its own.

One in-process run of the shard job's assets and checks, tagged with a partition range as the backfill daemon
tags it, against simulator processes: each shard of the range is published under its own prefix with its own
manifest, and gets its own materialization (with its own figures) of every asset and its own evaluation of
every check, none stored without a partition (what Dagster does with a check result of a range run). A shard
that fails mid-range stops the run, and the shards done before it stay materialized: a retry redoes the rest.
"""

from __future__ import annotations

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.completions import completions
from dagster_project.assets.conversations import conversations
from dagster_project.assets.hf_export import hf_export
from dagster_project.assets.raw_prompts import raw_prompts
from dagster_project.assets.specforge_export import specforge_export
from dagster_project.assets.training_set import training_set
from dagster_project.checks import completions as completions_checks
from dagster_project.checks import training_set as training_set_checks
from dagster_project.generation.shards import read_completions_manifest
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.store import layout
from dagster_project.store.storage import LocalStore
from dagster_project.training.hf_export import CARD_KEY
from tests.support.dagster_helpers import FAST_ANSWERS, asset_check_keys
from tests.support.pilots import pass_pilot

SHARD_ASSETS = [completions, training_set, specforge_export, hf_export]
SHARD_RUN = [
    *SHARD_ASSETS,
    *dg.load_asset_checks_from_modules([completions_checks]),
    *dg.load_asset_checks_from_modules([training_set_checks]),
]


def _resources(store: LocalStore, endpoints: list[str]) -> dict:
    return {
        "store": DatasetStore(root=store.uri, work_dir=str(store.root.parent / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "generation": GenerationConfig(),
        "fleet": SGLangFleet(endpoints=endpoints),
    }


def _range_run(store: LocalStore, instance: dg.DagsterInstance, first: int, last: int, endpoints: list[str]):
    return dg.materialize(
        SHARD_RUN,
        tags={
            "dagster/asset_partition_range_start": layout.partition_key(first),
            "dagster/asset_partition_range_end": layout.partition_key(last),
        },
        resources=_resources(store, endpoints),
        instance=instance,
        raise_on_error=False,
    )


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The demo's conversations over the loaded shard partitions, in a local store, their pilot passed, and a test
    instance."""
    with dg.instance_for_test() as instance:
        root = tmp_path_factory.mktemp("ranges")
        store = LocalStore(root / "store")
        assert dg.materialize([raw_prompts, conversations], resources=_resources(store, []), instance=instance).success
        pass_pilot(_resources(store, []), instance, own_fleet=root / "pilot_fleet")
        yield store, instance


def test_a_range_run_gives_each_shard_its_prefix_manifest_materializations_and_check_evaluations(published, sim_fleet):
    store, instance = published
    fleet = sim_fleet(1, **FAST_ANSWERS)
    shards = [2, 3]
    keys = [layout.partition_key(shard) for shard in shards]

    result = _range_run(store, instance, shards[0], shards[-1], fleet.urls)

    assert result.success
    manifests = {shard: read_completions_manifest(store, shard) for shard in shards}
    assert all(manifest is not None and manifest.shard == shard for shard, manifest in manifests.items())
    for asset in SHARD_ASSETS:
        materialized = {m.partition: m.metadata for m in result.asset_materializations_for_node(asset.key.path[-1])}
        assert sorted(materialized) == keys, asset.key
        # Each shard's own figures: its store prefix, its row count.
        uris = {materialized[key]["uri"].value for key in keys}
        assert len(uris) == len(keys), (asset.key, uris)
    rows = {m.partition: m.metadata["rows"].value for m in result.asset_materializations_for_node("completions")}
    # The pool slot each shard's generation held, and of it the seconds with no request in flight.
    slots = [m.metadata for m in result.asset_materializations_for_node("completions")]
    assert all(0 <= m["pool_slot_idle_s"].value <= m["pool_slot_s"].value for m in slots), slots
    assert rows == {layout.partition_key(shard): manifests[shard].rows for shard in shards}
    # The range's export step rebuilt the dataset card once, over every shard it exported.
    assert f"{len(shards)} of {len(shards)} shards passed every check" in store.get_bytes(CARD_KEY).decode()
    for asset in ("completions", "training_set"):
        evaluations = [e for e in result.get_asset_check_evaluations() if e.asset_key == dg.AssetKey(asset)]
        by_check = {(e.check_name, e.partition) for e in evaluations}
        assert by_check == {(key.name, partition) for key in asset_check_keys(asset) for partition in keys}, asset
        assert len(evaluations) == len(by_check)
        # Each evaluation judges its own shard's materialization (the one the UI then shows it as current for).
        latest = {
            key: instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[key]), limit=1
            )
            .records[0]
            .storage_id
            for key in keys
        }
        assert all(e.target_materialization_data.storage_id == latest[e.partition] for e in evaluations), asset
        history = instance.event_log_storage.get_asset_check_execution_history(asset_check_keys(asset)[0], limit=10)
        assert sorted(record.partition for record in history) == keys


def test_a_shard_failing_mid_range_leaves_the_shards_before_it_materialized(published, sim_fleet):
    store, instance = published
    fleet = sim_fleet(1, **FAST_ANSWERS)
    # The range's last shard cannot be generated: its conversations are not published.
    store.delete(layout.shard_manifest_key(layout.CONVERSATIONS, 1))

    result = _range_run(store, instance, 0, 1, fleet.urls)

    assert not result.success
    assert [m.partition for m in result.asset_materializations_for_node("completions")] == [layout.partition_key(0)]
    assert layout.partition_key(0) in instance.get_materialized_partitions(dg.AssetKey("completions"))
    assert layout.partition_key(1) not in instance.get_materialized_partitions(dg.AssetKey("completions"))
    assert read_completions_manifest(store, 0) is not None and read_completions_manifest(store, 1) is None
