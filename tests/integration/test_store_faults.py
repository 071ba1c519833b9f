"""An S3 store that misbehaves: hung endpoint, permanent errors, listing through an outage (moto behind a proxy)."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from dagster_project.store.storage import RetryPolicy, S3Store, StoreError, bounded_client
from tests.support.clocks import SteppedClock
from tests.support.fault_proxy import fault_proxy
from tests.support.sglang_fixtures import wait_until


def s3_store(bucket: str, endpoint: str, policy: RetryPolicy, **timing) -> S3Store:
    return S3Store(f"s3://{bucket}/runs/r1", bounded_client(policy, endpoint_url=endpoint), policy, **timing)


@pytest.fixture
def proxy(s3_server, s3_bucket):
    with fault_proxy(s3_server.endpoint) as proxy:
        yield proxy


def test_a_hung_s3_endpoint_fails_the_call_within_its_timeouts_naming_the_object(s3_bucket, proxy):
    policy = RetryPolicy(attempts=3, backoff_s=0.1, connect_timeout_s=1, read_timeout_s=1, deadline_s=60)
    store = s3_store(s3_bucket, proxy.endpoint, policy)
    proxy.go_silent()
    with pytest.raises(StoreError, match=rf"PUT s3://{s3_bucket}/runs/r1/a/b.json failed after 3 attempt") as failed:
        store.put_bytes("a/b.json", b"{}")
    # Each attempt was cut by the client's read timeout (the policy's: tests/unit/store/test_store_faults.py), not by
    # the endpoint, which never answers: no call hangs on a silent endpoint.
    assert "Read timeout" in str(failed.value)
    assert proxy.held == 3  # exactly our attempts: botocore adds no hidden retries


def test_the_deadline_stops_retrying_an_endpoint_that_keeps_failing(s3_bucket, proxy):
    """On a clock that moves only with the backoff's pauses: 0.1, 0.2, 0.4 and 0.8 s bring the fifth failure to 1.5 s,
    and its pause of 1.6 s would pass the 2 s deadline, so the fifth attempt is the last of the hundred allowed."""
    clock = SteppedClock()
    policy = RetryPolicy(attempts=100, backoff_s=0.1, deadline_s=2)
    store = s3_store(s3_bucket, proxy.endpoint, policy, clock=clock, sleep=clock.sleep)
    proxy.go_down()
    with pytest.raises(StoreError, match=r"GET .*/missing.json failed after 5 attempt"):
        store.get_bytes("missing.json")
    assert clock.slept == [0.1, 0.2, 0.4, 0.8] and proxy.refused == 5


def test_permanent_errors_are_not_retried(s3_server, s3_bucket):
    store = s3_store("no-such-bucket-here", s3_server.endpoint, RetryPolicy(attempts=5, backoff_s=2.0))
    with pytest.raises(StoreError, match="not retried"):
        store.put_bytes("x.json", b"{}")
    with pytest.raises(StoreError, match="not retried"):
        store.get_bytes("x.json")
    assert store.calls.made == 2 and not store.calls.retried  # one call each, never a second attempt


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
