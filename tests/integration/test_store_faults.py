"""An S3 store that misbehaves: hung endpoint, permanent errors, listing through an outage (moto behind a proxy)."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dagster_project.store.storage import RetryPolicy, S3Store, StoreError, bounded_client
from tests.support.fault_proxy import fault_proxy
from tests.support.sglang_fixtures import wait_until


def s3_store(bucket: str, endpoint: str, policy: RetryPolicy) -> S3Store:
    return S3Store(f"s3://{bucket}/runs/r1", bounded_client(policy, endpoint_url=endpoint), policy)


@pytest.fixture
def proxy(s3_server, s3_bucket):
    with fault_proxy(s3_server.endpoint) as proxy:
        yield proxy


def test_a_hung_s3_endpoint_fails_the_call_within_its_timeouts_naming_the_object(s3_bucket, proxy):
    policy = RetryPolicy(attempts=3, backoff_s=0.1, connect_timeout_s=1, read_timeout_s=1, deadline_s=60)
    store = s3_store(s3_bucket, proxy.endpoint, policy)
    proxy.go_silent()
    started = time.monotonic()
    with pytest.raises(StoreError, match=rf"PUT s3://{s3_bucket}/runs/r1/a/b.json failed after 3 attempt"):
        store.put_bytes("a/b.json", b"{}")
    # Three attempts of at most one second of silence each, plus backoff: not 6 botocore tries x 60 s each.
    assert time.monotonic() - started < 10
    assert proxy.held == 3  # exactly our attempts: botocore adds no hidden retries


def test_the_deadline_stops_retrying_a_hung_endpoint(s3_bucket, proxy):
    policy = RetryPolicy(attempts=100, backoff_s=0.1, connect_timeout_s=1, read_timeout_s=0.5, deadline_s=2)
    store = s3_store(s3_bucket, proxy.endpoint, policy)
    proxy.go_silent()
    started = time.monotonic()
    with pytest.raises(StoreError, match="failed after"):
        store.get_bytes("missing.json")
    assert time.monotonic() - started < 6
    assert proxy.held < 100


def test_permanent_errors_are_not_retried(s3_server, s3_bucket):
    policy = RetryPolicy(attempts=5, backoff_s=2.0)
    store = s3_store("no-such-bucket-here", s3_server.endpoint, policy)
    started = time.monotonic()
    with pytest.raises(StoreError, match="not retried"):
        store.put_bytes("x.json", b"{}")
    with pytest.raises(StoreError, match="not retried"):
        store.get_bytes("x.json")
    assert time.monotonic() - started < 2  # one backoff of 2 s would already exceed this


def test_missing_credentials_are_not_retried(s3_server, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = s3_store("some-bucket", s3_server.endpoint, RetryPolicy(attempts=5, backoff_s=2.0))
    with pytest.raises(StoreError, match="not retried"):
        store.put_bytes("x.json", b"{}")


def test_permanent_errors_are_recognized_through_the_transfer_layer(s3_server, s3_bucket, tmp_path):
    path = tmp_path / "part.parquet"
    path.write_bytes(b"x" * 1000)
    store = s3_store("no-such-bucket-here", s3_server.endpoint, RetryPolicy(attempts=5, backoff_s=2.0))
    with pytest.raises(StoreError, match="upload s3://no-such-bucket-here/runs/r1/part.parquet failed.*not retried"):
        store.put_file("part.parquet", path)


def test_listing_rides_out_a_brief_outage(s3_bucket, s3_server, proxy):
    store = s3_store(s3_bucket, proxy.endpoint, RetryPolicy(attempts=20, backoff_s=0.1, deadline_s=60))
    keys = [f"completions/shard=00001/part-{i}.parquet" for i in range(3)]
    for key in keys:
        store.put_bytes(key, b"data")
    proxy.go_down()
    with ThreadPoolExecutor(1) as pool:
        listing = pool.submit(lambda: [info.key for info in store.list("completions/")])
        wait_until(lambda: proxy.refused >= 1, timeout_s=30, what="the listing to hit the outage")
        proxy.come_back()
        assert listing.result(timeout=60) == keys
