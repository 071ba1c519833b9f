"""A completions shard's data version: what tells Dagster that its training shard and export are stale."""

from dataclasses import replace

from dagster_project.generation.shards import CompletionsShardManifest
from dagster_project.store.manifest import StoredObject

SHARD = CompletionsShardManifest(
    shard=0,
    rows=2,
    ids_digest="ids",
    settings_fingerprint="settings",
    objects=(
        StoredObject("completions/shard=00000/part-0.parquet", 100, "aaa"),
        StoredObject("completions/shard=00000/_manifest.json", 10, "mmm"),
    ),
    published_at=1.0,
)


def test_new_answers_for_the_same_ids_are_a_new_version():
    regenerated = replace(SHARD, objects=(StoredObject("completions/shard=00000/part-0.parquet", 100, "bbb"),))
    assert regenerated.ids_digest == SHARD.ids_digest and regenerated.data_version != SHARD.data_version


def test_other_settings_are_a_new_version():
    assert replace(SHARD, settings_fingerprint="other").data_version != SHARD.data_version


def test_the_same_rows_published_again_keep_the_version():
    again = replace(
        SHARD,
        published_at=2.0,
        objects=(SHARD.objects[0], StoredObject("completions/shard=00000/_manifest.json", 11, "nnn")),
    )
    assert again.data_version == SHARD.data_version
