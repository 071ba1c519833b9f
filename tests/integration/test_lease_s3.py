"""The lease tests of tests/unit/store/test_lease.py, run again on S3 (the moto server): taken, refused, expired,
fenced and raced through conditional writes."""

from __future__ import annotations

import pytest

from dagster_project.store.storage import RetryPolicy, S3Store, bounded_client
from tests.unit.store import test_lease


@pytest.fixture
def store(s3_server, s3_bucket) -> S3Store:
    policy = RetryPolicy(attempts=2, backoff_s=0.05)
    return S3Store(f"s3://{s3_bucket}/run", bounded_client(policy, endpoint_url=s3_server.endpoint), policy)


# The local store's tests, given this module's S3 `store`.
test_a_live_lease_refuses_a_second_writer_naming_the_holder = (
    test_lease.test_a_live_lease_refuses_a_second_writer_naming_the_holder
)
test_an_expired_lease_is_taken_over_and_the_paused_writer_is_fenced_off = (
    test_lease.test_an_expired_lease_is_taken_over_and_the_paused_writer_is_fenced_off
)
test_racing_writers_get_exactly_one_lease = test_lease.test_racing_writers_get_exactly_one_lease
test_a_waiting_writer_takes_the_lease_when_the_holder_releases_it = (
    test_lease.test_a_waiting_writer_takes_the_lease_when_the_holder_releases_it
)
test_a_lease_whose_holder_died_on_this_host_is_taken_over_at_once = (
    test_lease.test_a_lease_whose_holder_died_on_this_host_is_taken_over_at_once
)
