"""The mixture_report asset, materialized by Dagster over published training shards: its metadata and the
report it writes."""

from __future__ import annotations

import dagster as dg
import orjson
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.mixture_report import mixture_report
from dagster_project.resources import DatasetStore
from dagster_project.store.storage import LocalStore
from dagster_project.training.mixture import REPORT_KEY
from dagster_project.training.stage import AssemblyOptions, assemble_shard
from tests.support.training_shards import healthy_rows, publish_completions

pytestmark = pytest.mark.integration


def test_the_mixture_report_is_materialized_with_tables_and_plottable_figures(tmp_path):
    store = LocalStore(tmp_path / "store")
    for shard in (0, 1):
        publish_completions(store, shard, healthy_rows(6, shard=shard))
        assemble_shard(store, shard, AssemblyOptions(), tmp_path / "staging")
    resources = {"store": DatasetStore(root=store.uri, work_dir=str(tmp_path / "work"), s3=S3Resource())}
    with dg.instance_for_test() as instance:
        result = dg.materialize([mixture_report], resources=resources, instance=instance)
    assert result.success
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["training_rows"].value == 12
    assert metadata["share_by_source"].value == {"demo": 1.0}
    assert metadata["by_source"].value.splitlines()[2].startswith("| demo | 12 | — | 12 | 100.0% (100.0%) |")
    assert metadata["flagged"].value == []
    assert sum(metadata["length_histogram"].value.values()) == 12
    assert orjson.loads(store.get_bytes(REPORT_KEY))["training_rows"] == 12
