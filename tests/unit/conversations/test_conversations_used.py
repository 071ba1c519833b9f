"""`ConversationsUsed`: whether a shard was made from the conversations published now."""

from __future__ import annotations

from dataclasses import replace

from dagster_project.conversations.shards import ConversationsShardManifest, ConversationsUsed
from dagster_project.store.manifest import StoredObject


def shard(ids_digest: str, sha256: str | None) -> ConversationsShardManifest:
    stored = StoredObject(key="conversations/shard=00000/conversations.jsonl", size=10, sha256=sha256)
    return ConversationsShardManifest(
        shard=0, rows=1, ids_digest=ids_digest, num_shards=1, policy="p", build_id="b", objects=(stored,)
    )


def test_the_same_ids_with_other_text_are_other_conversations():
    made_from = ConversationsUsed.of(shard("ids", "aaa"))

    assert not made_from.changed_in(shard("ids", "aaa"))
    assert not made_from.changed_in(replace(shard("ids", "aaa"), build_id="another build"))  # rebuilt, same bytes
    assert made_from.changed_in(shard("ids", "bbb"))  # prompts edited under their own ids
    assert made_from.changed_in(shard("other ids", "aaa"))


def test_what_was_not_recorded_is_not_compared():
    assert not ConversationsUsed().changed_in(shard("ids", "aaa"))  # a shard made before either was recorded
    assert not ConversationsUsed(ids_digest="ids").changed_in(shard("ids", "bbb"))  # only the ids were
    assert ConversationsUsed(ids_digest="ids").changed_in(shard("other ids", "bbb"))
    assert ConversationsUsed.of(shard("ids", None)).content_digest == ""  # a checksum not known: no content digest
