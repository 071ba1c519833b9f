"""The demo, end to end for one shard: demo prompts → conversations → completions from a simulator fleet →
training_set (every gate green) → SpecForge export, with each row decoding to its template render + answer."""

from __future__ import annotations

import json

import dagster as dg
from dagster_aws.s3 import S3Resource

from dagster_project.assets.completions import completions
from dagster_project.assets.conversations import conversations
from dagster_project.assets.raw_prompts import raw_prompts
from dagster_project.assets.specforge_export import specforge_export
from dagster_project.assets.training_set import training_set
from dagster_project.checks.training_set import GATE_DESCRIPTIONS, training_set_gates, training_set_gx_suite
from dagster_project.generation.shards import iter_completion_batches
from dagster_project.resources import DatasetStore, GenerationConfig, SGLangFleet, TokenizerResource
from dagster_project.store import layout
from dagster_project.store.storage import LocalStore
from dagster_project.training.export import specforge_key
from dagster_project.training.shards import iter_training_batches
from tests.support.pilots import pass_pilot
from tests.support.training_shards import tokenizer

SHARD = 0
# The demo fleet's answers: thinking-shaped, ~300 tokens (`make demo`'s plan).
DEMO_OUTPUT_LEN = "lognormal:300:0.6"


def test_a_demo_shard_passes_every_training_gate_and_is_exported(sim_fleet, tmp_path):
    fleet = sim_fleet(2, output_len=DEMO_OUTPUT_LEN)
    store = LocalStore(tmp_path / "store")
    resources = {
        "store": DatasetStore(root=store.uri, work_dir=str(tmp_path / "work"), s3=S3Resource()),
        "tokenizer": TokenizerResource(),
        "generation": GenerationConfig(),
        "fleet": SGLangFleet(endpoints=fleet.urls),
    }
    partition = layout.partition_key(SHARD)
    with dg.instance_for_test() as instance:
        assert dg.materialize([raw_prompts, conversations], resources=resources, instance=instance).success
        pass_pilot(resources, instance)
        assert dg.materialize([completions], partition_key=partition, resources=resources, instance=instance).success
        result = dg.materialize(
            [training_set, training_set_gates, training_set_gx_suite, specforge_export],
            partition_key=partition,
            resources=resources,
            instance=instance,
            raise_on_error=False,
        )
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert {name: e.description for name, e in evaluations.items() if not e.passed} == {}
    assert set(evaluations) == {*GATE_DESCRIPTIONS, "gx_suite"} and result.success

    tok = tokenizer()
    sent = {
        row["event_id"]: (row["prompt_ids"], row["output_ids"])
        for batch in iter_completion_batches(store, SHARD)
        for row in batch.to_pylist()
    }
    training = [row for batch in iter_training_batches(store, SHARD) for row in batch.to_pylist()]
    assert len(training) > 20 and any(row["turn_index"] > 0 for row in training), "the demo shard has multi-turn rows"
    for row in training:
        prompt_ids, output_ids = sent[row["event_id"]]
        assert tok.decode(row["input_ids"]) == tok.decode(prompt_ids) + tok.decode(output_ids)
    # Provenance, as the simulator's responses gave it: the server that answered, its weight_version, MTP's stats.
    assert {row["server"] for row in training} <= set(fleet.urls) and {row["weight_version"] for row in training} == {
        "default"
    }
    assert all(row["spec_verify_ct"] > 0 and row["spec_accept_length"] >= 1 for row in training)
    assert {row["source"] for row in training} <= {"alpaca_tasks", "openai_messages", "sharegpt_chats"}
    exported = [json.loads(line) for line in store.get_bytes(specforge_key(SHARD)).splitlines()]
    assert [record["input_ids"] for record in exported] == [row["input_ids"] for row in training]
