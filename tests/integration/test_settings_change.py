"""Changing generation settings makes shards stale; it never mixes old answers into a new shard."""

import dagster as dg
from dagster_aws.s3 import S3Resource

from dagster_project.assets.completions import completions
from dagster_project.assets.conversations import conversations
from dagster_project.assets.raw_prompts import raw_prompts
from dagster_project.assets.run_report import run_report
from dagster_project.generation.shards import completions_manifest, shard_coverage
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.store.storage import LocalStore
from tests.support.pilots import pass_pilot


def pipeline_resources(tmp_path, fleet):
    """A local store and the resources of every stage; `resources(n)` with max_new_tokens=n."""
    store = LocalStore(tmp_path / "store")
    base = {
        "store": DatasetStore(root=store.uri, work_dir=str(tmp_path / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "fleet": SGLangFleet(endpoints=fleet.urls),
    }

    def resources(max_new_tokens: int = 256) -> dict:
        return {**base, "generation": GenerationConfig(max_new_tokens=max_new_tokens)}

    return store, resources


def test_new_settings_regenerate_a_shard_and_flag_the_others_stale(tmp_path, sim_fleet):
    fleet = sim_fleet(2, output_len="uniform:16:56")
    store, resources = pipeline_resources(tmp_path, fleet)

    def report_metadata(max_new_tokens: int) -> dict:
        result = dg.materialize([run_report], resources=resources(max_new_tokens))
        return result.asset_materializations_for_node("run_report")[0].metadata

    def served() -> int:
        return sum(len(fleet.job_requests(i)) for i in range(2))

    with dg.instance_for_test() as instance:
        assert dg.materialize([raw_prompts, conversations], resources=resources(256), instance=instance).success
        pass_pilot(resources(256), instance)
        for shard in ("shard-00000", "shard-00001"):
            assert dg.materialize(
                [completions], partition_key=shard, resources=resources(256), instance=instance
            ).success
        old = completions_manifest(store, 0).settings_fingerprint
        assert report_metadata(256)["stale_shards"].value == []
        assert report_metadata(512)["stale_shards"].value == [0, 1]

        pass_pilot(resources(512), instance)  # the new settings' own pilot, as the shards ask
        before = served()
        assert dg.materialize(
            [completions], partition_key="shard-00000", resources=resources(512), instance=instance
        ).success
        manifest = completions_manifest(store, 0)
        assert manifest.settings_fingerprint != old and manifest.settings.max_new_tokens == 512
        # Every event was generated again: nothing from the journal of the old settings was reused.
        assert served() - before == shard_coverage(store, 0).expected == manifest.rows
        assert report_metadata(512)["stale_shards"].value == [1]


def test_the_report_flags_a_materialized_shard_whose_objects_left_the_store(tmp_path, sim_fleet):
    fleet = sim_fleet(1, output_len="uniform:16:56")
    store, stage_resources = pipeline_resources(tmp_path, fleet)
    resources = stage_resources()
    with dg.instance_for_test() as instance:
        assert dg.materialize([raw_prompts, conversations], resources=resources, instance=instance).success
        pass_pilot(resources, instance)
        for shard in ("shard-00000", "shard-00001"):
            assert dg.materialize([completions], partition_key=shard, resources=resources, instance=instance).success
        store.delete(completions_manifest(store, 1).data_keys[0])  # an object lost after publication

        result = dg.materialize([run_report], resources=resources, instance=instance, raise_on_error=False)
        checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
        assert (
            not checks["materialized_shards_in_store"].passed
            and "[1]" in checks["materialized_shards_in_store"].description
        )
        assert not checks["dataset_exactly_once"].passed  # the lost shard's events are missing
        report = result.asset_materializations_for_node("run_report")[0].metadata
        assert report["not_in_store"].value == [1]
