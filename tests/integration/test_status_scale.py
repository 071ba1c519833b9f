"""The scale paths on S3 (moto on loopback): status from the store's index, coverage by id reading only the id
columns through pyarrow's S3 file system, and verification by the listing's ETags; plus the benchmark's own code
path at a tiny size."""

from __future__ import annotations

import pytest
from dagster_aws.s3 import S3Resource

from benchmarks import bench_status_scale as bench
from dagster_project.generation.shards import iter_completion_batches, read_completions_manifest
from dagster_project.ops.coverage import dataset_coverage, write_coverage
from dagster_project.ops.status import collect_status
from dagster_project.resources import DatasetStore
from dagster_project.store.layout import COMPLETIONS
from dagster_project.store.manifest import iter_parquet_batches
from dagster_project.store.storage import StoreError

pytestmark = pytest.mark.integration


@pytest.fixture
def s3_store(s3_bucket, tmp_path):
    store = DatasetStore(root=f"s3://{s3_bucket}/runs/r1", work_dir=str(tmp_path / "work"), s3=S3Resource()).open()
    bench.build_store(store, 300, 3, tmp_path / "build")
    return store


def test_coverage_by_id_on_s3_agrees_with_bare_duckdb_and_catches_an_object_rewritten_at_the_same_size(s3_store):
    coverage = dataset_coverage(s3_store, 3)
    assert coverage.exactly_once and coverage.events_planned == coverage.events_recorded == 300
    assert bench.bare_duckdb(s3_store) == (0, 0, 0)

    key = read_completions_manifest(s3_store, 2).data_keys[0]
    original = s3_store.get_bytes(key)
    s3_store.put_bytes(key, original[:-1] + bytes([original[-1] ^ 1]))
    damaged = dataset_coverage(s3_store, 3)
    assert damaged.shards_damaged == [2] and damaged.events_missing == read_completions_manifest(s3_store, 2).rows


def test_status_on_s3_answers_from_the_index_and_names_what_the_coverage_check_found(s3_store):
    status = collect_status(s3_store, [], materialized={0, 1, 2})
    assert status.storage.shards_published == 3 and status.progress.events_done == 300
    assert status.storage.materialized_not_in_store == []

    lost = read_completions_manifest(s3_store, 1).data_keys[0]
    s3_store.delete(lost)  # an object lost after publication
    by_id = dataset_coverage(s3_store, 3)
    write_coverage(s3_store, by_id)
    status = collect_status(s3_store, [], materialized={0, 1, 2})
    assert by_id.shards_damaged == [1] and status.storage.materialized_not_in_store == [1]
    # The lost object is named, in the shard states and in an alert.
    assert status.shards.completions == {"published": 2, "damaged": 1}
    assert [(state.shard, state.damaged_objects) for state in status.shards.needs_a_look] == [(1, [f"missing {lost}"])]
    assert any(alert.kind == "damaged" and f"missing {lost}" in alert.message for alert in status.alerts)


def test_the_benchmark_runs_end_to_end_at_a_tiny_size(tmp_path):
    assert bench.main(["--events", "200", "--shards", "4", "--work-dir", str(tmp_path), "--no-write"]) == 0
    assert read_completions_manifest(bench.local_store(200, 4, tmp_path), 3).stage == COMPLETIONS


def test_some_columns_of_an_s3_shard_are_read_in_place_and_a_missing_object_is_named(s3_store):
    batches = list(iter_completion_batches(s3_store, 0, ["event_id"]))
    assert {batch.schema.names[0] for batch in batches} == {"event_id"} and all(b.num_columns == 1 for b in batches)
    assert sum(batch.num_rows for batch in batches) == read_completions_manifest(s3_store, 0).rows
    key = read_completions_manifest(s3_store, 0).data_keys[0]
    s3_store.delete(key)
    with pytest.raises(StoreError, match=f"no object {s3_store.url(key)}"):
        list(iter_parquet_batches(s3_store, read_completions_manifest(s3_store, 0), ["event_id"]))
