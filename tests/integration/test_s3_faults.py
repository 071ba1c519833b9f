"""S3 failing transiently: a shard either publishes correctly or the run fails loudly with nothing half-published.

The S3 server is moto in server mode behind a TCP proxy that resets connections while it is down.
"""

from concurrent.futures import ThreadPoolExecutor

import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.resources.store import DatasetStore
from dagster_project.store.manifest import ShardManifest, publish_shard, read_shard_manifest, verify_shard
from dagster_project.store.storage import StoreError
from tests.support.fault_proxy import fault_proxy
from tests.support.sglang_fixtures import wait_until


@pytest.fixture
def proxied_store(s3_server, s3_bucket, monkeypatch, tmp_path):
    with fault_proxy(s3_server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        store = DatasetStore(
            root=f"s3://{s3_bucket}/runs/r1",
            work_dir=str(tmp_path / "work"),
            s3=S3Resource(),
            attempts=4,
            backoff_s=0.2,
        ).open()
        yield store, proxy


@pytest.fixture
def shard_files(tmp_path):
    files = []
    for name, size in [("part-0.parquet", 4096), ("part-1.parquet", 9000)]:
        path = tmp_path / name
        path.write_bytes(bytes(range(256)) * (size // 256))
        files.append((name, path))
    return files


def test_a_brief_outage_during_publishing_is_ridden_out(proxied_store, shard_files):
    store, proxy = proxied_store
    proxy.go_down()
    with ThreadPoolExecutor(1) as pool:
        publishing = pool.submit(publish_shard, store, ShardManifest(stage="completions", shard=7, rows=2), shard_files)
        wait_until(
            lambda: proxy.refused >= 2, timeout_s=30, what="the upload to hit the outage"
        )  # the upload has really hit the outage
        proxy.come_back()
        manifest = publishing.result(timeout=120)
    assert verify_shard(store, manifest) == []
    assert read_shard_manifest(store, "completions", 7, ShardManifest) == manifest
    assert [o.size for o in manifest.objects] == [4096, 8960]


def test_an_outage_longer_than_the_retries_fails_loudly_and_publishes_nothing(proxied_store, shard_files):
    store, proxy = proxied_store
    proxy.go_down()
    with pytest.raises(StoreError, match="failed after 4 attempt"):
        publish_shard(store, ShardManifest(stage="completions", shard=8, rows=2), shard_files)
    proxy.come_back()
    assert read_shard_manifest(store, "completions", 8, ShardManifest) is None  # the shard does not exist downstream


def test_a_failed_republish_never_pairs_the_old_manifest_with_new_objects(proxied_store, shard_files, tmp_path):
    store, proxy = proxied_store
    old = publish_shard(store, ShardManifest(stage="completions", shard=9, rows=1), shard_files[:1])
    proxy.go_down()
    with pytest.raises(StoreError):
        publish_shard(store, ShardManifest(stage="completions", shard=9, rows=5), shard_files[1:])
    proxy.come_back()
    manifest = read_shard_manifest(store, "completions", 9, ShardManifest)
    # The old publication stays whole: a republish replaces it, never withdraws it first.
    assert manifest == old and verify_shard(store, manifest) == []


def test_a_publish_to_a_slow_store_stops_at_its_deadline_naming_the_store(s3_server, s3_bucket, monkeypatch, tmp_path):
    """Every S3 answer 0.4 s late: each call succeeds, the publish would go on; past the deadline it stops."""
    with fault_proxy(s3_server.endpoint) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        store = DatasetStore(
            root=f"s3://{s3_bucket}/runs/r1", work_dir=str(tmp_path / "work"), s3=S3Resource(), publish_deadline_s=1.0
        ).open()
        files = []
        for i in range(6):
            path = tmp_path / f"part-{i}.parquet"
            path.write_bytes(bytes([i]) * 1000)
            files.append((path.name, path))
        proxy.slow_s = 0.4
        with pytest.raises(StoreError) as stopped, store.deadline("publishing completions shard 3"):
            publish_shard(store, ShardManifest(stage="completions", shard=3, rows=6), files)
        proxy.slow_s = 0.0
        assert read_shard_manifest(store, "completions", 3, ShardManifest) is None  # nothing half-published
    message = str(stopped.value)
    assert message.startswith("publishing completions shard 3 passed its deadline of 1 s (the store resource's ")
    assert f"the store {store.uri} is slow (its last call took " in message
