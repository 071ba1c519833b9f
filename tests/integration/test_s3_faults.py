"""S3 failing transiently: a shard either publishes correctly or the run fails loudly with nothing half-published;
S3 answering late: a publish stops at its deadline, and `dflash status` answers within its budget all the same.

The S3 server is moto in server mode behind a TCP proxy that resets connections while it is down, or holds its
answers while it is slow.
"""

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.generation.heartbeat import write_heartbeat
from dagster_project.processes import this_process
from dagster_project.resources.store import DatasetStore
from dagster_project.store.manifest import (
    ShardManifest,
    publish_shard,
    read_shard_manifest,
    verify_shard,
    write_stage_manifest,
)
from dagster_project.store.storage import S3Store, StoreError
from tests.support.fault_proxy import fault_proxy
from tests.support.heartbeats import heartbeat
from tests.support.sglang_fixtures import wait_until
from tests.support.stage_manifests import conversations_manifest


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


STATUS_BUDGET_S = 2.0
# A command that takes longer fails the test: a hang guard for a loaded machine, far past any budget.
COMMAND_TIMEOUT_S = 120.0


def test_status_answers_within_its_budget_from_its_snapshot_when_every_s3_answer_is_late(
    s3_server, s3_bucket, sim_fleet, tmp_path
):
    """Issue 38's slow store: four `dflash status` calls took 87-103 s each and blamed an idle server. Here every S3
    answer is held until the commands have returned (the trial's were 5-20 s late): status answers from the snapshot its
    last timely answer kept, says "store slow: last call N s" naming the store, and blames no server (the same figures
    read in time do). Waiting for S3 instead, it would answer only once its calls had timed out, retries and all."""
    root = f"s3://{s3_bucket}/runs/r1"
    writer = S3Store(root, s3_server.client())  # straight to the S3 server: the store as the run left it
    write_stage_manifest(writer, conversations_manifest(num_shards=2, rows=40, turns=40))
    host, pid, start = this_process()  # a running shard 0 with work waiting: 4 of 10 events done, 40 planned
    write_heartbeat(writer, heartbeat(0, host=host, pid=pid, process_start=start, heartbeat_interval_s=5.0), first=True)
    fleet = sim_fleet(1, enable_metrics=True)  # idle: nothing sends it work
    with fault_proxy(s3_server.endpoint) as proxy:
        env = {
            **os.environ,
            **s3_server.env,
            "AWS_ENDPOINT_URL": proxy.endpoint,
            "DFLASH_STORE": root,
            "DFLASH_WORK_DIR": str(tmp_path / "work"),
            "DFLASH_SGLANG_ENDPOINTS": fleet.url(0),
            "DFLASH_STATUS_BUDGET_S": str(STATUS_BUDGET_S),
        }
        in_time = _status(env)
        assert f"ALERT [server]: {fleet.url(0)} is idle while shards [0] have work waiting" in in_time
        assert "store slow" not in in_time

        proxy.hold_answers()
        late = _status(env)
        scrape = _dflash(env, "metrics", "--once")
        held = proxy.answers_held
        proxy.release_answers()  # only now: both commands came back while their S3 answers were held
    assert held >= 2  # each command asked S3 and got no answer
    slow = re.search(r"store slow: last call (\d+) s", late)
    assert slow and int(slow.group(1)) >= STATUS_BUDGET_S - 1, late  # measured: no call answered within the budget
    assert f"ALERT [storage]: store slow: last call {slow.group(1)} s: the store {root} did not answer" in late
    assert "ALERT [server]" not in late  # not "… is idle while shards [0] have work waiting"
    # What it has: the snapshot's figures, marked as not refreshed, and the server probed now.
    assert "NOT REFRESHED (store slow: last call" in late
    assert "events 4/40 (10.0%), shards running 1 (0)" in late
    assert fleet.url(0) in late.split("3. Concurrency", 1)[1]
    # A scrape serves no old figures as new: it fails, as soon.
    assert scrape.returncode == 1 and scrape.stderr.startswith("dflash metrics: store slow: last call "), scrape.stderr


def _dflash(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """A `dflash` command as the operator runs it."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "dagster_project.cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"dflash {' '.join(args)} did not answer within {COMMAND_TIMEOUT_S:.0f} s")


def _status(env: dict[str, str]) -> str:
    result = _dflash(env, "status")
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def test_s3_throttling_is_retried_counted_by_cause_and_raised_as_an_alert(s3_server, s3_bucket, monkeypatch, tmp_path):
    """S3 answering `503 SlowDown` to one call in three: the shard publishes intact, the store counts each retried
    call under its cause, and status shows the figure and raises the alert a throttled job needs."""
    from dagster_project.ops.alerts import DEFAULT_THRESHOLDS
    from dagster_project.ops.status import collect_status, render_text
    from dagster_project.store.dataclass_json import to_json
    from dagster_project.store.layout import progress_key
    from tests.support.throttling_proxy import throttling_proxy

    with throttling_proxy(s3_server.endpoint, every=3) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
        store = DatasetStore(
            root=f"s3://{s3_bucket}/runs/throttled",
            work_dir=str(tmp_path / "work"),
            s3=S3Resource(),
            backoff_s=0.01,
        ).open()
        files = [(f"part-{n}.parquet", tmp_path / f"part-{n}.parquet") for n in range(3)]
        for _, path in files:
            path.write_bytes(bytes(range(256)) * 16)
        manifest = publish_shard(store, ShardManifest(stage="completions", shard=2, rows=3), files)
        assert verify_shard(store, manifest) == []
        assert proxy.throttled >= 2
        # Each throttled call is retried under the cause botocore names: `SlowDown` from the XML body, `503` for a
        # HEAD (no body), a connection closed mid-PUT; boto3's transfer layer retries some uploads itself.
        retried = store.calls.retried
        assert retried["SlowDown"] >= 1 and set(retried) <= {"SlowDown", "503", "ConnectionClosedError"}
        assert proxy.throttled // 2 <= retried["SlowDown"] + retried["503"] <= proxy.throttled
        assert store.calls.made > sum(retried.values())
        # What a shard run's heartbeat carries from its store, as status reads it.
        recorded = dict(store.calls.retried)  # status's own reads go through the proxy too, after this
        beat = heartbeat(2, store_calls=store.calls.made, store_retries=recorded)
        store.put_bytes(progress_key(2), to_json(beat))
        status = collect_status(store, [], thresholds=DEFAULT_THRESHOLDS)
    assert status.storage.store_retries == recorded
    text = render_text(status)
    assert f"SlowDown {recorded['SlowDown']}" in text and "store calls retried by the shard runs:" in text
    assert any(a.kind == "storage" and "is slowing the job" in a.message for a in status.alerts)
