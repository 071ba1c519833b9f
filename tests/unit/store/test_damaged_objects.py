"""A damaged object in the store (a manifest that is not JSON, a truncated Parquet file) fails what reads it with a
message naming the object, never a bare decoder error."""

from __future__ import annotations

import pytest

from dagster_project import cli
from dagster_project.generation.shards import read_completions_manifest
from dagster_project.ops.coverage import dataset_coverage
from dagster_project.store.layout import COMPLETIONS, CONVERSATIONS, shard_manifest_key, stage_manifest_key
from dagster_project.store.storage import CorruptObject, LocalStore
from dagster_project.training.stage import AssemblyOptions, assemble_shard
from tests.support.ingest_helpers import questions_in_shards
from tests.support.training_shards import healthy_rows, publish_completions


@pytest.fixture
def store(tmp_path) -> LocalStore:
    """Conversations in two shards, and completions published for shard 0."""
    store = questions_in_shards(tmp_path)
    publish_completions(store, 0, healthy_rows(4))
    return store


def damage_manifest(store: LocalStore, key: str) -> str:
    path = store.root / key
    path.write_bytes(path.read_bytes()[:40])  # cut short, as by a full disk or a hand edit
    return store.url(key)


def test_a_manifest_that_is_not_json_is_named_by_the_coverage_check_and_training_set(store, tmp_path):
    url = damage_manifest(store, shard_manifest_key(COMPLETIONS, 0))
    with pytest.raises(CorruptObject, match=f"{url} is damaged: it is not a valid CompletionsShardManifest"):
        read_completions_manifest(store, 0)
    with pytest.raises(CorruptObject, match=url):
        dataset_coverage(store, 2)  # the coverage check reads every manifest; status answers from their index
    with pytest.raises(CorruptObject, match=url):
        assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")


def test_dflash_status_names_a_damaged_manifest(store, tmp_path, monkeypatch):
    url = damage_manifest(store, stage_manifest_key(CONVERSATIONS))
    monkeypatch.setenv("DFLASH_STORE", store.uri)
    monkeypatch.setenv("DFLASH_WORK_DIR", str(tmp_path / "work"))
    with pytest.raises(SystemExit, match=f"dflash status: {url} is damaged: it is not a valid ConversationsManifest"):
        cli.main(["status"])


def test_a_truncated_parquet_object_is_named_by_training_set(store, tmp_path):
    manifest = read_completions_manifest(store, 0)
    path = store.root / manifest.data_keys[0]
    path.write_bytes(path.read_bytes()[:-100])  # the footer is gone
    with pytest.raises(CorruptObject, match=f"{store.url(manifest.data_keys[0])} is damaged: .* bytes in the store"):
        assemble_shard(store, 0, AssemblyOptions(), tmp_path / "staging")
