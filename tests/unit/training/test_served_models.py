"""The model that answered travels with the answers: the training set refuses a shard of two models, and the dataset
card names the model its rows came from."""

from __future__ import annotations

import pytest

from dagster_project.sglang.model_identity import QWEN3_6_27B, ModelIdentity
from dagster_project.store.storage import LocalStore
from dagster_project.training.hf_export import HfShardExport, dataset_card
from dagster_project.training.stage import AssemblyOptions, MixedModels, assemble_shard
from tests.support.training_shards import healthy_rows, publish_completions

LLAMA = ModelIdentity("meta-llama/Llama-3.1-8B-Instruct", "LlamaForCausalLM", 128256, 128009)


def test_a_shard_whose_answers_came_from_two_models_is_refused_naming_both(tmp_path):
    store = LocalStore(tmp_path / "store")
    rows = healthy_rows(5)
    for row in rows:
        row["served_model"] = QWEN3_6_27B.label
    rows[0]["served_model"] = LLAMA.label  # e.g. a journal resumed after the fleet's model changed
    publish_completions(store, 0, rows)
    with pytest.raises(MixedModels) as refused:
        assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")
    message = str(refused.value)
    assert "completions shard 0" in message and "holds answers of different models" in message
    assert f"{QWEN3_6_27B.label}: 4 answers" in message and f"{LLAMA.label}: 1 answers" in message
    assert not list((tmp_path / "store").glob("training_set/**/_manifest.json"))  # nothing published


def test_the_model_of_one_model_shards_reaches_the_training_manifest_and_the_card(tmp_path):
    store = LocalStore(tmp_path / "store")
    rows = healthy_rows(4)
    for row in rows:
        row["served_model"] = QWEN3_6_27B.label
    publish_completions(store, 0, rows)
    manifest = assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")
    assert manifest.source.served_models == {QWEN3_6_27B.label: 4}
    card = dataset_card([HfShardExport(shard=0, key="k", served_models=manifest.source.served_models)])
    assert "## Target model" in card
    assert f"| {QWEN3_6_27B.label} | 4 |" in card
    assert QWEN3_6_27B.label == "qwen3.6-27b (Qwen3_5ForConditionalGeneration, vocabulary 248320)"
