"""Acceptance of the walking skeleton: the demo materialized through the Dagster CLI, shard by shard.

`dagster asset materialize -m dagster_project.definitions` runs as a subprocess against a persistent temp
instance (DAGSTER_HOME with the project's dagster.yaml), a temp store and work dir, two shards, and a fleet of
simulator processes it reaches through DFLASH_SGLANG_ENDPOINTS: first `raw_prompts,conversations`, then `pilot`,
then `completions,training_set,specforge_export` for each shard (the two shard runs at once, as the demo does).

Then, from the outside:
* every training row is token-exact: its prompt is what the simulator received (length and hash from the
  simulator's own request log), its tail is exactly the `output_ids` the completions shard recorded for that
  request, and `loss_mask` is 0 over exactly the prompt and 1 over exactly the output; the fleet got one request
  per event, and before them one per answer of the pilot;
* the instance holds one materialization per shard partition and every check evaluation attributed to
  its shard, from runs tagged `dagster/partition`;
* the same flow with the store on S3 (the moto server process, reached through AWS_ENDPOINT_URL and
  credentials in the CLI's environment) writes every object under the store's prefix, the pilot's record and each
  shard behind its manifest.
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import orjson
import pytest

from dagster_project.conversations.shards import read_conversations_manifest
from dagster_project.generation.shards import iter_completion_batches
from dagster_project.generation_settings import GenerationSettings
from dagster_project.pilot_record import pilot_key, read_pilot
from dagster_project.store import layout
from dagster_project.store.manifest import ShardManifest, read_shard_manifest, verify_shard
from dagster_project.store.storage import LocalStore, Store, open_store
from dagster_project.training.export import specforge_key
from dagster_project.training.shards import iter_training_batches, training_manifest
from tests.support.dagster_helpers import (
    FAST_ANSWERS,
    SHARD_ASSETS,
    LoggedRequest,
    assert_token_exact,
    asset_check_keys,
    check_evaluations,
    dagster_home,
    materialize,
    materialized_partitions,
    pipeline_env,
    request_logs,
)
from tests.support.sglang_fixtures import SimFleet

NUM_SHARDS = 2
FINGERPRINT = GenerationSettings().fingerprint()
SHARDS = layout.partition_keys(NUM_SHARDS)
# Checks that warn instead of gating; every other check of a shard asset must pass on every shard.
WARNINGS = {"completions_spec_decoding"}


@dataclass
class CliRun:
    root: Path
    home: Path
    store: Store
    logged: dict[str, LoggedRequest]  # the shards' requests
    pilot_logged: dict[str, LoggedRequest]  # the pilot's, before them


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> CliRun:
    root = tmp_path_factory.mktemp("cli_local")
    with SimFleet.start(2, root / "fleet", **FAST_ANSWERS) as fleet:
        home = dagster_home(root / "dagster_home")
        env = pipeline_env(
            home=home, store=root / "store", work_dir=root / "work", num_shards=NUM_SHARDS, endpoints=fleet.urls
        )
        materialize(env, root, "raw_prompts,conversations")
        materialize(env, root, "pilot")  # OPERATIONS §4: the shards generate once a pilot of their settings passed
        pilot_logged = request_logs(fleet)
        with ThreadPoolExecutor(NUM_SHARDS) as pool:
            list(pool.map(lambda key: materialize(env, root, SHARD_ASSETS, key), SHARDS))
        logged = {rid: request for rid, request in request_logs(fleet).items() if rid not in pilot_logged}
    return CliRun(root, home, LocalStore(root / "store"), logged, pilot_logged)


def _events(store: Store, shard: int) -> list[dict]:
    columns = ["event_id", "status", "rid"]
    return [row for batch in iter_completion_batches(store, shard, columns) for row in batch.to_pylist()]


def test_every_training_row_is_what_the_engine_received_and_returned(local_run):
    rows = {shard: assert_token_exact(local_run.store, shard, local_run.logged) for shard in range(NUM_SHARDS)}
    assert all(count > 10 for count in rows.values()), rows
    # A healthy fleet got exactly one request per generation event, and every event is one of them; before them,
    # one per answer of the pilot, none of which became an event.
    events = [event for shard in range(NUM_SHARDS) for event in _events(local_run.store, shard)]
    assert all(event["status"] == "ok" for event in events)
    assert sorted(event["rid"] for event in events) == sorted(local_run.logged)
    assert len(local_run.pilot_logged) == read_pilot(local_run.store, FINGERPRINT).answers > 0
    # Every event became a row or was excluded with a counted reason; the export is the training rows verbatim.
    for shard in range(NUM_SHARDS):
        manifest = training_manifest(local_run.store, shard)
        assert manifest.rows + manifest.excluded == len(_events(local_run.store, shard))
        training = [
            {"input_ids": r["input_ids"], "loss_mask": r["loss_mask"]}
            for batch in iter_training_batches(local_run.store, shard, ["input_ids", "loss_mask"])
            for r in batch.to_pylist()
        ]
        exported = [orjson.loads(line) for line in local_run.store.get_bytes(specforge_key(shard)).splitlines()]
        assert [{k: r[k] for k in ("input_ids", "loss_mask")} for r in exported] == training


def test_the_comparison_catches_a_row_that_is_off_by_one_token(local_run):
    """The verifier above can fail: move the prompt/output boundary of one logged request by one token."""
    first_row = next(iter_training_batches(local_run.store, 0, ["event_id"])).column("event_id")[0].as_py()
    rid = next(event["rid"] for event in _events(local_run.store, 0) if event["event_id"] == first_row)
    request = local_run.logged[rid]
    shifted = {**local_run.logged, rid: dataclasses.replace(request, prompt_tokens=request.prompt_tokens + 1)}
    other_prompt = {**local_run.logged, rid: dataclasses.replace(request, input_hash="0" * 16)}
    for logged, phrase in ((shifted, "loss_mask"), (other_prompt, "not the ids the server received")):
        with pytest.raises(AssertionError, match=phrase):
            assert_token_exact(local_run.store, 0, logged)


def test_the_instance_shows_each_shard_materialized_with_its_checks(local_run):
    instance = dg.DagsterInstance.from_config(str(local_run.home))
    try:
        runs = instance.get_runs()
        # The conversations', the pilot's, one per shard.
        assert len(runs) == 2 + NUM_SHARDS and all(run.status == dg.DagsterRunStatus.SUCCESS for run in runs)
        partition_of_run = {run.run_id: run.tags.get("dagster/partition") for run in runs}
        assert sorted(filter(None, partition_of_run.values())) == SHARDS

        assert materialized_partitions(instance, SHARD_ASSETS) == {asset: set(SHARDS) for asset in SHARD_ASSETS}
        for asset in ("raw_prompts", "conversations"):
            assert instance.get_latest_materialization_event(dg.AssetKey(asset)) is not None, asset

        for asset in ("completions", "training_set"):
            evaluations = check_evaluations(instance, asset)
            expected = {(key.name, shard) for key in asset_check_keys(asset) for shard in SHARDS}
            assert set(evaluations) == expected, f"{asset}: evaluations not attributed to exactly the shards"
            for (check, shard), records in evaluations.items():
                assert len(records) == 1, (asset, check, shard)
                record = records[0]
                # Attributed to the shard of the run that evaluated it, and passed.
                assert partition_of_run[record.run_id] == shard, (asset, check, shard)
                evaluation = record.event.dagster_event.event_specific_data
                if check not in WARNINGS:
                    assert evaluation.passed, f"{asset}/{check} failed on {shard}: {evaluation.description}"

        conversation_checks = check_evaluations(instance, "conversations")
        assert {shard for _, shard in conversation_checks} == {None}
        assert all(r.event.dagster_event.event_specific_data.passed for rs in conversation_checks.values() for r in rs)
    finally:
        instance.dispose()


def test_the_same_flow_with_the_store_on_s3(sim_fleet, s3_server, s3_bucket, tmp_path):
    fleet = sim_fleet(2, **FAST_ANSWERS)
    prefix = "runs/dflash-v1"
    store_uri = f"s3://{s3_bucket}/{prefix}"
    env = pipeline_env(
        home=dagster_home(tmp_path / "dagster_home"),
        store=store_uri,
        work_dir=tmp_path / "work",
        num_shards=NUM_SHARDS,
        endpoints=fleet.urls,
        extra=s3_server.env,  # AWS_ENDPOINT_URL and credentials, for boto3's own chain in the CLI's process
    )
    home = Path(env["DAGSTER_HOME"])
    shard = 1
    materialize(env, tmp_path, "raw_prompts,conversations")
    materialize(env, tmp_path, "pilot")
    materialize(env, tmp_path, SHARD_ASSETS, layout.partition_key(shard))
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        expected = {asset: {layout.partition_key(shard)} for asset in SHARD_ASSETS}
        assert materialized_partitions(instance, SHARD_ASSETS) == expected
    finally:
        instance.dispose()

    pages = s3_server.client().get_paginator("list_objects_v2").paginate(Bucket=s3_bucket)
    keys = [obj["Key"] for page in pages for obj in page.get("Contents", [])]
    assert keys and all(key.startswith(prefix + "/") for key in keys), [
        k for k in keys if not k.startswith(prefix + "/")
    ]
    relative = {key[len(prefix) + 1 :] for key in keys}
    for stage in (layout.RAW_PROMPTS, layout.CONVERSATIONS):
        assert layout.stage_manifest_key(stage) in relative, stage
    assert pilot_key(FINGERPRINT) in relative
    for conversations_shard in range(NUM_SHARDS):
        assert layout.shard_manifest_key(layout.CONVERSATIONS, conversations_shard) in relative
    for stage in (layout.COMPLETIONS, layout.TRAINING_SET):
        assert layout.shard_manifest_key(stage, shard) in relative, stage
        assert not any(key.startswith(layout.shard_prefix(stage, 0)) for key in relative), (
            f"{stage} of an unrequested shard"
        )
    assert specforge_key(shard) in relative
    assert not (tmp_path / ".demo").exists(), "something was written to the default local store"

    store = open_store(store_uri, s3_server.client)
    assert read_conversations_manifest(store).num_shards == NUM_SHARDS
    for stage in (layout.CONVERSATIONS, layout.COMPLETIONS, layout.TRAINING_SET):
        manifest = read_shard_manifest(store, stage, shard, ShardManifest)
        listed = {obj.key for obj in manifest.objects}
        assert listed and listed <= relative and verify_shard(store, manifest) == [], stage
        assert all(key.startswith(layout.shard_prefix(stage, shard)) for key in listed), stage
    assert assert_token_exact(store, shard, request_logs(fleet)) > 10
