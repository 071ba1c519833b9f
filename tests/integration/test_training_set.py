"""The training_set asset, its blocking per-shard checks and the SpecForge export, run through Dagster."""

from __future__ import annotations

import dagster as dg
import pytest
from dagster_aws.s3 import S3Resource

from dagster_project.assets.specforge_export import specforge_export
from dagster_project.assets.training_set import training_set
from dagster_project.checks.training_set import GATE_DESCRIPTIONS, training_set_gates, training_set_gx_suite
from dagster_project.resources import DatasetStore, TokenizerResource
from dagster_project.store import layout
from dagster_project.store.storage import LocalStore
from dagster_project.store.verdicts import read_verdict
from dagster_project.training.export import specforge_key
from dagster_project.training.shards import training_manifest
from tests.support.dagster_helpers import evaluations_by_check
from tests.support.training_shards import disaster_rows, healthy_rows, publish_completions, templated_rows

SHARD = 1
PARTITION = layout.partition_key(SHARD)
ASSETS = [training_set, training_set_gates, training_set_gx_suite, specforge_export]


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def _materialize(store: LocalStore, assets: list = ASSETS, **kwargs) -> dg.ExecuteInProcessResult:
    with dg.instance_for_test() as instance:
        return dg.materialize(
            assets,
            partition_key=PARTITION,
            instance=instance,
            resources={
                "store": DatasetStore(root=store.uri, work_dir=str(store.root.parent / "work"), s3=S3Resource()),
                "tokenizer": TokenizerResource(),
            },
            **kwargs,
        )


def test_a_healthy_shard_passes_every_gate_and_is_exported(store):
    publish_completions(store, SHARD, healthy_rows(30, shard=SHARD))
    result = _materialize(store)
    assert result.success

    evaluations = evaluations_by_check(result)
    assert set(evaluations) == {*GATE_DESCRIPTIONS, "gx_suite"}
    assert all(e.passed and e.partition == PARTITION for e in evaluations.values())
    assert evaluations["gx_suite"].metadata["evaluated_expectations"].value == 17
    assert evaluations["loss_sum_floor"].metadata["rows"].value == 30
    materialized = {m.asset_key.to_user_string(): m for m in result.get_asset_materialization_events()}
    assert set(materialized) == {"training_set", "specforge_export"}
    assert materialized["training_set"].partition == PARTITION
    assert store.exists(specforge_key(SHARD))


def test_the_historical_failure_is_blocked_before_export(store):
    publish_completions(store, SHARD, disaster_rows(40, shard=SHARD))
    result = _materialize(store, raise_on_error=False)
    assert not result.success

    evaluations = evaluations_by_check(result)
    failed = {name for name, evaluation in evaluations.items() if not evaluation.passed}
    assert failed == {
        "loss_sum_floor",
        "loss_sum_concentration",
        "thinking_structure",
        "degenerate_answers",
        "short_answers",
    }
    description = evaluations["loss_sum_concentration"].description
    assert description.startswith(
        "BLOCKED: 88% of rows (35/40) have loss_mask sum exactly 6 — "
        "the signature of empty reasoning + a one-word answer such as 'OK.'; "
        "limit 5%; true share at least 53.4% (false-block rate 1 in 10,000); "
        "threshold max_top_loss_sum_share=0.05, min_repeats=5 (run config of the training_set_gates check); "
        "override: once the failures are understood, materialize specforge_export and hf_export"
    )
    assert len(evaluations["loss_sum_concentration"].metadata["example_ids"].value) == 5
    assert "; examples: " in description
    assert evaluations["loss_sum_concentration"].metadata["top_sums"].value["6"] == 35
    assert [m.asset_key.to_user_string() for m in result.get_asset_materialization_events()] == ["training_set"]
    assert not store.exists(specforge_key(SHARD))
    # What later runs obey: the recorded verdict names every gate that failed here.
    assert set(read_verdict(store, training_manifest(store, SHARD), "gates").failures) == failed


def test_a_later_run_of_the_export_alone_still_refuses_the_blocked_shard(store):
    # The shard fails one gate alone, so the refusal can only come from that gate's recorded verdict.
    publish_completions(store, SHARD, templated_rows(30, templated=15, shard=SHARD))
    first = _materialize(store, raise_on_error=False)
    assert {name for name, e in evaluations_by_check(first).items() if not e.passed} == {"loss_sum_concentration"}
    result = _materialize(store, [specforge_export], raise_on_error=False)
    assert not result.success and not store.exists(specforge_key(SHARD))
    failure = result.failure_data_for_node("specforge_export").error  # a refusal in one line (`dg.Failure`)
    assert (
        "training_set shard 1 is not cleared for export: gates/loss_sum_concentration: BLOCKED: 50% of rows (15/30)"
        in failure.message
    )


def test_thresholds_are_run_config(store):
    publish_completions(store, SHARD, disaster_rows(40, broken_share=0.1, shard=SHARD))
    strict = {"ops": {"training_set_gates": {"config": {"max_share_below_floor": 0.0}}}}
    result = _materialize(store, [training_set, training_set_gates], run_config=strict, raise_on_error=False)
    evaluations = evaluations_by_check(result)
    assert (
        not evaluations["loss_sum_floor"].passed
        and evaluations["loss_sum_floor"].metadata["max_share_below_floor"].value == 0.0
    )
    assert not result.success


def test_max_length_is_asset_config_and_recorded(store):
    publish_completions(store, SHARD, healthy_rows(30, shard=SHARD))
    run_config = {"ops": {"training_set": {"config": {"max_length": 200, "length_policy": "drop"}}}}
    result = _materialize(store, [training_set], run_config=run_config)
    metadata = result.get_asset_materialization_events()[0].materialization.metadata
    assert metadata["assembly"].value == {"max_length": 200, "length_policy": "drop", "exclude_length_capped": True}
    assert metadata["exclusions"].value["over_max_length"] + metadata["rows"].value == 30
    assert metadata["max_row_tokens"].value <= 200
    assert metadata["rows_over_max_length"].value == metadata["exclusions"].value["over_max_length"]
