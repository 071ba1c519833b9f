"""`training_set` refuses, in any later run, a completions shard whose blocking gate failed, naming the gate.

Dagster's blocking checks stop `training_set` only in the run that fails them. The completions checks also
record their verdict next to the shard (`store.verdicts`); `assemble_shard` reads it and refuses the shard
unless the operator overrides it, in which case the overridden gates are recorded in the training manifest.
A verdict about an earlier publication of the shard does not count. One run at a time assembles a shard.
"""

from __future__ import annotations

import pytest

from dagster_project.store.layout import TRAINING_SET, lease_key
from dagster_project.store.lease import Lease, LeaseHeld
from dagster_project.store.storage import LocalStore
from dagster_project.store.verdicts import failed_gates, record_verdict
from dagster_project.training.shards import read_training_manifest
from dagster_project.training.stage import AssemblyOptions, CompletionsGated, assemble_shard
from tests.support.training_shards import healthy_rows, publish_completions

ERROR_RATE = "BLOCKED: 93.8% of events (840/896) ended in an error (limit 2%); by kind {'bad_response': 840}"


@pytest.fixture
def store(tmp_path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def test_a_completions_shard_that_failed_a_gate_is_refused_naming_it_unless_overridden(store, tmp_path):
    completions = publish_completions(store, 0, healthy_rows(8))
    record_verdict(store, completions, "exactly_once", {})
    record_verdict(store, completions, "quality", {"error_rate": ERROR_RATE, "short_answers": "BLOCKED: empty"})
    failed = {"quality/error_rate": ERROR_RATE, "quality/short_answers": "BLOCKED: empty"}
    assert failed_gates(store, completions) == failed

    with pytest.raises(CompletionsGated, match="quality/error_rate: BLOCKED: 93.8% of events .*override_failed_gates"):
        assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")
    assert read_training_manifest(store, 0) is None

    manifest = assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging", override_failed_gates=True)
    assert manifest.rows == 8
    assert read_training_manifest(store, 0).source.gates_overridden == failed


def test_verdicts_on_an_earlier_publication_do_not_count(store, tmp_path):
    old = publish_completions(store, 0, healthy_rows(8))
    record_verdict(store, old, "quality", {"error_rate": ERROR_RATE})
    new = publish_completions(store, 0, healthy_rows(6))  # generated again: the old verdict is gone
    assert failed_gates(store, new) == {}
    record_verdict(store, new, "quality", {})
    assert assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging").source.gates_overridden == {}


def test_a_shard_being_assembled_by_another_run_is_refused_naming_it(store, tmp_path):
    publish_completions(store, 0, healthy_rows(4))
    with Lease(store, lease_key(TRAINING_SET, 0), "node-a pid 1 run first"):
        with pytest.raises(LeaseHeld, match="held by node-a pid 1 run first"):
            assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")
    assert read_training_manifest(store, 0) is None
    assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging", run_id="r2")
    assert read_training_manifest(store, 0).rows == 4
