"""The store on S3 (the moto server, through dagster-aws S3Resource as the pipeline uses it): the local store's
tests of tests/unit/store/test_storage.py run again here, and what only S3 has (ETags in listings)."""

from __future__ import annotations

import signal
from dataclasses import replace

import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.resources.store import DatasetStore
from dagster_project.store import object_index
from dagster_project.store.dataclass_json import to_json
from dagster_project.store.layout import COMPLETIONS, shard_manifest_key
from dagster_project.store.manifest import ShardManifest, read_manifests_from_objects
from dagster_project.store.storage import Store
from tests.support.s3_server import running_s3_server
from tests.unit.store import test_storage
from tests.unit.store.test_object_index import publish


@pytest.fixture
def store(s3_bucket, tmp_path) -> Store:
    # Endpoint and credentials from the environment (the s3_bucket fixture sets them).
    return DatasetStore(root=f"s3://{s3_bucket}/runs/demo", work_dir=str(tmp_path / "work"), s3=S3Resource()).open()


# The local store's tests, given this module's S3 `store`.
test_round_trip_list_and_delete = test_storage.test_round_trip_list_and_delete
test_publishing_replaces_a_shard_and_verifies_it = test_storage.test_publishing_replaces_a_shard_and_verifies_it
test_verification_reports_an_object_of_the_right_size_with_other_bytes = (
    test_storage.test_verification_reports_an_object_of_the_right_size_with_other_bytes
)


def test_on_s3_the_coverage_check_reads_only_the_manifests_its_listing_shows_changed(store, tmp_path):
    published = {shard: publish(store, tmp_path, shard) for shard in range(3)}
    read_keys: list[str] = []
    get_versioned = store.get_versioned
    store.get_versioned = lambda key: read_keys.append(key) or get_versioned(key)  # counts, then really reads

    def manifests_read() -> tuple[dict[int, ShardManifest], set[str]]:
        read_keys.clear()
        manifests, _ = read_manifests_from_objects(store, COMPLETIONS, CompletionsShardManifest)
        return manifests, {key for key in read_keys if key.startswith(f"{COMPLETIONS}/")}

    assert manifests_read() == (published, set())  # every copy carries its object's ETag: no manifest is fetched

    # Rewritten behind the index's back: another ETag in the listing, so this one is read, and its copy repaired.
    changed = replace(published[1], rows=7)
    store.put_bytes(shard_manifest_key(COMPLETIONS, 1), to_json(changed))
    assert manifests_read() == ({**published, 1: changed}, {shard_manifest_key(COMPLETIONS, 1)})
    assert manifests_read() == ({**published, 1: changed}, set())

    # A copy made before copies recorded ETags is read once, then gets its ETag.
    object_index.record(store, shard_manifest_key(COMPLETIONS, 2), to_json(published[2]))
    assert manifests_read() == ({**published, 1: changed}, {shard_manifest_key(COMPLETIONS, 2)})
    assert manifests_read()[1] == set()


def test_the_s3_server_stops_when_its_parent_ignores_sigterm():
    """An ignored SIGTERM is inherited through exec: the server must still stop on the fixture's terminate()
    (the teardown raises after 10 s otherwise), as a test suite that ignores SIGTERM somewhere once showed."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with running_s3_server() as server:
            server.client().create_bucket(Bucket="stops-on-sigterm")
    finally:
        signal.signal(signal.SIGTERM, previous)
